"""The report's pictures and history.png as a person reads them: read back from the drawn
matplotlib figures (label boxes, axis limits, colour bars, legends), not from pixels."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from orchestrator.results import plots
from orchestrator.tracking.history import Row, chart_figure, format_table

FOUR_AT_ONE_DOT = {"int8": (278_900, 7.41), "mobile": (279_100, 5.75),
                   "litert_dynamic": (281_700, 0.0569), "litert_int8": (284_400, 0.0296)}
LONG = "StatefulPartitionedCall/digits_cnn_1/"


def _variant(size: int, accuracy: float, est_ms: float, runs: list[float] | None = None,
             **extra: Any) -> dict[str, Any]:
    targets = {"phone": {"device": "phone-2016", "est_latency_ms": est_ms,
                         "budgets_ok": True},
               "pi": {"device": "raspberry-pi-3", "est_latency_ms": est_ms * 4,
                      "budgets_ok": True}}
    variant = {"size_bytes": size, "accuracy": accuracy, "source_accuracy": 0.9933,
               "fidelity": 1.0, "targets": targets, "threads": 2, **extra}
    if runs:
        ordered = sorted(runs)
        variant["latency_runs_ms"] = runs
        variant["latency_ms"] = {"p50": ordered[len(runs) // 2],
                                 "p99": ordered[int(0.99 * (len(runs) - 1))]}
    return variant


def _report(accuracy: float = 0.9933) -> dict[str, Any]:
    """The digits report's shape: four variants within a few KiB and at one accuracy, fp32
    four times their size; runs with a few slow outliers; LiteRT without a per-op profile."""
    rng = random.Random(7)
    slow = [rng.uniform(0.5, 0.9) for _ in range(46)] + [9.0, 25.0, 66.0, 102.0]
    tight = [rng.uniform(0.20, 0.26) for _ in range(50)]
    profile = {"source": "step_stats", "by_node_type": [
        {"node type": "MatMul", "avg ms": 0.087, "avg %": 58.0},
        {"node type": "Conv2D", "avg ms": 0.038, "avg %": 25.0}]}
    no_profile = {"source": None, "note": "LiteRT's Python interpreter has no per-op profiler"}
    layers = [{"node": f"{LONG}dense1_1/MatMul;{LONG}relu3_1/Relu", "op": "FULLY_CONNECTED",
               "rmse_over_scale": 0.43},
              {"node": f"{LONG}probs_1/BiasAdd", "op": "BiasAdd", "rmse_over_scale": 1.07},
              {"node": f"{LONG}relu1_1/Relu", "op": "Relu", "rmse_over_scale": 0.0},
              {"node": "Identity", "op": "SOFTMAX", "rmse_over_scale": 0.22}]
    variants = {"fp32": _variant(1_076_839, accuracy, 2.23, tight, profile=profile)}
    for name, (size, est) in FOUR_AT_ONE_DOT.items():
        litert = name.startswith("litert")
        variants[name] = _variant(size, accuracy, est, slow,
                                  profile=no_profile if litert else profile,
                                  layer_errors=layers if name in ("int8", "litert_int8")
                                  else None)
    budgets = {"max_size_mb": 1.0, "max_accuracy_drop": 0.01}
    return {"variants": variants, "selected": {"phone": "litert_int8", "pi": "litert_int8"},
            "targets": {"phone": {"device": "phone-2016", "budgets": budgets},
                        "pi": {"device": "raspberry-pi-3", "budgets": budgets}}}


def _boxes_overlap(boxes: list[Any]) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i) if boxes[i].overlaps(boxes[j])]


@pytest.mark.parametrize("accuracy", [0.9933, 1.0])
def test_tradeoff_separates_variants_on_one_dot(accuracy: float) -> None:
    figure = plots.tradeoff_figure(_report(accuracy))
    renderer = figure.canvas.get_renderer()
    panels = [ax for ax in figure.axes if ax.get_xlabel() == "shipped size, MiB"]
    assert len(panels) == 2
    for ax in panels:
        # each variant a dot of its own: five distinct places on the screen, not one
        dots = [tuple(c.get_offset_transform().transform(c.get_offsets()[0]).round())
                for c in ax.collections if c.get_sizes()[0] == plots.MARKER_SIZE]
        assert len(dots) == 5 and len(set(dots)) == 5
        # ... and each at its variant's true size and quality in data: only the drawing
        # moves, a few points (not the 0.07 MiB a shift in data would show)
        report = _report(accuracy)
        markers = {c.get_label(): c for c in ax.collections
                   if c.get_sizes()[0] == plots.MARKER_SIZE}
        assert set(markers) == set(report["variants"])
        for name, marker in markers.items():
            variant = report["variants"][name]
            (x, y), = marker.get_offsets()
            assert x == variant["size_bytes"] / plots.MIB and y == variant["accuracy"]
            drawn = marker.get_offset_transform().transform((x, y))
            true = ax.transData.transform((x, y))
            apart_pt = abs(drawn[0] - true[0]) * 72.0 / figure.dpi
            assert apart_pt <= 1.5 * plots.DODGE_PT + 1e-6 and drawn[1] == pytest.approx(true[1])
        colours = [tuple(c.get_facecolor()[0]) for c in ax.collections
                   if c.get_sizes()[0] == plots.MARKER_SIZE]
        assert len(set(colours)) == 5  # est. latencies 0.03..7.4 ms: five colours
        # labels: one for the cluster of four (naming them all), one for fp32; apart
        labels = [t for t in ax.texts if t.get_text()]
        assert len(labels) == 2
        cluster = next(t.get_text() for t in labels if "left to right" in t.get_text())
        assert all(name in cluster for name in FOUR_AT_ONE_DOT)
        assert cluster.startswith("4 variants at 0.266–0.271 MiB\n(drawn a few points apart)")
        assert not _boxes_overlap([plots.text_box(t, renderer) for t in labels])
        # accuracy is a fraction: the axis stays within [0, 1], padding inside only
        low, high = ax.get_ylim()
        assert 0.0 <= low < min(0.9933 - 0.01, accuracy) and accuracy <= high <= 1.0
        assert ax.get_xlim()[0] == 0.0
    bars = [ax for ax in figure.axes if "estimated latency on" in ax.get_ylabel()]
    assert len(bars) == 2  # a colour bar per target, saying it is an estimate
    assert bars[0].get_yscale() == "log"  # 30 µs to 7.4 ms: one colour each needs a log
    assert plots.tradeoff(_report(accuracy)).startswith(b"\x89PNG")


def test_latency_histogram_is_not_one_bar() -> None:
    report = _report()
    figure = plots.latency_figure(report["variants"])
    by_title = {ax.get_title().split(":")[0]: ax for ax in figure.axes if ax.get_visible()}
    int8, fp32 = by_title["int8"], by_title["fp32"]
    runs = report["variants"]["int8"]["latency_runs_ms"]
    # a few runs 100x slower: a log axis over the runs' own range, the p99 inside it
    assert int8.get_xscale() == "log" and "log scale" in int8.get_xlabel()
    low, high = int8.get_xlim()
    assert report["variants"]["int8"]["latency_ms"]["p99"] <= high <= max(runs)
    assert low >= min(runs) * 0.999
    heights = [patch.get_height() for patch in int8.patches]
    # on a linear axis 46 of 50 runs would share the first of 16 bars; here they spread
    assert max(heights) < 0.6 * len(runs)
    # a tight spread stays linear, in µs (below 1 ms), within its runs
    assert fp32.get_xscale() == "linear" and "µs" in fp32.get_xlabel()
    fp32_runs = report["variants"]["fp32"]["latency_runs_ms"]
    assert fp32.get_xlim()[1] <= max(fp32_runs) * 1000 * 1.0001


def test_op_time_leaves_out_pipelines_without_a_profile_and_says_why() -> None:
    figure = plots.op_time_figure(_report()["variants"])
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    assert titles == ["fp32: time per op type", "int8: time per op type",
                      "mobile: time per op type"]
    footer = figure.get_supxlabel()
    assert "litert_dynamic" in footer and "litert_int8" in footer
    assert "no per-op profiler" in footer
    assert plots.op_time_figure({"litert_int8": _report()["variants"]["litert_int8"]}) is None


def test_layer_errors_read_as_layers() -> None:
    figure = plots.layer_error_figure(_report()["variants"])
    for ax in (a for a in figure.axes if a.get_visible()):
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert set(labels) == {"dense1_1/MatMul", "probs_1/BiasAdd", "relu1_1/Relu",
                               "Identity"}
        assert all(t.get_fontsize() >= 8 for t in ax.get_yticklabels())
        values = [t.get_text() for t in ax.texts]
        assert "0.00" in values and "1.07" in values  # a zero reads as zero, not missing
        red = [p for p in ax.patches if p.get_facecolor()[0] > 0.7]
        assert len(red) == 1  # probs_1/BiasAdd, above the 0.7 flag


def _rows(latencies: list[float]) -> list[Row]:
    rows = []
    for i, p50 in enumerate(latencies):
        for target, device in (("phone", "phone-2016"), ("pi", "raspberry-pi-3")):
            rows.append(Row(run_id=f"r{i}", run_name=f"d@0123456 #{i + 1}",
                            start_time=f"2026-01-0{i + 1}T10:00:00Z", status="FINISHED",
                            git_commit="0123456", target=target, device=device,
                            selected="litert_int8", note=None, size_bytes=277_760,
                            size_mib=277_760 / 1048576, quality=0.9933, accuracy=0.9933,
                            latency_p50_ms=p50, host="AMD EPYC, 2 cores",
                            est_latency_ms=0.0296 if target == "phone" else 0.118))
    return rows


def _drawn_by(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pictures report_plots draws from here on, each drawn as its name's bytes."""
    drawn: list[str] = []
    for function, name in ((plots.latency_histograms, "latency"),
                           (plots.op_time_bars, "op_time"), (plots.tradeoff, "tradeoff"),
                           (plots.layer_error_bars, "layer_errors")):
        def draw(_: Any, name: str = name) -> bytes:
            drawn.append(name)
            return name.encode()

        monkeypatch.setattr(plots, function.__name__, draw)
    return drawn


