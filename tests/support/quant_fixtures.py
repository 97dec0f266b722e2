"""Tiny real models for the eight-bit stage tests: trained on the digits data, then frozen.

Freezing here is deliberately simple (trace the Keras call, convert_variables_to_constants_v2,
then TF's own remove_control_dependencies, remove_nodes(op=Identity) and fold_constants), so
these tests do not depend on the freeze/strip/fold stages. A test module makes the fixtures
it uses visible to pytest by binding them: `cnn, digits = quant_fixtures.cnn, ...`.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.measure import tf_runtime  # noqa: F401  (tf_adapter: TF env defaults
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.graph_rewrite import subgraph
from orchestrator.stages import StageContext, get_stage


def freeze(model: Any, input_shape: Sequence[int | None], input_name: str = "image"
           ) -> ModelArtifact:
    """Freeze a Keras model's inference call into a flat GraphDef artifact."""
    import tensorflow as tf

    from orchestrator.model.tf_adapter import convert_to_constants, transform_graph

    fn = tf.function(lambda x: model(x, training=False), autograph=False, input_signature=[
        tf.TensorSpec(list(input_shape), tf.float32, name=input_name)])
    frozen = convert_to_constants().convert_variables_to_constants_v2(fn.get_concrete_function())
    outputs = [t.name.split(":")[0] for t in frozen.outputs]
    graph_def = transform_graph(
        frozen.graph.as_graph_def(), [input_name], outputs,
        "remove_control_dependencies remove_nodes(op=Identity) fold_constants(ignore_errors=true)")
    graph_def = subgraph(graph_def, [input_name, *outputs])
    return ModelArtifact(graph_def=graph_def,
                         inputs=(TensorSpec(input_name, "float32", tuple(input_shape)),),
                         outputs=tuple(outputs))


# Test modules bind these fixtures themselves, so pytest would build them once per module;
# the caches below make each model once per process instead.

@functools.cache
def _digits(folder: str) -> dict[str, np.ndarray]:
    with np.load(Path(folder) / "data.npz") as data:
        return {k: data[k] for k in ("x_calib", "x_test", "y_test")}


def _train(model: Any, data: dict[str, np.ndarray], epochs: int = 12) -> Any:
    import keras
    from testbed import model_builds  # the trained weights, committed (its docstring)

    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    # Train on the calibration split (digits' own training images); test on x_test.
    model_builds.fit(model, data["x_calib"], _calib_labels(data["x_calib"]), epochs=epochs,
                     batch_size=32, verbose=0)
    return model


def _calib_labels(x_calib: np.ndarray) -> np.ndarray:
    """Labels for x_calib: data.npz has none, so take them from scikit-learn's digits."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0).reshape(len(digits.images), -1)
    index = {row.tobytes(): label for row, label in zip(images, digits.target, strict=True)}
    return np.asarray([index[x.reshape(-1).tobytes()] for x in x_calib])


def _cnn_model() -> Any:
    import keras
    from keras import layers

    inputs = keras.Input(shape=(8, 8, 1), name="image")
    x = layers.Conv2D(8, 3, padding="same", activation="relu", name="conv1")(inputs)
    x = layers.MaxPooling2D(2, name="pool")(x)
    x = layers.Conv2D(16, 3, padding="same", activation="relu", name="conv2")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(32, activation="relu", name="fc1")(x)
    outputs = layers.Dense(10, activation="softmax", name="probs")(x)
    return keras.Model(inputs, outputs, name="cnn")


def _separable_model() -> Any:
    import keras
    from keras import layers

    inputs = keras.Input(shape=(8, 8, 1), name="image")
    x = layers.Conv2D(16, 3, padding="same", activation="relu", name="stem")(inputs)
    x = layers.DepthwiseConv2D(3, padding="same", activation="relu", name="dw")(x)
    x = layers.SeparableConv2D(32, 3, padding="same", activation="relu", name="sep")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = layers.Dense(10, activation="softmax", name="probs")(x)
    return keras.Model(inputs, outputs, name="separable")


SEED = 7
# Trains in a fresh process: seeds, op determinism and one TF thread
# (testbed/model_builds.deterministic), so the weights are the same on every run and
# machine; in this session's TF (its thread pools sized by the machine's cores, other tests'
# ops run before) they would follow the core count.
_TRAIN = """
import sys
from pathlib import Path
sys.path[:0] = [{tests!r}, {benchmarks!r}]
from testbed import model_builds
model_builds.deterministic({seed})
from support import quant_fixtures
model = quant_fixtures._train(quant_fixtures._model({kind!r}),
                              quant_fixtures._digits({folder!r}), epochs={epochs})
