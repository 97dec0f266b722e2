"""Latency estimates per target: the model's FLOPs at the device's speed, plus the runtime's
own cost per run and per op, measured on this host and scaled by the device's one-core speed.

FLOPs alone cannot tell a TF session (tens of µs per run) from LiteRT (about a µs): two
files of the same arithmetic would get the same estimate, far below what this host
measures for the slower runtime. So, per file:

    compute (host) = FLOPs / this host's measured FLOP/s (a matmul at the benchmark's threads)
    excess         = the file's fastest timed run - compute (host)
    overhead       = excess clamped to [fixed, fixed + ops x per_op]

`fixed` and `per_op` are the runtime's own cost per run and per op, probed once per process
on this host (orchestrator.measure.host.runtime_costs: a one-op model and a chain of cheap ops, the
fastest of many runs). `ops` are the ops a run of the file executes: a TF session's graph
nodes, LiteRT's operators (as `inspect` counts them). The file's own measurement decides
within the band; outside it:

- below the floor (`fixed`) is timing resolution, or kernels faster than the probe's
  matmul: the runtime still costs its measured cost per run;
- above the ceiling is kernel time on this host's CPU (e.g. x86's slow classic 8-bit
  kernels, where ARM's NEON kernels are the fast ones), which does not carry over to another
  CPU: the device's kernel time is the compute term. The overhead is capped at the ceiling
  (`ceiling_applied`), so the same graph memory-mapped or not gets the same estimate, and
  a loaded host's slow runs do not reach the estimate beyond the probe.

The fastest timed run is taken, not the p50: other processes only ever add time. The p50
is shown beside it; where it is over SPREAD_WARN times the fastest run, most runs were
slowed (a busy host) and the method says so. (The coefficient of variation, `host_cv`, is
recorded too, but one preempted run among 50 µs-scale ones pushes it over 1: the p50
against the fastest run ignores single spikes.)

    device estimate = FLOPs / device FLOP/s x precision factor + overhead x slowdown

where slowdown is this host's measured one-core FLOP/s over the device's (the catalogue's
`core_flops_per_second`): the overhead is scalar work on one core, so it follows one core's
speed, not the device's total. Where the benchmark stage did not run (no host measurement),
the estimate is FLOPs only and says so.

Pure: no TensorFlow import (the report and the registry import it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.formatting import format_ms
from orchestrator.spec.devices import Device, core_flops_per_second

__all__ = ["Estimate", "estimate", "basis", "SPREAD_WARN", "timings_spread"]

RUNTIME_OPS = {"tensorflow": "graph nodes", "litert": "operators"}
RUNTIME_NAMES = {"tensorflow": "TF session", "litert": "LiteRT interpreter"}
# timings spread wider than this (std / mean) make the fastest run a weak calibration
SPREAD_WARN = 1.5  # p50 over the fastest run


@dataclass(frozen=True)
class Estimate:
    """One target's estimate and how it was made (report.json's `estimate`)."""

    latency_ms: float
    method: str  # every figure behind the estimate (the page's footnote)
    compute_ms: float
    summary: str = ""  # the estimate's two terms in one short line (the console)
    overhead_ms: float | None = None
    host_p50_ms: float | None = None
    host_fastest_ms: float | None = None  # what the overhead is calibrated on
    device_slowdown: float | None = None
    fixed_ms: float | None = None  # the runtime's cost per run, on the device
    per_op_ms: float | None = None  # and per op, on the device
    ops: int | None = None
    runtime: str | None = None
    ceiling_applied: bool = False  # the file's excess was over fixed + ops x per_op
    host_cv: float | None = None  # std / mean of the file's timed runs on this host

    def to_json(self) -> dict[str, Any]:
        """report.json's `estimate` (est_latency_ms stays the target's own key)."""
        data = asdict(self)
        data.pop("latency_ms")
        return {key: (round(value, 7) if isinstance(value, float) else value)
                for key, value in data.items()}


def basis(p50_ms: float, flops_per_second: float, core_flops_per_second: float,
          fixed_ms: float, ops: int | None, runtime: str, min_ms: float | None = None,
          per_op_ms: float | None = None, cv: float | None = None) -> dict[str, Any]:
    """What the benchmark stage records for the estimates (report.json `estimate_basis`):
    its measured p50, fastest run and cv of this file, this host's measured speed, the
    runtime's probed cost per run and per op, and the ops a run of this file executes."""
    return {"host_p50_ms": p50_ms, "host_min_ms": p50_ms if min_ms is None else min_ms,
            "host_cv": cv, "host_flops_per_second": flops_per_second,
            "host_core_flops_per_second": core_flops_per_second,
            "fixed_ms": fixed_ms, "per_op_ms": per_op_ms, "ops": ops, "runtime": runtime}


