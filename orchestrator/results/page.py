"""report.html: one self-contained page next to report.json (Jinja2).

The summary table, the selection per target with its reasons, where an estimate and a
measurement disagree, the warnings, the pictures of orchestrator.results.plots inlined as data
URIs, the per-layer diagnostics and the guard's trials. No external resource: it opens
from disk, with no server, and is logged to MLflow with the run.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.model.litert_precision import DESCRIPTIONS

PAGE = "report.html"
PICTURES = (("Size against quality per target (estimated device latency as colour)",
             "tradeoff.png"),
            ("Latency measured on this host, per pipeline", "latency.png"),
            ("Measured time per op type", "op_time.png"),
            ("Per-layer error of the 8-bit variants", "layer_errors.png"))


def _describe_settings(settings: Mapping[str, Any] | None, scope: str = "") -> str:
    """A guard trial's settings in words; layer names as everywhere (formatting.layer_name
    without the variant's shared `scope`)."""
    from orchestrator.formatting import layer_name

    if not settings:
        return "the recipe's own"
    parts = []
    for key, value in settings.items():
        if value in (None, [], False) and key != "eight_bit_ops":
            continue
        if isinstance(value, list):
            value = ", ".join(layer_name(str(v), scope) for v in value[:4]) + (
                f" and {len(value) - 4} more" if len(value) > 4 else "")
        parts.append(f"{key}: {value}")
    return "; ".join(parts) or "the recipe's own"


def _scope(variant: Mapping[str, Any]) -> str:
    """The scope every layer name of the variant shares (its per-layer table's, else its
    guard trials' names): stripped the same way in every table of the page."""
    from orchestrator.formatting import shared_scope

    names = [r["node"] for r in variant.get("layer_errors") or []] or [
        str(n) for t in variant.get("trials") or [] for key in ("weights_only", "float")
        for n in (t.get("settings") or {}).get(key) or []]
    return shared_scope(names)


