"""A layer made bad on purpose (a huge weight outlier, benchmarks/testbed/models_outlier.py): the
per-layer diagnostics name it as the worst, and the accuracy guard takes it back from
8 bits first, ending within the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testbed import model_builds

from orchestrator.cli.main import main

pytestmark = pytest.mark.slow

RECIPE = """\
version: 1
name: outlier
model:
  path: model/model.keras
  format: keras
  inputs: [{name: image, dtype: float32, shape: [1, 8, 8, 1]}]
data:
  representative: {source: model/data.npz, array: x_calib, samples: 200}
  evaluation: {source: model/data.npz, inputs: x_test, labels: y_test}
targets:
  - name: phone
    device: phone-2016
    budgets: {max_accuracy_drop: 0.01, min_fidelity: 0.98}
pipelines:
  fp32:
    stages: [freeze, strip, fold, evaluate]
  int8:
    from: fp32
    stages:
      - quantize_weights
      - quantize_nodes: {guard: true}
      - log_ranges
      - freeze_ranges
      - evaluate
"""


@pytest.fixture(scope="module")
def outlier_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("outlier") / "model"
    model_builds.build("models_outlier", folder)
    return folder


def test_guard_takes_the_bad_layer_back_first(outlier_model: Path, workspace: Path,
                                             prefect_server: None) -> None:
    (workspace / "model").symlink_to(outlier_model)
    (workspace / "recipe.yaml").write_text(RECIPE)
    code = main(["run", str(workspace / "recipe.yaml"), "-o", str(workspace / "out")])
    report = json.loads((workspace / "out" / "report.json").read_text())
    int8 = report["variants"]["int8"]
    baseline = int8["trials"][0]
    assert not baseline["meets_budgets"]  # the outlier ruins plain 8 bits
    # the diagnostics of the recipe's own settings name conv2 as the worst layer ...
    assert "/conv2" in baseline["worst_layer"]
    # ... and the guard's first decision takes exactly that layer back: the conv with its
    # bias and activation, one quantize/dequantize boundary around them
    first = int8["guard_decisions"][0]
    assert first["layers"] and all("/conv2" in node for node in first["layers"]), first
    assert len(first["layers"]) >= 2, first
    chosen = next(t for t in int8["trials"] if t["chosen"])
    assert chosen["meets_budgets"] and code == 0
    assert any("/conv2" in layer for layer in chosen["settings"]["float"])
    assert int8["accuracy_drop"] <= 0.01
    # the shipped diagnostics are the chosen candidate's: conv2 is float, so not among them
    tsv = (workspace / "out" / "int8" / "layer_errors.tsv").read_text().splitlines()
    assert tsv[0].startswith("node\t") and len(tsv) > 5
    assert not any("/conv2_1/convolution\t" in line for line in tsv[1:])
    # still 8-bit where it does not hurt: well under half of float's size
    assert int8["size_bytes"] < 0.5 * report["variants"]["fp32"]["size_bytes"]
