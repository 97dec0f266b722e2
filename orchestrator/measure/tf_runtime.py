"""Run a GraphDef: one TF1 session, configured like a phone (inter-op 1, intra-op = cores).

Shared by benchmark, evaluate, log_ranges and the tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.model import tf_adapter  # noqa: F401  (sets TF env defaults before import
from orchestrator.model.artifact import ModelArtifact, tensor_name

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

    from orchestrator.model.kinds import KeyLookup


def session_config(intra_op_threads: int | None = None) -> Any:
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2

    return tf.compat.v1.ConfigProto(
        inter_op_parallelism_threads=1,
        intra_op_parallelism_threads=intra_op_threads or os.cpu_count() or 1,
        graph_options=tf.compat.v1.GraphOptions(
            # Run the graph as written: grappler must not re-fold what a stage produced.
            rewrite_options=rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True)),
    )


class GraphRunner:
    """Imports a GraphDef once and runs it many times. Use as a context manager."""

    def __init__(self, graph_def: GraphDef, inputs: Sequence[str], outputs: Sequence[str],
                 intra_op_threads: int | None = None) -> None:
        import tensorflow as tf

        from orchestrator.model.graph_rewrite import copy_graph

        self.graph = tf.Graph()
        with self.graph.as_default():  # a copy: importing adds default attrs to what it gets
            tf.compat.v1.import_graph_def(copy_graph(graph_def), name="")
        self.input_tensors = [self.graph.get_tensor_by_name(tensor_name(n)) for n in inputs]
        self.output_tensors = [self.graph.get_tensor_by_name(tensor_name(n)) for n in outputs]
        self.session = tf.compat.v1.Session(graph=self.graph,
                                            config=session_config(intra_op_threads))

    @classmethod
    def for_artifact(cls, artifact: ModelArtifact, **kwargs: Any) -> GraphRunner:
        return cls(artifact.graph_def, artifact.input_names, artifact.outputs, **kwargs)

    def __enter__(self) -> GraphRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    def run(self, *inputs: np.ndarray, fetches: Sequence[Any] | None = None,
            options: Any = None, run_metadata: Any = None) -> list[np.ndarray]:
        """One session.run; returns the outputs (or `fetches`) as numpy arrays."""
        feed = dict(zip(self.input_tensors, inputs, strict=True))
        targets = list(fetches) if fetches is not None else self.output_tensors
        return self.session.run(targets, feed_dict=feed, options=options,
                                run_metadata=run_metadata)

    def input_specs(self) -> list[tuple[list[int | None] | None, np.dtype]]:
        """(shape with None for unknown dimensions, numpy dtype) per model input: what a
        runner of any kind (see `open_runner`) tells about its inputs."""
        return [(None if t.shape.rank is None else t.shape.as_list(),
                 np.dtype(t.dtype.as_numpy_dtype)) for t in self.input_tensors]

    def node_timings(self, feeds: Sequence[np.ndarray], runs: int) -> list[Any]:
        """Each node's timing over `runs` traced runs (step stats), as profiling records."""
        import tensorflow as tf

        from orchestrator.measure.profiling import from_step_stats

        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        traced = []
        for _ in range(runs):
            metadata = tf.compat.v1.RunMetadata()
            self.run(*feeds, options=options, run_metadata=metadata)
            traced.append(metadata.step_stats)
        op_types = {op.name: op.type for op in self.graph.get_operations()}
        return from_step_stats(traced, op_types)

    def fixed_batch_size(self) -> int | None:
        """The first input's batch dimension when the graph fixes it (e.g. 1), else None."""
        shape = self.input_tensors[0].shape
        if shape.rank is None or shape.rank == 0:
            return None
        return shape[0] if shape[0] is not None else None

    def batches(self, inputs: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
        """Split `inputs` into batches the graph accepts. A graph that fixes its batch size
        gets a short last batch padded by repeating its last sample (see `predict`)."""
        fixed = self.fixed_batch_size()
        size = fixed or batch_size
        for start in range(0, len(inputs), size):
            batch = inputs[start:start + size]
            if fixed and len(batch) < fixed:
                pad = np.repeat(batch[-1:], fixed - len(batch), axis=0)
                batch = np.concatenate([batch, pad], axis=0)
            yield batch

    def predict(self, inputs: np.ndarray, batch_size: int = 64) -> np.ndarray:
        """The first output over all `inputs`, concatenated along the batch axis (padding
        of a fixed-size last batch dropped)."""
        return self.predict_all(inputs, batch_size, first_only=True)[0]

    def predict_all(self, inputs: np.ndarray, batch_size: int = 64,
                    first_only: bool = False) -> list[np.ndarray]:
        """Every output over all `inputs`, in the model's output order, each concatenated
        along the batch axis (padding of a fixed-size last batch dropped)."""
        fetches = self.output_tensors[:1] if first_only else self.output_tensors
        per_batch = [self.run(batch, fetches=fetches)
                     for batch in self.batches(inputs, batch_size)]
        return [np.concatenate([outs[i] for outs in per_batch], axis=0)[:len(inputs)]
                for i in range(len(fetches))]


def open_runner(artifact: ModelArtifact, keys: KeyLookup | None = None,
                intra_op_threads: int | None = None) -> Any:
    """A runner for an artifact of any kind, with GraphRunner's interface (run, predict_all,
    batches, fixed_batch_size, input_specs, close): LiteRT's interpreter for a tflite model,
    a TF session for the others (a memmapped model rebuilt, an encrypted one decrypted in
    memory first)."""
    from orchestrator.model.kinds import runnable

    model = runnable(artifact, keys)
    if model.kind == "tflite":
        from orchestrator.measure.litert_runtime import LiteRTRunner

        return LiteRTRunner(model, num_threads=intra_op_threads)
    return GraphRunner.for_artifact(model, intra_op_threads=intra_op_threads)


def predict(artifact: ModelArtifact, inputs: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Convenience: the artifact's first output on `inputs`."""
    with GraphRunner.for_artifact(artifact) as runner:
        return runner.predict(inputs, batch_size)


def predict_all(artifact: ModelArtifact, inputs: np.ndarray, batch_size: int = 64
                ) -> list[np.ndarray]:
    """Convenience: every output of the artifact on `inputs`, in its output order."""
    with GraphRunner.for_artifact(artifact) as runner:
        return runner.predict_all(inputs, batch_size)


def random_input(shape: list[int | None] | None, dtype: np.dtype, batch: int, seed: int
                 ) -> np.ndarray:
    """Random data of the input's dtype and shape: batch first, unknown dimensions 1."""
    dims = () if shape is None else tuple(
        (batch if i == 0 else 1) if d is None else d for i, d in enumerate(shape))
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(dims) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, dims).astype(dtype)
    return rng.random(dims).astype(dtype)