def _run_report(run_id: str, started: float, cached: bool) -> dict[str, Any]:
    """_report() as a run wrote it: its MLflow run, and stages with their times."""
    report = _report()
    for variant in report["variants"].values():
        variant["stages"] = [{"stage": "freeze", "seconds": 0.25, "cached": cached,
                              "started": started, "finished": started + 0.25}]
    return {**report, "mlflow_run_id": run_id}


def test_pictures_of_a_report_drawn_before_are_kept_not_drawn_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = _drawn_by(monkeypatch)
    first = plots.report_plots(_run_report("run1", 1000.0, cached=False), tmp_path)
    assert len(drawn) == 4 and set(first) == set(plots.report_plots(_report()))
    # a cached re-run: another MLflow run, other stage times, the same pictures
    drawn.clear()
    again = plots.report_plots(_run_report("run2", 2000.0, cached=True), tmp_path)
    assert again == first and drawn == []
    # a figure a picture shows changed: drawn anew, and kept beside the first
    changed = _run_report("run3", 3000.0, cached=False)
    changed["variants"]["fp32"]["accuracy"] = 0.5
    assert plots.report_plots(changed, tmp_path) == first and len(drawn) == 4
    assert len(list(tmp_path.iterdir())) == 2


def test_kept_pictures_damaged_or_unwritable_are_drawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = _drawn_by(monkeypatch)
    report = _run_report("run1", 1000.0, cached=False)
    first = plots.report_plots(report, tmp_path)
    (entry,) = tmp_path.iterdir()
    (entry / "latency.png").write_bytes(b"half a picture")
    drawn.clear()
    assert plots.report_plots(report, tmp_path) == first and len(drawn) == 4
    assert plots.report_plots(report, tmp_path) == first and len(drawn) == 4  # kept again
    # a folder that cannot be written: drawn each time, and the run goes on
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    drawn.clear()
    assert plots.report_plots(report, blocked) == first and len(drawn) == 4
    assert plots.report_plots(report, blocked) == first and len(drawn) == 8
    # a report whose key cannot be made (keys json cannot sort): drawn, kept nowhere
    report["variants"]["fp32"]["odd"] = {1: "one", "two": 2}
    assert plots.report_plots(report, tmp_path / "other") == first and len(drawn) == 12
    assert not (tmp_path / "other").exists()


