"""report.html as a person reads it: budgets in words, one row per estimate with the method
folded, LiteRT's per-layer rows naming the op and the tensor it writes, every `-` explained,
and an estimate below this host's own measurement saying why where it stands (the page's
cell and the console's table)."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.measure.estimates import SPREAD_WARN
from orchestrator.results.host_comparison import below_host
from orchestrator.results.page import (
    _BUDGET_WORDS,
    _OUTPUT_BUDGET_WORDS,
    budget_words,
    render,
)
from orchestrator.results.report import print_summary
from orchestrator.spec.models import Budgets, OutputBudgets

SCOPE = "StatefulPartitionedCall/digits_cnn_1/"
INT8_METHOD = ("29.7 µs compute (1.14 MFLOP at 20 GFLOP/s ×0.52 int8) + 584 µs runtime "
               "overhead (87.5 µs on this host ×6.67 for a Snapdragon 820 Kryo core, ...; "
               "the rest is kernel time on this host's CPU ..., so the overhead is capped "
               "there)")


def _variant(kind: str, p50: float, est: float, estimate: dict[str, Any],
             **extra: Any) -> dict[str, Any]:
    return {"artifact": f"{kind}/model", "kind": kind, "size_bytes": 272_520,
            "gzip_size_bytes": 200_000, "params": 268_364,
            "latency_ms": {"p50": p50}, "accuracy": 0.9933, "accuracy_drop": 0.0,
            "fidelity": 1.0, "stages": [{"name": "benchmark", "cached": False}],
            "warnings": [], "precision": "int8",
            "targets": {"phone": {"device": "phone-2016", "est_latency_ms": est,
                                  "budgets_ok": True, "estimate": estimate}}, **extra}


def _report() -> dict[str, Any]:
    int8 = _variant("graphdef", 6.36, 0.6135, {
        "method": INT8_METHOD, "summary": "29.7 µs compute + 584 µs runtime overhead",
        "compute_ms": 0.0297, "overhead_ms": 0.5838, "device_slowdown": 6.6705,
        "runtime": "tensorflow", "ceiling_applied": True, "host_p50_ms": 6.36,
        "host_fastest_ms": 1.97},
        layer_errors=[{"node": f"{SCOPE}bn1_1/batchnorm/add_1", "op": "BiasAdd",
                       "rmse_over_scale": 0.33, "nmse": 9.2e-5, "clipped_share": 1e-4},
                      {"node": f"{SCOPE}relu1_1/Relu", "op": "Relu", "rmse_over_scale": 0.0,
                       "nmse": None, "clipped_share": None}])
    lite = _variant("tflite", 0.0061, 0.0329, {
        "method": "29.6 µs compute + 3.33 µs runtime overhead (LiteRT ...)",
        "compute_ms": 0.0296, "overhead_ms": 0.00333, "device_slowdown": 6.6705,
        "runtime": "litert", "ceiling_applied": False, "host_p50_ms": 0.0061,
        "host_fastest_ms": 0.006},
        layer_errors=[{"node": f"{SCOPE}relu1_1/Relu;{SCOPE}bn1_1/batchnorm/add_1;"
                               f"{SCOPE}conv1_1/convolution", "op": "CONV_2D",
                       "rmse_over_scale": 0.31, "nmse": 4.7e-5, "scale": 0.014},
                      {"node": "Identity", "op": "SOFTMAX", "rmse_over_scale": 0.22,
                       "nmse": None, "scale": 0.0039}])
    return {"recipe": "digits-cnn", "selected": {"phone": "litert_int8"},
            "targets": {"phone": {"device": "phone-2016", "budgets": {
                "max_size_mb": 1.0, "max_latency_ms": 50.0,
                "outputs": {"output_0": {"min_sqnr_db": 39.0, "min_cosine": None}}}}},
            "selection_reasons": {"phone": {"int8": "meets every budget, but ...",
                                            "litert_int8": "selected: ..."}},
            "variants": {"int8": int8, "litert_int8": lite}}


def test_budgets_read_as_bounds_not_a_dict(tmp_path: Path) -> None:
    budgets = _report()["targets"]["phone"]["budgets"]
    assert budget_words(budgets) == [
        ("max_size_mb", "size ≤ 1 MiB"), ("max_latency_ms", "latency ≤ 50 ms"),
        ("outputs.output_0.min_sqnr_db", "output_0: SQNR ≥ 39 dB")]
    html = render(_report(), {}, tmp_path).decode()
    line = html[html.index('data-budgets="phone"'):]
    line = line[:line.index("</p>")]
    assert '<code title="outputs.output_0.min_sqnr_db">output_0: SQNR ≥ 39 dB</code>' in line
    assert "{" not in line and "min_sqnr_db&#39;" not in line


def test_each_estimate_is_a_row_with_its_method_folded(tmp_path: Path) -> None:
    html = render(_report(), {}, tmp_path).decode()
    table = html[html.index('<table class="methods">'):]
    table = table[:table.index("</table>")]
    rows = re.findall(r'<tr data-method="([^"]+)">(.*?)</tr>', table, re.S)
    assert [key for key, _ in rows] == ["int8:phone", "litert_int8:phone"]
    int8 = rows[0][1]
    # the figure and its two terms in cells, a few words of method, the whole text folded
    for cell in ("<td>614 µs</td>", "<td>29.7 µs</td>", "<td>584 µs</td>", "<td>6.36 ms</td>"):
        assert cell in int8
    assert "FLOPs at the device&#39;s rate + TF session overhead measured here ×6.67" in int8
    folded = re.search(r"<details><summary>full method</summary>(.*?)</details>", int8, re.S)
    assert folded and "so the overhead is capped there" in folded.group(1)
    assert "<ol class=\"methods\">" not in html


def test_litert_layers_name_the_op_and_the_tensor_it_writes(tmp_path: Path) -> None:
    html = render(_report(), {}, tmp_path).decode()
    lite = html[html.index("Per-layer diagnostics: litert_int8"):]
    lite = lite[:lite.index("</table>") + 600]
    assert '<th class="name">op</th><th class="name">output tensor</th>' in lite
    # the op and its output tensor in one row, in that order: SOFTMAX writes Identity
    assert re.search(r'<td class="name">SOFTMAX</td><td class="name"[^>]*>Identity<', lite)
    assert re.search(r'<td class="name">CONV_2D</td><td class="name"[^>]*>'
                     r'(digits_cnn_1/)?relu1_1/Relu <small class="note">\(\+2 fused\)</small>',
                     lite)
    # no clipping column LiteRT does not measure; the nmse dash says why, here and below
    assert "<th>clipped</th>" not in lite
    assert re.search(r'<td title="the float tensor&#39;s power could not be read[^"]*">- \*</td>',
                     lite)
    assert 'data-legend="nmse">- * in nmse: the float tensor&#39;s power' in lite
    graphdef = html[html.index("Per-layer diagnostics: int8"):]
    graphdef = graphdef[:graphdef.index("Per-layer diagnostics: litert_int8")]
    assert '<th class="name">op</th><th class="name">layer (node)</th>' in graphdef
    assert "<th>clipped</th>" in graphdef and "<td>0.01%</td>" in graphdef
    assert 'data-legend="nmse">- * in nmse: the float tensor is zero' in graphdef
    assert 'data-legend="clipped">- † in clipped:' in graphdef


def test_every_budget_field_has_its_words_and_no_other_key_does() -> None:
    # the words table matches the recipe's budget fields exactly, so a renamed or new
    # budget cannot fall back to `key: value` (or keep words for a key no recipe has)
    assert set(_BUDGET_WORDS) == set(Budgets.model_fields) - {"outputs"}
    assert set(_OUTPUT_BUDGET_WORDS) == set(OutputBudgets.model_fields)
    for key in _BUDGET_WORDS:
        [(shown_key, words)] = budget_words({key: 0.5})
        assert shown_key == key and key not in words, words
    assert budget_words({"min_device_agreement": 0.99}) == [
        ("min_device_agreement", "top-1 agreement, board against this host ≥ 0.99")]


def test_an_estimate_below_host_timings_that_spread_says_its_runs_were_slowed() -> None:
    # the one spread rule (estimates.timings_spread): just over SPREAD_WARN, slowed runs;
    # just under it, the device's speed
    def why(fastest: float) -> str | None:
        lite = _report()["variants"]["litert_int8"]
        lite["targets"]["phone"].update(est_latency_ms=0.001)
        lite["targets"]["phone"]["estimate"]["host_fastest_ms"] = fastest
        return below_host(lite, "phone", short=True)

    assert why(0.0061 / (SPREAD_WARN * 1.01)) == "below host: its runs were slowed"
    assert why(0.0061 / (SPREAD_WARN * 0.99)) == "below host: a faster device"


def test_an_estimate_below_the_host_says_why_beside_it(tmp_path: Path) -> None:
    html = render(_report(), {}, tmp_path).decode()
    int8 = html[html.index('data-variant="int8"'):html.index('data-variant="litert_int8"')]
    cell = re.search(r'<td class="target" data-cell="phone".*?</td>', int8, re.S).group(0)
    assert "614 µs" in cell and 'data-note="below-host"' in cell
    assert "x86&#39;s 8-bit kernels are slow" in cell
    lite = html[html.index('data-variant="litert_int8"'):]
    lite = lite[:lite.index("</tr>")]
    assert "below-host" not in lite  # 32.9 µs est. against 6.10 µs measured: above
    out = io.StringIO()
    print_summary(_report(), tmp_path, Console(file=out, width=250, color_system=None))
    lines = out.getvalue().splitlines()
    table_end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    # right under the table, before its notes: the figure and why
    assert lines[table_end + 1] == (
        "  int8: est. latency below this host's p50 (6.36 ms): this host spends most of it "
        "in TF's classic 8-bit kernels, slow on x86 and fast (NEON) on Arm; the estimate "
        "counts the device's own compute instead")
    assert not any(line.startswith("  litert_int8: est. latency below") for line in lines)
