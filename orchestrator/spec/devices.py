"""The device catalogue: what a target's CPU is (its clusters: cores, clocks, FLOPs per
cycle, dot product), its DRAM bandwidth and RAM, the threads a model runs with, and where
each figure comes from (`sources`; `orchestrator devices NAME` prints them).

Light on purpose (pydantic only): recipe validation imports it, and must stay fast.

The report's estimates price a file's operators on these clusters
(orchestrator.measure.cost_model and estimates). `flops_per_second` and
`precision_factors` serve only the FLOPs-only fallback, for a file whose operators were
not recorded (`estimate_latency_ms`: FLOPs / what the device sustains per second, 2 FLOPs
per multiply-add as benchmark_model and TF's v1 profiler count). Either is an estimate, to
rank variants and catch budget breaks early; measure on the device before shipping.

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
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    field_validator,
    model_validator,
)

from orchestrator.limits import bounded

__all__ = ["Device", "Cluster", "PRESETS", "DEFAULT_PRECISION_FACTORS", "resolve_device",
           "estimate_latency_ms", "precision_of", "core_flops_per_second"]

# Latency multiplier per precision, relative to float32.
# int8 on ARM: SPEC's measured ResNet-50 on a HiKey 960 (Cortex-A73), 1 core,
# int8 935 ms / fp32 1794 ms = 0.52. The NEON 8-bit kernels are where the gain comes from.
ARM_INT8_FACTOR = 0.52
DEFAULT_PRECISION_FACTORS: Mapping[str, float] = {"float32": 1.0, "int8": ARM_INT8_FACTOR}
# at most 256 cores, as orchestrator/limits.py says and why
Cores = bounded("cores")


class Cluster(BaseModel):
    """One cluster of identical CPU cores: what the per-op estimate prices a core by."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    core: str = Field(description="The core, e.g. \"Cortex-A76\" or \"Apple Vortex\".")
    count: Cores = Field(description="Cores in this cluster.")
    ghz: PositiveFloat = Field(description="Their highest sustained clock, GHz.")
    fp32_flops_per_cycle: PositiveFloat = Field(
        description="Peak float32 FLOPs per cycle of one core (2 per multiply-add): 8 per "
        "128-bit NEON FMA pipe, e.g. 8 for a Cortex-A53 or A72, 16 for an A76 or A78, 32 "
        "for an X1.")
    dotprod: bool = Field(False, description="Has Armv8.2's int8 dot-product instructions "
                          "(SDOT/UDOT), which int8 GEMM kernels use: the calibration's "
                          "dot-product gain applies to its int8 ops.")
    in_order: bool = Field(False, description="An in-order core (Cortex-A53, A55): it "
                           "sustains a smaller share of its peak.")
    big: bool = Field(True, description="A big (fast) core: a model's threads go to these "
                      "by default; false for a big.LITTLE chip's little cluster.")

    @property
    def microarchitecture(self) -> str:
        """The core design a vendor's name builds on: "Kryo 385 Gold (Cortex-A75)" ->
        "Cortex-A75" (the calibration's per-core factors are per design)."""
        inner = self.core.partition("(")[2].rstrip(")").strip()
        return inner or self.core

    @property
    def core_class(self) -> str:
        """The class of core the calibration's rates are per (cost_model)."""
        if self.core.lower().startswith("apple"):
            return "apple"
        if "x86" in self.core.lower():
            return "x86"
        return "arm-in-order" if self.in_order else "arm-ooo"


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

    soc: str | None = Field(None, description="The system on chip, e.g. \"Snapdragon 855\".")
    clusters: list[Cluster] | None = Field(
        None, max_length=8, description="The CPU's clusters, fastest first: what the "
        "per-op estimate prices (docs/estimates.md). Without them the estimate takes one "
        "cluster of `cores` out-of-order Arm cores at core_flops_per_second.")
    memory_gbs: PositiveFloat | None = Field(
        None, description="DRAM bandwidth, GB/s (theoretical: bus width x transfer rate): "
        "ops that move more bytes than they compute are priced by it.")
    cache_mb: PositiveFloat | None = Field(
        None, description="The last-level cache a model's tensors can stay in, MB: an op "
        "whose bytes fit moves them at the cache's speed, not the DRAM's. Default: 1 MB (a "
        "phone's or a board's L2).")
    threads: Cores | None = Field(
        None, description="Threads a model runs with. Default: the big cores. A target's "
        "`threads:` sets it.")
    sources: list[str] = Field(default_factory=list, max_length=32,
                               description="Where each figure comes from.")

    @property
    def cpu_clusters(self) -> list[Cluster]:
        """The clusters, or the one the flat figures describe (an inline device)."""
        if self.clusters:
            return list(self.clusters)
        per_core = core_flops_per_second(self)
        return [Cluster(core=self.cpu or "Arm core (assumed out-of-order)", count=self.cores,
                        ghz=per_core / 8e9, fp32_flops_per_cycle=8.0)]

    @property
    def big_cores(self) -> int:
        return sum(c.count for c in self.cpu_clusters if c.big) or self.cores

    @property
    def default_threads(self) -> int:
        """The threads an estimate is for: the target's, else the big cores."""
        return self.threads or self.big_cores

    @property
    def compute_unit(self) -> str:
        """What runs the model, as quantizing stages price a precision (quant/knobs.py):
        "npu" for an a16w8-capable accelerator, else "cpu"."""
        return "npu" if self.a16w8 else "cpu"

    @model_validator(mode="after")
    def _threads_fit(self) -> Device:
        if self.threads is not None and self.threads > self.cores:
            raise ValueError(f"threads: {self.threads} is more than the device's {self.cores} "
                             "cores: threads beyond its cores only share them")
        return self

    @field_validator("precision_factors")
    @classmethod
    def _fill_defaults(cls, value: dict[str, float]) -> dict[str, float]:
        # An inline spec that only overrides "int8" still needs "float32": 1.0.
        return {**DEFAULT_PRECISION_FACTORS, **value}

    @property
    def ram_limit_mb(self) -> float:
        """The RAM a model may actually use: the app limit where there is one."""
        return self.app_ram_limit_mb or self.ram_mb


