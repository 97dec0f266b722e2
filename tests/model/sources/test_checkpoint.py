"""TF1 checkpoint sources: .meta + restore + freeze, outputs detected past the saver."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from support.helpers_models import Built
from support.helpers_tf import run

from orchestrator.errors import ModelSourceError
from orchestrator.model.artifact import TensorSpec
from orchestrator.model.sources import load_model


@pytest.mark.parametrize("form", ["dir", "meta", "prefix", "index"])
def test_loads_every_path_form(checkpoint: Built, form: str) -> None:
    path = {"dir": checkpoint.path, "meta": checkpoint.path / "model.ckpt.meta",
            "prefix": checkpoint.path / "model.ckpt",
            "index": checkpoint.path / "model.ckpt.index"}[form]
    artifact = load_model(path)
    assert artifact.metadata["source_format"] == "checkpoint"
    assert artifact.inputs == (TensorSpec("x", "float32", (None, 3)),)
    assert artifact.outputs == ("y",)  # not save/..., init, or the variables' ops
    ops = {n.op for n in artifact.graph_def.node}
    assert not ops & {"VariableV2", "VarHandleOp", "SaveV2", "RestoreV2", "NoOp"}
    np.testing.assert_allclose(run(artifact, checkpoint.x)[0], checkpoint.expected, atol=1e-5)


def test_named_outputs(checkpoint: Built) -> None:
    artifact = load_model(checkpoint.path, outputs=["add"])
    assert artifact.outputs == ("add",)
    with pytest.raises(ModelSourceError, match="output 'logits' not found.*candidates: y"):
        load_model(checkpoint.path, outputs=["logits"])


def test_missing_data_is_a_source_error(checkpoint: Built, tmp_path: Path) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint.path, copy)
    (copy / "model.ckpt.index").unlink()
    with pytest.raises(ModelSourceError, match="index missing") as exc:
        load_model(copy / "model.ckpt.meta")
    assert "model.ckpt.meta" in str(exc.value)
