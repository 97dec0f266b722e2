"""The report's pictures, as PNG bytes, from report.json alone (matplotlib, no display).

- `latency.png`: a histogram of the host's measured run times per pipeline (a log axis
  where a few slow runs would squash the rest into one bar);
- `op_time.png`: measured time per op type per pipeline, from the benchmark's profile
  (pipelines without one, such as LiteRT's, are named in one line instead of a panel);
- `tradeoff.png`: per target, size against accuracy (or fidelity) of every variant, each
  coloured by its *estimated* device latency (with a colour bar, one scale for every
  target), the target's budget
  lines, the selected one ringed; each dot at its variant's true size and quality, and
  where dots would hide each other, drawn a few points apart on the screen (the data
  stay put) with one label saying so;
- `layer_errors.png`: per 8-bit variant, each layer's own error (rmse/scale) as the
  diagnostics measured it, flagged layers in red, named as everywhere else
  (formatting.layer_names).

Measured figures (the host's) and estimates (the device's) are named apart in every title
and axis. Each picture is drawn as a matplotlib Figure first (`*_figure`, which the tests
read back), then saved. Nothing here is imported by a stage.

Drawing them takes a second or more (matplotlib's import too), as long as a whole cached
re-run takes otherwise, and such a run's report draws the very pictures the run before
drew: `report_plots` keeps what it drew in a folder (a run's: `.orchestrator/pictures/`),
under a key of everything the pictures are drawn from (picture_key), and a report with the
same key gets those bytes back without matplotlib. A run with new results starts a
drawing process early (`start_drawing`: it imports matplotlib beside the run's work), which
draws half the pictures while the run draws the other half, on both cores; should either
half fail, the run draws them all itself, as it does without that process.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator import helper_process, zygote
from orchestrator.formatting import MIB, format_ms, format_size, layer_names

# A layer's error above this many quantization steps is flagged (see layer_errors).
FLAG_ABOVE = 0.7
ROUNDING_ALONE = 0.29  # 1/sqrt(12): the error of rounding alone
MAX_LAYERS_SHOWN = 20
MAX_OP_TYPES_SHOWN = 8
LAYER_NAME_WIDTH = 34  # characters of a layer's name on the axis
DPI = 110
# A histogram whose slowest run is this many times its median gets a log axis: on a
# linear one, a few slow runs (a cold cache, a busy core) squash the rest into one bar.
LOG_SPREAD = 3.0
MARKER_SIZE = 64  # scatter's s: points squared, so the marker is 8 pt across
# a cluster's markers are drawn this far apart: less than their 8 pt, so that they overlap
# like a fanned hand (each edge visible) and stay close to where their data are
DODGE_PT = 5.0
CLUSTER_PT = 10.0  # markers closer than this would hide each other: a cluster


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def png(figure: Any) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    pyplot().close(figure)
    return buffer.getvalue()


def _grid(count: int, width: float = 4.2, height: float = 2.8) -> tuple[Any, list[Any]]:
    plt = pyplot()
    columns = min(count, 3)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows),
                                squeeze=False, layout="constrained", dpi=DPI)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return figure, flat[:count]


def _ms_axis(largest_ms: float) -> tuple[str, float]:
    """The unit an axis of timings reads best in, and the factor from ms: µs below 1 ms
    (as formatting.format_ms writes them)."""
    return ("µs", 1000.0) if largest_ms < 1.0 else ("ms", 1.0)


def _plain(value: float, _: Any = None) -> str:
    """A tick label of a log axis: 0.5, 1, 20, not powers of ten."""
    return f"{value:g}"


# --- latency.png


def latency_figure(variants: Mapping[str, Any]) -> Any | None:
    import numpy as np
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    measured = {name: [float(x) for x in v["latency_runs_ms"]] for name, v in variants.items()
                if v.get("latency_runs_ms")}
    if not measured:
        return None
    figure, axes = _grid(len(measured))
    for ax, (name, runs) in zip(axes, measured.items(), strict=True):
        stats = variants[name].get("latency_ms") or {}
        unit, factor = _ms_axis(float(np.percentile(runs, 99)))
        values = np.asarray(runs) * factor
        low, high = float(values.min()), float(values.max())
        middle = float(np.median(values))
        log = low > 0 and high / middle > LOG_SPREAD
        bins = min(40, max(10, len(runs) // 2)) if log else min(30, max(5, len(runs) // 3))
        if high <= low:  # every run alike: one bar, with room either side
            edges = np.linspace(low * 0.95, high * 1.05 if high else 1.0, bins + 1)
        elif log:
            edges = np.geomspace(low, high, bins + 1)
        else:
            edges = np.linspace(low, high, bins + 1)
        ax.hist(values, bins=edges, color="#4c72b0")
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(_plain))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(edges[0], edges[-1])  # the runs' own range: no margin past the slowest
        for key, style in (("p50", "--"), ("p99", ":")):
            if stats.get(key) is not None:
                ax.axvline(stats[key] * factor, color="#c44e52", linestyle=style,
                           label=f"{key} {format_ms(stats[key])}")
        if stats.get("p50") is not None:
            ax.legend(fontsize=8)
        threads = variants[name].get("threads")
        scale = (f", log scale (slowest run {high / middle:.0f}x the median)" if log else "")
        ax.set_title(f"{name}: {len(runs)} runs, {threads} thread(s)", fontsize=9)
        ax.set_xlabel(f"host latency, {unit} (measured){scale}", fontsize=8)
        ax.set_ylabel("runs", fontsize=8)
        ax.tick_params(labelsize=7)
    figure.suptitle("Latency measured on this host, per pipeline", fontsize=11)
    return figure


def latency_histograms(variants: Mapping[str, Any]) -> bytes | None:
    figure = latency_figure(variants)
    return None if figure is None else png(figure)


# --- op_time.png


def op_time_figure(variants: Mapping[str, Any]) -> Any | None:
    profiled = {name: v["profile"]["by_node_type"][:MAX_OP_TYPES_SHOWN]
                for name, v in variants.items()
                if (v.get("profile") or {}).get("by_node_type")}
    if not profiled:
        return None
    # a pipeline the benchmark could not profile gets one line, not an empty panel
    missing: dict[str, str] = {name: (v["profile"].get("note") or "no per-op profile")
                               for name, v in variants.items()
                               if v.get("profile") and name not in profiled}
    figure, axes = _grid(len(profiled), height=3.0)
    for ax, (name, rows) in zip(axes, profiled.items(), strict=True):
        rows = rows[::-1]  # the slowest on top
        unit, factor = _ms_axis(max(r["avg ms"] for r in rows))
        values = [r["avg ms"] * factor for r in rows]
        positions = list(range(len(rows)))
        ax.barh(positions, values, color="#55a868")
        ax.set_yticks(positions, [r["node type"] for r in rows])
        for y, value, row in zip(positions, values, rows, strict=True):
            if row.get("avg %") is not None:
                ax.annotate(f"{row['avg %']:.0f}%", (value, y), xytext=(3, 0),
                            textcoords="offset points", va="center", fontsize=7)
        ax.margins(x=0.12)  # room for the shares
        ax.set_title(f"{name}: time per op type", fontsize=9)
        ax.set_xlabel(f"{unit} per run, measured (TF step stats)", fontsize=8)
        ax.tick_params(labelsize=7)
    figure.suptitle("Where the time goes, measured on this host", fontsize=11)
    if missing:
        notes = list(dict.fromkeys(missing.values()))
        why = notes[0] if len(notes) == 1 else "; ".join(f"{n}: {missing[n]}" for n in missing)
        figure.supxlabel(_wrap(f"Not shown, no per-op profile: {', '.join(missing)}"
                               + (f" ({why})" if why else ""), 150), fontsize=8,
                         color="dimgrey")
    return figure


def op_time_bars(variants: Mapping[str, Any]) -> bytes | None:
    figure = op_time_figure(variants)
    return None if figure is None else png(figure)


# --- tradeoff.png


def _norm(estimates: Iterable[float]) -> Any | None:
    """The colour scale of estimated latencies: logarithmic when they span more than a
    factor of 10 (a linear one paints all but the slowest the same colour)."""
    from matplotlib.colors import LogNorm, Normalize

    values = [v for v in estimates if v is not None and v > 0]
    if not values:
        return None
    low, high = min(values), max(values)
    if high / low > 10:
        return LogNorm(low, high)
    if high == low:  # one value: a scale around it
        return Normalize(low * 0.9, high * 1.1)
    return Normalize(low, high)


def _fraction_limits(values: Sequence[float]) -> tuple[float, float]:
    """Room around the values, within [0, 1]: a fraction's axis never shows what it
    cannot be."""
    low, high = min(values), max(values)
    span = max(high - low, 0.01)
    return max(0.0, low - 0.2 * span), min(1.0, high + 0.2 * span)


def tradeoff_figure(report: Mapping[str, Any]) -> Any | None:
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LogNorm
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    variants = report["variants"]
    targets = report.get("targets") or {}
    names = list(targets) or sorted({t for v in variants.values() for t in v["targets"]})
    if not names:
        return None
    use_accuracy = any(v.get("accuracy") is not None for v in variants.values())
    quality_key = "accuracy" if use_accuracy else "fidelity"
    figure, axes = _grid(len(names), width=5.6, height=4.4)
    cmap = pyplot().get_cmap("viridis")
    panels = []
    # one colour scale for every target: the same colour is the same latency in each panel
    norm = _norm(v["targets"].get(target, {}).get("est_latency_ms") for target in names
                 for v in variants.values() if v.get(quality_key) is not None)
    for ax, target in zip(axes, names, strict=True):
        points = [(name, v["size_bytes"] / MIB, float(v[quality_key]),
                   v["targets"].get(target, {}).get("est_latency_ms"))
                  for name, v in variants.items() if v.get(quality_key) is not None]
        budgets = (targets.get(target) or {}).get("budgets") or {}
        device = (targets.get(target) or {}).get("device") or _device(variants, target)
        handles = [Line2D([], [], linestyle="", marker="o", markersize=13,
                          markerfacecolor="none", markeredgecolor="#c44e52",
                          markeredgewidth=2, label="selected")]
        sizes = [p[1] for p in points]
        qualities = [p[2] for p in points]
        if budgets.get("max_size_mb") is not None:
            sizes.append(float(budgets["max_size_mb"]))
            handles.append(ax.axvline(budgets["max_size_mb"], color="#c44e52", linestyle=":",
                                      label=f"max_size_mb {budgets['max_size_mb']:g}"))
        floor = _quality_floor(variants, budgets, quality_key)
        if floor is not None:
            qualities.append(floor[0])
            handles.append(ax.axhline(floor[0], color="#dd8452", linestyle=":",
                                      label=floor[1]))
        if points:
            ax.set_xlim(0.0, max(sizes) * 1.12)
            ax.set_ylim(*_fraction_limits(qualities))
        if norm is not None:
            bar = figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.02)
            if isinstance(norm, LogNorm):
                bar.ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                bar.ax.yaxis.set_minor_formatter(NullFormatter())
            bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_ms(v)))
            bar.set_label(f"estimated latency on {device} (not measured)", fontsize=8)
            bar.ax.tick_params(labelsize=7)
        chosen = (report.get("selected") or {}).get(target)
        ax.set_title(f"{target} ({device}): "
                     + (f"{chosen} selected" if chosen else "nothing selected"), fontsize=9)
        ax.set_xlabel("shipped size, MiB", fontsize=8)
        ax.set_ylabel(f"{quality_key} (measured on the evaluation data)", fontsize=8)
        ax.legend(handles=handles, fontsize=7, loc="upper center", ncol=3, frameon=False,
                  bbox_to_anchor=(0.5, -0.13))
        ax.tick_params(labelsize=7)
        panels.append((ax, target, points, norm))
    figure.suptitle("Size against quality per target: one dot per variant, coloured by its "
                    "estimated latency; budgets dotted", fontsize=10)
    figure.canvas.draw()  # the layout settles the axes' size, which the clustering reads
    for ax, target, points, norm in panels:
        _place_points(figure, ax, points, norm, cmap, (report.get("selected") or {}).get(
            target))
    return figure


def _device(variants: Mapping[str, Any], target: str) -> str:
    return next((str(v["targets"][target]["device"]) for v in variants.values()
                 if (v["targets"].get(target) or {}).get("device")), "its device")


def _clusters(ax: Any, points: Sequence[tuple[str, float, float, Any]], dpi: float
              ) -> list[list[int]]:
    """Indices of the points whose markers would overlap on `ax`, grouped (closer than
    CLUSTER_PT, transitively), each group ordered by size, groups in the points' order."""
    at = [ax.transData.transform((x, y)) * 72.0 / dpi for _, x, y, _ in points]
    group = list(range(len(points)))

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for i in range(len(points)):
        for j in range(i):
            if math.dist(at[i], at[j]) < CLUSTER_PT:
                group[root(i)] = root(j)
    clusters: dict[int, list[int]] = {}
    for i in range(len(points)):
        clusters.setdefault(root(i), []).append(i)
    return [sorted(members, key=lambda i: (points[i][1], points[i][0]))
            for members in clusters.values()]


