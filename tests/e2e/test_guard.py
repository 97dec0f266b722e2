"""The accuracy guard where the eight-bit kernels cannot reach a budget: misleading
calibration data (tests/fixtures/recipes/guard_tight.yaml) breaks every activation range.
The search moves towards float, then its last trial answers with weights-only 8-bit, which
meets the budget and is chosen, in one clear line; under an impossible budget the report
says that nothing meets it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.guard.trials import NOISE_DB

RECIPE = Path(__file__).resolve().parents[1] / "fixtures" / "recipes" / "guard_tight.yaml"

pytestmark = pytest.mark.slow


def run(workspace: Path, *extra: str) -> tuple[int, dict]:
    code = main(["run", str(RECIPE), "-o", str(workspace / "out"), *extra])
    return code, json.loads((workspace / "out" / "report.json").read_text())


def test_guard_answers_with_weights_only_where_kernels_cannot(
        digits_example: Path, workspace: Path, prefect_server: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run(workspace)
    int8 = report["variants"]["int8"]
    trials = int8["trials"]
    baseline = trials[0]
    # the recipe's own settings break the budget (misleading calibration data)...
    assert not baseline["meets_budgets"] and baseline["accuracy_drop"] > 0.5
    # ...the layer search gets closer to float, but not within the budget...
    decisions = int8["guard_decisions"]
    assert [d["trial"] for d in decisions] == [t["trial"] for t in trials[1:]]
    for d in decisions:
        if d["outcome"] == "kept: closer to float":
            assert d["logit_sqnr_db_after"] > d["logit_sqnr_db_before"] + NOISE_DB, d
    assert all(d["quality_before"].startswith("accuracy drop") for d in decisions)
    # ...so the last trial, every layer weights-only, answers, meets it and is chosen
    chosen = [t for t in trials if t["chosen"]]
    assert chosen == [trials[-1]] and chosen[0]["meets_budgets"], trials
    assert chosen[0]["settings"].get("eight_bit_ops") is False
    assert decisions[-1]["action"] == "every layer weights-only"
    assert decisions[-1]["outcome"] == "meets budgets"
    verdict = int8["guard_verdict"]
    assert "eight-bit kernels cannot reach the budget" in verdict
    assert "weights-only 8-bit" in verdict and "chosen" in verdict
    assert verdict in int8["warnings"]
    assert "eight-bit kernels cannot reach the budget" in capsys.readouterr().out
    assert int8["accuracy_drop"] <= 0.01 and int8["targets"]["phone"]["budgets_ok"]
    assert report["selected"]["phone"] == "int8" and code == 0
    # 8-bit weights: a quarter of float's size
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
    # no 8-bit model is bit-exact with float
    code, report = run(workspace, "--set", "tune.max_trials=3", "--set",
                       "targets.0.budgets.outputs={output_0: {max_abs_error: 0.0}}")
    int8 = report["variants"]["int8"]
    assert code == 1
    assert 2 <= len(int8["trials"]) <= 4  # the recipe's settings and at most three more
    assert not any(t["meets_budgets"] for t in int8["trials"])
    assert "weights-only 8-bit cannot either" in int8["guard_verdict"]
    assert not int8["targets"]["phone"]["budgets_ok"]
    assert report["selected"]["phone"] is None
    assert "none meets its budgets" in capsys.readouterr().out


def test_the_console_says_cached_only_for_what_came_from_the_cache(
        digits_example: Path, workspace: Path, prefect_server: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    trials = ("--set", "tune.max_trials=3")
    # a loose budget: the recipe's own settings meet it, no trial
    code, _ = run(workspace, *trials, "--set", "targets.0.budgets.max_accuracy_drop=1.0")
    assert code == 0 and "guard int8" not in capsys.readouterr().err
    # the budget tightened: the stages of the recipe's settings (trial 0) come from the
    # cache and say so; the trials run, each says its line, and the summary tells how much
    # of the chosen one the cache gave, as the table and report.json do
    code, report = run(workspace, *trials)
    err = capsys.readouterr().err
    chosen = next(t for t in report["variants"]["int8"]["trials"] if t["chosen"])
    stages = report["variants"]["int8"]["stages"]
    from_cache = sum(s["cached"] for s in stages)
    tried = len(report["variants"]["int8"]["trials"]) - 1
    assert code == 0 and tried >= 2 and from_cache < len(stages), stages
    assert [f"trial {n}/3" in err for n in range(1, tried + 1)] == [True] * tried, err
    guard_lines = [line.strip() for line in err.splitlines() if "guard int8:" in line]
    assert guard_lines[-1] == (f"guard int8: {tried} trials run, chose trial "
                               f"{chosen['trial']}: {from_cache}/{len(stages)} of its stages "
                               "from the cache"), guard_lines
    assert all("cached" not in line for line in guard_lines)
    # each trial line shows the budgeted figure beside its bound, then the guard's measure
    trial_lines = [line for line in guard_lines if re.search(r"trial \d+/3 ", line)]
    assert len(trial_lines) == tried and all(
        re.search(r"accuracy drop \d\.\d{4} \(90% upper bound \d\.\d{4}\) (≤|>) 0\.01; "
                  r"ranked by logit SQNR", line)
        for line in trial_lines), trial_lines
    assert all(t["budget_figures"] for t in report["variants"]["int8"]["trials"])
    # the same run again: every trial from the cache, said once, none replayed
    code, again = run(workspace, *trials)
    err = capsys.readouterr().err
    guard_lines = [line.strip() for line in err.splitlines() if "guard int8" in line]
    assert guard_lines == [f"guard int8: {tried} trials from the cache, chose trial "
                           f"{chosen['trial']}"], err
    assert all(s["cached"] for s in again["variants"]["int8"]["stages"])
    assert [line.split()[-1] for line in err.splitlines() if line.strip().startswith("✓")] \
        == ["cached"] * len([line for line in err.splitlines() if "✓" in line])
