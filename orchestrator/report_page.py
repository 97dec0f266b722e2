"""report.html: one self-contained page next to report.json (Jinja2).

The summary table, the selection per target with its reasons, where an estimate and a
measurement disagree, the warnings, the pictures of orchestrator.plots inlined as data
URIs, the per-layer diagnostics and the guard's trials. No external resource: it opens
from disk, with no server, and is logged to MLflow with the run.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

PAGE = "report.html"
PICTURES = (("Size against quality per target (estimated device latency as colour)",
             "tradeoff.png"),
            ("Latency measured on this host, per pipeline", "latency.png"),
            ("Measured time per op type", "op_time.png"),
            ("Per-layer error of the 8-bit variants", "layer_errors.png"))


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _describe_settings(settings: Mapping[str, Any] | None) -> str:
    if not settings:
        return "the recipe's own"
    parts = []
    for key, value in settings.items():
        if value in (None, [], False) and key != "eight_bit_ops":
            continue
        if isinstance(value, list):
            value = ", ".join(str(v).split(";")[0].rsplit("/", 2)[-2] if "/" in str(v)
                              else str(v) for v in value[:4]) + (
                f" and {len(value) - 4} more" if len(value) > 4 else "")
        parts.append(f"{key}: {value}")
    return "; ".join(parts) or "the recipe's own"


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


def render(report: Mapping[str, Any], images: Mapping[str, bytes]) -> bytes:
    """The page's bytes, the pictures (file name -> PNG) inlined."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("orchestrator", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.Undefined)
    template = environment.get_template("report.html.j2")
    variants = report["variants"]
    target_names = list(report.get("selected") or {})
    hosts = [v["host"] for v in variants.values() if v.get("host")]
    warnings = [(name, w) for name, v in variants.items() for w in v.get("warnings") or []]
    html = template.render(
        report=report, target_names=target_names, targets=report.get("targets") or {},
        selected_names=set(filter(None, (report.get("selected") or {}).values())),
        host=hosts[0] if hosts else None, warnings=warnings,
        disagreements=_disagreements(report),
        pictures=[(title, name) for title, name in PICTURES if name in images],
        images={name: base64.b64encode(png).decode() for name, png in images.items()},
        fmt=_fmt, describe_settings=_describe_settings)
    return html.encode()


def report_files(report: Mapping[str, Any]) -> tuple[dict[str, bytes], list[str]]:
    """(file name -> bytes: the PNGs and report.html, warnings). A picture or the page that
    cannot be made is a warning, never a failed run."""
    from orchestrator.plots import report_plots

    warnings: list[str] = []
    try:
        images = report_plots(report)
    except Exception as exc:  # noqa: BLE001  (a plot must not fail a run that succeeded)
        images = {}
        warnings.append(f"plots not drawn: {type(exc).__name__}: {exc}")
    try:
        page = render(report, images)
    except Exception as exc:  # noqa: BLE001  (likewise for the page)
        warnings.append(f"{PAGE} not written: {type(exc).__name__}: {exc}")
        return dict(images), warnings
    return {**images, PAGE: page}, warnings
