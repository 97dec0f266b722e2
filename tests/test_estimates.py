"""The latency model: FLOPs at the device's speed plus the runtime's own cost, calibrated on
this host's measurement of the same file and scaled by the device's one-core speed. Pure
arithmetic on given figures: nothing is timed here."""

from __future__ import annotations

import pytest

from orchestrator.devices import PRESETS, Device, core_flops_per_second, estimate_latency_ms
from orchestrator.estimates import basis, estimate

PI3, PHONE = PRESETS["raspberry-pi-3"], PRESETS["phone-2016"]
FLOPS = 1.2e6  # about the digits CNN
HOST_FLOPS, HOST_CORE = 100e9, 80e9


def measured(p50_ms: float, ops: int, runtime: str = "tensorflow", fixed_ms: float = 0.08,
             min_ms: float | None = None) -> dict[str, object]:
    return basis(p50_ms, HOST_FLOPS, HOST_CORE, fixed_ms, ops, runtime, min_ms=min_ms)


def test_without_a_host_measurement_it_is_flops_only_and_says_so() -> None:
    made = estimate(FLOPS, PI3, "int8")
    assert made is not None
    assert made.latency_ms == pytest.approx(estimate_latency_ms(FLOPS, PI3, "int8"))
    assert made.overhead_ms is None and made.host_p50_ms is None
    assert "FLOPs only" in made.method and "benchmark" in made.method
    assert estimate(None, PI3, "int8", measured(0.25, 40)) is None  # no FLOPs: no estimate
    # a cached benchmark result from before the host's speed was recorded: FLOPs only
    old = {"host_p50_ms": 0.25, "ops": 40}
    assert estimate(FLOPS, PI3, "float32", old).overhead_ms is None  # type: ignore[union-attr]


def test_calibration_from_the_host_p50() -> None:
    p50, ops, fixed = 0.25, 40, 0.08
    made = estimate(FLOPS, PI3, "float32", measured(p50, ops, fixed_ms=fixed))
    assert made is not None
    host_compute = FLOPS / HOST_FLOPS * 1000  # 0.012 ms
    slowdown = HOST_CORE / 9.6e9  # a Cortex-A53 at 1.2 GHz, 8 FLOP/cycle
    assert made.device_slowdown == pytest.approx(slowdown, rel=1e-3)
    assert made.compute_ms == pytest.approx(FLOPS / 5e9 * 1000)
    assert made.overhead_ms == pytest.approx((p50 - host_compute) * slowdown)
    assert made.latency_ms == pytest.approx(made.compute_ms + made.overhead_ms)
    # the overhead splits into the runtime's cost per run and per op, both scaled
    assert made.fixed_ms == pytest.approx(fixed * slowdown)
    assert made.fixed_ms + made.per_op_ms * ops == pytest.approx(made.overhead_ms)
    assert made.host_p50_ms == p50 and made.ops == ops and made.runtime == "tensorflow"
    for words in ("compute", "1.2 MFLOP", "5 GFLOP/s", "250 µs fastest run on this host",
                  "Cortex-A53", "40 graph nodes"):
        assert words in made.method, (words, made.method)
    shown = made.to_json()
    assert set(shown) >= {"method", "compute_ms", "overhead_ms", "host_p50_ms",
                          "device_slowdown"}
    assert "latency_ms" not in shown  # est_latency_ms stays the target's own key


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
    # a device slower than the host on both counts is never estimated below the host
    assert sluggish.device_slowdown > 1 and sluggish.latency_ms >= 0.25


def test_a_many_op_graph_beats_a_tflite_of_the_same_flops_only_where_measured_slower() -> None:
    graph = measured(0.25, 60, "tensorflow", fixed_ms=0.08)  # a TF session: ~µs per node
    lite = measured(0.02, 9, "litert", fixed_ms=0.0005)  # LiteRT: ~1 µs per operator
    for device in (PI3, PHONE, PRESETS["hikey-960"]):
        on_graph = estimate(FLOPS, device, "int8", graph)
        on_lite = estimate(FLOPS, device, "int8", lite)
        assert on_graph is not None and on_lite is not None
        assert on_graph.compute_ms == on_lite.compute_ms  # FLOPs alone cannot tell them
        assert on_graph.latency_ms > on_lite.latency_ms
        assert "graph nodes" in on_graph.method and "operators" in on_lite.method
    # measured the other way round, the order turns: the measurement decides, not the kind
    swapped = estimate(FLOPS, PI3, "int8", measured(0.015, 60, "tensorflow", fixed_ms=0.002))
    assert swapped.latency_ms < estimate(FLOPS, PI3, "int8", lite).latency_ms  # type: ignore[union-attr]


def test_a_run_faster_than_its_compute_keeps_the_runtime_cost_per_run() -> None:
    # 1 GFLOP in 1 ms on a 100 GFLOP/s host: faster kernels than the probe's matmul; what
    # remains is the runtime's measured cost per run
    made = estimate(1e9, PI3, "float32", measured(1.0, 10, fixed_ms=0.08))
    assert made is not None
    assert made.overhead_ms == pytest.approx(0.08 * made.device_slowdown, rel=1e-3)
    assert made.per_op_ms == 0.0 and made.fixed_ms == made.overhead_ms
    assert "under its" in made.method
    bare = estimate(1e9, PI3, "float32", measured(1.0, 10, fixed_ms=0.0))
    assert bare is not None and bare.overhead_ms == 0.0 and bare.latency_ms == bare.compute_ms


def test_the_fastest_run_calibrates_not_a_noisy_p50() -> None:
    # another process slowed half the runs: the p50 moved, the fastest run did not
    quiet = estimate(FLOPS, PI3, "int8", measured(0.25, 40, min_ms=0.25))
    noisy = estimate(FLOPS, PI3, "int8", measured(4.0, 40, min_ms=0.25))
    assert quiet is not None and noisy is not None
    assert noisy.latency_ms == quiet.latency_ms
    assert noisy.host_p50_ms == 4.0 and noisy.host_fastest_ms == 0.25
    assert "p50 4 ms" in noisy.method


def test_catalogue_core_speeds() -> None:
    # published one-core fp32 peaks (see orchestrator.devices); a default from the total
    assert core_flops_per_second(PI3) == pytest.approx(1.2e9 * 8)
    assert core_flops_per_second(PRESETS["raspberry-pi-4"]) == pytest.approx(1.5e9 * 8)
    assert core_flops_per_second(PRESETS["hikey-960"]) == pytest.approx(2.36e9 * 8, rel=0.01)
    inline = Device(flops_per_second=8e9, cores=4, ram_mb=512)
    assert core_flops_per_second(inline) == 2e9
    for name, device in PRESETS.items():
        assert device.cpu, name  # named in each estimate's explanation
        # one core's peak is at least its share of the sustained all-core figure
        assert core_flops_per_second(device) >= device.flops_per_second / device.cores, name
