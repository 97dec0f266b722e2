"""A model's latency on a device, op by op: each operator's work at the rate its kind of
kernel sustains on that device's cores, at its precision and runtime, or the time its bytes
take to move where that is longer; plus each op's dispatch; for the threads it runs with.

    op time  = max((work + output elements x element cost[kind])
                   / (core peak x efficiency[precision][kind] x runtime factor
                      x the op's thread speedup),
                   bytes / (DRAM bandwidth x bandwidth efficiency) where they do not fit
                   in the last-level cache)
               + dispatch (+ a thread barrier when threads > 1, as far as the op splits)
    core peak = clock x float32 FLOPs per cycle x the core class's and design's factors
                (x int8's gain for int8 and dynamic range, x the dot-product gain where
                the core has SDOT)
    thread speedup = 1 + parallel efficiency x (sum of the cores' speeds / the first's - 1)
                     (an op gets work / (work + parallel work) of it: small ops barely split)

Work is the op's FLOPs (2 per multiply-add) for convolutions, matmuls and pooling, and its
output elements for elementwise kinds. The efficiencies, class and design factors, dispatch
cost, parallel and bandwidth efficiencies are fitted per kind of op on published measurements
(benchmarks/estimates.py writes latency_calibration.json beside this module), never per
model: the fit sees MobileNet's depthwise layers and Inception's 3x3s, not "MobileNet v1 on
a Pixel 3". A device brings only what its datasheet says (clusters, clocks, FLOPs per
cycle, dot product, DRAM bandwidth: spec/devices.py).

Pure: numpy only (the report, the registry and the benchmark import it). The fit uses the
same vectorised function (`seconds`) over many rows at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.model.operators import KINDS, PRECISIONS, Operator
from orchestrator.spec.devices import DEFAULT_CACHE_MB, Device

__all__ = ["Calibration", "Pricing", "PricedOp", "calibration", "price", "RUNTIMES",
           "OpArrays", "DeviceRow", "device_row", "op_arrays", "seconds"]

CALIBRATION_FILE = Path(__file__).with_name("latency_calibration.json")
KIND_LIST = list(KINDS)
GEMM_KINDS = ("conv_1x1", "conv", "depthwise", "fully_connected", "pool")
CLASSES = ("arm-ooo", "arm-in-order", "apple", "x86")
RUNTIMES = {"litert-xnnpack": "LiteRT with XNNPACK", "litert-builtin": "LiteRT builtin "
            "kernels", "tensorflow": "a TF session"}


@dataclass(frozen=True)
class Calibration:
    """The fitted rates (latency_calibration.json): see the module docstring."""

    efficiency: dict[str, dict[str, float]]  # precision -> kind -> share of the core's peak
    class_factor: dict[str, float]  # core class -> its sustained speed against arm-ooo's
    parallel_efficiency: float
    dispatch_cycles: float  # per op, on the device's first core
    sync_cycles: float  # per op, when more than one thread runs it
    bandwidth_efficiency: float  # share of the theoretical DRAM bandwidth ops sustain
    dotprod_gain: float  # int8 GEMMs' speed with SDOT against without
    runtime_factor: dict[str, dict[str, float]]  # runtime -> precision -> speed factor
    expected_error: dict[str, Any]  # what benchmarks/estimates.py measured, per class
    fitted_on: str = ""
    # per output element, in FLOP-equivalents at the kind's rate: a kernel's cost beyond
    # its multiply-adds (packing, writing the output, a depthwise's loads per pixel)
    element_cost: dict[str, float] = field(default_factory=dict)
    # an op of this much work gets half the threads' speedup: small ops barely split
    parallel_work: float = 1e6
    # per core design (Cortex-A73, Kryo...), its sustained speed against its class's, where
    # published rows on a device with that core taught it; 1.0 elsewhere
    core_factor: dict[str, float] = field(default_factory=dict)
    int8_gain: float = 2.0  # int8 GEMMs' speed over float's without SDOT (twice the lanes)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        """The calibration from latency_calibration.json (fields it lacks: the defaults)."""
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.__dataclass_fields__}


@lru_cache(maxsize=1)
def calibration() -> Calibration:
    """The committed calibration (read once per process)."""
    return Calibration.from_json(json.loads(CALIBRATION_FILE.read_text()))


# ------------------------------------------------------------------ vectorised arithmetic

@dataclass(frozen=True)
class OpArrays:
    """A model's operators as arrays (one entry per op)."""

    kind: np.ndarray  # index into KIND_LIST
    precision: np.ndarray  # index into PRECISIONS
    work: np.ndarray  # FLOPs for GEMM_KINDS, output elements else (0 for a reshape)
    gemm_elements: np.ndarray  # a GEMM kind's output elements (its per-pixel cost); 0 else
    bytes: np.ndarray


