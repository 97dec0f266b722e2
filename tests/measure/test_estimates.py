"""The latency model: FLOPs at the device's speed plus the runtime's own cost, calibrated on
this host's measurement of the same file and scaled by the device's one-core speed. Pure
arithmetic on given figures: nothing is timed here."""

from __future__ import annotations

import pytest

from orchestrator.formatting import format_ms
from orchestrator.measure.estimates import basis, estimate
from orchestrator.spec.devices import PRESETS, Device, core_flops_per_second, estimate_latency_ms

PI3, PHONE = PRESETS["raspberry-pi-3"], PRESETS["phone-2016"]
FLOPS = 1.2e6  # about the digits CNN
HOST_FLOPS, HOST_CORE = 100e9, 80e9


def measured(p50_ms: float, ops: int, runtime: str = "tensorflow", fixed_ms: float = 0.08,
             min_ms: float | None = None, per_op_ms: float | None = 0.002,
             cv: float | None = 0.05) -> dict[str, object]:
    return basis(p50_ms, HOST_FLOPS, HOST_CORE, fixed_ms, ops, runtime, min_ms=min_ms,
                 per_op_ms=per_op_ms, cv=cv)


def test_without_a_host_measurement_it_is_flops_only_and_says_so() -> None:
    made = estimate(FLOPS, PI3, "int8")
    assert made is not None
    assert made.latency_ms == pytest.approx(estimate_latency_ms(FLOPS, PI3, "int8"))
    assert made.overhead_ms is None and made.host_p50_ms is None
    assert not made.ceiling_applied and made.host_cv is None
    assert "FLOPs only" in made.method and "benchmark" in made.method
    assert estimate(None, PI3, "int8", measured(0.25, 40)) is None  # no FLOPs: no estimate
    # a cached benchmark result from before the host's speed was recorded: FLOPs only
    old = {"host_p50_ms": 0.25, "ops": 40}
    assert estimate(FLOPS, PI3, "float32", old).overhead_ms is None  # type: ignore[union-attr]


def test_within_the_band_the_file_own_measurement_decides() -> None:
    # 40 graph nodes: the runtime costs 80 µs to 80 + 40 x 2 = 160 µs a run on this host
    p50, fastest, ops, fixed, per_op = 0.18, 0.15, 40, 0.08, 0.002
    made = estimate(FLOPS, PI3, "float32", measured(p50, ops, fixed_ms=fixed,
                                                   min_ms=fastest, per_op_ms=per_op))
    assert made is not None
    host_compute = FLOPS / HOST_FLOPS * 1000  # 0.012 ms
    slowdown = HOST_CORE / 9.6e9  # a Cortex-A53 at 1.2 GHz, 8 FLOP/cycle
    assert made.device_slowdown == pytest.approx(slowdown, rel=1e-3)
    assert made.compute_ms == pytest.approx(FLOPS / 5e9 * 1000)
    assert made.overhead_ms == pytest.approx((fastest - host_compute) * slowdown)
    assert made.latency_ms == pytest.approx(made.compute_ms + made.overhead_ms)
    assert not made.ceiling_applied
    # the probe's costs per run and per op, scaled to the device
    assert made.fixed_ms == pytest.approx(fixed * slowdown)
    assert made.per_op_ms == pytest.approx(per_op * slowdown)
    assert made.host_p50_ms == p50 and made.host_fastest_ms == fastest
    assert made.ops == ops and made.runtime == "tensorflow" and made.host_cv == 0.05
    for words in ("compute", "1.2 MFLOP", "5 GFLOP/s", "150 µs fastest run", "p50 180 µs",
                  "Cortex-A53", "40 graph nodes", "taken as measured",
                  "TF session: 80.0 µs per run + 2.00 µs per op, probed on this host"):
        assert words in made.method, (words, made.method)
    assert "spread" not in made.method
    # the console's line: the two terms, each as the method says them, in one short line
    assert made.summary == (f"{made.method.split(' + ')[0]} + {format_ms(made.overhead_ms)} "
                            f"runtime overhead ({format_ms(fastest - host_compute)} on this "
                            f"host ×{slowdown:.3g} for a Cortex-A53)"), made.summary
    assert len(made.summary) < 140
    shown = made.to_json()
    assert set(shown) >= {"method", "compute_ms", "overhead_ms", "host_p50_ms",
                          "host_fastest_ms", "device_slowdown", "fixed_ms", "per_op_ms",
                          "ops", "runtime", "ceiling_applied", "host_cv"}
    assert "latency_ms" not in shown  # est_latency_ms stays the target's own key


