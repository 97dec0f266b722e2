"""The device catalogue: what a target can do, and FLOPs-only latency estimates.

Light on purpose (pydantic only): recipe validation imports it, and must stay fast.

`estimate_latency_ms` is the classic rule of thumb from "Optimizing for mobile": divide the
model's FLOPs by what the device sustains per second. FLOPs follow benchmark_model's and the
v1 profiler's convention, 2 per multiply-add, which is also the convention of the per-device
figures below. It cannot see a runtime's own cost per run and per op (a TF session's is far
above LiteRT's), so the report's estimates come from orchestrator.measure.estimates, which adds that
cost as measured on this host and scaled by `core_flops_per_second`; this FLOPs-only figure
is their fallback where nothing was measured. Either is an estimate, to rank variants and
catch budget breaks early; measure on the device before shipping.

Sources of the catalogue's figures (cited per preset below):
- SPEC: the project's specification (20 / 10 / 5 GFLOP/s for a 2016 phone, a modern phone,
  a Raspberry Pi 3; ResNet-50 on a HiKey 960 measured at 1794 / 567 ms fp32, 935 / 522 ms
  int8, on 1 / 4 cores).
- VFP Benchmark (vfpbench, flatlib): measured single-thread fp32 peaks per core: Cortex-A72
  at 2.0 GHz 15.9 GFLOP/s (8 FLOP/cycle: a 4-lane NEON FMA per cycle); Snapdragon 820 Kryo
  10.5 GFLOP/s; Apple A9 Twister at 1.85 GHz 41.9 GFLOP/s (24 FLOP/cycle, 3 NEON pipes).
- Arm: Cortex-A53 issues one 128-bit NEON FMA per cycle (8 fp32 FLOP/cycle); Cortex-X1
  has 4x128-bit SIMD units (32 FLOP/cycle).
- High Performance Linpack (fp64, all cores): Raspberry Pi 4 at 1.5 GHz about 8 GFLOP/s
  (Feiereisen 2022, 64-bit OS); fp32 doubles the NEON lanes.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator

from orchestrator.limits import bounded

__all__ = ["Device", "PRESETS", "DEFAULT_PRECISION_FACTORS", "resolve_device",
           "estimate_latency_ms", "precision_of", "core_flops_per_second"]

# Latency multiplier per precision, relative to float32.
# int8 on ARM: SPEC's measured ResNet-50 on a HiKey 960 (Cortex-A73), 1 core,
# int8 935 ms / fp32 1794 ms = 0.52. The NEON 8-bit kernels are where the gain comes from.
ARM_INT8_FACTOR = 0.52
DEFAULT_PRECISION_FACTORS: Mapping[str, float] = {"float32": 1.0, "int8": ARM_INT8_FACTOR}
# at most 256 cores, as orchestrator/limits.py says and why
Cores = bounded("cores")


class Device(BaseModel):
    """A target device: compute, cores, memory, and how precision changes its speed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, description="Preset name, or a free label for an inline "
                             "device.")
    flops_per_second: PositiveFloat = Field(
        description="Sustained float32 FLOP/s with all `cores` busy (2 FLOPs per "
        "multiply-add), e.g. 20e9 for a 2016 high-end phone (SPEC's figure; about half the "
        "peak of a Snapdragon 820's four Kryo cores).")
    cores: Cores = Field(description="CPU cores the model runs on (intra-op threads).")
    cpu: str | None = Field(None, description="The CPU, as the estimate's explanation names "
                            "it, e.g. \"Cortex-A53\".")
    core_flops_per_second: PositiveFloat | None = Field(
        None, description="One core's float32 FLOP/s (2 per multiply-add), e.g. 9.6e9 for a "
        "Cortex-A53 at 1.2 GHz (8 FLOP/cycle). It scales the runtime's per-run and per-op "
        "cost measured on this host (scalar work, which follows one core's speed, not the "
        "device's total): the slowdown is this host's measured one-core FLOP/s over this. "
        "Default: flops_per_second / cores.")
    ram_mb: PositiveFloat = Field(description="Physical RAM, in MB.")
    app_ram_limit_mb: PositiveFloat | None = Field(
        None, description="RAM an app may use before the OS kills it (iOS: about 100 MB on "
        "2016 phones); null when only physical RAM limits.")
    precision_factors: dict[str, PositiveFloat] = Field(
        default_factory=lambda: dict(DEFAULT_PRECISION_FACTORS),
        description="Latency multiplier per precision relative to float32 (estimates). "
        "int8 defaults to 0.52, from SPEC's HiKey 960 ResNet-50 figures (935 ms int8 vs "
        "1794 ms fp32 on one core); on x86 it is above 1, since 8-bit is often slower there. "
        "Missing precisions take the defaults.")

    a16w8: bool = Field(
        False, description="Runs int8 weights with int16 activations (a16w8) on native "
        "kernels: a DSP or NPU with a16w8 support. False (every preset: their CPUs): LiteRT "
        "runs int16 activations on its reference kernels, slower than float, so the "
        "accuracy guard tries every int8 method before it gives a layer int16 "
        "activations.")

    @property
    def compute_unit(self) -> str:
        """What runs the model, as quantizing stages price a precision (quant/knobs.py):
        "npu" for an a16w8-capable accelerator, else "cpu"."""
        return "npu" if self.a16w8 else "cpu"

    @field_validator("precision_factors")
    @classmethod
    def _fill_defaults(cls, value: dict[str, float]) -> dict[str, float]:
        # An inline spec that only overrides "int8" still needs "float32": 1.0.
        return {**DEFAULT_PRECISION_FACTORS, **value}

    @property
    def ram_limit_mb(self) -> float:
        """The RAM a model may actually use: the app limit where there is one."""
        return self.app_ram_limit_mb or self.ram_mb


