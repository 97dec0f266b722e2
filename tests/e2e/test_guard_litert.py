"""The accuracy guard on the LiteRT path: misleading calibration data
(tests/fixtures/recipes/guard_tight_litert.yaml) breaks LiteRT's full-integer model. The
guard keeps the ops the quantization debugger measured worst in float, a trial each, then
answers with dynamic range, which meets the budget and is chosen, in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.guard.trials import NOISE_DB

RECIPE = Path(__file__).resolve().parents[1] / "fixtures" / "recipes" / "guard_tight_litert.yaml"

pytestmark = pytest.mark.slow


def test_litert_guard_keeps_ops_float_then_answers_with_dynamic_range(
        digits_example: Path, workspace: Path, prefect_server: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(RECIPE), "-o", str(workspace / "out")])
    report = json.loads((workspace / "out" / "report.json").read_text())
    lite = report["variants"]["litert_int8"]
    trials, decisions = lite["trials"], lite["guard_decisions"]
    baseline = trials[0]
    assert not baseline["meets_budgets"] and baseline["accuracy_drop"] > 0.5
    # the debugger's per-op errors rank the ops: the worst is named for the baseline
    assert baseline["worst_layer"]
    # each float step names ops of the int8 model (LiteRT's fused output tensors, the
    # names the debugger's denylist takes), and a kept one moved towards float
    float_steps = [d for d in decisions if d["action"] == "float"]
    assert float_steps and all(d["layers"] for d in float_steps)
    assert any(";" in name for d in float_steps for name in d["layers"])
    for d in decisions:
        if d["outcome"] == "kept: closer to float":
            assert d["logit_sqnr_db_after"] > d["logit_sqnr_db_before"] + NOISE_DB, d
    # the last trial is dynamic range: it meets the budget and is chosen, with a verdict
    chosen = [t for t in trials if t["chosen"]]
    assert chosen == [trials[-1]] and chosen[0]["meets_budgets"], trials
    assert decisions[-1]["action"] == "every layer weights-only"
    verdict = lite["guard_verdict"]
    assert "LiteRT's int8 model cannot reach the budget" in verdict
    assert "dynamic range" in verdict and "chosen" in verdict
    assert verdict in lite["warnings"]
    assert "dynamic range" in capsys.readouterr().out
    assert code == 0 and report["selected"]["phone"] == "litert_int8"
    # int8 weights: about a quarter of the float graph's size
    assert lite["kind"] == "tflite"
    assert lite["size_bytes"] < 0.3 * report["variants"]["fp32"]["size_bytes"]
