"""Format detection and the bad inputs a user can give: always a ModelSourceError with the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers_models import Built

from orchestrator.errors import ModelSourceError
from orchestrator.model.sources import detect_format, load_model


def test_detects_each_format(module_sm: Built, keras_files: dict[str, Built],
                             frozen_files: dict[str, Built], checkpoint: Built) -> None:
    assert detect_format(module_sm.path) == "saved_model"
    assert detect_format(module_sm.path / "saved_model.pb") == "saved_model"
    assert detect_format(keras_files["keras"].path) == "keras"
    assert detect_format(keras_files["h5"].path) == "keras"
    assert detect_format(frozen_files["pb"].path) == "frozen_graph"
    assert detect_format(frozen_files["pbtxt"].path) == "frozen_graph"
    assert detect_format(checkpoint.path) == "checkpoint"
    assert detect_format(checkpoint.path / "model.ckpt.meta") == "checkpoint"
    assert detect_format(checkpoint.path / "model.ckpt") == "checkpoint"  # a prefix


def test_saved_model_pb_path_means_its_folder(module_sm: Built) -> None:
    assert load_model(module_sm.path / "saved_model.pb").outputs


def test_explicit_format_must_exist(frozen_files: dict[str, Built]) -> None:
    with pytest.raises(ModelSourceError, match="unknown model format 'onnx'"):
        load_model(frozen_files["pb"].path, format="onnx")


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pb"
    for fmt in ("auto", "frozen_graph", "keras", "saved_model", "checkpoint"):
        with pytest.raises(ModelSourceError, match="not found") as exc:
            load_model(missing, format=fmt)
        assert exc.value.file == str(missing)


def test_directory_that_is_no_model(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(ModelSourceError, match="neither a SavedModel") as exc:
        load_model(tmp_path)
    assert exc.value.file == str(tmp_path)
    with pytest.raises(ModelSourceError, match="not a SavedModel directory"):
        load_model(tmp_path, format="saved_model")


def test_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07")
    with pytest.raises(ModelSourceError, match="cannot tell the model format") as exc:
        load_model(path)
    assert exc.value.file == str(path)


@pytest.mark.parametrize("name", ["model.pb", "model.pbtxt", "model.keras", "model.h5",
                                  "model.ckpt.meta"])
def test_empty_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"")
    if name.endswith(".meta"):
        (tmp_path / "model.ckpt.index").write_bytes(b"")
    with pytest.raises(ModelSourceError, match="empty") as exc:
        load_model(path)
    assert exc.value.file == str(path)


@pytest.mark.parametrize("name", ["model.pb", "model.pbtxt", "model.keras", "model.h5",
                                  "model.ckpt.meta", "sm/saved_model.pb"])
def test_random_bytes(tmp_path: Path, name: str) -> None:
    import numpy as np

    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(np.random.default_rng(7).bytes(4096))
    if name.endswith(".meta"):
        (tmp_path / "model.ckpt.index").write_bytes(b"x")
    with pytest.raises(ModelSourceError) as exc:
        load_model(path)
    expected = path.parent if name.startswith("sm/") else path
    assert exc.value.file == str(expected)
    assert str(expected) in str(exc.value)
