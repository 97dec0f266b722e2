"""The accuracy guard: a plain 8-bit result that breaks a tight budget is searched until a
candidate meets it, or the report says clearly that none was found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main

RECIPE = Path(__file__).resolve().parents[1] / "fixtures" / "recipes" / "guard_tight.yaml"

pytestmark = pytest.mark.slow


def run(workspace: Path, *extra: str) -> tuple[int, dict]:
    code = main(["run", str(RECIPE), "-o", str(workspace / "out"), *extra])
    return code, json.loads((workspace / "out" / "report.json").read_text())


def test_guard_finds_settings_that_meet_the_budget(digits_example: Path, workspace: Path,
                                                   prefect_server: None) -> None:
    code, report = run(workspace)
    int8 = report["variants"]["int8"]
    trials = int8["trials"]
    baseline = trials[0]
    # the recipe's own settings break the budget (misleading calibration data)...
    assert not baseline["meets_budgets"] and baseline["accuracy_drop"] > 0.01
    # ...and the guard ends with a candidate that meets it, which the variant now is
    chosen = [t for t in trials if t["chosen"]]
    assert len(chosen) == 1 and chosen[0]["meets_budgets"] and chosen[0]["trial"] > 0
    assert chosen[0]["settings"]["float"] or chosen[0]["settings"]["weights_only"]
    # every decision names its layers, what was done, the quality before and after, the size
    decisions = int8["guard_decisions"]
    assert [d["trial"] for d in decisions] == [t["trial"] for t in trials[1:]]
    assert decisions[-1]["outcome"] == "meets budgets"
    assert all(d["quality_before"].startswith("accuracy drop") for d in decisions)
    assert all(d["size_after_bytes"] > 0 for d in decisions)
    kept = [d for d in decisions if d["outcome"] != "stepped back: no closer"]
    assert set(chosen[0]["settings"]["float"]) | set(chosen[0]["settings"]["weights_only"]) \
        == {layer for d in kept for layer in d["layers"]}
    assert int8["accuracy_drop"] <= 0.01
    assert int8["accuracy_drop"] == chosen[0]["accuracy_drop"]
    assert int8["targets"]["phone"]["budgets_ok"]
    assert report["selected"]["phone"] == "int8"
    assert code == 0
    # still an 8-bit model, smaller than float
    assert any(op.startswith("Quantized") for op in int8["ops"])
    assert int8["size_bytes"] < 0.4 * report["variants"]["fp32"]["size_bytes"]
    # every trial is a nested MLflow run under the int8 pipeline's run
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    parent = client.get_run(report["mlflow_run_id"])
    runs = client.search_runs([parent.info.experiment_id], "tags.`orchestrator.trial` = 'true'")
    assert len(runs) == len(trials) - 1
    assert all("accuracy_drop" in r.data.metrics for r in runs)
    changes = [r.data.tags.get("guard.change", "") for r in runs]  # what each one changed
    assert all("->" in c or "percentile" in c or "bias" in c for c in changes), changes


def test_guard_reports_when_nothing_meets_the_budget(digits_example: Path, workspace: Path,
                                                     prefect_server: None,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    code, report = run(workspace, "--set", "tune.max_trials=2")
    int8 = report["variants"]["int8"]
    assert code == 1
    assert len(int8["trials"]) == 3  # the recipe's settings and two candidates
    assert not any(t["meets_budgets"] for t in int8["trials"])
    assert not int8["targets"]["phone"]["budgets_ok"]
    assert any("accuracy drop" in v for v in int8["targets"]["phone"]["violations"])
    assert report["selected"]["phone"] is None
    assert "none meets its budgets" in capsys.readouterr().out