def _place_points(figure: Any, ax: Any, points: Sequence[tuple[str, float, float, Any]],
                  norm: Any, cmap: Any, selected: str | None) -> None:
    """Each variant's dot at its own data position (size, quality); where dots would hide
    each other (sizes within a few KiB), a cluster's markers are moved apart on the screen
    only, DODGE_PT each, and its one label says so and names them left to right."""
    from matplotlib.transforms import Bbox, offset_copy

    renderer = figure.canvas.get_renderer()
    scale = figure.dpi / 72.0  # display pixels per point
    labels: list[Any] = []
    obstacles: list[Any] = []
    for members in _clusters(ax, points, figure.dpi):
        x = sum(points[i][1] for i in members) / len(members)
        y = sum(points[i][2] for i in members) / len(members)
        offsets = [(k - (len(members) - 1) / 2) * DODGE_PT for k in range(len(members))]
        centre = ax.transData.transform((x, y))
        radius = (math.sqrt(MARKER_SIZE * (4 if selected in (points[i][0] for i in members)
                                           else 1)) / 2 + 1) * scale
        lines = []
        reach = 0.0  # how far right of the cluster's centre its markers are drawn, points
        for i, dx in zip(members, offsets, strict=True):
            name, size, quality, est = points[i]
            # the data stay true; only the drawing moves, by dx points
            shifted = offset_copy(ax.transData, fig=figure, x=dx, y=0, units="points")
            color = cmap(norm(est)) if (norm is not None and est is not None) else "lightgrey"
            ax.scatter([size], [quality], s=MARKER_SIZE, color=color, edgecolors="black",
                       linewidths=0.6, zorder=3, transform=shifted, clip_on=False,
                       label=name)
            if name == selected:
                ax.scatter([size], [quality], s=MARKER_SIZE * 4, facecolors="none",
                           edgecolors="#c44e52", linewidths=2, zorder=4, transform=shifted,
                           clip_on=False)
            lines.append(f"{name}, est. {format_ms(est)}" if est is not None else name)
            drawn = ax.transData.transform((size, quality)) + (dx * scale, 0.0)
            reach = max(reach, (drawn[0] - centre[0]) / scale)
            obstacles.append(Bbox.from_extents(drawn[0] - radius, drawn[1] - radius,
                                               drawn[0] + radius, drawn[1] + radius))
        sizes = sorted(points[i][1] for i in members)
        low, high = format_size(sizes[0] * MIB), format_size(sizes[-1] * MIB)
        span = low if low == high else f"{low.removesuffix(' MiB')}–{high}"
        where = f"{len(lines)} variants at {span}\n(drawn a few points apart), left to right:"
        text = "\n".join(lines if len(lines) == 1 else [where, *lines])
        half = reach + radius / scale + 2.0  # clear of the outermost marker
        label = ax.annotate(text, (x, y), xytext=(half, 0), textcoords="offset points",
                            fontsize=7, va="center", ha="left", zorder=5,
                            arrowprops={"arrowstyle": "-", "color": "0.55", "lw": 0.6,
                                        "shrinkA": 0, "shrinkB": radius / scale},
                            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.7",
                                  "lw": 0.5, "alpha": 0.9})
        label.set_in_layout(False)  # the layout is settled; a label must not move it
        labels.append((label, half))
    placed: list[Any] = []
    axes_box = ax.get_window_extent(renderer)
    for label, half in labels:
        _clear(label, half, placed + obstacles, axes_box, renderer)
        placed.append(text_box(label, renderer))


