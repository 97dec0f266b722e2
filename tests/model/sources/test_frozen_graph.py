"""Frozen GraphDef sources: binary .pb, text .pbtxt, and inputs/outputs detection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.helpers_models import Built, tf1_graph
from support.helpers_tf import run

from orchestrator.errors import ModelSourceError
from orchestrator.model.artifact import TensorSpec
from orchestrator.model.sources import load_model


@pytest.mark.parametrize("kind", ["pb", "pbtxt"])
def test_loads_and_detects_io(frozen_files: dict[str, Built], kind: str) -> None:
    built = frozen_files[kind]
    artifact = load_model(built.path)
    assert artifact.metadata["source_format"] == "frozen_graph"
    assert artifact.inputs == (TensorSpec("x", "float32", (None, 3)),)
    assert artifact.outputs == ("y",)
    np.testing.assert_allclose(run(artifact, built.x)[0], built.expected, atol=1e-5)


def test_named_io_are_checked(frozen_files: dict[str, Built]) -> None:
    path = frozen_files["pb"].path
    artifact = load_model(path, inputs=[TensorSpec("x", "float32", (2, 3))], outputs=["add"])
    assert artifact.outputs == ("add",) and artifact.inputs[0].shape == (2, 3)
    with pytest.raises(ModelSourceError, match="output 'probs' not found.*candidates: y") as exc:
        load_model(path, outputs=["probs"])
    assert exc.value.file == str(path)
    with pytest.raises(ModelSourceError, match="input 'image' not found.*candidates: x"):
        load_model(path, inputs=[TensorSpec("image")])


def test_graph_with_variables_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "unfrozen.pb"
    path.write_bytes(tf1_graph(with_variables=True).as_graph_def().SerializeToString())
    with pytest.raises(ModelSourceError, match="still holds variables") as exc:
        load_model(path)
    assert exc.value.file == str(path)


def test_unknown_op_is_refused(tmp_path: Path) -> None:
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.node.add(name="x", op="NoSuchOpAnywhere")
    path = tmp_path / "custom.pb"
    path.write_bytes(graph_def.SerializeToString())
    with pytest.raises(ModelSourceError, match="not a valid TensorFlow graph.*NoSuchOpAnywhere"):
        load_model(path)
