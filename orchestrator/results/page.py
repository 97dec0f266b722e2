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
from orchestrator.results.host_comparison import below_host

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
        elif isinstance(value, bool):  # as the recipe writes it
            value = str(value).lower()
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


# budget key -> (what it bounds, the comparison, the unit): a budget as a person reads it
_BUDGET_WORDS = {
    "max_size_mb": ("size", "≤", " MiB"), "max_ram_mb": ("RAM", "≤", " MiB"),
    "max_latency_ms": ("latency", "≤", " ms"), "max_accuracy_drop": ("accuracy drop", "≤", ""),
    "min_fidelity": ("fidelity", "≥", ""),
    "min_sqnr_db": ("SQNR of every output but class scores", "≥", " dB"),
    "min_device_agreement": ("top-1 agreement, board against this host", "≥", "")}
_OUTPUT_BUDGET_WORDS = {"min_sqnr_db": ("SQNR", "≥", " dB"), "min_cosine": ("cosine", "≥", ""),
                        "max_abs_error": ("abs error", "≤", ""),
                        "min_agreement": ("agreement", "≥", "")}


def _bound(words: tuple[str, str, str], value: Any) -> str:
    what, compare, unit = words
    shown = f"{value:g}" if isinstance(value, int | float) else str(value)
    return f"{what} {compare} {shown}{unit}"


def budget_words(budgets: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(recipe key, words) per budget, e.g. ("max_size_mb", "size ≤ 1 MiB"),
    ("outputs.output_0.min_sqnr_db", "output_0: SQNR ≥ 39 dB"); a key this page does not
    know is shown as `key: value`."""
    shown = []
    for key, value in (budgets or {}).items():
        if value is None:
            continue
        if key == "outputs" and isinstance(value, Mapping):
            for output, bounds in value.items():
                for name, bound in (bounds or {}).items() if isinstance(bounds, Mapping) \
                        else [("", bounds)]:
                    if bound is None:
                        continue
                    words = _OUTPUT_BUDGET_WORDS.get(name)
                    shown.append((f"outputs.{output}.{name}",
                                  f"{output}: " + (_bound(words, bound) if words
                                                   else f"{name}: {bound}")))
        elif key in _BUDGET_WORDS:
            shown.append((key, _bound(_BUDGET_WORDS[key], value)))
        else:
            shown.append((key, f"{key}: {value}"))
    return shown


def method_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per variant and target whose estimate says how it was made: the figure,
    its two terms, the method in a few words, the full method text."""
    from orchestrator.formatting import format_ms
    from orchestrator.measure.cost_model import RUNTIMES
    from orchestrator.measure.estimates import RUNTIME_NAMES

    rows = []
    targets = report.get("targets") or {}
    for target in report.get("selected") or {}:
        for name, variant in report["variants"].items():
            result = variant["targets"].get(target) or {}
            made = result.get("estimate") or {}
            if not made.get("method"):
                continue
            if made.get("overhead_ms") is None:
                how = "FLOPs at the device's rate only (no benchmark stage)"
            elif made.get("top_ops"):
                threads = int(made.get("threads") or 1)
                chosen = ("the target's" if made.get("threads_from") == "target"
                          else "its big cores")
                runtime = RUNTIMES.get(str(made.get("priced_as")), str(made.get("priced_as")))
                how = (f"{threads} thread{'s' if threads > 1 else ''} ({chosen}), ops priced "
                       f"for {runtime}")
            else:  # a report from before per-op estimates
                runtime = RUNTIME_NAMES.get(str(made.get("runtime")), "runtime")
                how = (f"FLOPs at the device's rate + {runtime} overhead measured here "
                       f"×{made.get('device_slowdown', 0):.3g}")
            error = made.get("expected_error") or {}
            rows.append({
                "variant": name, "target": target,
                "device": (targets.get(target) or {}).get("device") or result.get("device"),
                "estimate": format_ms(result.get("est_latency_ms")),
                "compute": format_ms(made.get("compute_ms")),
                "overhead": format_ms(made.get("overhead_ms")),
                "host": format_ms((variant.get("latency_ms") or {}).get("p50")),
                "below_host": below_host(variant, target),
                "how": how, "method": made["method"],
                "expected_error": ("not measured" if error.get("unmeasured")
                                   else f"{float(error['p80_factor']):.2f}x"
                                   if error.get("p80_factor") else ""),
                "expected_error_text": error.get("text", ""),
                "top_ops": [{**op, "ms": format_ms(op.get("ms")),
                             "share": f"{100 * float(op.get('share') or 0):.0f} %"}
                            for op in made.get("top_ops") or []]})
    return rows


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
    methods = method_rows(report)
    # what the RAM column's figures are: one name for all, else each cell names its own
    ram_measures = sorted({ram_measure(v) for v in variants.values()},
                          key=list(RAM_SOURCE_OF).index)
    from orchestrator.results.board_figures import (
        EMULATED_NOTE,
        FIGURES_NOTE,
        PAGE_COLUMNS,
        board_rows,
    )

    rows = board_rows(report)
    html = template.render(
        board_rows=rows, emulated_note=EMULATED_NOTE[0].upper() + EMULATED_NOTE[1:],
        board_columns=list(PAGE_COLUMNS), board_note=FIGURES_NOTE[0].upper() + FIGURES_NOTE[1:],
        report=report, target_names=target_names, targets=report.get("targets") or {},
        selected_names=set(filter(None, (report.get("selected") or {}).values())),
        host=hosts[0] if hosts else None, warnings=warnings, diagnostics=diagnostics,
        disagreements=_disagreements(report), broken=broken,
        show_ram=any("ram" in b for b in broken.values()) or any(
            "max_ram_mb" in b for b in budgets),
        ram_header=ram_measures[0] if len(ram_measures) == 1 else "see cells",
        ram_mixed=len(ram_measures) > 1, ram_measure=ram_measure,
        ram_notes=[RAM_SOURCE_OF[m] for m in ram_measures], no_targets=NO_TARGETS,
        methods=methods, method_number={(m["variant"], m["target"]): i + 1
                                        for i, m in enumerate(methods)},
        budget_words=budget_words, below_host=below_host,
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
