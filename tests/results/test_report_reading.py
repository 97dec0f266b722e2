"""What a person reads in the console summary and on report.html: one unit family (MiB),
timings with 3 significant digits, the broken budget's own cell marked, the file to ship,
warnings once and only those that call for action, the same layer names everywhere."""

from __future__ import annotations

import copy
import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.measure.budgets import MB, Violation
from orchestrator.results.page import render
from orchestrator.results.report import (
    RAM_HEAP,
    RAM_SIZE,
    RAM_TRACED,
    _ram,
    advice,
    console_warnings,
    print_summary,
)

FLAG = "1 layer(s) above 0.7 RMSE/scale (rounding alone: 0.29): probs_1/BiasAdd 1.07"
NODES = ["StatefulPartitionedCall/digits_cnn_1/dense1_1/MatMul;"
         "StatefulPartitionedCall/digits_cnn_1/relu3_1/Relu",
         "StatefulPartitionedCall/digits_cnn_1/bn1_1/batchnorm/add_1"]


def _target(est: float, violations: list[Violation], method: str = "") -> dict:
    return {"device": "phone-2016", "est_latency_ms": est, "budgets_ok": not violations,
            "violations": violations, "broken": [v.kind for v in violations],
            **({"estimate": {"method": method}} if method else {})}


def _variant(artifact: str, kind: str, size: int, p50: float, est: float,
             violations: list[Violation] | None = None, **extra: object) -> dict:
    return {"artifact": artifact, "kind": kind, "size_bytes": size,
            "gzip_size_bytes": size - 1000, "params": 268_364,
            "latency_ms": {"p50": p50}, "accuracy": 0.9933, "accuracy_drop": 0.0,
            "fidelity": 1.0, "ram_bytes": size, "ram_source": RAM_SIZE,
            "stages": [{"name": "benchmark", "cached": False}], "warnings": [],
            "targets": {"phone": _target(est, violations or [], f"{est} ms: how")},
            **extra}


@pytest.fixture
def report() -> dict:
    size_broken = Violation("size 1.03 MiB > max_size_mb 1 MiB", "size")
    int8 = _variant("int8/model.pb", "graphdef", 272_520, 0.629, 0.0297,
                    layer_errors=[{"node": node, "op": "BiasAdd", "nmse": 4e-4,
                                   "rmse_over_scale": 1.07 if "bn1" in node else 0.3}
                                  for node in NODES],
                    diagnostics=[FLAG])
    int8["stages"] = [{"name": "freeze_ranges", "cached": False},
                      {"name": "benchmark", "cached": False, "warnings": ["a stage said"]}]
    int8["warnings"] = ["a stage said", "the guard's verdict"]
    int8["trials"] = [{"trial": 0, "settings": {"weights_only": [], "float": []},
                       "quality": "accuracy drop 0.0000", "logit_sqnr_db": 33.7,
                       "size_bytes": 272_520, "meets_budgets": True, "chosen": True}]
    return {"recipe": "digits-cnn", "selected": {"phone": "litert_int8"},
            "targets": {"phone": {"device": "phone-2016",
                                  "budgets": {"max_size_mb": 1.0, "max_latency_ms": 50}}},
            "selection_reasons": {"phone": {"fp32": "breaks a budget: " + size_broken}},
            "page_files": ["report.html"],
            "variants": {
                "fp32": _variant("fp32/model.pb", "graphdef", 1_076_839, 0.299, 0.0569,
                                 [size_broken]),
                "int8": int8,
                "litert_int8": _variant("litert_int8/model.tflite", "tflite", 277_760,
                                        0.0096, 0.0296,
                                        layer_errors=[{"node": node, "op": "FULLY_CONNECTED",
                                                       "rmse_over_scale": 0.43,
                                                       "nmse": 5.7e-5} for node in NODES])}}


def _console(report: dict, out_dir: Path) -> str:
    out = io.StringIO()
    print_summary(report, out_dir, Console(file=out, width=250, color_system=None))
    return out.getvalue()


def _row(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"│ {name} "))


