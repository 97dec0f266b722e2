"""A target's budgets checked against a variant's measurements: one home for the report's
gates, the accuracy guard and `promote`.

Quality budgets read the evaluate stage's metrics (orchestrator/stages/evaluate.py):
`accuracy_drop`, `fidelity`, and per output `<metric>.<output>` (`sqnr_db.onset`...).

A budget is met only at its figure's bound where evaluate measured one
(orchestrator/measure/confidence.py): `fidelity_low`, `top1_agreement_low.<output>`,
`sqnr_db_low.<output>` must reach a minimum, `accuracy_drop_high` stay under a maximum. So
`min_fidelity: 0.99` with 300 of 300 agreeing holds (90% lower bound 0.9946), with 298 of
300 it does not (0.9841). The message states the figure, its bound and the level, and,
where the evaluation set is too small for even a perfect score to meet an agreement budget,
how many samples it needs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.formatting import MIB, apart, format_ms, format_size
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, lowest_meetable, samples_needed
from orchestrator.measure.fidelity import OUTPUT_METRICS, output_names, safe_name

# max_size_mb and max_ram_mb are in MiB (1,048,576 bytes): what phones and their app stores
# report; messages, tables and the page say MiB (orchestrator.formatting)
MB = MIB

# What a violation broke: the report marks that budget's cell (size, latency, RAM, accuracy
# drop, fidelity, SQNR, another per-output figure), never another one.
SIZE, LATENCY, RAM = "size", "latency", "ram"
ACCURACY, FIDELITY, SQNR, OUTPUT = "accuracy", "fidelity", "sqnr", "output"
KINDS = (SIZE, LATENCY, RAM, ACCURACY, FIDELITY, SQNR, OUTPUT)


class Violation(str):
    """A readable violation that knows which budget it broke (`kind`, one of KINDS). It is
    its message wherever a string is wanted: report.json's `violations`, `promote`'s lines,
    the guard's trials."""

    kind: str

    def __new__(cls, message: str, kind: str) -> Violation:
        if kind not in KINDS:
            raise ValueError(f"unknown violation kind {kind!r}")
        made = super().__new__(cls, message)
        made.kind = kind
        return made

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]  (pickle, copy)
        return str(self), self.kind


def broken_kinds(violations: Sequence[str]) -> list[str]:
    """The kinds of budget that `violations` broke, once each, in KINDS order (a plain
    string, from an older report, counts as none)."""
    found = {getattr(v, "kind", None) for v in violations}
    return [kind for kind in KINDS if kind in found]


# What one unit of shortfall is, per kind of figure: a point of accuracy or agreement, a
# dB of SQNR, a thousandth of cosine. Summed, they rank two trials of one pipeline.
_AGREEMENT_UNIT = 0.01
_SQNR_UNIT_DB = 1.0
_COSINE_UNIT = 0.001
_NOT_MEASURED = math.inf


@dataclass(frozen=True)
class _Check:
    """One quality budget against its figure."""

    figure: str  # what a console line shows, e.g. "min SQNR 23.1 dB (onset)"
    violation: str | None
    shortfall: float  # 0.0 when it holds
    order: int  # headline priority when every budget holds (lower first)
    value: float = 0.0  # among checks of one order, the lowest value is the headline
    kind: str = OUTPUT  # the budget it checks (Violation.kind)
    against: str = ""  # the figure beside its bound, e.g. "SQNR 41.2 dB (out) ≥ 39 dB"