def text_box(label: Any, renderer: Any) -> Any:
    """Where a label's text is drawn, in display pixels: without its leader line (an
    Annotation's own extent spans the line to its point too)."""
    from matplotlib.text import Annotation, Text

    if isinstance(label, Annotation):
        label.update_positions(renderer)
    return Text.get_window_extent(label, renderer)


def _clear(label: Any, half: float, taken: Sequence[Any], axes_box: Any, renderer: Any
           ) -> None:
    """Move `label` off every box in `taken`: right of its dot, else left of it, stepping
    up and down by its own height; it stays inside the axes where it can."""
    box = text_box(label, renderer)
    step = box.height * 72.0 / label.figure.dpi + 2.0
    tries = [(side, k * step * sign) for k in range(0, 8) for sign in (1, -1)
             for side in ("left", "right")]
    best = None
    for side, dy in tries:
        label.set_ha(side)
        label.xyann = (half if side == "left" else -half, dy)
        box = text_box(label, renderer)
        inside = (box.x0 >= axes_box.x0 and box.x1 <= axes_box.x1
                  and box.y0 >= axes_box.y0 and box.y1 <= axes_box.y1)
        clear = not any(box.overlaps(other) for other in taken)
        if clear and inside:
            return
        if clear and best is None:
            best = (side, dy)
    if best is not None:  # clear of the others, if not inside
        label.set_ha(best[0])
        label.xyann = (half if best[0] == "left" else -half, best[1])


