"""SavedModel sources: TF2 loader, signature names, and the TF1 loader fallback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.helpers_models import Built
from support.helpers_tf import run

from orchestrator.errors import ModelSourceError
from orchestrator.model.artifact import TensorSpec
from orchestrator.model.sources import load_model, saved_model
from orchestrator.stages import StageContext
from orchestrator.stages.freeze import Params as FreezeParams
from orchestrator.stages.freeze import run as freeze

CALLS = {"PartitionedCall", "StatefulPartitionedCall"}


def op_of(artifact, name: str) -> str:
    return next(n.op for n in artifact.graph_def.node if n.name == name)


def test_tf_module_with_tf2_loader(module_sm: Built) -> None:
    artifact = load_model(module_sm.path)
    assert artifact.metadata["loader"] == "tf2"
    assert artifact.metadata["source_format"] == "saved_model"
    assert artifact.inputs == (TensorSpec("x", "float32", (None, 3)),)
    (output,) = artifact.outputs
    assert op_of(artifact, output) == "Identity"
    assert artifact.metadata["input_names"] == {"x": "x"}
    assert artifact.metadata["output_names"] == {"y": output}
    assert not {"VarHandleOp", "ReadVariableOp", "VariableV2"} & {
        n.op for n in artifact.graph_def.node}
    np.testing.assert_allclose(run(artifact, module_sm.x)[0], module_sm.expected, atol=1e-5)


def test_keras_export_names(keras_files: dict[str, Built]) -> None:
    built = keras_files["export"]
    artifact = load_model(built.path)
    assert artifact.inputs == (TensorSpec("feat", "float32", (None, 3)),)
    assert artifact.outputs == ("Identity",)
    assert artifact.metadata["output_names"] == {"output_0": "Identity"}
    np.testing.assert_allclose(run(artifact, built.x)[0], built.expected, atol=1e-5)
    # the signature name, the node name and the Keras layer name all name the same output
    for name in ("output_0", "Identity", "Identity:0", "probs"):
        assert load_model(built.path, outputs=[name]).outputs == ("Identity",)
    assert load_model(built.path, outputs=["probs"]).metadata["output_names"] == {
        "probs": "Identity"}


def test_recipe_input_spec_is_checked(keras_files: dict[str, Built]) -> None:
    path = keras_files["export"].path
    artifact = load_model(path, inputs=[TensorSpec("feat", "float32", (1, 3))])
    assert artifact.inputs == (TensorSpec("feat", "float32", (1, 3)),)
    with pytest.raises(ModelSourceError, match="is float32 in the model") as exc:
        load_model(path, inputs=[TensorSpec("feat", "int32", None)])
    assert exc.value.file == str(path)
    with pytest.raises(ModelSourceError, match="does not fit"):
        load_model(path, inputs=[TensorSpec("feat", "float32", (1, 4))])


def test_unknown_names_list_candidates(keras_files: dict[str, Built]) -> None:
    path = keras_files["export"].path
    with pytest.raises(ModelSourceError, match="output 'logits' not found.*output_0") as exc:
        load_model(path, outputs=["logits"])
    assert exc.value.file == str(path) and str(path) in str(exc.value)
    with pytest.raises(ModelSourceError, match="input 'image' not found.*feat"):
        load_model(path, inputs=[TensorSpec("image")])


def test_tf1_builder_saved_model(tf1_sm: Built) -> None:
    artifact = load_model(tf1_sm.path)
    assert artifact.metadata["input_names"] == {"feat": "x"}
    assert artifact.metadata["output_names"] == {"score": "y"}
    assert load_model(tf1_sm.path, inputs=[TensorSpec("feat")], outputs=["score"]).outputs == (
        "y",)
    np.testing.assert_allclose(run(artifact, tf1_sm.x)[0], tf1_sm.expected, atol=1e-5)


def test_falls_back_to_tf1_loader_when_tf2_rejects(broken_sm: Built) -> None:
    import tensorflow as tf

    with pytest.raises(Exception):  # noqa: B017  (whatever TF raises: the point is it fails)
        tf.saved_model.load(str(broken_sm.path))
    artifact = load_model(broken_sm.path)
    assert artifact.metadata["loader"] == "tf1"
    assert artifact.metadata["input_names"] == {"x": "serving_default_x"}
    (output,) = artifact.outputs
    assert artifact.metadata["output_names"] == {"y": output}
    assert op_of(artifact, output) == "StatefulPartitionedCall"  # inlined by freeze
    assert not {"VarHandleOp", "ReadVariableOp"} & {n.op for n in artifact.graph_def.node}
    np.testing.assert_allclose(run(artifact, broken_sm.x)[0], broken_sm.expected, atol=1e-5)

    frozen = freeze(artifact, FreezeParams(), StageContext("test", "freeze")).artifact
    assert not CALLS & {n.op for n in frozen.graph_def.node}
    np.testing.assert_allclose(run(frozen, broken_sm.x)[0], broken_sm.expected, atol=1e-5)


def test_fallback_when_tf2_loader_fails(tf1_sm: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise ValueError("old Keras export")

    monkeypatch.setattr(saved_model, "load_tf2_signature", fail)
    artifact = load_model(tf1_sm.path)
    assert artifact.metadata["loader"] == "tf1"
    np.testing.assert_allclose(run(artifact, tf1_sm.x)[0], tf1_sm.expected, atol=1e-5)


def test_both_loaders_failing_is_a_source_error(tmp_path: Path) -> None:
    bad = tmp_path / "sm"
    bad.mkdir()
    (bad / "saved_model.pb").write_bytes(b"\x0a\xff\xff garbage")
    with pytest.raises(ModelSourceError, match="TF2 loader") as exc:
        load_model(bad)
    assert exc.value.file == str(bad)


def test_signature_choice(tmp_path: Path) -> None:
    import tensorflow as tf

    class Two(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="a")])
        def double(self, a: Any) -> Any:
            return {"out": a * 2.0}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="a")])
        def triple(self, a: Any) -> Any:
            return {"out": a * 3.0}

    module = Two()
    path = tmp_path / "two"
    tf.saved_model.save(module, str(path),
                        signatures={"double": module.double, "triple": module.triple})
    with pytest.raises(ModelSourceError, match="no 'serving_default'.*double, triple"):
        load_model(path)
    artifact = saved_model.load(path, signature_key="triple")
    np.testing.assert_allclose(run(artifact, np.array([1.0, 2.0], np.float32))[0], [3.0, 6.0])
    with pytest.raises(ModelSourceError, match="signature 'quad' not found"):
        saved_model.load(path, signature_key="quad")