def op_arrays(operators: Sequence[Operator]) -> OpArrays:
    """The operators as the arrays `seconds` prices."""
    kinds = np.array([KIND_LIST.index(o.kind if o.kind in KINDS else "other")
                      for o in operators], dtype=np.int64)
    return OpArrays(
        kind=kinds,
        precision=np.array([PRECISIONS.index(o.precision) if o.precision in PRECISIONS
                            else 0 for o in operators], dtype=np.int64),
        # a reshape moves nothing (a Const is read in place): only its dispatch
        work=np.array([float(o.flops) if o.kind in GEMM_KINDS else
                       0.0 if o.kind == "reshape" else float(o.elements) for o in operators]),
        gemm_elements=np.array([float(o.elements) if o.kind in GEMM_KINDS else 0.0
                                for o in operators]),
        bytes=np.array([0.0 if o.kind == "reshape" else float(o.bytes) for o in operators]))


@dataclass(frozen=True)
class DeviceRow:
    """What the arithmetic needs of one device at one thread count."""

    ghz: float
    flops_per_cycle: float
    core_class: str
    core: str  # the first core's design (Cluster.microarchitecture)
    dotprod: bool
    memory_gbs: float | None
    cache_bytes: float  # an op whose bytes fit here is not priced by the DRAM's bandwidth
    threads: int
    # the threads' cores: (raw speed against the first, core class, design), fastest first
    cores: tuple[tuple[float, str, str], ...]


def device_row(device: Device, threads: int | None = None) -> DeviceRow:
    """`device` at `threads` (default its own) as `seconds` reads it."""
    clusters = device.cpu_clusters
    count = max(1, threads or device.default_threads)
    first = clusters[0]
    peak = first.ghz * first.fp32_flops_per_cycle
    cores: list[tuple[float, str, str]] = []
    for cluster in clusters:
        for _ in range(cluster.count):
            cores.append((cluster.ghz * cluster.fp32_flops_per_cycle / peak,
                          cluster.core_class, cluster.microarchitecture))
    # more threads than cores: they share the cores, no faster than all cores
    return DeviceRow(ghz=first.ghz, flops_per_cycle=first.fp32_flops_per_cycle,
                     core_class=first.core_class, core=first.microarchitecture,
                     dotprod=first.dotprod,
                     memory_gbs=device.memory_gbs, threads=count,
                     cache_bytes=(device.cache_mb or DEFAULT_CACHE_MB) * 1e6,
                     cores=tuple(cores[:count]))


def core_speed(cal: Calibration, core_class: str, design: str) -> float:
    """A core's sustained speed against its peak's, as fitted: its class's, times its
    design's where published rows taught one."""
    return cal.class_factor.get(core_class, 1.0) * cal.core_factor.get(design, 1.0)


def thread_speedup(row: DeviceRow, cal: Calibration) -> float:
    """The threads' speedup on an op large enough to split fully."""
    if row.threads <= 1:
        return 1.0
    own = core_speed(cal, row.core_class, row.core)
    total = sum(speed * core_speed(cal, kind, design) / own
                for speed, kind, design in row.cores)
    return 1.0 + cal.parallel_efficiency * max(total - 1.0, 0.0)