def _quality_floor(variants: Mapping[str, Any], budgets: Mapping[str, Any],
                   quality_key: str) -> tuple[float, str] | None:
    """The lowest quality a budget allows, in the plot's own measure."""
    if quality_key == "accuracy" and budgets.get("max_accuracy_drop") is not None:
        sources = [v.get("source_accuracy") for v in variants.values()
                   if v.get("source_accuracy") is not None]
        if sources:
            return (sources[0] - budgets["max_accuracy_drop"],
                    f"max_accuracy_drop {budgets['max_accuracy_drop']}")
    if quality_key == "fidelity" and budgets.get("min_fidelity") is not None:
        return budgets["min_fidelity"], f"min_fidelity {budgets['min_fidelity']}"
    return None


def tradeoff(report: Mapping[str, Any]) -> bytes | None:
    figure = tradeoff_figure(report)
    return None if figure is None else png(figure)


# --- layer_errors.png


def _unique(labels: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Labels that two layers share get their op (then a count) added."""
    out = []
    for label, row in zip(labels, rows, strict=True):
        if labels.count(label) > 1:
            label = f"{label} [{row.get('op') or '?'}]"
        while label in out:
            label += "'"
        out.append(label)
    return out


def layer_error_figure(variants: Mapping[str, Any]) -> Any | None:
    measured = {name: v["layer_errors"] for name, v in variants.items()
                if v.get("layer_errors")}
    if not measured:
        return None
    shown = {name: sorted(rows, key=lambda r: r.get("rmse_over_scale") or 0.0,
                          reverse=True)[:MAX_LAYERS_SHOWN][::-1]
             for name, rows in measured.items()}
    height = max(3.2, 0.3 * max(len(rows) for rows in shown.values()) + 1.6)
    figure, axes = _grid(len(measured), width=5.6, height=height)
    for ax, (name, worst) in zip(axes, shown.items(), strict=True):
        short = layer_names([r["node"] for r in measured[name]], width=LAYER_NAME_WIDTH)
        labels = _unique([short[r["node"]] for r in worst], worst)
        values = [r.get("rmse_over_scale") or 0.0 for r in worst]
        colors = ["#c44e52" if v > FLAG_ABOVE else "#4c72b0" for v in values]
        positions = list(range(len(worst)))
        ax.barh(positions, values, color=colors)
        ax.set_yticks(positions, labels)
        for y, value in zip(positions, values, strict=True):  # a zero reads as 0.00
            ax.annotate(f"{value:.2f}", (value, y), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=7)
        ax.axvline(FLAG_ABOVE, color="#c44e52", linestyle=":", label=f"flag {FLAG_ABOVE}")
        ax.axvline(ROUNDING_ALONE, color="grey", linestyle=":",
                   label=f"rounding alone {ROUNDING_ALONE}")
        ax.set_xlim(0, max([*values, FLAG_ABOVE]) * 1.18)
        ax.set_title(f"{name}: each layer's own error (red: above {FLAG_ABOVE})", fontsize=9)
        ax.set_xlabel("rmse / quantization step (measured on representative data)",
                      fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.legend(fontsize=7, loc="lower right")
    figure.suptitle("Per-layer error of the 8-bit variants", fontsize=11)
    return figure


def layer_error_bars(variants: Mapping[str, Any]) -> bytes | None:
    figure = layer_error_figure(variants)
    return None if figure is None else png(figure)


def _wrap(text: str, width: int = 44) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def report_plots(report: Mapping[str, Any], cache: Path | None = None) -> dict[str, bytes]:
    """File name -> PNG bytes, for the pictures the report has data for. With `cache` (a
    folder): the pictures drawn for a report with the same picture_key, when there are
    some; else drawn, and kept there."""
    key = None
    if cache is not None:
        try:
            key = picture_key(report)
        except (OSError, TypeError, ValueError, AttributeError, RecursionError):
            pass  # drawn and not kept: a report the key cannot read is no failed run
    if cache is not None and key is not None:
        kept = _kept_pictures(cache, key)
        if kept is not None:
            return kept
    pictures = _PAINTER.draw(report)
    if pictures is None:  # none started, or a share failed: drawn here, as always
        variants = report["variants"]
        made = {"latency.png": latency_histograms(variants),
                "op_time.png": op_time_bars(variants), "tradeoff.png": tradeoff(report),
                "layer_errors.png": layer_error_bars(variants)}
        pictures = {name: data for name, data in made.items() if data is not None}
    if cache is not None and key is not None:
        _keep_pictures(cache, key, pictures)
    return pictures


# --- pictures kept between runs

# What changes from run to run but draws nothing: the MLflow run, the page's file list
# (set after drawing), and when each stage started and finished, cached or not (a cached
# stage reports the seconds it was computed in, as its first run did).
_NOT_DRAWN = ("mlflow_run_id", "page_files")
_NOT_DRAWN_PER_STAGE = ("started", "finished", "cached")
_NOT_DRAWN_PER_TRIAL = ("seconds",)  # a guard trial's wall time: cached or not
KEEP_PICTURES = 16  # reports whose pictures a folder keeps, the most recently used
_MANIFEST = "pictures.json"


def picture_key(report: Mapping[str, Any]) -> str:
    """A digest of everything the report's pictures are drawn from: the report (less
    `_NOT_DRAWN`), this module's and formatting's code, matplotlib's and numpy's versions
    and matplotlib's configuration files."""
    from importlib.metadata import PackageNotFoundError, version

    from orchestrator import formatting

    drawn = {k: v for k, v in report.items() if k not in _NOT_DRAWN}
    drawn["variants"] = {
        name: {**variant, "stages": [
            {k: v for k, v in stage.items() if k not in _NOT_DRAWN_PER_STAGE}
            for stage in variant.get("stages") or []], "trials": [
            {k: v for k, v in trial.items() if k not in _NOT_DRAWN_PER_TRIAL}
            for trial in variant.get("trials") or []]}
        if isinstance(variant, Mapping) else variant
        for name, variant in (report.get("variants") or {}).items()}
    digest = hashlib.sha256(json.dumps(drawn, sort_keys=True, default=repr).encode())
    for source in (__file__, formatting.__file__, *_rc_files()):
        digest.update(source.encode() + b"\0" + Path(source).read_bytes())
    for package in ("matplotlib", "numpy"):
        try:
            digest.update(f"{package}=={version(package)}".encode())
        except PackageNotFoundError:
            digest.update(f"{package} missing".encode())
    return digest.hexdigest()


