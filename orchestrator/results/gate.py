"""The CI gate: compare a run's report.json with a baseline, per variant and target.

A baseline is another report.json (the same recipe run on the base branch) or the report of
a registered model version (`registry:NAME@ALIAS`). Each limit is a growth or a drop
relative to the baseline; `None` disables it. Nothing here runs a model: the gate reads
two reports and says which limits a change breaks.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.formatting import SIZE_UNIT_NOTE, apart, format_ms, format_number, format_size
from orchestrator.limits import name_problem
from orchestrator.measure.budgets import agreement_with_host

MAX_REPORT_BYTES = 64 * 1024 * 1024  # a digits report is ~13 KB; a trials table adds little
REGISTRY_PREFIX = "registry:"
# MLflow's own rule for aliases (mlflow.utils.validation): ASCII word characters and '-'
ALIAS_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,255}")


@dataclass(frozen=True)
class Limits:
    """What a change may cost against its baseline. None disables a limit.

    The defaults: shipped bytes may grow 10 %; accuracy and fidelity may drop 0.01 (one
    sample in a hundred); latency may grow 25 %. A measured (host) p50 that moves by less
    than `min_latency_change_ms` is timer noise and never breaks the limit. An estimated
    latency is FLOPs over the device's FLOP/s (deterministic) plus the runtime's cost
    measured on the host and scaled to the device (orchestrator.measure.estimates): its noise floor
    is `min_latency_change_ms` times that scale (none for a FLOPs-only estimate)."""

    max_size_growth_pct: float | None = 10.0
    max_accuracy_drop: float | None = 0.01
    max_fidelity_drop: float | None = 0.01
    max_latency_growth_pct: float | None = 25.0
    min_latency_change_ms: float = 1.0


@dataclass
class Row:
    """One compared figure: a variant's size, accuracy, fidelity, or latency (measured on
    the host, or estimated for a target)."""

    variant: str
    metric: str
    baseline: str
    current: str
    change: str
    limit: str
    status: str  # "ok", "broken", "n/a" (not comparable), "-" (no limit)
    reason: str = ""
    described: str = ""  # the figure in a sentence, for the reason


def _row(variant: str, metric: str, described: str) -> Row:
    return Row(variant, metric, "", "", "", "", "", described=described)


@dataclass
class GateResult:
    recipe: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def broken(self) -> list[Row]:
        return [r for r in self.rows if r.status == "broken"]

    @property
    def passed(self) -> bool:
        return not self.broken


# ---- reading reports ---------------------------------------------------------------------

def _bad(source: str, where: str, message: str) -> OrchestratorError:
    return OrchestratorError(message, file=source, field=where)


def _number(value: Any, source: str, where: str, *, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(source, where, f"expected a finite number{' or null' if optional else ''}, "
                                  f"found {json.dumps(value)[:40]}")
    return float(value)


def _mapping(value: Any, source: str, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _bad(source, where, f"expected an object, found {type(value).__name__}")
    return value


def check_report(data: Any, source: str) -> dict[str, Any]:
    """The fields the gate reads, checked: a report.json (SPEC) of at least one variant.
    Raises OrchestratorError (exit 2) naming `source` and the field."""
    report = _mapping(data, source, "(top level)")
    variants = _mapping(report.get("variants"), source, "variants")
    if not variants:
        raise _bad(source, "variants", "no variants: the run reported nothing to compare")
    for name, variant in variants.items():
        where = f"variants.{name}"
        _mapping(variant, source, where)
        if "size_bytes" not in variant:
            raise _bad(source, f"{where}.size_bytes", "missing")
        _number(variant["size_bytes"], source, f"{where}.size_bytes", optional=False)
        for key in ("accuracy", "fidelity"):
            _number(variant.get(key), source, f"{where}.{key}")
        latency = variant.get("latency_ms")
        if latency is not None:
            _number(_mapping(latency, source, f"{where}.latency_ms").get("p50"), source,
                    f"{where}.latency_ms.p50")
        for target, facts in _mapping(variant.get("targets", {}), source,
                                      f"{where}.targets").items():
            _number(_mapping(facts, source, f"{where}.targets.{target}").get("est_latency_ms"),
                    source, f"{where}.targets.{target}.est_latency_ms")
    if "recipe" in report and not isinstance(report["recipe"], str):
        raise _bad(source, "recipe", f"expected a string, found {type(report['recipe']).__name__}")
    return dict(report)


def load_report(path: Path) -> dict[str, Any]:
    """A report.json file, read and checked (exit 2 naming the file, line and field)."""
    from orchestrator.paths import read_regular_file

    try:
        raw = read_regular_file(path, MAX_REPORT_BYTES)
    except ValueError as exc:
        raise OrchestratorError(f"cannot read the report: {exc}", file=str(path)) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise OrchestratorError(f"not UTF-8 text (byte {exc.start})", file=str(path)) from None
    except json.JSONDecodeError as exc:
        raise OrchestratorError(f"not JSON: {exc.msg}", file=str(path), line=exc.lineno,
                                column=exc.colno) from None
    return check_report(data, str(path))


def parse_registry_ref(text: str) -> tuple[str, str]:
    """`registry:NAME@ALIAS` -> (NAME, ALIAS); exit 2 saying what is wrong."""
    body = text.removeprefix(REGISTRY_PREFIX)
    name, sep, alias = body.rpartition("@")
    if not sep:
        raise OrchestratorError(f"bad registry reference {text!r}: expected "
                                "registry:NAME@ALIAS, e.g. registry:digits-cnn@production")
    problem = name_problem(name)
    if problem:
        raise OrchestratorError(f"bad registry reference {text!r}: model name: {problem}")
    if not ALIAS_PATTERN.fullmatch(alias):
        raise OrchestratorError(f"bad registry reference {text!r}: alias {alias!r}: use 1-255 "
                                "letters, digits, '_' and '-'")
    return name, alias


def registry_tracking_uri(report: Mapping[str, Any], report_path: Path) -> str:
    """MLFLOW_TRACKING_URI, else the mlruns/ of the project the report's recipe lives in
    (of the report file itself when the recipe is no longer there)."""
    from orchestrator.cache.project import project_root, tracking_uri

    recipe = report.get("recipe_path")
    anchor = Path(recipe) if isinstance(recipe, str) and os.path.exists(recipe) else report_path
    return tracking_uri(project_root(anchor))


def load_baseline(ref: str, report: Mapping[str, Any], report_path: Path,
                  version_report: Callable[[str, str, str], Mapping[str, Any]]
                  ) -> dict[str, Any]:
    """The baseline report: a report.json path, or `registry:NAME@ALIAS`, the report of
    the model version that alias points to, as `version_report(name, alias, tracking_uri)`
    reads it (the Model Registry's, which the command passes in: tracking/ is above)."""
    if not ref.startswith(REGISTRY_PREFIX):
        return load_report(Path(ref))
    name, alias = parse_registry_ref(ref)
    data = version_report(name, alias, registry_tracking_uri(report, report_path))
    return check_report(data, ref)


# ---- comparing -------------------------------------------------------------------------

def _pct(base: float, new: float) -> float:
    if base == 0:
        return 0.0 if new == 0 else math.inf
    return (new - base) / base * 100.0


def _fmt_pct(value: float) -> str:
    return "+inf %" if math.isinf(value) else f"{value:+.1f} %"


def _limit_text(value: float | None, template: str) -> str:
    return "none" if value is None else template.format(value)


def _compare_growth(row: Row, base: float | None, new: float | None, limit: float | None,
                    show: Callable[[float, int], str], floor: float = 0.0) -> Row:
    """Fill `row` for a figure that must not grow more than `limit` percent, shown as
    everywhere (formatting: MiB, µs/ms with 3 significant digits, more where two differ)."""
    row.baseline = "-" if base is None else show(base, 3)
    row.current = "-" if new is None else show(new, 3)
    if base is not None and new is not None:
        row.baseline, row.current = apart(base, new, show)
    row.limit = _limit_text(limit, "max +{:g} %")
    if new is None or base is None:
        return _missing(row, base, limit)
    growth = _pct(base, new)
    broken = limit is not None and growth > limit and new - base >= floor
    return _settle(row, _fmt_pct(growth), broken, "-" if limit is None else "ok",
                   lambda: _over(row, f"grew {_fmt_pct(growth)}", f"+{limit:g} %"))


def _compare_drop(row: Row, base: float | None, new: float | None, limit: float | None
                  ) -> Row:
    """Fill `row` for a quality figure that must not drop more than `limit`."""
    row.baseline = format_number(base, ".4f")
    row.current = format_number(new, ".4f")
    row.limit = _limit_text(limit, "max -{:g}")
    if new is None or base is None:
        return _missing(row, base, limit)
    # the figures are ratios of counts: no float slop
    broken = limit is not None and base - new > limit + 1e-12
    return _settle(row, f"{new - base:+.4f}", broken, "-" if limit is None else "ok",
                   lambda: _over(row, f"dropped {base - new:.4f}", f"{limit:g}"))


def _missing(row: Row, base: float | None, limit: float | None) -> Row:
    # a change that stops measuring a gated figure must not pass the gate unseen
    return _settle(row, "-", base is not None and limit is not None, "n/a", lambda: (
        f"{row.described} is not measured in this run (the baseline has {row.baseline}): "
        "keep the stage that measures it"))


def _over(row: Row, moved: str, limit: str) -> str:
    return f"{row.described} {moved} ({row.baseline} -> {row.current}), over the limit of {limit}"


def _settle(row: Row, change: str, broken: bool, otherwise: str, reason: Callable[[], str]
            ) -> Row:
    """The row's change and status: "broken" with `reason()`, else `otherwise` ("ok", or
    "-" without a limit, or "n/a")."""
    row.change = change
    row.status = "broken" if broken else otherwise
    if broken:
        row.reason = reason()
    return row


def _p50(variant: Mapping[str, Any]) -> float | None:
    latency = variant.get("latency_ms")
    return None if latency is None else latency.get("p50")


def _est(variant: Mapping[str, Any], target: str) -> float | None:
    facts = variant.get("targets", {}).get(target)
    return None if facts is None else facts.get("est_latency_ms")


def _est_floor(variant: Mapping[str, Any], target: str, limits: Limits) -> float:
    """The timer noise an estimate carries: its host-measured part, scaled to the device."""
    made = (variant.get("targets", {}).get(target) or {}).get("estimate") or {}
    scale = made.get("device_slowdown") if made.get("overhead_ms") is not None else None
    return limits.min_latency_change_ms * float(scale) if isinstance(scale, int | float) else 0.0


def compare(report: Mapping[str, Any], baseline: Mapping[str, Any], limits: Limits,
            report_name: str = "the report", baseline_name: str = "the baseline"
            ) -> GateResult:
    """Every figure of every variant of `report` against the same variant of `baseline`
    (both checked by check_report). Raises OrchestratorError (exit 2) when the baseline
    lacks one of the report's variants."""
    variants, base_variants = report["variants"], baseline["variants"]
    lacking = [name for name in variants if name not in base_variants]
    if lacking:
        raise OrchestratorError(
            f"the baseline {baseline_name} lacks variant {', '.join(map(repr, lacking))} of "
            f"{report_name} (the baseline has {', '.join(sorted(base_variants))}): run the "
            "baseline with the same pipelines")
    result = GateResult(recipe=str(report.get("recipe", "?")))
    if baseline.get("recipe") not in (None, report.get("recipe")):
        result.notes.append(f"the baseline is recipe {baseline['recipe']!r}, this run "
                            f"{report.get('recipe')!r}")
    dropped = sorted(set(base_variants) - set(variants))
    if dropped:
        result.notes.append(f"not in this run, not compared: {', '.join(dropped)}")
    for name, new in variants.items():
        base = base_variants[name]
        row = _row(name, "size", "size (shipped file)")
        result.rows.append(_compare_growth(row, base["size_bytes"], new["size_bytes"],
                                           limits.max_size_growth_pct, format_size))
        for key, limit in (("accuracy", limits.max_accuracy_drop),
                           ("fidelity", limits.max_fidelity_drop)):
            row = _row(name, key, key)
            result.rows.append(_compare_drop(row, base.get(key), new.get(key), limit))
        row = _row(name, "host p50 (measured)", "measured latency (host p50)")
        result.rows.append(_compare_growth(row, _p50(base), _p50(new),
                                           limits.max_latency_growth_pct, format_ms,
                                           floor=limits.min_latency_change_ms))
        for target in new.get("targets", {}):
            device = new["targets"][target].get("device")
            row = _row(name, f"{target} latency (est.)", f"estimated latency on {target}"
                       + (f" ({device})" if device else ""))
            if target not in base.get("targets", {}):
                est = _est(new, target)
                row.baseline, row.change, row.status = "-", "-", "n/a"
                row.current = format_ms(est)
                row.limit = "new target"
                result.rows.append(row)
                continue
            result.rows.append(_compare_growth(row, _est(base, target), _est(new, target),
                                               limits.max_latency_growth_pct, format_ms,
                                               floor=_est_floor(new, target, limits)))
            result.rows.extend(_device_rows(name, target, base, new, limits))
    result.notes.extend(_selection_notes(report, baseline))
    return result


def _on_board(variant: Mapping[str, Any], target: str) -> Mapping[str, Any] | None:
    measured = (variant.get("targets", {}).get(target) or {}).get("measured")
    return measured if measured and measured.get("measured") else None


def _device_rows(name: str, target: str, base: Mapping[str, Any], new: Mapping[str, Any],
                 limits: Limits) -> list[Row]:
    """The target's board figures, where both runs measured the variant there: accuracy
    and agreement with the host on the board, and its latency where the board is real
    (an emulated board's timings are qemu's)."""
    mine, theirs = _on_board(new, target), _on_board(base, target)
    if mine is None or theirs is None:
        return []
    rows = [_compare_drop(_row(name, f"{target} accuracy (board)",
                               f"accuracy on {target}'s board"),
                          theirs.get("accuracy"), mine.get("accuracy"),
                          limits.max_accuracy_drop),
            _compare_drop(_row(name, f"{target} agreement (board)",
                               f"top-1 agreement of {target}'s board with the host"),
                          agreement_with_host(theirs), agreement_with_host(mine),
                          limits.max_fidelity_drop)]
    if not mine.get("emulated") and not theirs.get("emulated"):
        rows.append(_compare_growth(
            _row(name, f"{target} p50 (board)", f"latency measured on {target}'s board (p50)"),
            theirs["latency_ms"]["p50"], mine["latency_ms"]["p50"],
            limits.max_latency_growth_pct, format_ms, floor=limits.min_latency_change_ms))
    return rows


def _selection_notes(report: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
    """Per target, which variant the run selected (a budget change shows up here)."""
    new, base = report.get("selected") or {}, baseline.get("selected") or {}
    if not isinstance(new, Mapping) or not isinstance(base, Mapping):
        return []
    notes = []
    for target, chosen in new.items():
        before = base.get(target, "-")
        shown = chosen or "none (no variant within budgets)"
        if target in base and before != chosen:
            notes.append(f"{target}: selected {before or 'none'} -> {shown}")
        else:
            notes.append(f"{target}: selected {shown}")
    return notes


# ---- Markdown --------------------------------------------------------------------------

def verdict(result: GateResult) -> str:
    count = len(result.broken)
    return ("passed: every figure within its limit" if result.passed
            else f"FAILED: {count} limit{'s' if count != 1 else ''} broken")


def limits_text(limits: Limits) -> str:
    """The limits in force, as one line."""
    show = _limit_text
    return (f"size growth {show(limits.max_size_growth_pct, '<= +{:g} %')}, accuracy drop "
            f"{show(limits.max_accuracy_drop, '<= {:g}')}, fidelity drop "
            f"{show(limits.max_fidelity_drop, '<= {:g}')}, latency growth "
            f"{show(limits.max_latency_growth_pct, '<= +{:g} %')} (measured changes under "
            f"{limits.min_latency_change_ms:g} ms are timer noise)")


def to_markdown(result: GateResult, limits: Limits, report_name: str, baseline_name: str
                ) -> str:
    """The comparison as a pull-request comment."""
    lines = [f"## Model gate: {result.recipe}: {verdict(result)}", "",
             f"`{report_name}` against the baseline `{baseline_name}`.", "",
             f"Limits: {limits_text(limits)}. Sizes: {SIZE_UNIT_NOTE}.", ""]
    if result.broken:
        lines += ["**Broken:**", ""]
        lines += [f"- {r.variant}: {r.reason}" for r in result.broken]
        lines.append("")
    lines += ["| variant | figure | baseline | this run | change | limit | status |",
              "|---|---|---:|---:|---:|---|---|"]
    for r in result.rows:
        status = "**BROKEN**" if r.status == "broken" else r.status
        lines.append(f"| {r.variant} | {r.metric} | {r.baseline} | {r.current} | {r.change} "
                     f"| {r.limit} | {status} |")
    lines.append("")
    if result.notes:
        lines += [f"- {note}" for note in result.notes]
        lines.append("")
    lines.append("*measured*: this machine's p50 over the benchmark's timed runs. "
                 "*estimated*: FLOPs over the target device's FLOP/s plus the runtime's "
                 "cost measured on this machine, scaled to the device (its noise floor "
                 "scaled the same way).")
    return "\n".join(lines) + "\n"