# The last level of cache a core reaches, MB: the shared L2 or L3 (the DSU's, not a
# system cache behind it). Sources: the MLPerf v0.5 system descriptions (HiKey 960 2 MB,
# RK3399 1 MB big cluster, Pi 4 1 MB); Wikipedia's Kryo page (Snapdragon 820/821: 1 MB);
# dday.it (Snapdragon 835: 2 MB); AnandTech (845: 2 MB L3; Apple A11/A12: 8 MB L2; Tensor:
# 4 MB L3); WikiChip (855: 2 MB L3); the Pi 5 announcement (2 MB L3); NVIDIA's Orin Nano
# datasheet (2 MB L3 per cluster); Wikipedia, Apple A16 (16 MB L2). Assumed, not found:
# the Pi 3's 512 KB, the Snapdragon 670's and 888's, the Tensor G3's (as the G1's).
CACHE_MB = {"phone-2016": 1.0, "pixel-xl": 1.0, "pixel-2": 2.0, "pixel-3": 2.0,
            "pixel-3a": 1.0, "pixel-4": 2.0, "pixel-6": 4.0, "pixel-8": 4.0,
            "phone-modern": 4.0, "iphone-8": 8.0, "iphone-xs": 8.0, "iphone-15": 16.0,
            "raspberry-pi-3": 0.5, "raspberry-pi-4": 1.0, "raspberry-pi-5": 2.0,
            "rk3399": 1.0, "hikey-960": 2.0, "jetson-orin-nano": 2.0, "x86-server": 32.0}
DEFAULT_CACHE_MB = 1.0


def _preset(**fields: Any) -> Device:
    fields.setdefault("cache_mb", CACHE_MB.get(str(fields.get("name"))))
    clusters = fields.get("clusters")
    if clusters and "core_flops_per_second" not in fields:
        first = clusters[0]
        fields["core_flops_per_second"] = first.ghz * first.fp32_flops_per_cycle * 1e9
    if clusters and "flops_per_second" not in fields:
        # the FLOPs-only fallback's figure: a quarter of the big cores' peak, about what
        # the fitted rates sustain on a model's mix of convolutions (docs/estimates.md)
        fields["flops_per_second"] = 0.25e9 * sum(
            c.count * c.ghz * c.fp32_flops_per_cycle for c in clusters if c.big)
    if clusters and "cores" not in fields:
        fields["cores"] = sum(c.count for c in clusters)
    return Device.model_validate(fields)