def test_the_same_graph_memory_mapped_or_not_gets_the_same_estimate_above_the_ceiling(
        ) -> None:
    # one graph as a GraphDef and memory-mapped: x86's slow 8-bit kernels and a busy host
    # made their fastest runs 0.25 ms and 0.9 ms, both over what the runtime itself costs
    ceiling = 0.08 + 40 * 0.002
    graphdef = estimate(FLOPS, PI3, "int8", measured(0.4, 40, min_ms=0.25))
    mapped = estimate(FLOPS, PI3, "int8", measured(1.5, 40, min_ms=0.9))
    assert graphdef is not None and mapped is not None
    assert graphdef.latency_ms == mapped.latency_ms
    assert graphdef.ceiling_applied and mapped.ceiling_applied
    assert graphdef.overhead_ms == pytest.approx(ceiling * HOST_CORE / 9.6e9)
    assert graphdef.host_fastest_ms != mapped.host_fastest_ms  # each keeps its own timing
    assert "does not carry over to another CPU" in graphdef.method
    assert "8-bit kernels" in graphdef.method and "capped" in graphdef.method
    fp32 = estimate(FLOPS, PI3, "float32", measured(0.4, 40, min_ms=0.25))
    assert fp32 is not None and fp32.ceiling_applied and "8-bit" not in fp32.method
    # just under the ceiling the file's own measurement counts, and is below the cap
    inside = estimate(FLOPS, PI3, "int8", measured(0.4, 40, min_ms=0.16))
    assert inside is not None and not inside.ceiling_applied
    assert inside.latency_ms < graphdef.latency_ms


def test_a_run_below_the_floor_gets_the_runtime_cost_per_run() -> None:
    # 1 GFLOP in 1 ms on a 100 GFLOP/s host: faster kernels than the probe's matmul; what
    # remains is the runtime's measured cost per run
    made = estimate(1e9, PI3, "float32", measured(1.0, 10, fixed_ms=0.08))
    assert made is not None
    assert made.overhead_ms == pytest.approx(0.08 * made.device_slowdown, rel=1e-3)
    assert made.fixed_ms == made.overhead_ms and not made.ceiling_applied
    assert "leaves nothing" in made.method and "under the runtime's 80.0 µs per run" in \
        made.method
    # a LiteRT file whose fastest run is within timer resolution of the compute
    lite = estimate(FLOPS, PI3, "int8", measured(0.0125, 8, "litert", fixed_ms=0.0005,
                                                 per_op_ms=3e-5, min_ms=0.0121))
    assert lite is not None
    assert lite.overhead_ms == pytest.approx(0.0005 * lite.device_slowdown, rel=1e-3)
    assert "LiteRT interpreter: 0.500 µs per run + 0.0300 µs per op" in lite.method
    bare = estimate(1e9, PI3, "float32", measured(1.0, 10, fixed_ms=0.0))
    assert bare is not None and bare.overhead_ms == 0.0 and bare.latency_ms == bare.compute_ms


def test_a_slower_core_scales_the_overhead_up() -> None:
    given = measured(0.25, 40)
    fast = Device(flops_per_second=5e9, cores=4, ram_mb=1024, core_flops_per_second=40e9)
    slow = Device(flops_per_second=5e9, cores=4, ram_mb=1024, core_flops_per_second=4e9)
    quick, sluggish = estimate(FLOPS, fast, "float32", given), estimate(FLOPS, slow,
                                                                      "float32", given)
    assert quick is not None and sluggish is not None
    assert quick.compute_ms == sluggish.compute_ms  # same total FLOP/s
    assert sluggish.overhead_ms == pytest.approx(quick.overhead_ms * 10)
    assert sluggish.latency_ms > quick.latency_ms
    assert sluggish.device_slowdown > 1


