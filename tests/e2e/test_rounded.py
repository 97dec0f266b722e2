"""recipes/digits_rounded.yaml: round_weights keeps the file size and the float graph, and
pays off when the file is compressed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_rounded_recipe(digits_example: Path, workspace: Path, prefect_server: None) -> None:
    recipes = workspace / "recipes"
    recipes.mkdir()
    shutil.copy(ROOT / "recipes" / "digits_rounded.yaml", recipes)
    (workspace / "examples").symlink_to(ROOT / "examples")
    assert main(["run", str(recipes / "digits_rounded.yaml"), "-o", str(workspace / "out")]) == 0
    report = json.loads((workspace / "out" / "report.json").read_text())
    fp32, rounded = report["variants"]["fp32"], report["variants"]["rounded"]
    # same raw size (still float32 tensors), a third of the compressed size
    assert abs(rounded["size_bytes"] - fp32["size_bytes"]) <= 0.001 * fp32["size_bytes"]
    assert rounded["gzip_size_bytes"] <= 0.4 * fp32["gzip_size_bytes"]
    assert rounded["ops"] == fp32["ops"]  # still the float graph: no new ops
    assert rounded["accuracy_drop"] <= 0.01 and rounded["fidelity"] >= 0.99
    stage = next(s for s in rounded["stages"] if s["name"] == "round_weights")
    assert stage["cached"] is False