def _cores(core: str, count: int, ghz: float, flops_per_cycle: float, *, dotprod: bool = False,
           in_order: bool = False, big: bool = True) -> Cluster:
    return Cluster(core=core, count=count, ghz=ghz, fp32_flops_per_cycle=flops_per_cycle,
                   dotprod=dotprod, in_order=in_order, big=big)


# Sources of the clusters' figures, cited by key in each preset's `sources`:
VFPBENCH = ("vfpbench (flatlib, wlog.flatlib.jp 2015-2019): measured one-core fp32 peaks, "
            "8 FLOP/cycle on Kryo, A53, A55, A72, A75; 24 on Apple's 3-pipe cores (A9)")
LLVM_CORES = ("llvm/llvm-project AArch64Processors.td: which cores have the dot product "
              "(A75, A55, A76, A78, X1 and later; not A53, A72, A73, Kryo, Apple A11/A12)")
NEON_PIPES = ("Arm and LLVM scheduling models (AArch64SchedNeoverseN1.td, copied from "
              "Cortex-A76): 2x128-bit FP/ASIMD pipes on A76/A78 (16 FLOP/cycle); "
              "Linley Group on X1: 4x128-bit (32)")
MLPERF_SYSTEMS = ("mlcommons/inference_results_v0.5 closed/dividiti/systems/*.json: the "
                  "boards' cores, clocks, caches and memory")