def _preset(**fields: object) -> Device:
    return Device.model_validate(fields)


PRESETS: dict[str, Device] = {
    device.name: device for device in (
        # SPEC: "a 2016 high-end phone does about 20 GFLOP/s". 4 cores, 2 GB; iOS killed
        # apps above about 100 MB. Its cores: a Snapdragon 820's Kryo (2 at 2.15 GHz, 2 at
        # 1.59 GHz; vfpbench measured 10.5 GFLOP/s fp32 on one core, so about 36 on all
        # four: SPEC's 20 sustained is 55% of that peak). An iPhone 7's Apple A10 has 2 fast
        # cores at 2.34 GHz; with A9's 3 NEON pipes (24 FLOP/cycle, vfpbench) about 56
        # GFLOP/s each, 5x a Kryo core: the overhead scales by the slower, Android flagship.
        _preset(name="phone-2016", flops_per_second=20e9, cores=4, ram_mb=2048,
                app_ram_limit_mb=100, cpu="Snapdragon 820 Kryo core",
                core_flops_per_second=10.5e9),
        # SPEC: "a modern phone about 10" (a sustained, thermally limited figure, far below
        # the published peaks: a Cortex-A78 at 2.4 GHz with 2x128-bit SIMD units does 38
        # GFLOP/s on one core, a Cortex-X1 at 3.0 GHz with 4x128-bit 96). 8 cores, 6 GB; iOS
        # lets an app use about a third of RAM. One core: the Cortex-A78's peak.
        _preset(name="phone-modern", flops_per_second=10e9, cores=8, ram_mb=6144,
                app_ram_limit_mb=2048, cpu="Cortex-A78", core_flops_per_second=38.4e9),
        # SPEC: "a Raspberry Pi 3 about 5". 4x Cortex-A53 at 1.2 GHz, 1 GB, plain Linux (no
        # app limit). Peak: 4 cores x 1.2 GHz x 8 FLOP/cycle (one 4-lane NEON FMA per cycle)
        # = 38.4 GFLOP/s, so SPEC's 5 is 13% of peak, as TF's kernels sustain on an in-order
        # core. Roy Longbottom's MP-MFLOPS (compiled, not NEON) measured 0.8 GFLOP/s fp32 on
        # one core of a Pi 3B+ and 3.1 on four.
        _preset(name="raspberry-pi-3", flops_per_second=5e9, cores=4, ram_mb=1024,
                cpu="Cortex-A53", core_flops_per_second=9.6e9),
        # Not in SPEC's figures (its example recipe names it). 4x Cortex-A72 at 1.5 GHz
        # (1.8 GHz on later boards), 1-8 GB (4 GB here), Linux. Peak 4 x 1.5 GHz x 8
        # FLOP/cycle (vfpbench measured 8 on an A72: 15.9 GFLOP/s at 2.0 GHz) = 48 GFLOP/s;
        # High Performance Linpack measured about 8 GFLOP/s fp64 on all four cores
        # (Feiereisen 2022), and Roy Longbottom's benchmarks put it at about 2x a Pi 3B+.
        # 10 GFLOP/s: twice SPEC's Pi 3 figure, 21% of peak.
        _preset(name="raspberry-pi-4", flops_per_second=10e9, cores=4, ram_mb=4096,
                cpu="Cortex-A72", core_flops_per_second=12e9),
        # Derived from SPEC's measurement, ResNet-50 on the HiKey 960's 4 Cortex-A73 cores
        # at 2.36 GHz (the LITTLE A53 cluster is not counted). ResNet-50 is about 4.1 G
        # multiply-adds, i.e. about 8.2 GFLOP in the profiler's 2-per-multiply-add count.
        #   fp32: 8.2 GFLOP / 0.567 s (4 cores) = 14.5 GFLOP/s  (1 core: 8.2 / 1.794 = 4.6)
        #   int8 on 4 cores: 522 / 567 = 0.92. The 8-bit kernels scaled poorly past one
        #   core in that measurement, so on this board the 1-core factor (0.52) would
        #   overstate the gain at 4 threads. 3 GB RAM, Linux.
        # One core's peak: 2.36 GHz x 8 FLOP/cycle (as the A72; no A73 figure was found
        # published) = 18.9 GFLOP/s; SPEC's 1-core ResNet-50 sustains 24% of it.
        _preset(name="hikey-960", flops_per_second=14.5e9, cores=4, ram_mb=3072,
                precision_factors={"float32": 1.0, "int8": 0.92}, cpu="Cortex-A73",
                core_flops_per_second=18.9e9),
        # A 16-core AVX2 server, about 200 GFLOP/s sustained in TF's float kernels (an
        # estimate, not SPEC's). The classic 8-bit kernels are tuned for ARM NEON and are
        # often slower than float on x86 (SPEC): 2.0 is a rough estimate; measure with
        # `benchmark` instead. One core: 2.0 GHz x 32 FLOP/cycle (two 8-lane AVX2 FMA
        # units) = 64 GFLOP/s peak.
        _preset(name="x86-server", flops_per_second=200e9, cores=16, ram_mb=65536,
                precision_factors={"float32": 1.0, "int8": 2.0}, cpu="x86-64 AVX2 core",
                core_flops_per_second=64e9),
    )
}