def seconds(ops: OpArrays, row: DeviceRow, runtime: str, cal: Calibration,
            dispatch_s: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each op's seconds, its compute seconds, its memory seconds) on `row`.
    `dispatch_s`: the runtime's cost per op on this device where it was measured (a TF
    session's, probed on this host and scaled); else the calibrated cycles."""
    hz = row.ghz * 1e9
    peak = hz * row.flops_per_cycle * core_speed(cal, row.core_class, row.core)
    efficiency = np.array([[cal.efficiency.get(p, {}).get(k, cal.efficiency["float32"]
                                                          .get(k, 0.05))
                            for k in KIND_LIST] for p in PRECISIONS])
    factors = cal.runtime_factor.get(runtime, {})
    runtime_speed = np.array([factors.get(p, 1.0) for p in PRECISIONS])
    # int8 GEMMs: twice float's lanes, and SDOT's gain where the core has it; dynamic
    # range runs its matmuls in int8 too (its activations quantized on the fly)
    int8 = cal.int8_gain * (cal.dotprod_gain if row.dotprod else 1.0)
    gains = {"int8": int8, "dynamic": int8}
    int_gain = np.array([gains.get(p, 1.0) for p in PRECISIONS])
    gemm = np.isin(ops.kind, [KIND_LIST.index(k) for k in GEMM_KINDS])
    gain = np.where(gemm, int_gain[ops.precision], 1.0)
    extra = np.array([cal.element_cost.get(k, 0.0) for k in KIND_LIST])[ops.kind]
    work = ops.work + extra * ops.gemm_elements
    # the threads' speedup, less for an op too small to split well
    split = work / (work + cal.parallel_work) if cal.parallel_work > 0 else 1.0
    speedup = 1.0 + (thread_speedup(row, cal) - 1.0) * split
    rate = (peak * efficiency[ops.precision, ops.kind] * runtime_speed[ops.precision] * gain
            * speedup)
    compute = work / rate
    if row.memory_gbs:  # an op whose tensors stay in the cache never waits on the DRAM
        streamed = np.where(ops.bytes > row.cache_bytes, ops.bytes, 0.0)
        memory = streamed / (row.memory_gbs * 1e9 * cal.bandwidth_efficiency)
    else:
        memory = np.zeros_like(compute)
    dispatch = cal.dispatch_cycles / hz if dispatch_s is None else dispatch_s
    # the threads meet after an op as far as they split it; a reshape runs on one
    reshape = ops.kind == KIND_LIST.index("reshape")
    barrier = (cal.sync_cycles / hz * np.where(reshape, 0.0, split) if row.threads > 1
               else 0.0)
    return np.maximum(compute, memory) + dispatch + barrier, compute, memory


# ------------------------------------------------------------------------- one estimate

@dataclass(frozen=True)
class PricedOp:
    """One operator's cost on the device: its kernel and the runtime's cost around it."""

    name: str
    op: str
    kind: str
    precision: str
    ms: float  # kernel + dispatch (+ barrier)
    kernel_ms: float  # the kernel alone: its compute, or its bytes where that is longer
    share: float  # ms, of the whole run
    why: str


@dataclass(frozen=True)
class Pricing:
    """A model's operators priced on one device at one thread count."""

    total_ms: float
    ops: tuple[PricedOp, ...]  # every op, in run order
    threads: int
    runtime: str
    speedup: float  # the threads' speedup on an op large enough to split fully

    @property
    def kernel_ms(self) -> float:
        return sum(op.kernel_ms for op in self.ops)

    def top(self, count: int = 5) -> list[PricedOp]:
        """The `count` ops that cost most, costliest first."""
        return sorted(self.ops, key=lambda o: -o.ms)[:count]

    def by_kind(self) -> dict[str, float]:
        """Kernel time per kind of op, largest first (dispatch is the runtime's)."""
        totals: dict[str, float] = {}
        for op in self.ops:
            totals[op.kind] = totals.get(op.kind, 0.0) + op.kernel_ms
        return dict(sorted(totals.items(), key=lambda item: -item[1]))


def price(operators: Sequence[Operator], device: Device, runtime: str,
          threads: int | None = None, dispatch_ms: float | None = None,
          cal: Calibration | None = None) -> Pricing:
    """Each operator's cost on `device` with `threads` (default: the device's), and why."""
    cal = cal or calibration()
    row = device_row(device, threads)
    arrays = op_arrays(operators)
    total, compute, memory = seconds(arrays, row, runtime, cal,
                                     None if dispatch_ms is None else dispatch_ms / 1e3)
    whole_ms = float(total.sum()) * 1e3
    kernels = np.maximum(compute, memory)
    priced = []
    for index, op in enumerate(operators):
        ms = float(total[index]) * 1e3
        priced.append(PricedOp(name=short_name(op.name), op=op.op, kind=op.kind,
                               precision=op.precision, ms=ms,
                               kernel_ms=float(kernels[index]) * 1e3,
                               share=ms / whole_ms if whole_ms > 0 else 0.0,
                               why=_why(op, float(compute[index]), float(memory[index]))))
    return Pricing(total_ms=whole_ms, ops=tuple(priced), threads=row.threads,
                   runtime=runtime, speedup=thread_speedup(row, cal))


def _why(op: Operator, compute_s: float, memory_s: float) -> str:
    shape = f" ({op.detail})" if op.detail else ""
    if memory_s > compute_s and memory_s > 0:
        return (f"{KINDS.get(op.kind, op.kind)}{shape}: bound by memory, "
                f"{op.bytes / 1e6:.3g} MB moved")
    if op.kind in GEMM_KINDS and op.flops:
        return f"{KINDS.get(op.kind, op.kind)}{shape}: {op.flops / 1e6:.3g} MFLOP"
    if op.elements:
        return f"{KINDS.get(op.kind, op.kind)}{shape}: {op.elements} elements"
    return f"{KINDS.get(op.kind, op.kind)}{shape}: its dispatch"


# name scopes TF gives inside a layer: the layer's own name is the part before them
_GENERIC_SCOPES = {"batchnorm", "convolution", "depthwise", "BiasAdd", "MatMul"}


def short_name(name: str) -> str:
    """A fused op's readable name: its first part's layer (`conv_pw_1_relu/Relu6` ->
    `conv_pw_1_relu`), not TF's `a;b;c` join of every fused node."""
    first = name.split(";")[0]
    parts = [p for p in first.split("/") if p]
    if len(parts) >= 3 and parts[-2] in _GENERIC_SCOPES:  # bn1/batchnorm/mul_1: keep bn1
        return "/".join(parts[-3:])
    return parts[-2] if len(parts) >= 2 and len(parts[-1]) <= 12 else (parts[-1] if parts
                                                                       else name)