def _outputs(metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per output (as evaluate names them): its figures, from `<metric>.<output>` keys."""
    found: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        metric, dot, output = key.partition(".")
        if dot and metric in OUTPUT_METRICS and value is not None:
            found.setdefault(output, {})[metric] = float(value)
    return found


@dataclass(frozen=True)
class _Bound:
    """The bound a budget is judged at: its value, which side, at what confidence."""

    value: float
    side: str  # "lower" or "upper"
    confidence: float

    def text(self, fmt: str, unit: str = "") -> str:
        return f" ({self.confidence:.0%} {self.side} bound {self.value:{fmt}}{unit})"


def _bound(metrics: Mapping[str, Any], key: str, side: str = "lower") -> _Bound | None:
    value = metrics.get(key)
    if value is None:
        return None
    return _Bound(float(value), side, float(metrics.get("confidence") or DEFAULT_CONFIDENCE))


def _too_few(metrics: Mapping[str, Any], limit: float) -> str:
    """Where even a perfect agreement on the evaluation set cannot show `limit` met: how
    many samples it needs (empty otherwise)."""
    n, confidence = metrics.get("evaluation_samples"), metrics.get("confidence")
    if n is None or confidence is None or not 0.0 < limit < 1.0:
        return ""
    if lowest_meetable(int(n), float(confidence)) >= limit:
        return ""
    return (f": {int(n)} evaluation samples cannot show {limit:g} met at {confidence:.0%} "
            f"even all agreeing; it needs {samples_needed(limit, None, float(confidence))}")


def _at_least(name: str, figure: str, value: float, limit: float, unit: float, order: int,
              kind: str, fmt: str = ".4f", bound: _Bound | None = None,
              note: str = "") -> _Check:
    text = f"{figure} {value:{fmt}}" + (bound.text(fmt) if bound else "")
    judged = bound.value if bound else value
    short = max(0.0, limit - judged)
    return _Check(text, f"{text} < {name} {limit:g}{note}" if judged < limit else None,
                  short / unit, order, judged, kind,
                  f"{text} {'<' if judged < limit else '≥'} {limit:g}")


def _at_most(name: str, figure: str, value: float, limit: float, unit: float, order: int,
             kind: str, fmt: str = ".4f", bound: _Bound | None = None) -> _Check:
    text = f"{figure} {value:{fmt}}" + (bound.text(fmt) if bound else "")
    judged = bound.value if bound else value
    over = max(0.0, judged - limit)
    return _Check(text, f"{text} > {name} {limit:g}" if judged > limit else None,
                  over / unit, order, -judged, kind,
                  f"{text} {'>' if judged > limit else '≤'} {limit:g}")


def _missing(text: str, order: int, kind: str) -> _Check:
    return _Check(text, text, _NOT_MEASURED, order, kind=kind, against=text)


def _checks(metrics: Mapping[str, Any], budgets: Any) -> list[_Check]:
    checks: list[_Check] = []
    drop, fidelity = metrics.get("accuracy_drop"), metrics.get("fidelity")
    if budgets.max_accuracy_drop is not None:
        checks.append(_missing("accuracy_drop not measured: add evaluate (with labelled data) "
                               "to the pipeline", 0, ACCURACY) if drop is None else
                      _at_most("max_accuracy_drop", "accuracy drop", drop,
                               budgets.max_accuracy_drop, _AGREEMENT_UNIT, 0, ACCURACY,
                               bound=_bound(metrics, "accuracy_drop_high", "upper")))
    outputs = _outputs(metrics)
    per_output: Mapping[str, Any] = getattr(budgets, "outputs", None) or {}
    own = {safe_name(name): b for name, b in per_output.items()}
    if getattr(budgets, "min_sqnr_db", None) is not None:
        others = [o for o, f in outputs.items() if "top1_agreement" not in f]
        if not outputs:
            checks.append(_missing("SQNR not measured: add evaluate to the pipeline", 1, SQNR))
        elif not others:
            checks.append(_missing("min_sqnr_db: every output is class scores (set "
                                   "outputs.<name>.min_sqnr_db for one of them)", 1, SQNR))
        for output in others:
            if own.get(output) is None or own[output].min_sqnr_db is None:
                checks.append(_sqnr(output, outputs[output], budgets.min_sqnr_db,
                                    confidence=metrics.get("confidence")))
    for name, budget in per_output.items():
        checks += _output_checks(name, budget, outputs, metrics)
    if budgets.min_fidelity is not None:
        # an agreement (a class output) needs enough samples for its bound to reach it
        agreement = any("top1_agreement" in f for f in outputs.values())
        checks.append(_missing("fidelity not measured: add evaluate to the pipeline", 2,
                               FIDELITY) if fidelity is None else
                      _at_least("min_fidelity", "fidelity", fidelity, budgets.min_fidelity,
                                _AGREEMENT_UNIT, 2, FIDELITY,
                                bound=_bound(metrics, "fidelity_low"),
                                note=_too_few(metrics, budgets.min_fidelity)
                                if agreement else ""))
    return checks


def _sqnr(output: str, figures: Mapping[str, float], limit: float,
          name: str = "min_sqnr_db", confidence: float | None = None) -> _Check:
    if "sqnr_db" not in figures:
        return _missing(f"SQNR of output {output!r} not measured (an integer output)", 1,
                        SQNR)
    value = figures["sqnr_db"]
    bound = None if "sqnr_db_low" not in figures else _Bound(
        figures["sqnr_db_low"], "lower", float(confidence or DEFAULT_CONFIDENCE))
    shown = f"{value:.1f} dB" + (bound.text(".1f", " dB") if bound else "")
    judged = bound.value if bound else value
    text = f"SQNR {shown} ({output})"
    return _Check(text, f"{text} < {name} {limit:g}" if judged < limit else None,
                  max(0.0, limit - judged) / _SQNR_UNIT_DB, 1, judged, SQNR,
                  f"{output} SQNR {shown} {'<' if judged < limit else '≥'} {limit:g} dB")


def _output_checks(name: str, budget: Any, outputs: Mapping[str, Mapping[str, float]],
                   metrics: Mapping[str, Any]) -> list[_Check]:
    """The checks of one output's own budgets."""
    key = safe_name(name)
    prefix = f"outputs.{name}"
    if key not in outputs:
        known = ", ".join(outputs) or "none measured: add evaluate to the pipeline"
        return [_missing(f"{prefix}: no such output measured (outputs: {known})", 3, OUTPUT)]
    figures = outputs[key]
    checks: list[_Check] = []
    if budget.min_sqnr_db is not None:
        checks.append(_sqnr(key, figures, budget.min_sqnr_db, f"{prefix}.min_sqnr_db",
                            metrics.get("confidence")))
    wanted = (("min_cosine", "cosine", "cosine", _COSINE_UNIT, True),
              ("max_abs_error", "max_abs_error", "max abs error", None, False),
              ("min_agreement", "top1_agreement" if "top1_agreement" in figures
               else "threshold_agreement", "agreement", _AGREEMENT_UNIT, True))
    for field, metric, figure, unit, at_least in wanted:
        limit = getattr(budget, field)
        if limit is None:
            continue
        if metric not in figures:
            checks.append(_missing(f"{prefix}.{field}: output {key!r} has no {figure} figure"
                                   + (" (neither class scores nor probabilities)"
                                      if field == "min_agreement" else ""), 3, OUTPUT))
        elif at_least:
            low = figures.get(f"{metric}_low")
            bound = None if low is None else _Bound(
                low, "lower", float(metrics.get("confidence") or DEFAULT_CONFIDENCE))
            checks.append(_at_least(f"{prefix}.{field}", f"{figure} ({key})", figures[metric],
                                    limit, unit, 3, OUTPUT, bound=bound,
                                    note=_too_few(metrics, limit) if bound else ""))
        else:  # max abs error: in units of its own limit
            checks.append(_at_most(f"{prefix}.{field}", f"{figure} ({key})", figures[metric],
                                   limit, max(limit, 1e-12), 3, OUTPUT, ".4g"))
    return checks


def quality_violations(metrics: Mapping[str, Any], budgets: Any) -> list[Violation]:
    """Readable violations of the quality budgets (accuracy drop, fidelity, SQNR and the
    per-output ones) by evaluate's metrics (the accuracy guard searches until none is left)."""
    return [Violation(c.violation, c.kind) for c in _checks(metrics, budgets)
            if c.violation is not None]


def quality_shortfall(metrics: Mapping[str, Any], budgets: Any) -> float:
    """How far the quality budgets are from holding: 0.0 when they all hold, larger the
    worse; inf when a budgeted figure was not measured. The sum over budgets of the shortfall
    in units of 0.01 (accuracy drop, fidelity, agreement), 1 dB (SQNR), 0.001 (cosine) or the
    limit itself (max abs error): comparable between two trials of one pipeline."""
    return float(sum(c.shortfall for c in _checks(metrics, budgets)))


def quality_against_budgets(metrics: Mapping[str, Any], budgets: Any) -> list[str]:
    """Every quality budget's figure beside its bound, in the order the budgets are
    checked, e.g. ["accuracy drop 0.0040 ≤ 0.01", "output_0 SQNR 41.2 dB ≥ 39 dB"]: what
    a guard trial met or broke (a "not measured" message where the figure is missing)."""
    return [c.against for c in _checks(metrics, budgets)]


def quality_headline(metrics: Mapping[str, Any], budgets: Any) -> str:
    """The one quality figure a console line shows: the worst-broken budget's figure, else
    that of the first budget in the order accuracy drop, SQNR (the lowest), per-output,
    fidelity; without quality budgets the accuracy drop, else the lowest SQNR, else the
    fidelity. E.g. "accuracy drop 0.0040", "SQNR 23.1 dB (onset)"."""
    checks = _checks(metrics, budgets)
    broken = [c for c in checks if c.violation is not None]
    if broken:
        return max(broken, key=lambda c: c.shortfall).figure
    if checks:
        first = min(checks, key=lambda c: (c.order, c.value))
        several = sum(c.order == first.order for c in checks) > 1
        return f"min {first.figure}" if first.order == 1 and several else first.figure
    if metrics.get("accuracy_drop") is not None:
        return f"accuracy drop {metrics['accuracy_drop']:.4f}"
    sqnrs = {o: f["sqnr_db"] for o, f in _outputs(metrics).items()
             if "sqnr_db" in f and "top1_agreement" not in f}
    if sqnrs:
        worst = min(sqnrs, key=sqnrs.__getitem__)
        return f"min SQNR {sqnrs[worst]:.1f} dB ({worst})"
    if metrics.get("fidelity") is not None:
        return f"fidelity {metrics['fidelity']:.4f}"
    return "quality not measured"


def has_quality_budgets(budgets: Any) -> bool:
    """Whether any quality budget is set (the guard has something to meet)."""
    return any(getattr(budgets, f, None) is not None
               for f in ("max_accuracy_drop", "min_fidelity", "min_sqnr_db")) or bool(
        getattr(budgets, "outputs", None))


def variant_quality_metrics(variant: Mapping[str, Any]) -> dict[str, float]:
    """A report variant's quality metrics as `quality_violations` reads them: its accuracy
    drop and fidelity, and the figures of its evaluate's per-output table (not the merged
    metrics of every stage, where another stage's `<metric>.<layer>` could pass for an
    output)."""
    metrics = {f"{metric}.{row['name']}": row[metric] for row in variant.get("outputs") or []
               for metric in OUTPUT_METRICS if row.get(metric) is not None}
    metrics.update({k: variant[k] for k in ("accuracy_drop", "fidelity")
                    if variant.get(k) is not None})
    # their bounds (evaluate's metrics); the drop's only while it is evaluate's own (a
    # board's accuracy replaces it: report.judged_on_device)
    measured = variant.get("metrics") or {}
    bounds = ["fidelity_low", "confidence", "evaluation_samples"]
    if measured.get("accuracy_drop") is not None and variant.get("accuracy_drop") is not None \
            and abs(measured["accuracy_drop"] - variant["accuracy_drop"]) < 1e-6:
        bounds.append("accuracy_drop_high")
    metrics.update({k: measured[k] for k in bounds if measured.get(k) is not None})
    return metrics


def check_output_budgets(loaded: Any, outputs: Sequence[str], metadata: Mapping[str, Any]
                         ) -> None:
    """Every `budgets.outputs` name must be an output of the model (as evaluate names them,
    or that name before it was made safe): else RecipeError (exit 2) at its recipe line."""
    from orchestrator.errors import RecipeError
    from orchestrator.spec.error_locations import make_error

    names = output_names(outputs, metadata)
    for index, target in enumerate(loaded.recipe.targets):
        for name in target.budgets.outputs or {}:
            if safe_name(name) not in names:
                raise make_error(RecipeError, f"target {target.name!r}: budgets for output "
                                 f"{name!r}, which the model does not have; its outputs: "
                                 f"{', '.join(names)}", loaded.path,
                                 ("targets", index, "budgets", "outputs", name), loaded.marks)


def check_budgets(variant: Mapping[str, Any], budgets: Any, est_latency_ms: float | None,
                  device: Any = None, latency_basis: str = "estimated",
                  on_device: Mapping[str, Any] | None = None) -> list[Violation]:
    """Violations of one target's budgets, and of the device's own RAM limit (empty when
    all are met): each a readable message that knows which budget it broke (`kind`).
    Sizes and RAM in MiB, the unit of max_size_mb and max_ram_mb. `est_latency_ms` is the
    latency the budget reads, `latency_basis` what it is ("estimated", or "measured on
    ..." where the target's board measured it); `on_device` the board's measurement, for
    min_device_agreement."""
    violations: list[Violation] = []

    def mib(value: float, digits: int) -> str:
        return format_size(value * MB, digits, unit=False)

    def over(key: str, limit_mb: float | None) -> tuple[str, str] | None:
        """The variant's `key` bytes and the limit in MiB, as `apart` shows them, when the
        figure is over the limit; else None (also when there is no limit)."""
        if limit_mb is None or variant[key] / MB <= limit_mb:
            return None
        return apart(variant[key] / MB, limit_mb, mib)

    ram_measure = f"({_ram_measure(variant)})"
    if device is not None and (shown := over("ram_bytes", device.ram_limit_mb)):
        violations.append(Violation(f"RAM {shown[0]} MiB {ram_measure} > the device's "
                                    f"limit of {shown[1]} MiB", RAM))
    if shown := over("size_bytes", budgets.max_size_mb):
        violations.append(Violation(f"size {shown[0]} MiB > max_size_mb "
                                    f"{budgets.max_size_mb:g} MiB", SIZE))
    violations += quality_violations(variant_quality_metrics(variant), budgets)
    if budgets.max_latency_ms is not None:
        if est_latency_ms is None:
            violations.append(Violation("latency not measured: add benchmark to the pipeline",
                                        LATENCY))
        elif est_latency_ms > budgets.max_latency_ms:
            est, _ = apart(est_latency_ms, budgets.max_latency_ms, format_ms)
            violations.append(Violation(f"{latency_basis} latency {est} > max_latency_ms "
                                        f"{budgets.max_latency_ms:g} ms", LATENCY))
    minimum = getattr(budgets, "min_device_agreement", None)
    if minimum is not None:
        # the class outputs' top-1 agreement, else the energy fidelity of the others
        agreement = agreement_with_host(on_device or {})
        if agreement is None:
            reason = (on_device or {}).get("reason") or "add connect: to the target"
            violations.append(Violation(f"device agreement not measured: {reason}", FIDELITY))
        elif agreement < minimum:
            violations.append(Violation(
                f"top-1 agreement of the board's outputs with this host's {agreement:.4f} < "
                f"min_device_agreement {minimum:g}", FIDELITY))
    if shown := over("ram_bytes", budgets.max_ram_mb):
        violations.append(Violation(f"RAM {shown[0]} MiB {ram_measure} > max_ram_mb "
                                    f"{budgets.max_ram_mb:g} MiB", RAM))
    return violations


def agreement_with_host(board: Mapping[str, Any]) -> float | None:
    """A board's agreement with this host's outputs for the same file: the class outputs'
    `top1_agreement`, else `agreement_with_host` (the energy fidelity of the others); a
    report from before issue 39 named it `fidelity` there. None when not measured."""
    return board.get("top1_agreement", board.get("agreement_with_host", board.get("fidelity")))


def _ram_measure(variant: Mapping[str, Any]) -> str:
    """What the RAM figure is ("heap growth", "traced peak", "file size": report._ram), so
    that both RAM messages read alike."""
    return str(variant.get("ram_measure") or variant.get("ram_source") or "file size")
