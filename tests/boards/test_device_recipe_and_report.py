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


# ---- issue 39: one word per figure, threads within the board --------------------------


def test_on_a_board_fidelity_is_against_the_source_and_agreement_against_the_host() -> None:
    """The board ran the same file as this host (the same outputs: agreement 1.0), whose
    8-bit outputs disagree with the float source's on 3 of 20 samples: the board's
    fidelity is 0.85, as evaluate says on the host, not 1.0. Accuracy is the first class
    output's, as evaluate scores it (the first output here is a box, not classes)."""
    import numpy as np

    from orchestrator.boards.measurement import compare

    rng = np.random.default_rng(0)
    source_scores = rng.dirichlet(np.ones(5), size=20)
    labels = source_scores.argmax(axis=1)
    quantized = source_scores.copy()
    for row in range(3):  # three samples' top class moves
        quantized[row] = np.roll(quantized[row], 1)
    boxes = rng.normal(size=(20, 4))
    device = host = [boxes, quantized]
    compared = compare(device, host, ["box", "probs"], labels, kinds=["values", "class_scores"],
                       source=[boxes, source_scores])
    assert compared["fidelity"] == pytest.approx(0.85)
    assert compared["agreement_with_host"] == 1.0 and compared["top1_agreement"] == 1.0
    assert compared["accuracy"] == compared["host_accuracy"] == pytest.approx(0.85)
    assert compared["outputs"]["probs"]["top1_agreement"] == 1.0  # per output: the host's
    # random inputs (no evaluation data): no source outputs, no fidelity to claim
    alone = compare(device, host, ["box", "probs"], None, kinds=None)
    assert alone["fidelity"] is None and alone["agreement_with_host"] == 1.0


@pytest.mark.parametrize(("asked", "cores", "timed", "capped_from"), [
    ([1, 8], 2, [1, 2], 8),       # phone-modern's 8 cores on the 2-core emulated board
    ([8], 2, [2], 8),             # the first setting (latency_ms) too
    ([4, 8, 1], 2, [2, 1], 8),    # order kept, each once
    ([1, 2], 4, [1, 2], None),    # within the board: as asked
    ([1, 8], None, [1, 8], None),  # a board that did not say
])
def test_thread_settings_are_capped_at_the_boards_cores(
        asked: list[int], cores: int | None, timed: list[int], capped_from: int | None
        ) -> None:
    from orchestrator.stages.measure_on_device import _capped

    assert _capped(asked, cores) == (timed, capped_from)


def measured_on_board(**changes: Any) -> dict[str, Any]:
    figures = {**board(0.44, 0.9933, emulated=True), "first": 26.0, "threads": 1,
               "threads_matrix": [{"threads": 1}, {"threads": 2}], "threads_capped_from": 8,
               "fidelity": 0.96, "agreement_with_host": 1.0, "outputs": {}}
    figures["board"] = {"machine": "aarch64", "cpu": "Cortex-A76", "cores": 2}
    figures.update(changes)
    return figures


def test_the_board_table_names_each_figure_and_says_threads_were_capped() -> None:
    from orchestrator.results.board_figures import board_rows, capped_lines

    report = {"variants": {"lite": variant(0.5, 0.96, measured_on_board())}}
    [row] = board_rows(report)
    assert row["fidelity"] == "0.9600" and row["agreement with host"] == "1.0000"
    assert "threads capped at the board's 2 cores (asked 8)" in row["note"]
    assert capped_lines(report, "pi") == [
        "lite: threads capped at the board's 2 cores (asked up to 8; timed 1, 2)"]
    # a report from before: its board `fidelity` was the agreement with the host
    old = measured_on_board(fidelity=1.0, threads_capped_from=None)
    del old["agreement_with_host"], old["top1_agreement"]
    [row] = board_rows({"variants": {"lite": variant(0.5, 0.96, old)}})
    assert row["fidelity"] == "-" and row["agreement with host"] == "1.0000"
    assert "capped" not in row["note"]