def _number(measured: Mapping[str, Any], key: str) -> float | None:
    value = measured.get(key)
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def estimate(flops: float | None, device: Device, precision: str = "float32",
             measured: Mapping[str, Any] | None = None) -> Estimate | None:
    """The estimate for one file on `device`, or None without FLOPs. `measured` is the
    benchmark stage's `estimate_basis` (see `basis`); None: FLOPs only."""
    if flops is None:
        return None
    factor = device.precision_factors.get(precision, 1.0)
    compute_ms = flops / device.flops_per_second * factor * 1000.0
    compute_text = (f"{format_ms(compute_ms)} compute ({_flops(flops)} at "
                    f"{_rate(device.flops_per_second)}"
                    + (f" ×{factor:g} {precision}" if factor != 1.0 else "") + ")")
    usable = measured is not None and all(
        isinstance(measured.get(key), int | float) and measured[key] > 0
        for key in ("host_flops_per_second", "host_core_flops_per_second"))
    if not usable or not isinstance(measured.get("host_p50_ms"), int | float):
        return Estimate(latency_ms=compute_ms, compute_ms=compute_ms,
                        method=f"{compute_text}; FLOPs only: no host measurement of this "
                               "file (add benchmark to the pipeline to count the runtime's "
                               "own cost)",
                        summary=f"{compute_text}; FLOPs only (no benchmark stage)")
    assert measured is not None
    p50 = float(measured["host_p50_ms"])
    host_ms = _number(measured, "host_min_ms")
    host_ms = p50 if host_ms is None else host_ms
    cv = _number(measured, "host_cv")
    host_compute_ms = flops / float(measured["host_flops_per_second"]) * 1000.0
    fixed = _number(measured, "fixed_ms") or 0.0
    per_op = _number(measured, "per_op_ms")
    ops = measured.get("ops")
    ops = int(ops) if isinstance(ops, int | float) and ops > 0 else None
    runtime = measured.get("runtime")
    noun = RUNTIME_OPS.get(str(runtime), "ops")
    ceiling = None if per_op is None or ops is None else fixed + ops * per_op
    excess = host_ms - host_compute_ms
    overhead_host = max(fixed, excess)
    capped = ceiling is not None and overhead_host > ceiling
    if capped:
        assert ceiling is not None
        overhead_host = ceiling
    slowdown = float(measured["host_core_flops_per_second"]) / core_flops_per_second(device)
    overhead_ms = overhead_host * slowdown

    probe = (f"{RUNTIME_NAMES.get(str(runtime), str(runtime or 'the runtime'))}: "
             f"{format_ms(fixed)} per run"
             + ("" if per_op is None else f" + {format_ms(per_op)} per op")
             + ", probed on this host")
    mine = (f"this file's {format_ms(host_ms)} fastest run (p50 {format_ms(p50)}) "
            f"less its {format_ms(host_compute_ms)} compute at the probe's matmul rate")
    mine += (f" leaves {format_ms(excess)}" if excess > 0 else " leaves nothing")
    if capped:
        assert ceiling is not None and ops is not None
        kernels = ("x86's classic 8-bit kernels are slow ones, ARM's NEON ones fast"
                   if precision == "int8" and runtime == "tensorflow" else
                   "its kernels short of the probe's matmul rate on these tensors")
        why = (f", over the {format_ms(ceiling)} the runtime costs for its {ops} {noun}: "
               f"the rest is kernel time on this host's CPU ({kernels}), which does not "
               "carry over to another CPU, so the overhead is capped there")
    elif excess < fixed:
        why = (f", under the runtime's {format_ms(fixed)} per run (timing resolution, or "
               "kernels faster than the probe's matmul): the overhead is that cost per run")
    elif ceiling is None:
        why = (": taken as measured (no per-op probe in this measurement, so it is not "
               "capped at the runtime's own cost)")
    else:
        assert ops is not None
        why = (f", within the runtime's cost for its {ops} {noun} "
               f"({format_ms(fixed)} to {format_ms(ceiling)}): taken as measured")
    cpu = device.cpu or device.name or "this device"
    method = (f"{compute_text} + {format_ms(overhead_ms)} runtime overhead "
              f"({format_ms(overhead_host)} on this host ×{slowdown:.3g} for a {cpu}, one "
              f"core against this host's; {probe}; {mine}{why})")
    spread = timings_spread(p50, host_ms)
    if spread is not None:
        method += f"; {spread}: rerun on a quiet machine for a firmer estimate"
    summary = (f"{compute_text} + {format_ms(overhead_ms)} runtime overhead "
               f"({format_ms(overhead_host)} on this host ×{slowdown:.3g} for a {cpu})")
    return Estimate(latency_ms=compute_ms + overhead_ms, method=method, summary=summary,
                    compute_ms=compute_ms, overhead_ms=overhead_ms, host_p50_ms=p50,
                    host_fastest_ms=host_ms, device_slowdown=round(slowdown, 4),
                    fixed_ms=fixed * slowdown,
                    per_op_ms=None if per_op is None else per_op * slowdown,
                    ops=ops, runtime=None if runtime is None else str(runtime),
                    ceiling_applied=capped, host_cv=None if cv is None else round(cv, 4))


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