PRESETS: dict[str, Device] = {
    device.name: device for device in (
        # SPEC: "a 2016 high-end phone does about 20 GFLOP/s". A Snapdragon 820: 2 Kryo at
        # 2.15 GHz and 2 at 1.59 GHz, 8 FLOP/cycle (vfpbench); LPDDR4-3733 on 64 bits.
        # iOS killed apps above about 100 MB.
        _preset(name="phone-2016", flops_per_second=20e9, ram_mb=2048, app_ram_limit_mb=100,
                cpu="Snapdragon 820 Kryo core", soc="Snapdragon 820",
                clusters=[_cores("Kryo", 2, 2.15, 8), _cores("Kryo", 2, 1.59, 8, big=False)],
                memory_gbs=29.9,
                sources=["SPEC: 20 GFLOP/s sustained", VFPBENCH, LLVM_CORES,
                         "nanoreview SD820/821: 2x2.15 + 2x1.59 GHz Kryo, LPDDR4 1866 MHz "
                         "4x16 bit (29.8 GB/s)"]),
        # SPEC: "a modern phone about 10" (a sustained, thermally limited figure). Its
        # clusters: a Cortex-A78 class phone (Snapdragon 888-like: 1 X1, 3 A78, 4 A55).
        _preset(name="phone-modern", flops_per_second=10e9, ram_mb=6144,
                app_ram_limit_mb=2048, cpu="Cortex-A78", soc="Snapdragon 888 class",
                clusters=[_cores("Cortex-X1", 1, 2.84, 32, dotprod=True),
                          _cores("Cortex-A78", 3, 2.42, 16, dotprod=True),
                          _cores("Cortex-A55", 4, 1.8, 8, dotprod=True, in_order=True,
                                 big=False)],
                memory_gbs=51.2,
                sources=["SPEC: 10 GFLOP/s sustained", NEON_PIPES, LLVM_CORES,
                         "LPDDR5-6400 on 64 bits: 51.2 GB/s (derived)"]),
        # SPEC: "a Raspberry Pi 3 about 5". 4x Cortex-A53 at 1.2 GHz, in order, 8
        # FLOP/cycle; 1 GB LPDDR2 at 900 MT/s on 32 bits (3.6 GB/s, the width assumed).
        _preset(name="raspberry-pi-3", flops_per_second=5e9, ram_mb=1024, cpu="Cortex-A53",
                soc="BCM2837", clusters=[_cores("Cortex-A53", 4, 1.2, 8, in_order=True)],
                memory_gbs=3.6, core_flops_per_second=9.6e9,
                sources=["SPEC: 5 GFLOP/s sustained", VFPBENCH, LLVM_CORES,
                         "Raspberry Pi Beginner's Guide 2018: LPDDR2 at 900 MHz"]),
        # 4x Cortex-A72 at 1.5 GHz (1.8 on boards from rev 1.4), 8 FLOP/cycle (vfpbench);
        # LPDDR4-3200 on 32 bits: 12.8 GB/s (STREAM measures 5.5: sci-pi.org.uk).
        _preset(name="raspberry-pi-4", flops_per_second=10e9, ram_mb=4096, cpu="Cortex-A72",
                soc="BCM2711", clusters=[_cores("Cortex-A72", 4, 1.5, 8)], memory_gbs=12.8,
                core_flops_per_second=12e9,
                sources=[MLPERF_SYSTEMS, VFPBENCH, LLVM_CORES,
                         "raspberrypi/documentation config_txt/overclocking: 1500 MHz "
                         "(1800 from rev 1.4)", "Raspberry Pi 4 spec: LPDDR4-3200"]),
        # 4x Cortex-A76 at 2.4 GHz (the emulated board's core), 16 FLOP/cycle, dot
        # product; LPDDR4X-4267 on 32 bits: 17 GB/s; 512 KB L2 per core, 2 MB L3.
        _preset(name="raspberry-pi-5", ram_mb=8192, cpu="Cortex-A76", soc="BCM2712",
                clusters=[_cores("Cortex-A76", 4, 2.4, 16, dotprod=True)], memory_gbs=17.1,
                sources=["Raspberry Pi 5 announcement (Upton 2023): 2.4 GHz quad A76, "
                         "LPDDR4X-4267", NEON_PIPES, LLVM_CORES]),
        # HiKey 960: 4 Cortex-A73 at 2.36 GHz + 4 A53 at 1.84; LPDDR4-3600 on 64 bits.
        # SPEC measured ResNet-50 at 1794 / 567 ms fp32, 935 / 522 ms int8 on 1 / 4 cores.
        _preset(name="hikey-960", flops_per_second=14.5e9, ram_mb=3072,
                precision_factors={"float32": 1.0, "int8": 0.92}, cpu="Cortex-A73",
                soc="Kirin 960", clusters=[_cores("Cortex-A73", 4, 2.362, 8),
                                           _cores("Cortex-A53", 4, 1.844, 8, in_order=True,
                                                  big=False)],
                memory_gbs=28.8, core_flops_per_second=18.9e9,
                sources=["SPEC: ResNet-50 measured on 1 and 4 cores", MLPERF_SYSTEMS,
                         LLVM_CORES, "nanoreview Kirin 960: LPDDR4 1800 MHz 2x32 bit"]),
        # Firefly-RK3399: 2 Cortex-A72 at 1.8 GHz + 4 A53 at 1.4; dual-channel 32-bit
        # DRAM (12.8 GB/s if DDR3-1600/LPDDR4-1600: the board's type is not published).
        _preset(name="rk3399", ram_mb=4096, cpu="Cortex-A72", soc="RK3399",
                clusters=[_cores("Cortex-A72", 2, 1.8, 8),
                          _cores("Cortex-A53", 4, 1.4, 8, in_order=True, big=False)],
                memory_gbs=12.8,
                sources=[MLPERF_SYSTEMS, VFPBENCH, LLVM_CORES,
                         "RK3399 datasheet: dual-channel 32-bit DRAM (rate assumed 1600)"]),
        # Pixel XL: Snapdragon 821, 2 Kryo at 2.34 GHz + 2 at 1.6 (vfpbench: 18.7 GFLOP/s
        # on one big core), LPDDR4-3733 on 64 bits.
        _preset(name="pixel-xl", ram_mb=4096, app_ram_limit_mb=512, cpu="Kryo",
                soc="Snapdragon 821",
                clusters=[_cores("Kryo", 2, 2.342, 8), _cores("Kryo", 2, 1.6, 8, big=False)],
                memory_gbs=29.9,
                sources=[VFPBENCH, LLVM_CORES, "nanoreview SD821: 2x2.342 + 2x1.6 GHz"]),
        # Pixel 2: Snapdragon 835, 4 Kryo 280 Gold (A73-based) at 2.45 GHz + 4 at 1.9.
        _preset(name="pixel-2", ram_mb=4096, app_ram_limit_mb=512, cpu="Kryo 280 Gold",
                soc="Snapdragon 835",
                clusters=[_cores("Kryo 280 Gold (Cortex-A73)", 4, 2.45, 8),
                          _cores("Kryo 280 Silver (Cortex-A53)", 4, 1.9, 8, in_order=True,
                                 big=False)],
                memory_gbs=29.9,
                sources=[VFPBENCH, LLVM_CORES, "Qualcomm at CES 2017: 4x2.45 + 4x1.9 GHz",
                         "AnandTech: Kryo 280 is a modified Cortex-A73"]),
        # Pixel 3: Snapdragon 845, 4 Kryo 385 Gold (A75) at 2.8 GHz + 4 A55 at 1.77;
        # quad-channel LPDDR4X-3733 (29.9 GB/s); vfpbench 22.3 GFLOP/s on one big core.
        _preset(name="pixel-3", ram_mb=4096, app_ram_limit_mb=512, cpu="Cortex-A75",
                soc="Snapdragon 845",
                clusters=[_cores("Kryo 385 Gold (Cortex-A75)", 4, 2.8, 8, dotprod=True),
                          _cores("Kryo 385 Silver (Cortex-A55)", 4, 1.77, 8, dotprod=True,
                                 in_order=True, big=False)],
                memory_gbs=29.9,
                sources=[VFPBENCH, LLVM_CORES, "WikiChip Snapdragon 845: 4x2.8 + 4x1.7 "
                         "GHz, quad-channel LPDDR4X-3733", "AnandTech SD845 preview"]),
        # Pixel 3a: Snapdragon 670, 2 Kryo 360 Gold (A75) at 2.0 GHz + 6 A55 at 1.7;
        # dual-channel 16-bit LPDDR4X-3733 (14.9 GB/s).
        _preset(name="pixel-3a", ram_mb=4096, app_ram_limit_mb=512, cpu="Cortex-A75",
                soc="Snapdragon 670",
                clusters=[_cores("Kryo 360 Gold (Cortex-A75)", 2, 2.0, 8, dotprod=True),
                          _cores("Kryo 360 Silver (Cortex-A55)", 6, 1.7, 8, dotprod=True,
                                 in_order=True, big=False)],
                memory_gbs=14.9,
                sources=[VFPBENCH, LLVM_CORES, "Qualcomm Snapdragon 670 product brief: "
                         "2x2.0 + 6x1.7 GHz Kryo 360, LPDDR4X 1866 MHz 2x16 bit"]),
        # Pixel 4: Snapdragon 855, 1 A76 at 2.84 GHz + 3 at 2.42 + 4 A55 at 1.8;
        # quad-channel LPDDR4X-4266 (34.1 GB/s).
        _preset(name="pixel-4", ram_mb=6144, app_ram_limit_mb=1024, cpu="Cortex-A76",
                soc="Snapdragon 855",
                clusters=[_cores("Kryo 485 Gold prime (Cortex-A76)", 1, 2.84, 16,
                                 dotprod=True),
                          _cores("Kryo 485 Gold (Cortex-A76)", 3, 2.42, 16, dotprod=True),
                          _cores("Kryo 485 Silver (Cortex-A55)", 4, 1.8, 8, dotprod=True,
                                 in_order=True, big=False)],
                memory_gbs=34.1,
                sources=[NEON_PIPES, LLVM_CORES, "WikiChip Snapdragon 855: 1x2.84 + 3x2.42 "
                         "+ 4x1.8 GHz, quad-channel LPDDR4X-4266"]),
        # Pixel 6: Google Tensor, 2 X1 at 2.8 GHz + 2 A76 at 2.25 + 4 A55 at 1.8; LPDDR5
        # (51.2 GB/s for 64-bit LPDDR5-6400: the rate is not published).
        _preset(name="pixel-6", ram_mb=8192, app_ram_limit_mb=2048, cpu="Cortex-X1",
                soc="Google Tensor",
                clusters=[_cores("Cortex-X1", 2, 2.802, 32, dotprod=True),
                          _cores("Cortex-A76", 2, 2.253, 16, dotprod=True),
                          _cores("Cortex-A55", 4, 1.8, 8, dotprod=True, in_order=True,
                                 big=False)],
                memory_gbs=51.2,
                sources=[NEON_PIPES, LLVM_CORES, "notebookcheck / XDA: the Pixel 6 Pro's "
                         "/proc/cpuinfo (2x2.80 X1, 2x2.25 A76, 4x1.80 A55)"]),
        # Pixel 8: Tensor G3, 1 X3 at 2.91 GHz + 4 A715 at 2.37 + 4 A510 at 1.7.
        _preset(name="pixel-8", ram_mb=8192, app_ram_limit_mb=2048, cpu="Cortex-X3",
                soc="Google Tensor G3",
                clusters=[_cores("Cortex-X3", 1, 2.91, 32, dotprod=True),
                          _cores("Cortex-A715", 4, 2.37, 16, dotprod=True),
                          _cores("Cortex-A510", 4, 1.7, 8, dotprod=True, in_order=True,
                                 big=False)],
                memory_gbs=51.2,
                sources=["Android Authority: the Tensor G3's clusters (Device Info HW)",
                         "LLVM: X3 modelled as Neoverse V2 (4 ASIMD pipes), A715 as N2 (2)",
                         LLVM_CORES]),
        # iPhone 8: Apple A11, 2 Monsoon at 2.38 GHz + 4 Mistral (out of order, ~1.6 GHz);
        # 24 FLOP/cycle assumed from the A9's 3 measured NEON pipes; no dot product.
        _preset(name="iphone-8", ram_mb=2048, app_ram_limit_mb=700, cpu="Apple Monsoon",
                soc="Apple A11",
                clusters=[_cores("Apple Monsoon", 2, 2.38, 24),
                          _cores("Apple Mistral", 4, 1.6, 8, big=False)],
                memory_gbs=29.9,
                sources=["AnandTech iPhone XS review: A11 and A12 clocks measured",
                         VFPBENCH, LLVM_CORES]),
        # iPhone XS: Apple A12, 2 Vortex at 2.5 GHz + 4 Tempest at 1.59; LPDDR4X-4266.
        _preset(name="iphone-xs", ram_mb=4096, app_ram_limit_mb=1400, cpu="Apple Vortex",
                soc="Apple A12",
                clusters=[_cores("Apple Vortex", 2, 2.5, 24),
                          _cores("Apple Tempest", 4, 1.59, 8, big=False)],
                memory_gbs=34.1,
                sources=["AnandTech iPhone XS review: Vortex 2.5 GHz, Tempest 1.59",
                         VFPBENCH, LLVM_CORES]),
        # iPhone 15: Apple A16, 2 Everest at 3.46 GHz (4x128-bit FMA assumed) + 4
        # Sawtooth; dot product and i8mm; LPDDR5.
        _preset(name="iphone-15", ram_mb=6144, app_ram_limit_mb=3000, cpu="Apple Everest",
                soc="Apple A16",
                clusters=[_cores("Apple Everest", 2, 3.46, 32, dotprod=True),
                          _cores("Apple Sawtooth", 4, 2.02, 8, dotprod=True, big=False)],
                memory_gbs=51.2,
                sources=["Wikipedia, Apple A16: 2 P-cores at 3.46 GHz, 4 E-cores, LPDDR5",
                         LLVM_CORES]),
        # Jetson Orin Nano (8 GB): 6 Cortex-A78AE at 1.5 GHz; 128-bit LPDDR5, 68 GB/s
        # shared with the GPU (the estimate is for the CPU).
        _preset(name="jetson-orin-nano", ram_mb=8192, cpu="Cortex-A78AE",
                soc="NVIDIA Orin (Nano)",
                clusters=[_cores("Cortex-A78AE", 6, 1.5, 16, dotprod=True)],
                memory_gbs=68.0,
                sources=["NVIDIA Jetson Orin Nano datasheet: 6x A78AE, 128-bit LPDDR5 "
                         "68 GB/s", NEON_PIPES, LLVM_CORES]),
        # A 16-core AVX2 server: one core 2.0 GHz x 32 FLOP/cycle (two 8-lane AVX2 FMA
        # units). The classic 8-bit kernels are tuned for ARM NEON and often slower than
        # float on x86 (SPEC).
        _preset(name="x86-server", flops_per_second=200e9, ram_mb=65536,
                precision_factors={"float32": 1.0, "int8": 2.0}, cpu="x86-64 AVX2 core",
                clusters=[_cores("x86-64 AVX2 core", 16, 2.0, 32)], memory_gbs=100.0,
                core_flops_per_second=64e9,
                sources=["an AVX2 core: 2 FMA units x 8 lanes x 2 = 32 FLOP/cycle"]),
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