def test_mlflow_logs_the_boards_fidelity_and_its_agreement_with_the_host_apart(
        tmp_path: Path) -> None:
    """The stage's metrics are the one source of `device_*`: logged once per pipeline run,
    as it ends; the end of the run adds them again only for a guard's chosen trial."""
    from orchestrator.stages.measure_on_device import _metrics
    from orchestrator.tracking.worker import MlflowLogger, variant_metrics

    measured = measured_on_board(load={"load_ms": 12.0})
    metrics = _metrics("pi", measured)
    assert metrics["device_fidelity.pi"] == 0.96
    assert metrics["device_agreement_with_host.pi"] == 1.0
    assert metrics["device_accuracy.pi"] == 0.9933

    logger = MlflowLogger(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = logger.client.create_experiment("boards", (tmp_path / "a").as_uri())
    logger.parent_run_id = logger.client.create_run(experiment).info.run_id
    run_id = logger.client.create_run(experiment).info.run_id
    logger.pipeline_runs["lite"] = run_id
    logger.node_end({"pipeline": "lite", "stage": "measure_on_device", "index": 3,
                     "variant_metrics": True,  # as the client sends it: the stage's field
                     "time_ms": 1, "metrics": metrics})
    lite = {**variant(0.5, 0.96, measured), "metrics": metrics}
    logger.finish({"report": {"variants": {"lite": lite}}})
    logged = logger.client.get_run(run_id).data.metrics
    assert logged["device_fidelity.pi"] == 0.96
    assert logged["device_agreement_with_host.pi"] == 1.0
    assert not any(k.startswith("measure_on_device.") for k in logged)
    for key in metrics:  # once each, not again at the end from the report
        assert len(logger.client.get_metric_history(run_id, key)) == 1, key
    # a guarded pipeline: its chosen trial's board figures were a trial's stage (not
    # logged as it ended): the end of the run logs them
    assert variant_metrics({**lite, "trials": [{"trial": 0}]})["device_fidelity.pi"] == 0.96
    assert not any(k.startswith("device_") for k in variant_metrics(lite))


def test_min_device_agreement_reads_the_agreement_with_the_host_not_the_fidelity() -> None:
    from orchestrator.measure.budgets import check_budgets
    from orchestrator.spec.models import Budgets

    figures = measured_on_board(fidelity=0.5, agreement_with_host=0.999)
    del figures["top1_agreement"]  # a model without class outputs
    budgets = Budgets(min_device_agreement=0.99)
    kept = variant(0.5, 0.99, None)
    assert not [v for v in check_budgets(kept, budgets, 0.5, on_device=figures)
                if "agreement" in str(v)]
    figures["agreement_with_host"] = 0.9
    [broken] = [v for v in check_budgets(kept, budgets, 0.5, on_device=figures)
                if "agreement" in str(v)]
    assert "0.9000" in str(broken)


def test_an_output_shaped_unlike_the_sources_is_named_not_dropped_silently() -> None:
    import numpy as np

    from orchestrator.boards.measurement import compare
    from orchestrator.stages.measure_on_device import Params, _warnings

    rng = np.random.default_rng(0)
    scores, boxes = rng.random((4, 3)), rng.random((4, 8))
    # the source model's second output is (4, 2, 4): the board's (4, 8) cannot be compared
    compared = compare([scores, boxes], [scores, boxes], ["scores", "boxes"], None,
                       None, [scores, boxes.reshape(4, 2, 4)])
    assert compared["unlike_source"] == {"boxes": {"board": [4, 8], "source": [4, 2, 4]}}
    assert compared["fidelity"] is not None  # the scores only
    result = {"where": "ssh://pi@board", "emulated": True,
              "latency_ms": {"p50": 1.0, "cv": 0.01}}
    [warning] = _warnings(Params(target="pi", connect="ssh://pi@board"),
                          {**result, **compared})
    assert warning == ("pi (ssh://pi@board): fidelity to the source model covers the other "
                       "outputs only: these outputs' shapes differ from the source model's: "
                       "boxes ([4, 8] on the board, [4, 2, 4] in the source model)")
    # every output unlike the source's: no fidelity at all, and the warning says so
    compared = compare([boxes], [boxes], ["boxes"], None, None, [boxes.reshape(4, 2, 4)])
    assert compared["fidelity"] is None
    [warning] = _warnings(Params(target="pi", connect="ssh://pi@board"),
                          {**result, **compared})
    assert "fidelity to the source model is not measured" in warning
    # alike: nothing said
    same = compare([boxes], [boxes], ["boxes"], None, None, [boxes])
    assert "unlike_source" not in same
    assert not _warnings(Params(target="pi", connect="ssh://pi@board"), {**result, **same})
