"""Fixtures for stage tests: freeze tiny Keras models (or plain TF functions) into artifacts.

Tracing the Keras call directly under `tf.function` gives a graph of real ops (no
PartitionedCall), so `convert_variables_to_constants_v2` alone yields a frozen graph of the
shape the freeze stage produces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
from support.helpers_tf import run

from orchestrator.model import tf_adapter  # noqa: F401  (TF env defaults before TF is imported
from orchestrator.model.artifact import ModelArtifact, TensorSpec

FUNCTION_CALL_OPS = {"PartitionedCall", "StatefulPartitionedCall"}


def freeze_function(fn: Callable, input_shape: Sequence[int]) -> ModelArtifact:
    """Trace `fn` on one float32 input named 'input' and freeze it into a ModelArtifact."""
    import tensorflow as tf

    from orchestrator.model.tf_adapter import convert_to_constants

    # autograph=False: nothing to convert, and it cannot parse the tests' lambdas.
    traced = tf.function(fn, autograph=False, input_signature=[
        tf.TensorSpec(list(input_shape), tf.float32, name="input")])
    frozen = convert_to_constants().convert_variables_to_constants_v2(
        traced.get_concrete_function())
    graph_def = frozen.graph.as_graph_def()
    calls = [n.name for n in graph_def.node if n.op in FUNCTION_CALL_OPS]
    assert not calls, f"frozen test graph still calls functions: {calls}"
    outputs = tuple(t.name.split(":")[0] for t in frozen.outputs)
    return ModelArtifact(graph_def=graph_def,
                         inputs=(TensorSpec("input", "float32", tuple(input_shape)),),
                         outputs=outputs)


def freeze_keras(model: object, input_shape: Sequence[int]) -> ModelArtifact:
    """Freeze a Keras model's inference call (training=False)."""
    return freeze_function(lambda x: model(x, training=False), input_shape)


def randomize_batch_norms(model: object, seed: int = 0) -> None:
    """Give every BatchNormalization non-trivial gamma, beta, moving mean and variance."""
    import keras

    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.moving_mean.shape[0]
            if layer.scale:
                layer.gamma.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
            if layer.center:
                layer.beta.assign(rng.normal(size=n).astype("float32"))
            layer.moving_mean.assign(rng.normal(size=n).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.3, 2.0, n).astype("float32"))


@pytest.fixture
def keras_artifact() -> Callable[[object, Sequence[int]], ModelArtifact]:
    """Call with (model, input_shape): randomizes its batch norms and freezes it."""
    import keras

    keras.utils.set_random_seed(0)

    def build(model: object, input_shape: Sequence[int]) -> ModelArtifact:
        randomize_batch_norms(model)
        return freeze_keras(model, input_shape)

    return build


def run_artifact(artifact: ModelArtifact, x: np.ndarray) -> np.ndarray:
    """The artifact's first output on `x`, through orchestrator.measure.tf_runtime (grappler off, so
    the graph runs as written)."""
    return run(artifact, x)[0]


@pytest.fixture
def run_graph() -> Callable[[ModelArtifact, np.ndarray], np.ndarray]:
    """Call with (artifact, x) to get its first output."""
    return run_artifact


@pytest.fixture
def tf_artifact() -> Callable[[Callable, Sequence[int]], ModelArtifact]:
    """Call with (fn, input_shape) to freeze a plain TF function of one input."""
    return freeze_function
