"""The report's pictures, as PNG bytes, from report.json alone (matplotlib, no display).

- `latency.png`: a histogram of the host's measured run times per pipeline;
- `op_time.png`: measured time per op type per pipeline, from the benchmark's profile;
- `tradeoff.png`: per target, size against accuracy (or fidelity) of every variant, each
  marked with its *estimated* device latency, the target's budget lines, the selected one
  ringed;
- `layer_errors.png`: per 8-bit variant, each layer's own error (rmse/scale) as the
  diagnostics measured it, flagged layers in red.

Measured figures (the host's) and estimates (FLOPs on the device) are named apart in
every title and axis. Nothing here is imported by a stage.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

# A layer's error above this many quantization steps is flagged (see layer_errors).
FLAG_ABOVE = 0.7
ROUNDING_ALONE = 0.29  # 1/sqrt(12): the error of rounding alone
MAX_LAYERS_SHOWN = 20
MAX_OP_TYPES_SHOWN = 8


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(figure)
    return buffer.getvalue()


def _grid(count: int, width: float = 4.2, height: float = 2.8) -> tuple[Any, list[Any]]:
    plt = pyplot()
    columns = min(count, 3)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows),
                                squeeze=False, layout="constrained")
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return figure, flat[:count]


def latency_histograms(variants: Mapping[str, Any]) -> bytes | None:
    measured = {name: v["latency_runs_ms"] for name, v in variants.items()
                if v.get("latency_runs_ms")}
    if not measured:
        return None
    figure, axes = _grid(len(measured))
    for ax, (name, runs) in zip(axes, measured.items(), strict=True):
        stats = variants[name].get("latency_ms") or {}
        ax.hist(runs, bins=min(30, max(5, len(runs) // 3)), color="#4c72b0")
        if stats.get("p50") is not None:
            ax.axvline(stats["p50"], color="#c44e52", linestyle="--",
                       label=f"p50 {stats['p50']:.3f} ms")
            ax.legend(fontsize=8)
        threads = variants[name].get("threads")
        ax.set_title(f"{name}: {len(runs)} runs, {threads} thread(s)", fontsize=9)
        ax.set_xlabel("host latency, ms (measured)", fontsize=8)
        ax.set_ylabel("runs", fontsize=8)
    figure.suptitle("Latency measured on this host, per pipeline", fontsize=11)
    return _png(figure)


def op_time_bars(variants: Mapping[str, Any]) -> bytes | None:
    profiled = {name: v["profile"] for name, v in variants.items() if v.get("profile")}
    if not profiled:
        return None
    figure, axes = _grid(len(profiled), height=3.2)
    for ax, (name, profile) in zip(axes, profiled.items(), strict=True):
        rows = (profile.get("by_node_type") or [])[:MAX_OP_TYPES_SHOWN]
        if not rows:
            ax.text(0.5, 0.5, "no per-op profile:\n" + _wrap(profile.get("note") or ""),
                    ha="center", va="center", fontsize=8, transform=ax.transAxes)
            ax.set_axis_off()
            ax.set_title(name, fontsize=9)
            continue
        labels = [r["node type"] for r in rows][::-1]
        values = [r["avg ms"] for r in rows][::-1]
        ax.barh(labels, values, color="#55a868")
        ax.set_title(f"{name}: time per op type", fontsize=9)
        ax.set_xlabel("ms per run, measured (step stats)", fontsize=8)
        ax.tick_params(labelsize=7)
    figure.suptitle("Where the time goes, measured on this host", fontsize=11)
    return _png(figure)


def tradeoff(report: Mapping[str, Any]) -> bytes | None:
    variants = report["variants"]
    targets = report.get("targets") or {}
    names = list(targets) or sorted({t for v in variants.values() for t in v["targets"]})
    if not names:
        return None
    use_accuracy = any(v.get("accuracy") is not None for v in variants.values())
    quality_key = "accuracy" if use_accuracy else "fidelity"
    figure, axes = _grid(len(names), width=5.0, height=3.8)
    plt = pyplot()
    for ax, target in zip(axes, names, strict=True):
        estimates = [v["targets"][target]["est_latency_ms"] for v in variants.values()
                     if v["targets"].get(target, {}).get("est_latency_ms") is not None]
        norm = plt.Normalize(min(estimates), max(estimates)) if estimates else None
        placed: list[tuple[float, float]] = []  # labels of points that coincide stack up
        for name, v in variants.items():
            quality = v.get(quality_key)
            if quality is None:
                continue
            size_kib = v["size_bytes"] / 1024
            est = v["targets"].get(target, {}).get("est_latency_ms")
            color = plt.cm.viridis(norm(est)) if (norm and est is not None) else "grey"
            ax.scatter([size_kib], [quality], s=60, color=color, zorder=3)
            label = name + (f", est. {est:.3f} ms" if est is not None else "")
            near = sum(1 for x, y in placed if abs(x - size_kib) <= 0.05 * max(x, size_kib)
                       and abs(y - quality) <= 0.002)
            placed.append((size_kib, quality))
            ax.annotate(label, (size_kib, quality), fontsize=7, xytext=(6, 4 + 10 * near),
                        textcoords="offset points")
            if (report.get("selected") or {}).get(target) == name:
                ax.scatter([size_kib], [quality], s=260, facecolors="none",
                           edgecolors="#c44e52", linewidths=2, zorder=4,
                           label="selected")
        budgets = (targets.get(target) or {}).get("budgets") or {}
        if budgets.get("max_size_mb") is not None:
            ax.axvline(budgets["max_size_mb"] * 1024, color="#c44e52", linestyle=":",
                       label=f"max_size_mb {budgets['max_size_mb']}")
        floor = _quality_floor(variants, budgets, quality_key)
        if floor is not None:
            ax.axhline(floor[0], color="#dd8452", linestyle=":", label=floor[1])
        device = (targets.get(target) or {}).get("device", "")
        ax.set_title(f"{target} ({device}): colour = est. latency (from FLOPs)", fontsize=9)
        ax.set_xlabel("shipped size, KiB", fontsize=8)
        ax.set_ylabel(f"{quality_key} (measured on the evaluation data)", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
        ax.tick_params(labelsize=7)
    figure.suptitle("Size against quality per target; budgets dotted", fontsize=11)
    return _png(figure)


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


def layer_error_bars(variants: Mapping[str, Any]) -> bytes | None:
    measured = {name: v["layer_errors"] for name, v in variants.items()
                if v.get("layer_errors")}
    if not measured:
        return None
    figure, axes = _grid(len(measured), width=5.5, height=4.0)
    for ax, (name, rows) in zip(axes, measured.items(), strict=True):
        worst = sorted(rows, key=lambda r: r.get("rmse_over_scale") or 0.0,
                       reverse=True)[:MAX_LAYERS_SHOWN][::-1]
        labels = [_short(r["node"]) for r in worst]
        values = [r.get("rmse_over_scale") or 0.0 for r in worst]
        colors = ["#c44e52" if v > FLAG_ABOVE else "#4c72b0" for v in values]
        ax.barh(labels, values, color=colors)
        ax.axvline(FLAG_ABOVE, color="#c44e52", linestyle=":", label=f"flag {FLAG_ABOVE}")
        ax.axvline(ROUNDING_ALONE, color="grey", linestyle=":",
                   label=f"rounding alone {ROUNDING_ALONE}")
        ax.set_title(f"{name}: each layer's own error (red: flagged)", fontsize=9)
        ax.set_xlabel("rmse / quantization step (measured on representative data)",
                      fontsize=8)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=7, loc="lower right")
    figure.suptitle("Per-layer error of the 8-bit variants", fontsize=11)
    return _png(figure)


def _short(node: str, width: int = 38) -> str:
    name = node.split(";")[0]
    return name if len(name) <= width else "…" + name[-(width - 1):]


def _wrap(text: str, width: int = 44) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def report_plots(report: Mapping[str, Any]) -> dict[str, bytes]:
    """File name -> PNG bytes, for the pictures the report has data for."""
    variants = report["variants"]
    made = {"latency.png": latency_histograms(variants), "op_time.png": op_time_bars(variants),
            "tradeoff.png": tradeoff(report), "layer_errors.png": layer_error_bars(variants)}
    return {name: png for name, png in made.items() if png is not None}