def test_a_many_op_graph_beats_a_tflite_of_the_same_flops_only_where_measured_slower() -> None:
    graph = measured(0.25, 60, "tensorflow", fixed_ms=0.08)  # a TF session: tens of µs
    lite = measured(0.02, 9, "litert", fixed_ms=0.0005, per_op_ms=3e-5)  # LiteRT: ~1 µs
    for device in (PI3, PHONE, PRESETS["hikey-960"]):
        on_graph = estimate(FLOPS, device, "int8", graph)
        on_lite = estimate(FLOPS, device, "int8", lite)
        assert on_graph is not None and on_lite is not None
        assert on_graph.compute_ms == on_lite.compute_ms  # FLOPs alone cannot tell them
        assert on_graph.latency_ms > on_lite.latency_ms
        assert "graph nodes" in on_graph.method and "operators" in on_lite.method
    # a runtime probed cheaper than LiteRT's turns the order: the probes decide, not the kind
    swapped = estimate(FLOPS, PI3, "int8", measured(0.015, 60, "tensorflow", fixed_ms=1e-4,
                                                    per_op_ms=1e-6))
    assert swapped.latency_ms < estimate(FLOPS, PI3, "int8", lite).latency_ms  # type: ignore[union-attr]


def test_the_fastest_run_calibrates_not_a_noisy_p50_and_a_spread_says_so() -> None:
    # another process slowed half the runs: the p50 moved, the fastest run did not
    quiet = estimate(FLOPS, PI3, "int8", measured(0.15, 40, min_ms=0.15, cv=0.05))
    noisy = estimate(FLOPS, PI3, "int8", measured(4.0, 40, min_ms=0.15, cv=0.75))
    assert quiet is not None and noisy is not None
    assert noisy.latency_ms == quiet.latency_ms
    assert noisy.host_p50_ms == 4.0 and noisy.host_fastest_ms == 0.15
    assert "p50 4.00 ms" in noisy.method and noisy.host_cv == 0.75
    assert noisy.method.endswith("host timings spread (p50 26.7× the fastest run): rerun on "
                                 "a quiet machine for a firmer estimate")
    assert "spread" not in quiet.method
    # one preempted run among µs-scale ones: a large cv, but the p50 is the fastest run's
    spike = estimate(FLOPS, PI3, "int8", measured(0.0072, 8, runtime="litert",
                                                  min_ms=0.0071, cv=1.59))
    assert spike is not None and "spread" not in spike.method


def test_a_measurement_without_a_per_op_probe_is_not_capped_and_says_so() -> None:
    # a benchmark result recorded before the per-op probe: the floor only
    made = estimate(FLOPS, PI3, "int8", measured(0.4, 40, min_ms=0.25, per_op_ms=None))
    assert made is not None and not made.ceiling_applied
    assert made.overhead_ms == pytest.approx((0.25 - 0.012) * HOST_CORE / 9.6e9)
    assert made.per_op_ms is None and "no per-op probe" in made.method


def test_catalogue_core_speeds() -> None:
    # published one-core fp32 peaks (see orchestrator.spec.devices); a default from the total
    assert core_flops_per_second(PI3) == pytest.approx(1.2e9 * 8)
    assert core_flops_per_second(PRESETS["raspberry-pi-4"]) == pytest.approx(1.5e9 * 8)
    assert core_flops_per_second(PRESETS["hikey-960"]) == pytest.approx(2.36e9 * 8, rel=0.01)
    inline = Device(flops_per_second=8e9, cores=4, ram_mb=512)
    assert core_flops_per_second(inline) == 2e9
    for name, device in PRESETS.items():
        assert device.cpu, name  # named in each estimate's explanation
        # one core's peak is at least its share of the sustained all-core figure
        assert core_flops_per_second(device) >= device.flops_per_second / device.cores, name