def test_the_cell_of_the_broken_budget_is_marked_not_the_latency(report: dict,
                                                                 tmp_path: Path) -> None:
    text = _console(report, tmp_path)
    fp32 = [cell.strip() for cell in _row(text, "fp32").split("│")[1:-1]]
    assert fp32[1] == "1.03 ✗"  # size MiB: the budget that broke
    assert fp32[-2] == "56.9 µs ✗ size"  # the latency itself is not marked, the kind named
    assert "FAIL" not in text
    litert = [cell.strip() for cell in _row(text, "litert_int8").split("│")[1:-1]]
    assert litert[1] == "0.265" and litert[4] == "9.60 µs"  # MiB; 3 significant digits
    assert litert[-2] == "29.6 µs ok ✓"


def test_one_unit_family_stated_once(report: dict, tmp_path: Path) -> None:
    text = _console(report, tmp_path)
    assert "KiB" not in text
    assert text.count("MiB = 1,048,576 bytes") == 1
    assert "size MiB" in text and "params: elements of the constant tensors" in text
    assert "1.03 MiB > max_size_mb 1 MiB" in text  # the reason says the same unit


def test_the_console_names_the_file_to_ship_relative_to_the_working_directory(
        report: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    text = _console(report, tmp_path / "out" / "digits")
    assert ("  ship out/digits/litert_int8/model.tflite, a LiteRT flatbuffer; load it: "
            in text)
    assert "docs/loading.md" in text
    assert "  its estimate: 0.0296 ms: how" in text  # the selected file's estimate method


def test_warnings_once_and_diagnostics_never_on_the_console(report: dict,
                                                            tmp_path: Path) -> None:
    text = _console(report, tmp_path)
    assert "a stage said" not in text  # the progress display said it beside its stage
    assert text.count("the guard's verdict") == 1  # found at the run's end: said here
    assert "RMSE/scale" not in text  # a diagnostic: the page has it
    assert console_warnings(report) == [("int8", "the guard's verdict")]


def test_advice_only_where_a_quality_budget_breaks_without_the_guard(report: dict) -> None:
    assert advice(report) == []  # budgets met
    broken = copy.deepcopy(report)
    int8 = broken["variants"]["int8"]
    int8["targets"]["phone"] = _target(0.03, [Violation(
        "accuracy drop 0.0300 > max_accuracy_drop 0.01", "accuracy")])
    assert advice(broken) == []  # the guard ran (it has trials): nothing to act on
    del int8["trials"]
    [(name, text)] = advice(broken)
    assert name == "int8" and "quantize_nodes: {guard: true}" in text
    assert "bn1_1/batchnorm/add_1 1.07" in text  # the layer named as everywhere


def test_the_page_marks_cells_links_the_file_and_keeps_diagnostics(report: dict,
                                                                   tmp_path: Path) -> None:
    html = render(report, {}, tmp_path).decode()
    fp32 = html[html.index('data-variant="fp32"'):html.index('data-variant="int8"')]
    assert re.search(r'class="fail" data-cell="size"[^>]*>1.03 ✗', fp32)
    assert '<span class="">56.9 µs</span>' in fp32 and "✗ size" in fp32
    assert "KiB" not in html and "MiB = 1,048,576 bytes" in html
    assert '<a href="litert_int8/model.tflite"><code>litert_int8/model.tflite</code></a>' in html
    assert "0.0296 ms: how" in html  # how the estimate was made
    assert "Diagnostics" in html and "probs_1/BiasAdd 1.07" in html
    assert "9.60 µs" in html and "0.005" not in html
    # the guard's single trial is the chosen one
    trials = html[html.index('class="trials"'):]
    assert '<td data-cell="chosen">✓</td>' in trials


def test_the_page_and_the_console_name_layers_alike(report: dict, tmp_path: Path) -> None:
    from orchestrator.formatting import layer_names

    html = render(report, {}, tmp_path).decode()
    assert ">dense1_1/MatMul<" in html and ">bn1_1/batchnorm/add_1<" in html
    # the advice (console) names them as the page does
    broken = copy.deepcopy(report)
    int8 = broken["variants"]["int8"]
    int8["targets"]["phone"] = _target(0.03, [Violation("fidelity 0.9 < min_fidelity 0.95",
                                                        "fidelity")])
    del int8["trials"]
    [(_, text)] = advice(broken)
    short = layer_names([r["node"] for r in int8["layer_errors"]])
    assert f"{short[NODES[1]]} 1.07" in text and ">bn1_1/batchnorm/add_1<" in html


def test_the_page_links_the_loading_docs_relative_to_itself(report: dict,
                                                            tmp_path: Path) -> None:
    from orchestrator.results.report import LOADING_DOC

    if not LOADING_DOC.is_file():
        pytest.skip("docs/loading.md is not next to the package (an installed wheel)")
    out = LOADING_DOC.parents[1] / "out" / "digits"
    html = render(report, {}, out).decode()
    assert '<a href="../../docs/loading.md">docs/loading.md</a>' in html


def test_ram_is_one_measure_for_every_kind() -> None:
    # a GraphDef's traced run and its load probe both ran: the probe's heap growth counts,
    # as for a .tflite (the digits fp32: 1.04 MiB of live tensors, 13.1 MiB of heap)
    both = {"peak_memory_bytes": 1_086_000, "memory": {"load_ms": 274.5,
                                                       "anon_growth_mb": 13.066}}
    assert _ram(both, 1_076_839) == {"ram_bytes": round(13.066 * MB), "ram_source": RAM_HEAP,
                                     "ram_measure": "heap growth"}
    tflite = _ram({"memory": {"load_ms": 23.0, "anon_growth_mb": 0.535}}, 277_760)
    assert tflite == {"ram_bytes": round(0.535 * MB), "ram_source": RAM_HEAP,
                      "ram_measure": "heap growth"}
    # the probe did not run: the traced peak, then the file's size, each named
    assert _ram({"peak_memory_bytes": 1_086_000}, 10) == {
        "ram_bytes": 1_086_000, "ram_source": RAM_TRACED, "ram_measure": "traced peak"}
    assert _ram({}, 277_760) == {"ram_bytes": 277_760, "ram_source": RAM_SIZE,
                                 "ram_measure": "file size"}


def test_a_ram_budget_reads_the_heap_growth_and_the_column_says_so(report: dict,
                                                                    tmp_path: Path) -> None:
    from orchestrator.measure.budgets import check_budgets
    from orchestrator.spec.models import Budgets

    fp32 = {"size_bytes": 1_076_839, **_ram({"peak_memory_bytes": 1_086_000, "memory": {
        "anon_growth_mb": 13.066}}, 1_076_839)}
    [broke] = check_budgets(fp32, Budgets(max_ram_mb=5), None)
    assert broke == "RAM 13.1 MiB (heap growth) > max_ram_mb 5 MiB" and broke.kind == "ram"
    for name, v in report["variants"].items():
        v.update(_ram({"memory": {"anon_growth_mb": 13.066 if name == "fp32" else 0.5}}, 0))
    assert "heap growth MiB<br>(measured)" in render(report, {}, tmp_path).decode()
    report["targets"]["phone"]["budgets"]["max_ram_mb"] = 5
    text = _console(report, tmp_path)
    assert "RAM MiB" in text and "(heap growth)" in text
    assert "RAM: heap growth, measured: the RssAnon growth of a fresh process" in text
    html = render(report, {}, tmp_path).decode()
    # one column of the heap growth, named as what the budget reads; not two alike
    assert "RAM MiB<br>(heap growth)" in html and "heap growth MiB<br>(measured)" not in html
    # a variant the probe did not measure: its cell says what its figure is
    report["variants"]["int8"].update(_ram({"peak_memory_bytes": 300_000}, 0))
    text = _console(report, tmp_path)
    assert "0.286 traced peak" in _row(text, "int8") and "(see cells)" in text
    assert "traced peak: the peak of live tensors" in text


def test_without_targets_no_target_legend_and_one_line_why_nothing_is_selected(
        report: dict, tmp_path: Path) -> None:
    with_targets = _console(report, tmp_path)
    assert "est.: the device's latency" in with_targets and "✓: selected" in with_targets
    assert "no targets" not in with_targets
    report.update(selected={}, targets={}, selection_reasons={})
    for v in report["variants"].values():
        v["targets"] = {}
    text = _console(report, tmp_path)
    assert "est.:" not in text and "✗" not in text and "✓" not in text
    assert text.count("no targets: nothing selected (add targets with budgets to pick a "
                      "file per device)") == 1
    html = render(report, {}, tmp_path).decode()
    assert "no targets: nothing selected" in html and "Estimated</b>" not in html


def test_prose_is_not_broken_mid_phrase_where_the_output_is_no_terminal(
        report: dict, tmp_path: Path) -> None:
    long = ("selected: meets every budget; lowest estimated latency (29.6 µs est.); and "
            "a reason long enough to pass the console's width " + "word " * 30).strip()
    report["selection_reasons"]["phone"]["litert_int8"] = long
    out = io.StringIO()
    print_summary(report, tmp_path, Console(file=out, width=80, color_system=None))
    text = out.getvalue()
    assert f"  litert_int8: {long}\n" in text  # one line, however long
    assert "  timings: 3 significant digits, µs below 1 ms; est.: the device's latency, " \
           "estimated (budgets and selection use it; within 10% a tie, which this host's " \
           "fastest runs break beyond their noise, else the smaller file; how, per variant: " \
           "report.html)\n" in text
    # the table still fits the width it was given
    assert max(len(line) for line in text.splitlines() if line[:1] in "┏│┗┃┡└") <= 80


def test_diagnostics_drop_the_guard_advice_where_the_guard_is_on(report: dict,
                                                                 tmp_path: Path) -> None:
    from orchestrator.engine.plan import build_plan
    from orchestrator.recipe.loading import load_recipe
    from orchestrator.results.report import guard_on, without_guard_advice
    from orchestrator.stages.freeze_ranges import _flag_diagnostic

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "digits.yaml"
    plan = build_plan(load_recipe(recipe, check_files=False), None, {})
    # digits.yaml: quantize_nodes {guard: true} in int8; LiteRT's without the guard
    assert {name: guard_on(nodes) for name, nodes in plan.pipelines.items()} == {
        "fp32": False, "int8": True, "mobile": False, "litert_int8": False,
        "litert_dynamic": False}
    row = {"node": NODES[1], "rmse_over_scale": 1.07, "clipped_share": 0.009}
    said = _flag_diagnostic([row], NODES)  # the stage's own words
    assert "guard" in said
    kept = without_guard_advice(said)
    assert kept == ("1 layer(s) above 0.7 RMSE/scale (rounding alone: 0.29): "
                    "bn1_1/batchnorm/add_1 1.07 (0.9% clipped)")
    tflite = ("1 layer(s) above 0.7 RMSE/scale (rounding alone: 0.29): dense 0.9. Where a "
              "quality budget breaks, the guard (convert_tflite: {guard: true}) keeps such "
              "layers in float")
    assert without_guard_advice(tflite) == ("1 layer(s) above 0.7 RMSE/scale (rounding "
                                            "alone: 0.29): dense 0.9")
    other = "stay float in the int8 model (no int8 kernel, or kept float): SOFTMAX x1"
    assert without_guard_advice(other) == other
    # the page's heading, in the plural its subject takes
    html = render(report, {}, tmp_path).decode()
    assert "What the stages found that changed nothing and ask for no action." in html


def test_the_trials_table_shows_each_budgeted_figure_beside_its_bound(report: dict,
                                                                       tmp_path: Path) -> None:
    report["variants"]["int8"]["trials"][0]["budget_figures"] = [
        "output_0 SQNR 41.2 dB ≥ 39 dB"]
    html = render(report, {}, tmp_path).decode()
    trials = html[html.index('class="trials"'):]
    assert "<td class=\"name\">output_0 SQNR 41.2 dB ≥ 39 dB</td>" in trials
    assert "what the guard ranks trials by (not a budget)" in trials
