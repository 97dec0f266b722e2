"""Keras sources: .keras and .h5, traced with their input signature and frozen."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.helpers_models import Built, multi_io_keras
from support.helpers_tf import run

from orchestrator.model.artifact import TensorSpec
from orchestrator.model.sources import load_model


@pytest.mark.parametrize("kind", ["keras", "h5"])
def test_single_io(keras_files: dict[str, Built], kind: str) -> None:
    built = keras_files[kind]
    artifact = load_model(built.path)
    assert artifact.metadata["source_format"] == "keras"
    assert artifact.inputs == (TensorSpec("feat", "float32", (None, 3)),)
    assert artifact.outputs == ("Identity",)
    assert artifact.metadata["input_names"] == {"feat": "feat"}
    assert artifact.metadata["output_names"] == {"probs": "Identity"}
    assert load_model(built.path, outputs=["probs"]).outputs == ("Identity",)
    assert not {"VarHandleOp", "ReadVariableOp"} & {n.op for n in artifact.graph_def.node}
    np.testing.assert_allclose(run(artifact, built.x)[0], built.expected, atol=1e-5)


def test_multiple_inputs_and_outputs(tmp_path: Path) -> None:
    import keras

    path = multi_io_keras(tmp_path)
    model = keras.models.load_model(path)
    artifact = load_model(path)
    assert [s.name for s in artifact.inputs] == ["zeta", "alpha"]  # the model's order
    assert artifact.inputs[1].shape == (None, 4)
    assert artifact.metadata["output_names"] == {"first": "Identity", "second": "Identity_1"}
    zeta = np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)
    alpha = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    expected = model([zeta, alpha], training=False)
    for got, want in zip(run(artifact, zeta, alpha), expected, strict=True):
        np.testing.assert_allclose(got, np.asarray(want), atol=1e-5)
    assert load_model(path, outputs=["second"]).outputs == ("Identity_1",)