model.save_weights({out!r})
"""


def _model(kind: str) -> Any:
    return _cnn_model() if kind == "cnn" else _separable_model()


@functools.cache
def _trained(kind: str, folder: str) -> Any:
    """The `kind` model built here, with the weights trained in a fresh process."""
    import os
    import subprocess
    import sys
    import tempfile

    here = Path(__file__).resolve().parent
    epochs = 12 if kind == "cnn" else 30
    with tempfile.TemporaryDirectory() as work:
        out = str(Path(work) / f"{kind}.weights.h5")
        code = _TRAIN.format(tests=str(here.parent), benchmarks=str(here.parents[1] / "benchmarks"),
                             seed=SEED, kind=kind, folder=folder, epochs=epochs, out=out)
        from testbed.model_builds import SINGLE_THREAD_ENV

        env = {**os.environ, **SINGLE_THREAD_ENV, "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": "",
               "PYTHONHASHSEED": "0"}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-4000:]
        model = _model(kind)
        model.load_weights(out)
    return model


@functools.cache
def _frozen(kind: str, folder: str, batch: int | None) -> ModelArtifact:
    return freeze(_trained(kind, folder), (batch, 8, 8, 1))


@pytest.fixture(scope="session")
def digits(digits_example: Path) -> dict[str, np.ndarray]:
    """x_calib (1000, used to train the fixtures and as representative data), x_test, y_test."""
    return _digits(str(digits_example))


@pytest.fixture(scope="session")
def cnn(digits_example: Path) -> ModelArtifact:
    """Conv2D, MaxPool, Conv2D, Flatten, Dense, Dense (softmax); dynamic batch."""
    return _frozen("cnn", str(digits_example), None)


@pytest.fixture(scope="session")
def cnn_batch1(digits_example: Path) -> ModelArtifact:
    """The same CNN with a fixed batch dimension of 1."""
    return _frozen("cnn", str(digits_example), 1)


@pytest.fixture(scope="session")
def separable(digits_example: Path) -> ModelArtifact:
    """Conv2D, DepthwiseConv2D, SeparableConv2D, global pooling, Dense."""
    return _frozen("separable", str(digits_example), None)


# --- helpers -----------------------------------------------------------------------------

def context(x: np.ndarray | None = None, stage: str = "test") -> StageContext:
    """A StageContext whose representative data are the rows of `x`."""
    def representative(samples: int | None, batch_size: int) -> Iterator[np.ndarray]:
        rows = x if samples is None else x[:samples]
        for start in range(0, len(rows), batch_size):
            yield rows[start:start + batch_size]

    return StageContext(pipeline="test", stage=stage,
                        representative=None if x is None else representative)


def apply(name: str, artifact: ModelArtifact, x: np.ndarray | None = None, **params: Any
          ) -> Any:
    """Run stage `name` with `params`; returns its StageResult."""
    stage = get_stage(name)
    return stage.run(artifact, stage.params(**params), context(x, name))


def predict(artifact: ModelArtifact, x: np.ndarray) -> np.ndarray:
    return tf_runtime.predict(artifact, x)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Top-1 agreement of two score arrays."""
    return float(np.mean(a.argmax(axis=1) == b.argmax(axis=1)))


def accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(scores.argmax(axis=1) == labels))


def ops(artifact: ModelArtifact) -> Counter[str]:
    return Counter(n.op for n in artifact.graph_def.node)


def nodes(artifact: ModelArtifact) -> dict[str, Any]:
    return {n.name: n for n in artifact.graph_def.node}


def chain(artifact: ModelArtifact, x: np.ndarray, *names: str) -> ModelArtifact:
    """Run stages with default params, one after the other."""
    for name in names:
        artifact = apply(name, artifact, x).artifact
    return artifact


@pytest.fixture(scope="module")
def int8(cnn, digits) -> ModelArtifact:  # noqa: ANN001
    """The digits CNN through quantize_weights, quantize_nodes, log_ranges, freeze_ranges."""
    artifact = apply("quantize_weights", cnn).artifact
    artifact = apply("quantize_nodes", artifact).artifact
    artifact = apply("log_ranges", artifact, digits["x_calib"], samples=100).artifact
    return apply("freeze_ranges", artifact).artifact


@pytest.fixture(params=["fp32", "int8"])
def fp32_and_int8(request: pytest.FixtureRequest) -> ModelArtifact:
    """Each test runs on the float CNN and on its 8-bit graph (bind `int8` too)."""
    return request.getfixturevalue("cnn" if request.param == "fp32" else "int8")
