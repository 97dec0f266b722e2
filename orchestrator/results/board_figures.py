"""What the targets' boards measured, as the console and the page show it: one row per
connected target and variant, labelled apart from the estimates and this host's figures.

An emulated board's timings are shown, marked, but they measure qemu, not the core: its
accuracy and its agreement with this host are the figures it is there for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.formatting import format_ms, format_number
from orchestrator.measure.budgets import agreement_with_host

EMULATED_NOTE = ("emulated: qemu runs the Arm kernels, so accuracy and agreement are the "
                 "board's; its timings are qemu's, not the core's, and decide nothing")
COLUMNS = ("variant", "p50 (threads)", "first run", "load, memory", "accuracy (host)",
           "fidelity", "agreement with host", "max abs diff", "cv")
# the page's table: every target's rows in one
PAGE_COLUMNS = ("target", "where", "variant", "board", *COLUMNS[1:], "note")
FIGURES_NOTE = ("accuracy: of the board's outputs (this host's, same file); fidelity: the "
                "board's outputs against the float source model's, as evaluate measures it "
                "on this host; agreement with host (top-1, else 1 - noise/signal energy), "
                "max abs diff: the board's outputs against this host's for the same file; "
                "cv: std/mean of the timed runs")


def connected_targets(report: Mapping[str, Any]) -> list[str]:
    """Targets that some variant was measured for on a board."""
    found: list[str] = []
    for variant in report.get("variants", {}).values():
        for target, result in variant.get("targets", {}).items():
            if result.get("measured") and target not in found:
                found.append(target)
    return found


def board_rows(report: Mapping[str, Any]) -> list[dict[str, str]]:
    rows = []
    for target in connected_targets(report):
        for name, variant in report["variants"].items():
            measured = variant["targets"].get(target, {}).get("measured")
            if not measured:
                continue
            board = measured.get("board") or {}
            row = {"target": target, "where": measured.get("where", ""), "variant": name,
                   "board": " ".join(str(p) for p in (board.get("machine"), board.get("cpu"))
                                     if p)}
            if not measured.get("measured"):
                row["note"] = f"not measured: {measured.get('reason')}"
                rows.append(row)
                continue
            latency = measured["latency_ms"]
            emulated = measured.get("emulated")
            load = measured.get("load") or {}
            outputs = measured.get("outputs") or {}
            worst = max((o.get("max_abs_diff", 0.0) for o in outputs.values()), default=None)
            row.update({
                "p50 (threads)": f"{format_ms(latency['p50'])} ({measured.get('threads')})",
                "first run": format_ms(latency.get("first")),
                "load, memory": (format_ms(load["load_ms"]) if "load_ms" in load else "-") + (
                    f", +{load['rss_growth_mb']:.1f} MiB" if "rss_growth_mb" in load else ""),
                "accuracy (host)": f"{format_number(measured.get('accuracy'), '.4f')} ("
                                   f"{format_number(measured.get('host_accuracy'), '.4f')})",
                "fidelity": format_number(_source_fidelity(measured), ".4f"),
                "agreement with host": format_number(agreement_with_host(measured), ".4f"),
                "max abs diff": "-" if worst is None else f"{worst:.3g}",
                "cv": format_number(latency.get("cv"), ".2f"),
                "note": ", ".join(filter(None, (
                    "emulated" if emulated else "",
                    f"threads capped at the board's {board.get('cores')} cores (asked "
                    f"{measured['threads_capped_from']})"
                    if measured.get("threads_capped_from") else "")))})
            rows.append(row)
    return rows


def _source_fidelity(measured: Mapping[str, Any]) -> float | None:
    """Fidelity to the float source model (before issue 39 a report's board `fidelity` was
    its agreement with this host: not shown as fidelity)."""
    return measured.get("fidelity") if "agreement_with_host" in measured else None


def capped_lines(report: Mapping[str, Any], target: str) -> list[str]:
    """Where the board has fewer cores than the thread settings asked: what it timed."""
    lines = []
    for name, variant in report.get("variants", {}).items():
        measured = (variant.get("targets", {}).get(target) or {}).get("measured") or {}
        if measured.get("threads_capped_from"):
            timed = ", ".join(str(row["threads"]) for row in measured.get("threads_matrix", []))
            lines.append(f"{name}: threads capped at the board's "
                         f"{(measured.get('board') or {}).get('cores')} cores (asked up to "
                         f"{measured['threads_capped_from']}; timed {timed})")
    return lines


def print_board_table(report: Mapping[str, Any], console: Any, prose: Mapping[str, Any]
                       ) -> None:
    """Per connected target, a table of what its board measured, the variants it could
    not measure with the reason, and what the target's budgets and selection read."""
    rows = board_rows(report)
    if not rows:
        return
    from rich.markup import escape
    from rich.table import Table

    for target in connected_targets(report):
        mine = [row for row in rows if row["target"] == target]
        measured = [row for row in mine if "not measured" not in row.get("note", "")]
        first = mine[0]
        emulated = any("emulated" in row.get("note", "") for row in measured)
        title = (f"measured on {target}'s board: {first['where']}, {first['board']}"
                 + (" (emulated)" if emulated else ""))
        if measured:
            table = Table(title=title)
            for column in COLUMNS:
                table.add_column(column, justify="left" if column == "variant" else "right")
            for row in measured:
                table.add_row(*(escape(row.get(c, "")) for c in COLUMNS))
            console.print(table)
        else:
            console.print(escape(title), **prose)
        unmeasured: dict[str, list[str]] = {}
        for row in mine:
            if row not in measured:
                unmeasured.setdefault(row["note"], []).append(row["variant"])
        notes = [f"{', '.join(names)}: {why}" for why, names in unmeasured.items()]
        notes += capped_lines(report, target)
        if measured:
            notes.append(FIGURES_NOTE)
        if emulated:
            notes.append(EMULATED_NOTE)
        basis = (report.get("selection_basis") or {}).get(target)
        if basis:
            notes.append(f"{target}'s budgets and selection read: {basis}")
        for note in notes:
            console.print(f"  [dim]{escape(note)}[/]", **prose)
