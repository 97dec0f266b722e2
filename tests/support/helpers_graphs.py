"""Tiny real TF graphs for the freeze/strip/sort/transform/summarize tests.

`assert_same_outputs` runs graphs through orchestrator.measure.tf_runtime (helpers_tf.run).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.model.artifact import ModelArtifact, TensorSpec
from support.helpers_tf import run


def assert_same_outputs(before: ModelArtifact, after: ModelArtifact, *inputs: np.ndarray,
                        tol: float = 1e-5) -> None:
    for old, new in zip(run(before, *inputs), run(after, *inputs), strict=True):
        np.testing.assert_allclose(new, old, rtol=tol, atol=tol)


def ops(artifact: ModelArtifact) -> Counter[str]:
    return Counter(n.op for n in artifact.graph_def.node)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def tf1_graph(build: Callable[[], None], inputs: Sequence[TensorSpec],
              outputs: Sequence[str]) -> ModelArtifact:
    """Run `build` inside a fresh tf.Graph and wrap that graph as an artifact."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        build()
    return ModelArtifact(graph_def=graph.as_graph_def(), inputs=tuple(inputs),
                         outputs=tuple(outputs))


def noisy_graph() -> ModelArtifact:
    """x[?,3] -> MatMul -> Identity -> CheckNumerics -> Relu -> Identity 'out', plus junk:
    a branch nothing needs, a constant subexpression, and a float64 side input."""
    import tensorflow as tf

    def build() -> None:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2) - 2.0, name="w")
        scale = tf.multiply(tf.constant(0.5, name="half"), tf.constant(3.0), name="scale")
        h = tf.identity(tf.matmul(x, w) * scale, name="h")
        h = tf.debugging.check_numerics(h, "bad", name="check")
        tf.identity(tf.nn.relu(h), name="out")
        tf.reduce_sum(x, name="unused_sum")

    return tf1_graph(build, [TensorSpec("x", "float32", (None, 3))], ["out"])


def call_graph() -> ModelArtifact:
    """A traced tf.function, not frozen: a PartitionedCall into a nested function, a
    tf.cond (StatelessIf) and a while loop (StatelessWhile), all in the function library."""
    import tensorflow as tf

    @tf.function
    def inner(x: Any) -> Any:
        return tf.nn.relu(x * 2.0 + 1.0)

    @tf.function
    def outer(x: Any) -> Any:
        y = inner(x)
        y = tf.cond(tf.reduce_sum(y) > 0.0, lambda: y * 3.0, lambda: y - 1.0)
        _, y = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 0.5 + 1.0),
                             [tf.constant(0), y])
        return y

    func = outer.get_concrete_function(tf.TensorSpec([None, 4], tf.float32, name="x"))
    graph_def = func.graph.as_graph_def()
    return ModelArtifact(graph_def=graph_def, inputs=(TensorSpec("x", "float32", (None, 4)),),
                         outputs=tuple(t.name.split(":")[0] for t in func.outputs))


def tf1_loaded(saved_model_dir: Path) -> ModelArtifact:
    """A SavedModel read by the TF1 loader: its graph is one StatefulPartitionedCall (which
    is also the output node) into a library of functions."""
    from orchestrator.model.sources._common import build_artifact
    from orchestrator.model.sources.saved_model import load_tf1_signature

    frozen = load_tf1_signature(saved_model_dir)
    return build_artifact(saved_model_dir, "saved_model", frozen, None, None, loader="tf1")