def _ships(report: Mapping[str, Any], out_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Per target with a selection: the file to ship, linked relative to the page, what it
    is, and the loading docs relative to the page (None when they are not on this disk)."""
    import os

    from orchestrator.results.report import LOADING_DOC, kind_words

    doc = None
    if out_dir is not None and LOADING_DOC.is_file():
        doc = Path(os.path.relpath(LOADING_DOC, out_dir.resolve())).as_posix()
    ships = {}
    for target, name in (report.get("selected") or {}).items():
        variant = report["variants"].get(name) or {} if name is not None else {}
        if variant.get("artifact"):
            ships[target] = {"path": variant["artifact"], "href": variant["artifact"],
                             "kind": kind_words(variant), "doc": doc}
    return ships


def _disagreements(report: Mapping[str, Any]) -> list[str]:
    """"<variant> for <target>" where the reasons say estimate and measurement disagree."""
    found = []
    for target, reasons in (report.get("selection_reasons") or {}).items():
        for name, why in reasons.items():
            match = re.search(r"Measured on this host it is the faster one \(([^)]*)\)", why)
            if match:
                found.append(f"{name} is estimated slower than {report['selected'][target]} "
                             f"for {target}, but measured faster on this host "
                             f"({match.group(1)})")
    return found


def render(report: Mapping[str, Any], images: Mapping[str, bytes],
           out_dir: Path | None = None) -> bytes:
    """The page's bytes, the pictures (file name -> PNG) inlined; `out_dir` (where the page
    goes) makes the link to the loading docs relative to it."""
    import jinja2

    from orchestrator.formatting import (
        SIZE_UNIT_NOTE,
        format_count,
        format_mib,
        format_ms,
        format_number,
        format_size,
        layer_names,
    )
    from orchestrator.results.report import (
        NO_TARGETS,
        PARAMS_NOTE,
        RAM_SOURCE_OF,
        broken_in,
        console_warnings,
        ram_measure,
    )

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("orchestrator.results", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.Undefined)
    template = environment.get_template("report.html.j2")
    variants = report["variants"]
    target_names = list(report.get("selected") or {})
    hosts = [v["host"] for v in variants.values() if v.get("host")]
    # every warning of the run: the stages' and those its end found (console_warnings)
    warnings = [(name, w) for name, v in variants.items() for w in v.get("warnings") or []]
    warnings += [w for w in console_warnings(report) if w not in warnings]
    diagnostics = [(name, d) for name, v in variants.items() for d in v.get("diagnostics") or []]
    broken = {name: broken_in(v) for name, v in variants.items()}
    budgets = [(report.get("targets") or {}).get(t, {}).get("budgets") or {}
               for t in target_names]
    methods = [(name, t, v["targets"][t]["estimate"]["method"]) for t in target_names
               for name, v in variants.items()
               if (v["targets"][t].get("estimate") or {}).get("method")]
    # what the RAM column's figures are: one name for all, else each cell names its own
    ram_measures = sorted({ram_measure(v) for v in variants.values()},
                          key=list(RAM_SOURCE_OF).index)
    from orchestrator.results.device_figures import EMULATED_NOTE, device_rows

    rows = device_rows(report)
    html = template.render(
        device_rows=rows, emulated_note=EMULATED_NOTE[0].upper() + EMULATED_NOTE[1:],
        device_columns=["target", "where", "variant", "board", "p50 (threads)", "first run",
                        "load, memory", "accuracy (host)", "top-1 agreement", "max abs diff",
                        "cv", "note"],
        report=report, target_names=target_names, targets=report.get("targets") or {},
        selected_names=set(filter(None, (report.get("selected") or {}).values())),
        host=hosts[0] if hosts else None, warnings=warnings, diagnostics=diagnostics,
        disagreements=_disagreements(report), broken=broken,
        show_ram=any("ram" in b for b in broken.values()) or any(
            "max_ram_mb" in b for b in budgets),
        ram_header=ram_measures[0] if len(ram_measures) == 1 else "see cells",
        ram_mixed=len(ram_measures) > 1, ram_measure=ram_measure,
        ram_notes=[RAM_SOURCE_OF[m] for m in ram_measures], no_targets=NO_TARGETS,
        methods=methods, method_number={(n, t): i + 1 for i, (n, t, _) in enumerate(methods)},
        ships=_ships(report, out_dir), size_note=SIZE_UNIT_NOTE, params_note=PARAMS_NOTE,
        pictures=[(title, name) for title, name in PICTURES if name in images],
        images={name: base64.b64encode(png).decode() for name, png in images.items()},
        fmt=format_number, ms=format_ms, count=format_count, layer_names=layer_names,
        size=lambda b: format_size(b, unit=False), mib=lambda m: format_mib(m, unit=False),
        computes_in_text=DESCRIPTIONS,
        describe_settings=lambda settings, name: _describe_settings(
            settings, _scope(variants[name])))
    return html.encode()


def report_files(report: Mapping[str, Any], out_dir: Path | None = None,
                 picture_cache: Path | None = None) -> tuple[dict[str, bytes], list[str]]:
    """(file name -> bytes: the PNGs and report.html, warnings). A picture or the page that
    cannot be made is a warning, never a failed run. `picture_cache`: the folder where the
    pictures of earlier reports are kept (plots.report_plots)."""
    from orchestrator.results.plots import report_plots

    warnings: list[str] = []
    try:
        images = report_plots(report, picture_cache)
    except Exception as exc:  # noqa: BLE001  (a plot must not fail a run that succeeded)
        images = {}
        warnings.append(f"plots not drawn: {type(exc).__name__}: {exc}")
    try:
        page = render(report, images, out_dir)
    except Exception as exc:  # noqa: BLE001  (likewise for the page)
        warnings.append(f"{PAGE} not written: {type(exc).__name__}: {exc}")
        return dict(images), warnings
    return {**images, PAGE: page}, warnings