def _rc_files() -> list[str]:
    """The matplotlibrc files matplotlib would read besides its own (MATPLOTLIBRC, the
    working directory's, the user's), and its font list cache, those that exist."""
    candidates = [Path("matplotlibrc")]
    if os.environ.get("MATPLOTLIBRC"):
        rc = Path(os.environ["MATPLOTLIBRC"])
        candidates += [rc, rc / "matplotlibrc"]
    home = Path.home()
    config = Path(os.environ.get("MPLCONFIGDIR") or Path(
        os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "matplotlib")
    cache = Path(os.environ.get("MPLCONFIGDIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "matplotlib")
    candidates.append(config / "matplotlibrc")
    found = [str(c.resolve()) for c in candidates if c.is_file()]
    return found + sorted(str(f) for f in cache.glob("fontlist-*.json") if f.is_file())


def _kept_pictures(cache: Path, key: str) -> dict[str, bytes] | None:
    """The pictures kept under `key`, each as written (checked by its digest); None when
    there are none, or they cannot be read whole."""
    entry = cache / key
    try:
        listed = json.loads((entry / _MANIFEST).read_text())
        pictures = {name: (entry / name).read_bytes() for name in listed}
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if any(hashlib.sha256(data).hexdigest() != listed[name]
           for name, data in pictures.items()):
        shutil.rmtree(entry, ignore_errors=True)  # damaged: this run keeps new ones
        return None
    with contextlib.suppress(OSError):
        os.utime(entry)  # recently used: the last to go (_prune)
    return pictures


def _keep_pictures(cache: Path, key: str, pictures: Mapping[str, bytes]) -> None:
    """`pictures` kept under `key`: written into a folder of their own, renamed into place
    whole (a run beside this one may keep the same). A folder that cannot be written costs
    the next run its drawing, never this run anything."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=".new-", dir=cache))
        try:
            for name, data in pictures.items():
                (folder / name).write_bytes(data)
            (folder / _MANIFEST).write_text(json.dumps(
                {name: hashlib.sha256(data).hexdigest() for name, data in pictures.items()}))
            folder.rename(cache / key)
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            return
        _prune(cache)
    except OSError:
        pass


def _prune(cache: Path, keep: int = KEEP_PICTURES) -> None:
    """The `keep` most recently used reports' pictures stay; older ones go, and so do
    folders left half written (by a run killed while writing) an hour ago."""
    entries, stale = [], time.time() - 3600
    for entry in cache.iterdir():
        try:
            used = entry.stat().st_mtime
        except OSError:
            continue
        if entry.name.startswith(".new-"):
            if used < stale:
                shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_dir():
            entries.append((used, entry))
    for _, entry in sorted(entries, reverse=True)[keep:]:
        shutil.rmtree(entry, ignore_errors=True)


# --- drawing on both cores

# The pictures in two shares of about equal drawing time: the run draws the first, a
# drawing process the second, at the same time
SHARES = (("tradeoff.png", "op_time.png"), ("latency.png", "layer_errors.png"))
DRAW_TIMEOUT_S = 300.0


def _draw(report: Mapping[str, Any], name: str) -> bytes | None:
    variants = report["variants"]
    if name == "tradeoff.png":
        return tradeoff(report)
    return {"latency.png": latency_histograms, "op_time.png": op_time_bars,
            "layer_errors.png": layer_error_bars}[name](variants)


Painter = subprocess.Popen[bytes] | zygote.ForkedProcess
PAINTER_MODULE = "orchestrator.results.plots"


class _Painter:
    """A process (`python -m orchestrator.results.plots`) that imports matplotlib as soon
    as it starts, then draws the second share of one report's pictures while the run draws
    the first."""

    def __init__(self) -> None:
        self.process: Painter | None = None

    def start(self) -> None:
        if self.process is not None:
            return
        with open(os.devnull, "wb") as devnull, contextlib.suppress(OSError):
            # a warm process forks it, where one runs; failing that, the run draws them all
            self.process = zygote.start_module(PAINTER_MODULE, helper_process.module_env(),
                                               stderr=devnull.fileno())

    def draw(self, report: Mapping[str, Any]) -> dict[str, bytes] | None:
        """The report's pictures, in the order report_plots makes them; None when no
        process was started, or either share met an error (report_plots then draws them
        all itself, one after the other, and meets the first error as it always did)."""
        process, self.process = self.process, None
        if process is None:
            return None
        helper = helper_process.Helper(process)
        try:
            with helper.exchange():
                helper.write(pickle.dumps((SHARES[1], dict(report))))
                helper.close_input()
                drawn = {name: _draw(report, name) for name in SHARES[0]}
                answer = pickle.loads(helper.read_to_end(
                    helper_process.deadline_in(DRAW_TIMEOUT_S)))
        except Exception:  # noqa: BLE001  (drawn again, in order, by report_plots)
            return None
        finally:
            helper_process.stop(process, None)
        if not isinstance(answer, dict) or set(answer) != set(SHARES[1]):
            return None  # its share met an error
        drawn.update(answer)
        order = ("latency.png", "op_time.png", "tradeoff.png", "layer_errors.png")
        return {name: data for name in order if (data := drawn[name]) is not None}

    def stop(self) -> None:
        """A process that drew nothing (a run that failed, or found its pictures kept)."""
        process, self.process = self.process, None
        if process is not None:
            helper_process.stop(process, None)


_PAINTER = _Painter()


def start_drawing() -> None:
    """Start the process that will draw half of this run's pictures (it imports matplotlib
    now, beside the run's work): for a run whose results are new."""
    _PAINTER.start()


def stop_drawing() -> None:
    """End the drawing process if it drew nothing."""
    _PAINTER.stop()


def drawing_process() -> int:
    """The drawing process: matplotlib first, then a share of one report's pictures (in
    on stdin, pickled, until it ends), out on stdout: {name: PNG or None}, or the name of
    the error a picture met (the run draws them again itself, and reports it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pyplot()
    request = sys.stdin.buffer.read()
    if not request:  # the run ended without pictures to draw
        return 0
    share, report = pickle.loads(request)
    try:
        answer: Any = {name: _draw(report, name) for name in share}
    except Exception as exc:  # noqa: BLE001  (the run's own drawing reports it)
        answer = type(exc).__name__
    sys.stdout.buffer.write(pickle.dumps(answer))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(drawing_process())
