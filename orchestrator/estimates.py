"""Latency estimates per target: the model's FLOPs at the device's speed, plus the runtime's
own cost per run and per op, calibrated on this host's measurement of the same file.

FLOPs alone cannot tell a TF session (tens of µs per run and a few µs per graph node) from
LiteRT (under a µs per run): two files of the same arithmetic would get the same estimate,
far below what this host measures for the slower runtime. So, per file:

    host time = compute + overhead
    compute   = FLOPs / this host's measured FLOP/s (a matmul at the benchmark's threads)
    overhead  = max(fixed, host time - compute) = fixed + per_op x ops
                (fixed: a one-op model's fastest run in the same runtime, on this host;
                 ops: graph nodes a TF session runs, operators LiteRT invokes)

The host time is the fastest of the benchmark's timed runs of this file, not its p50: other
processes on the host only ever add time, and multiplied by the device's slowdown their
noise would decide budgets (on a shared 2-core machine one file's p50 was 7x its fastest
run). The p50 is shown beside it.

    device estimate = FLOPs / device FLOP/s x precision factor
                      + overhead x slowdown

where slowdown is this host's measured one-core FLOP/s over the device's (the catalogue's
`core_flops_per_second`): the overhead is scalar work on one core, so it follows one core's
speed, not the device's total. Where the benchmark stage did not run (no host measurement),
the estimate is FLOPs only and says so.

Limits, stated where the estimate is shown: the host's compute is taken at the probe's
matmul rate, so a compute-bound model's kernel shortfall from that rate counts as overhead
(the estimate errs slow there); an int8 graph's slower x86 kernels count as overhead too.

Pure: no TensorFlow import (report.py and the registry's gate import it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.devices import Device, core_flops_per_second

__all__ = ["Estimate", "estimate", "basis"]

RUNTIME_OPS = {"tensorflow": "graph nodes", "litert": "operators"}


@dataclass(frozen=True)
class Estimate:
    """One target's estimate and how it was made (report.json's `estimate`)."""

    latency_ms: float
    method: str
    compute_ms: float
    overhead_ms: float | None = None
    host_p50_ms: float | None = None
    host_fastest_ms: float | None = None  # what the overhead is calibrated on
    device_slowdown: float | None = None
    fixed_ms: float | None = None  # the runtime's cost per run, on the device
    per_op_ms: float | None = None  # and per op, on the device
    ops: int | None = None
    runtime: str | None = None

    def to_json(self) -> dict[str, Any]:
        """report.json's `estimate` (est_latency_ms stays the target's own key)."""
        data = asdict(self)
        data.pop("latency_ms")
        return {key: (round(value, 6) if isinstance(value, float) else value)
                for key, value in data.items()}


def basis(p50_ms: float, flops_per_second: float, core_flops_per_second: float,
          fixed_ms: float, ops: int | None, runtime: str, min_ms: float | None = None
          ) -> dict[str, Any]:
    """What the benchmark stage records for the estimates (report.json `estimate_basis`):
    its measured p50 and fastest run of this file, this host's measured speed, the runtime
    and its ops."""
    return {"host_p50_ms": p50_ms, "host_min_ms": p50_ms if min_ms is None else min_ms,
            "host_flops_per_second": flops_per_second,
            "host_core_flops_per_second": core_flops_per_second,
            "fixed_ms": fixed_ms, "ops": ops, "runtime": runtime}


def estimate(flops: float | None, device: Device, precision: str = "float32",
             measured: Mapping[str, Any] | None = None) -> Estimate | None:
    """The estimate for one file on `device`, or None without FLOPs. `measured` is the
    benchmark stage's `estimate_basis` (see `basis`); None: FLOPs only."""
    if flops is None:
        return None
    factor = device.precision_factors.get(precision, 1.0)
    compute_ms = flops / device.flops_per_second * factor * 1000.0
    compute_text = (f"{_ms(compute_ms)} compute ({_flops(flops)} at "
                    f"{_rate(device.flops_per_second)}"
                    + (f" ×{factor:g} {precision}" if factor != 1.0 else "") + ")")
    usable = measured is not None and all(
        isinstance(measured.get(key), int | float) and measured[key] > 0
        for key in ("host_flops_per_second", "host_core_flops_per_second"))
    if not usable or not isinstance(measured.get("host_p50_ms"), int | float):
        return Estimate(latency_ms=compute_ms, compute_ms=compute_ms,
                        method=f"{compute_text}; FLOPs only: no host measurement of this "
                               "file (add benchmark to the pipeline to count the runtime's "
                               "own cost)")
    assert measured is not None
    p50 = float(measured["host_p50_ms"])
    fastest = measured.get("host_min_ms")
    host_ms = float(fastest) if isinstance(fastest, int | float) else p50
    host_compute_ms = flops / float(measured["host_flops_per_second"]) * 1000.0
    fixed_host = measured.get("fixed_ms")
    fixed_host = float(fixed_host) if isinstance(fixed_host, int | float) else None
    # the runtime's cost per run was measured: it is there even where this file ran faster
    # than its FLOPs at the probe's matmul rate (LiteRT's kernels outrun TF's matmul)
    overhead_host = max(fixed_host or 0.0, host_ms - host_compute_ms)
    slowdown = float(measured["host_core_flops_per_second"]) / core_flops_per_second(device)
    overhead_ms = overhead_host * slowdown
    ops = measured.get("ops")
    ops = int(ops) if isinstance(ops, int | float) and ops > 0 else None
    per_op_host = (None if fixed_host is None or ops is None
                   else max(0.0, overhead_host - fixed_host) / ops)
    runtime = measured.get("runtime")
    cpu = device.cpu or device.name or "this device"
    split = ""
    if fixed_host is not None and per_op_host is not None and per_op_host > 0:
        split = (f"; {_ms(fixed_host * slowdown)} per run + {ops} "
                 f"{RUNTIME_OPS.get(str(runtime), 'ops')} × "
                 f"{_ms(per_op_host * slowdown)}")
    if host_ms - host_compute_ms >= (fixed_host or 0.0):
        source = (f"{_ms(host_ms)} fastest run on this host (p50 {_ms(p50)}) minus its "
                  f"{_ms(host_compute_ms)} compute")
    else:
        source = (f"the runtime's {_ms(fixed_host or 0.0)} per run on this host: the file's "
                  f"{_ms(host_ms)} fastest run is under its {_ms(host_compute_ms)} compute "
                  "at the probe's matmul rate")
    method = (f"{compute_text} + {_ms(overhead_ms)} runtime overhead ({source}, "
              f"×{slowdown:.3g} for a {cpu}{split})")
    return Estimate(latency_ms=compute_ms + overhead_ms, method=method,
                    compute_ms=compute_ms, overhead_ms=overhead_ms, host_p50_ms=p50,
                    host_fastest_ms=host_ms,
                    device_slowdown=round(slowdown, 4),
                    fixed_ms=None if fixed_host is None else fixed_host * slowdown,
                    per_op_ms=None if per_op_host is None else per_op_host * slowdown,
                    ops=ops, runtime=None if runtime is None else str(runtime))


def _ms(value: float) -> str:
    """3 significant digits; µs below 1 ms."""
    if value >= 1.0:
        return f"{value:.3g} ms"
    if value >= 0.001:
        return f"{value * 1000:.3g} µs"
    return f"{value * 1000:.2g} µs"


def _flops(value: float) -> str:
    for scale, unit in ((1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP")):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} FLOP"


def _rate(value: float) -> str:
    return f"{value / 1e9:.3g} GFLOP/s"