def core_flops_per_second(device: Device) -> float:
    """One core's float32 FLOP/s: the catalogue's figure, else the device's total / cores."""
    return device.core_flops_per_second or device.flops_per_second / device.cores


def resolve_device(spec: str | Device) -> Device:
    """A Device from a preset name or an inline spec.

    Raises ValueError (never KeyError) for an unknown preset, naming the known ones and the
    closest match.
    """
    if isinstance(spec, Device):
        return spec
    device = PRESETS.get(spec)
    if device is not None:
        return device
    close = difflib.get_close_matches(spec, list(PRESETS), n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    raise ValueError(f"unknown device preset {spec!r}{hint}; known presets: "
                     f"{', '.join(sorted(PRESETS))}, or give an inline spec with "
                     "flops_per_second, cores and ram_mb")


def estimate_latency_ms(flops: float, device: Device, precision: str = "float32") -> float:
    """Estimated latency of one inference of `flops` FLOPs on `device`, in ms.

    flops / flops_per_second * precision factor * 1000. A precision the device does not
    list counts as float32 speed.
    """
    factor = device.precision_factors.get(precision, 1.0)
    return flops / device.flops_per_second * factor * 1000.0


def precision_of(op_counts: Mapping[str, int]) -> str:
    """"int8" when the graph has any Quantized* op (quantize_nodes), else "float32".

    quantize_weights graphs have no Quantized* ops: they run in float after expanding the
    weights at load, so they count as float32.
    """
    quantized = any(op.startswith("Quantized") and count > 0
                    for op, count in op_counts.items())
    return "int8" if quantized else "float32"