def test_the_pictures_of_the_most_recently_used_reports_stay(tmp_path: Path) -> None:
    for index in range(5):
        plots._keep_pictures(tmp_path, f"key{index}", {"a.png": b"%d" % index})
        os.utime(tmp_path / f"key{index}", (1000 + index, 1000 + index))
    assert plots._kept_pictures(tmp_path, "key0") == {"a.png": b"0"}  # used now: newest
    (tmp_path / ".new-left-by-a-killed-run").mkdir()
    os.utime(tmp_path / ".new-left-by-a-killed-run", (1000, 1000))
    plots._prune(tmp_path, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key0", "key3", "key4"]


def _forked(process: object) -> bool:
    from orchestrator.zygote import ForkedProcess

    return isinstance(process, ForkedProcess)


def test_a_drawing_process_draws_half_and_the_pictures_are_the_same(helper_kind: str) -> None:
    report = _report()
    alone = plots.report_plots(report)
    plots.start_drawing()
    process = plots._PAINTER.process
    assert process is not None and _forked(process) == (helper_kind == "forked")
    assert plots.report_plots(report) == alone  # byte for byte
    assert plots._PAINTER.process is None and process.poll() is not None  # one report each


def test_a_picture_that_fails_fails_as_it_does_without_a_drawing_process(
        helper_kind: str) -> None:
    report = _report()
    report["variants"]["fp32"]["latency_runs_ms"] = ["not a number"]  # the second share's
    with pytest.raises(Exception) as alone:
        plots.report_plots(report)
    plots.start_drawing()
    assert _forked(plots._PAINTER.process) == (helper_kind == "forked")
    with pytest.raises(Exception) as helped:
        plots.report_plots(report)
    assert (type(helped.value), str(helped.value)) == (type(alone.value), str(alone.value))
    assert plots._PAINTER.process is None


def test_a_drawing_process_that_drew_nothing_is_ended(helper_kind: str) -> None:
    plots.start_drawing()
    process = plots._PAINTER.process
    assert process is not None and _forked(process) == (helper_kind == "forked")
    plots.stop_drawing()
    assert process.poll() is not None and plots._PAINTER.process is None


def test_history_legend_fits_and_latency_stays_above_zero() -> None:
    figure = chart_figure(_rows([0.0096, 0.0073, 0.0060]), "digits-cnn")
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    (legend,) = figure.legends
    inside = figure.bbox
    box = legend.get_window_extent(renderer)
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1, (box, inside)
    assert inside.y0 <= box.y0 and box.y1 <= inside.y1, (box, inside)
    size_ax, _, latency_ax = figure.axes[:3]
    assert latency_ax.get_yscale() == "linear" and latency_ax.get_ylim()[0] == 0.0
    assert size_ax.get_ylim()[0] >= 0.0 and "MiB" in size_ax.get_ylabel()
    labels = [t.get_text() for t in latency_ax.get_yticklabels()]
    assert any(label.endswith(" µs") for label in labels), labels


def test_history_names_the_commit_the_recipe_file_last_changed_in() -> None:
    rows = _rows([0.0096, 0.0073])
    table = format_table(rows, "digits-cnn").splitlines()
    assert table[1].split()[:4] == ["started", "(UTC)", "recipe", "commit"]
    assert ("recipe commit: the commit that last changed the recipe file, not the "
            "checkout's HEAD (-dirty: the file had uncommitted changes)") in table
    figure = chart_figure(rows, "digits-cnn")
    assert "recipe commit (the commit that last changed the recipe file)" in (
        figure.axes[2].get_xlabel())


def test_every_target_colours_latency_on_one_scale() -> None:
    # the pi's estimates (4x the phone's) span less than 10x on their own, so each panel
    # with its own scale would read log on one and linear on the other
    report = _report()
    for name, variant in report["variants"].items():
        variant["targets"]["phone"]["est_latency_ms"] = 0.02 if name == "litert_int8" else 0.5
        variant["targets"]["pi"]["est_latency_ms"] = 0.3 if name == "litert_int8" else 0.9
    figure = plots.tradeoff_figure(report)
    bars = [ax for ax in figure.axes if "estimated latency on" in ax.get_ylabel()]
    assert len(bars) == 2
    assert [ax.get_yscale() for ax in bars] == ["log", "log"]
    assert bars[0].get_ylim() == bars[1].get_ylim()
    # the same latency is the same colour in both panels: the phone's 0.5 ms and ...
    panels = [ax for ax in figure.axes if ax.get_xlabel() == "shipped size, MiB"]
    colour = {(i, c.get_label()): tuple(c.get_facecolor()[0])
              for i, ax in enumerate(panels) for c in ax.collections
              if c.get_sizes()[0] == plots.MARKER_SIZE}
    assert colour[(0, "int8")] != colour[(1, "int8")]  # 0.5 ms against 0.9 ms
    assert colour[(0, "litert_int8")] != colour[(1, "litert_int8")]
    report["variants"]["int8"]["targets"]["pi"]["est_latency_ms"] = 0.5
    figure = plots.tradeoff_figure(report)
    panels = [ax for ax in figure.axes if ax.get_xlabel() == "shipped size, MiB"]
    same = [tuple(c.get_facecolor()[0]) for ax in panels for c in ax.collections
            if c.get_label() == "int8" and c.get_sizes()[0] == plots.MARKER_SIZE]
    assert len(same) == 2 and same[0] == same[1]
