"""Session-wide tiny models for the source tests (built once, read many times)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import helpers_models as hm


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def module_sm(models: Path) -> hm.Built:
    return hm.module_saved_model(models / "module_sm")


@pytest.fixture(scope="session")
def broken_sm(models: Path, module_sm: hm.Built) -> hm.Built:
    path = models / "broken_sm"
    shutil.copytree(module_sm.path, path)
    hm.break_for_tf2_loader(path)
    return hm.Built(path, module_sm.x, module_sm.expected)


@pytest.fixture(scope="session")
def keras_files(models: Path) -> dict[str, hm.Built]:
    return hm.keras_files(models / "keras")


@pytest.fixture(scope="session")
def frozen_files(models: Path) -> dict[str, hm.Built]:
    return hm.frozen_files(models / "frozen")


@pytest.fixture(scope="session")
def checkpoint(models: Path) -> hm.Built:
    return hm.tf1_checkpoint(models / "ckpt")


@pytest.fixture(scope="session")
def tf1_sm(models: Path) -> hm.Built:
    return hm.tf1_builder_saved_model(models / "tf1_sm")
