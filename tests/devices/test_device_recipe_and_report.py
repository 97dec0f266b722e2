"""A recipe's `connect:` targets: validation at the line, the measure_on_device stages
added, and what the report, selection and gate make of a board's figures."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from orchestrator.engine.plan import build_plan
from orchestrator.errors import OrchestratorError
from orchestrator.recipe.loading import load_recipe
from orchestrator.results.gate import Limits, compare
from orchestrator.results.report import judged_on_device, select, selection_basis

RECIPE = """\
version: 1
name: boards
model: {{path: {model}}}
data:
  evaluation: {{source: {data}, inputs: x_test, labels: y_test}}
targets:
  - name: pi
    device: raspberry-pi-4
    connect: {connect}
  - name: phone
    device: phone-2016
pipelines:
  fp32: {{stages: [freeze, strip, fold]}}
  lite:
    from: fp32
    stages: [{{convert_tflite: {{mode: dynamic_range}}}}{extra}]
"""


def write(folder: Path, digits: Path, connect: str = "ssh://pi@board", extra: str = ""
          ) -> Path:
    recipe = folder / "r.yaml"
    recipe.write_text(RECIPE.format(model=digits / "saved_model", data=digits / "data.npz",
                                    connect=connect, extra=extra))
    return recipe


def test_every_pipeline_is_measured_on_the_connected_target_only(
        tmp_path: Path, digits_example: Path) -> None:
    loaded = load_recipe(write(tmp_path, digits_example))
    for pipeline in ("fp32", "lite"):
        name, params = loaded.stages[pipeline][-1]
        assert name == "measure_on_device"
        assert (params.target, params.connect) == ("pi", "ssh://pi@board")
    added = [n for p in loaded.stages.values() for n, _ in p if n == "measure_on_device"]
    assert len(added) == 2  # phone has no board: nothing for it


def test_another_board_is_another_cache_key(tmp_path: Path, digits_example: Path) -> None:
    first = build_plan(load_recipe(write(tmp_path, digits_example)))
    other = build_plan(load_recipe(write(tmp_path, digits_example, "ssh://pi@other")))
    keys = {n.id: n.key for n in first.nodes}
    for node in other.nodes:
        same = node.stage != "measure_on_device"
        assert (keys[node.id] == node.key) is same, node.id


@pytest.mark.parametrize(("connect", "says"), [
    ("'ssh://pi:hunter2@board'", "a password never goes in a recipe"),
    ("'tcp://board'", "is not a device URL"),
    ("'qemu://aarch64?cpu=x&y=1'", "unknown option 'y'"),
])
def test_a_bad_connect_is_exit_2_at_its_line(tmp_path: Path, digits_example: Path,
                                             connect: str, says: str) -> None:
    with pytest.raises(OrchestratorError) as caught:
        load_recipe(write(tmp_path, digits_example, connect))
    assert caught.value.exit_code == 2
    text = str(caught.value)
    assert says in text and "r.yaml:9:" in text and "targets.0.connect" in text
    assert "hunter2" not in text


def test_measure_on_device_for_a_target_without_a_board(tmp_path: Path,
                                                        digits_example: Path) -> None:
    recipe = write(tmp_path, digits_example, extra=", {measure_on_device: {target: phone}}")
    with pytest.raises(OrchestratorError) as caught:
        load_recipe(recipe)
    assert "target 'phone'" in str(caught.value) and "no connect: URL" in str(caught.value)
    assert "targets with connect: pi" in str(caught.value)


def test_a_listed_measurement_keeps_its_params_and_gets_the_url(tmp_path: Path,
                                                                digits_example: Path) -> None:
    recipe = write(tmp_path, digits_example,
                   extra=", {measure_on_device: {target: pi, runs: 7, timeout_s: 30}}")
    loaded = load_recipe(recipe)
    devices = [p for n, p in loaded.stages["lite"] if n == "measure_on_device"]
    assert len(devices) == 1
    assert (devices[0].runs, devices[0].timeout_s, devices[0].connect) == (
        7, 30, "ssh://pi@board")


# ---- report, selection, gate ------------------------------------------------------------


def variant(est: float, accuracy: float, board: dict[str, Any] | None) -> dict[str, Any]:
    return {"size_bytes": 1000, "accuracy": accuracy, "source_accuracy": 0.99,
            "accuracy_drop": round(0.99 - accuracy, 6), "latency_ms": {"p50": 0.01},
            "targets": {"pi": {"est_latency_ms": est, "budgets_ok": True, "violations": [],
                               **({"measured": board} if board else {})}}}


def board(p50: float, accuracy: float, emulated: bool = False, agreement: float = 1.0
          ) -> dict[str, Any]:
    return {"measured": True, "where": "ssh://pi@board", "emulated": emulated,
            "latency_ms": {"p50": p50, "cv": 0.01}, "accuracy": accuracy,
            "top1_agreement": agreement, "board": {"machine": "aarch64"}}


def test_a_real_boards_latency_and_accuracy_are_what_the_budgets_read() -> None:
    measured = board(p50=2.0, accuracy=0.95)
    judged, figures = judged_on_device(variant(0.5, 0.99, None), "pi", 0.5, measured)
    assert figures["latency_ms"] == 2.0 and figures["latency_basis"] == "measured on pi's board"
    assert figures["accuracy"] == 0.95 and judged["accuracy_drop"] == pytest.approx(0.04)
    # an emulated board: its accuracy counts (the Arm kernels' numerics), its timing not
    judged, figures = judged_on_device(variant(0.5, 0.99, None), "pi", 0.5,
                                       board(p50=9.0, accuracy=0.95, emulated=True))
    assert figures["latency_ms"] == 0.5 and figures["latency_basis"] == "estimated"
    assert figures["accuracy_basis"] == "measured on pi's board (emulated)"


def test_selection_follows_the_boards_measurement_where_it_disagrees_with_the_estimate(
        ) -> None:
    variants = {"a": variant(0.5, 0.99, None), "b": variant(0.8, 0.99, None)}
    assert select(variants, ["pi"]) == {"pi": "a"}  # by the estimates
    for name, p50 in (("a", 3.0), ("b", 1.0)):  # the board says otherwise
        result = variants[name]["targets"]["pi"]
        result.update(latency_ms=p50, latency_basis="measured on pi's board",
                      measured=board(p50, 0.99))
    assert select(variants, ["pi"]) == {"pi": "b"}
    assert selection_basis(variants, ["pi"])["pi"].startswith(
        "latency measured on the board for a, b")


def test_the_gate_compares_board_figures_where_both_runs_have_them() -> None:
    base = {"recipe": "r", "variants": {"a": variant(0.5, 0.99, board(1.0, 0.99))},
            "selected": {"pi": "a"}}
    worse = copy.deepcopy(base)
    worse["variants"]["a"]["targets"]["pi"]["measured"] = board(2.0, 0.95, agreement=0.9)
    rows = {r.metric: r for r in compare(worse, base, Limits()).rows}
    assert rows["pi accuracy (board)"].status == "broken"
    assert rows["pi agreement (board)"].status == "broken"
    assert rows["pi p50 (board)"].status == "broken"
    same = {r.metric: r.status for r in compare(base, base, Limits()).rows}
    assert same["pi p50 (board)"] == "ok"
    # only one side measured on the board: nothing to compare there
    lone = copy.deepcopy(base)
    del lone["variants"]["a"]["targets"]["pi"]["measured"]
    assert not [r for r in compare(lone, base, Limits()).rows if "board" in r.metric]
