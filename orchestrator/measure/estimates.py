"""Latency estimates per target: the shipped file's operators priced one by one on the
target's cores (orchestrator.measure.cost_model), for the threads it runs with.

    device estimate = sum over ops of max(work at its kind's rate, bytes at the DRAM's)
                      + the runtime's own cost per op and per run

The rates are fitted per kind of op on published measurements (benchmarks/estimates.py),
and the estimate carries how far that benchmark found them off on devices of the same class
of core (`expected_error`). The runtime is the one that runs the file: LiteRT with XNNPACK
(ai-edge-litert applies it by default) or a TF session, whose cost per op (tens of µs per
graph node) is probed on this host (orchestrator.measure.host.runtime_costs) and scaled by
the device's one-core speed against this host's (`device_slowdown`).

The benchmark stage records what this needs (`basis`): the file's operators, the runtime,
and this host's measured figures. Where no operators were recorded (no benchmark stage, a
report from before), the estimate is FLOPs at the device's catalogued rate, and says so.

The file's own timings on this host are kept beside the estimate (the page compares them)
but do not enter it: kernel time on an x86 host says little about an Arm core, and an
estimate that read them would change with every busy spell of the host.

Pure: no TensorFlow import (the report and the registry import it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from orchestrator.formatting import format_ms
from orchestrator.model.operators import Operator
from orchestrator.spec.devices import Device, core_flops_per_second, estimate_latency_ms

__all__ = ["Estimate", "estimate", "basis", "SPREAD_WARN", "timings_spread",
           "expected_error"]

RUNTIME_OPS = {"tensorflow": "graph nodes", "litert": "operators"}
RUNTIME_NAMES = {"tensorflow": "TF session", "litert": "LiteRT interpreter"}
# the cost model's runtime for a file run by each of the benchmark's runtimes
PRICED_AS = {"litert": "litert-xnnpack", "tensorflow": "tensorflow"}
# timings spread wider than this (p50 over the fastest run) mark a busy host
SPREAD_WARN = 1.5
TOP_OPS = 5


@dataclass(frozen=True)
class Estimate:
    """One target's estimate and how it was made (report.json's `estimate`)."""

    latency_ms: float
    method: str  # every figure behind the estimate (the page's footnote)
    compute_ms: float  # the kernels' time on the device
    summary: str = ""  # the estimate in one short line (the console)
    overhead_ms: float | None = None  # the runtime's own cost per op and per run
    host_p50_ms: float | None = None
    host_fastest_ms: float | None = None
    device_slowdown: float | None = None  # this host's one-core speed over the device's
    fixed_ms: float | None = None  # the runtime's cost per run, on the device
    per_op_ms: float | None = None  # and per op, on the device
    ops: int | None = None
    runtime: str | None = None
    ceiling_applied: bool = False  # kept for older reports' readers: always False now
    host_cv: float | None = None
    threads: int | None = None
    threads_from: str | None = None  # "target" or "big cores"
    thread_speedup: float | None = None
    priced_as: str | None = None  # the cost model's runtime
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    by_kind_ms: dict[str, float] = field(default_factory=dict)
    expected_error: dict[str, Any] | None = None
    board_factor: float | None = None  # scaled by the target's board (report.board_factors)

    def scaled_by_board(self, factor: float, target: str) -> Estimate:
        """This estimate scaled by its target's board (report.board_factors), every figure
        of it, and saying so. One factor for the device, whatever the file's runtime or
        precision."""
        why = (f"×{factor:.3g} by {target}'s board: it measured the variants it ran "
               f"{factor:.3g}× their estimates")
        return replace(self, latency_ms=self.latency_ms * factor, board_factor=round(factor, 4),
                       compute_ms=self.compute_ms * factor,
                       overhead_ms=None if self.overhead_ms is None
                       else self.overhead_ms * factor,
                       method=f"{self.method}; scaled {why}",
                       summary=f"{format_ms(self.latency_ms * factor)} ({why}; unscaled: "
                               f"{self.summary})")

    def to_json(self) -> dict[str, Any]:
        """report.json's `estimate` (est_latency_ms stays the target's own key)."""
        data = asdict(self)
        data.pop("latency_ms")
        return _rounded(data)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 7)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def basis(p50_ms: float, flops_per_second: float, core_flops_per_second: float,
          fixed_ms: float, ops: int | None, runtime: str, min_ms: float | None = None,
          per_op_ms: float | None = None, cv: float | None = None,
          operators: list[Operator] | None = None) -> dict[str, Any]:
    """What the benchmark stage records for the estimates (report.json `estimate_basis`):
    its measured p50, fastest run and cv of this file, this host's measured speed, the
    runtime's probed cost per run and per op, the ops a run executes, and the operators
    (one compact row each: name, op, kind, precision, FLOPs, elements, bytes, shape)."""
    return {"host_p50_ms": p50_ms, "host_min_ms": p50_ms if min_ms is None else min_ms,
            "host_cv": cv, "host_flops_per_second": flops_per_second,
            "host_core_flops_per_second": core_flops_per_second,
            "fixed_ms": fixed_ms, "per_op_ms": per_op_ms, "ops": ops, "runtime": runtime,
            **({"operators": [o.to_row() for o in operators]} if operators else {})}


def _number(measured: Mapping[str, Any], key: str) -> float | None:
    value = measured.get(key)
    return float(value) if isinstance(value, int | float) and value >= 0 else None


# the classes of core the calibration's expected errors are per, in words
CLASS_WORDS = {"arm-ooo": "out-of-order Arm cores", "arm-in-order": "in-order Arm cores",
               "apple": "Apple cores", "x86": "x86 cores"}


def expected_error(device: Device, unmeasured: str | None = None) -> dict[str, Any] | None:
    """How far the benchmark found estimates off on published devices of this device's
    class of core (leave-one-device-out), with the words the report shows; where no
    published row ran on its class (x86), the figure over every device, and it says so.
    `unmeasured`: what this estimate prices that no published row ran (a TF session, int16
    reference kernels): its error is then not known, and the words say so first (the
    LiteRT figure after them, as a floor, never as the estimate's own)."""
    from orchestrator.measure.cost_model import calibration

    core_class = device.cpu_clusters[0].core_class
    words = CLASS_WORDS.get(core_class, core_class)
    figures = calibration().expected_error.get(core_class)
    scope = f"published devices with {words}"
    if not figures or not figures.get("rows"):
        figures = calibration().expected_error.get("all")
        scope = f"all published devices (none has {words})"
    if not figures or not figures.get("rows"):
        return None
    factor = float(figures["p80_factor"])
    litert = (f"within {factor:.2f}x of the published figure for 4 in 5 rows on {scope} "
              f"(median error {figures['median_factor']:.2f}x over {figures['rows']} rows, "
              "each device left out of the fit; benchmarks/estimates.py)")
    if unmeasured:
        return {**figures, "class": core_class, "unmeasured": unmeasured,
                "short": f"not measured for {unmeasured}",
                "text": f"not measured: no published row ran {unmeasured} (LiteRT's "
                        f"estimates are {litert}; expect more here)"}
    return {**figures, "class": core_class, "short": f"within {factor:.2f}x", "text": litert}


def unmeasured_by_the_benchmark(operators: list[Operator], priced_as: str) -> str | None:
    """What these operators run on that no published row of the calibration measured."""
    if priced_as == "tensorflow":
        return "a TF session (a GraphDef)"
    if any(o.precision == "int16" for o in operators):
        return "int16 activations (reference kernels)"
    return None


def estimate(flops: float | None, device: Device, precision: str = "float32",
             measured: Mapping[str, Any] | None = None) -> Estimate | None:
    """The estimate for one file on `device`, or None without FLOPs or operators.
    `measured` is the benchmark stage's `estimate_basis` (see `basis`)."""
    rows = (measured or {}).get("operators")
    if rows:
        return _priced([Operator.from_row(r) for r in rows], device, measured or {})
    if flops is None:
        return None
    factor = device.precision_factors.get(precision, 1.0)
    compute_ms = estimate_latency_ms(flops, device, precision)  # the catalogue's one rule
    compute_text = (f"{format_ms(compute_ms)} compute ({_flops(flops)} at "
                    f"{_rate(device.flops_per_second)}"
                    + (f" ×{factor:g} {precision}" if factor != 1.0 else "") + ")")
    return Estimate(latency_ms=compute_ms, compute_ms=compute_ms,
                    method=f"{compute_text}; FLOPs only: no operators of this file were "
                           "recorded (add benchmark to the pipeline for the per-op estimate)",
                    summary=f"{compute_text}; FLOPs only (no benchmark stage)")


def _priced(operators: list[Operator], device: Device, measured: Mapping[str, Any]
            ) -> Estimate:
    from orchestrator.measure.cost_model import RUNTIMES, price

    runtime = str(measured.get("runtime") or "litert")
    priced_as = PRICED_AS.get(runtime, "litert-xnnpack")
    host_core = _number(measured, "host_core_flops_per_second")
    slowdown = host_core / core_flops_per_second(device) if host_core else None
    per_op_host = _number(measured, "per_op_ms")
    fixed_host = _number(measured, "fixed_ms") or 0.0
    # a TF session's cost per node is its executor's, probed on this host: scaled to the
    # device's core; LiteRT's is the calibrated one (the same for every run of a file)
    probed = runtime == "tensorflow" and per_op_host is not None and slowdown is not None
    dispatch = per_op_host * slowdown if probed else None
    pricing = price(operators, device, priced_as, dispatch_ms=dispatch)
    fixed_ms = fixed_host * slowdown if probed else 0.0
    total = pricing.total_ms + fixed_ms
    ops = len(operators)
    compute = pricing.kernel_ms
    overhead = total - compute  # dispatch and the threads' barriers, and a session's run
    per_op_ms = (pricing.total_ms - compute) / ops if ops else 0.0
    threads_from = "target" if device.threads else "big cores"
    error = expected_error(device, unmeasured_by_the_benchmark(operators, priced_as))
    top = [{"name": o.name, "op": o.op, "kind": o.kind, "precision": o.precision,
            # of the whole estimate, a TF session's cost per run included
            "ms": o.ms, "share": o.ms / total if total else 0.0, "why": o.why}
           for o in pricing.top(TOP_OPS)]
    kinds = pricing.by_kind()

    def largest_kinds(count: int) -> str:
        return ", ".join(f"{kind} {format_ms(ms)}" for kind, ms in list(kinds.items())[:count])

    cores = threads_on(device, pricing.threads)
    threads_text = ("("
                    + ("the target's `threads:`" if threads_from == "target"
                       else "the device's big cores; a target's `threads:` sets them")
                    + (f"; up to ×{pricing.speedup:.2f} on an op large enough to split"
                       if pricing.threads > 1 else "") + ")")
    core = device.cpu_clusters[0].core
    overhead_text = (f"{format_ms(overhead)} {RUNTIME_NAMES.get(runtime, runtime)} overhead "
                     + (f"({ops} {RUNTIME_OPS.get(runtime, 'ops')} × "
                        f"{format_ms(per_op_host or 0.0)} probed on this host ×{slowdown:.3g} "
                        f"for a {core}, the threads' barriers, + {format_ms(fixed_ms)} per "
                        "run)" if probed
                        else f"({ops} ops: their calibrated dispatch and the threads' "
                             "barriers)"))
    on = f" of a {device.soc}" if device.soc else ""
    method = (f"{format_ms(total)} on {cores}{on} {threads_text} with {RUNTIMES[priced_as]}: "
              f"{format_ms(compute)} in kernels (by kind: {largest_kinds(4)}) + {overhead_text}. "
              "Each op's work at its kind's rate on this core (fitted on published "
              "measurements), or, where its tensors do not fit in the cache, its bytes at "
              "the DRAM's bandwidth if that is longer"
              + (f"; expected error {error['text']}" if error else ""))
    p50 = _number(measured, "host_p50_ms")
    fastest = _number(measured, "host_min_ms")
    if p50 is not None and fastest:
        spread = timings_spread(p50, fastest)
        if spread is not None and probed:
            method += f"; {spread}: the probe of the runtime's cost may read high"
    summary = (f"{format_ms(total)} on {cores} ({largest_kinds(3)}; "
               f"{format_ms(overhead)} overhead)"
               + (f", expected error: {error['short']}" if error else ""))
    cv = _number(measured, "host_cv")
    return Estimate(latency_ms=total, method=method, summary=summary, compute_ms=compute,
                    overhead_ms=overhead, host_p50_ms=p50, host_fastest_ms=fastest,
                    device_slowdown=None if slowdown is None else round(slowdown, 4),
                    fixed_ms=fixed_ms, per_op_ms=per_op_ms, ops=ops, runtime=runtime,
                    host_cv=None if cv is None else round(cv, 4), threads=pricing.threads,
                    threads_from=threads_from, thread_speedup=round(pricing.speedup, 3),
                    priced_as=priced_as, top_ops=top,
                    by_kind_ms={k: round(v, 6) for k, v in kinds.items()},
                    expected_error=error)


def threads_on(device: Device, threads: int) -> str:
    """The cores `threads` threads run on, fastest first: "4 threads: 1 Cortex-A76 2.84 GHz
    + 3 Cortex-A76 2.42 GHz"."""
    left, parts = threads, []
    for cluster in device.cpu_clusters:
        used = min(left, cluster.count)
        if used:
            parts.append(f"{used} {cluster.microarchitecture} {cluster.ghz:g} GHz")
        left -= used
    noun = "thread" if threads == 1 else "threads"
    return f"{threads} {noun}: " + " + ".join(parts) + (
        f" (and {left} more, sharing them)" if left > 0 else "")


def timings_spread(p50_ms: float, fastest_ms: float) -> str | None:
    """`host timings spread (p50 N× the fastest run)` where the median run is over
    SPREAD_WARN times the fastest (other processes slowed the runs), else None: the one rule
    a run's estimate and `orchestrator benchmark` warn by."""
    if fastest_ms > 0 and p50_ms / fastest_ms > SPREAD_WARN:
        return f"host timings spread (p50 {p50_ms / fastest_ms:.3g}× the fastest run)"
    return None


def _flops(value: float) -> str:
    for scale, unit in ((1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP")):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} FLOP"


def _rate(value: float) -> str:
    return f"{value / 1e9:.3g} GFLOP/s"
