"""Latency estimates per target (orchestrator.measure.estimates): the file's operators priced
one by one on the target's cores (cost_model), for the threads it runs with, plus the
runtime's own cost: LiteRT's calibrated dispatch, or a TF session's cost per node probed on
this host and scaled by the device's one-core speed. The file's own host timings do not
enter the estimate. Pure arithmetic on given figures: nothing is timed here."""

from __future__ import annotations

import pytest

from orchestrator.measure.cost_model import calibration, price
from orchestrator.measure.estimates import basis, estimate
from orchestrator.model.operators import Operator
from orchestrator.spec.devices import PRESETS, Device, core_flops_per_second, estimate_latency_ms

PI3, PI4, PHONE = PRESETS["raspberry-pi-3"], PRESETS["raspberry-pi-4"], PRESETS["phone-2016"]
FLOPS = 1.2e6  # about the digits CNN
HOST_FLOPS, HOST_CORE = 100e9, 80e9

# a small CNN's operators, as the benchmark stage records them
OPERATORS = [
    Operator("m/conv1/Relu;m/conv1/conv", "CONV_2D", "conv", "int8", 30_000_000, 200_000,
             250_000, "3x3/2 3->32 ch, 56x56 out"),
    Operator("m/dw1/Relu6", "DEPTHWISE_CONV_2D", "depthwise", "int8", 4_000_000, 200_000,
             400_000, "3x3/1 32->32 ch, 56x56 out"),
    Operator("m/pw1/Relu6", "CONV_2D", "conv_1x1", "int8", 25_000_000, 400_000, 600_000,
             "1x1/1 32->64 ch, 56x56 out"),
    Operator("m/add", "ADD", "elementwise", "int8", 400_000, 400_000, 1_200_000),
    Operator("m/gap/Mean", "MEAN", "pool", "int8", 400_000, 64, 400_000),
    Operator("m/flatten", "RESHAPE", "reshape", "int8", 0, 64, 128),
    Operator("m/dense/MatMul", "FULLY_CONNECTED", "fully_connected", "int8", 1280, 10, 800,
             "640 weights"),
    Operator("m/probs", "SOFTMAX", "softmax", "int8", 50, 10, 20),
]


def measured(runtime: str = "litert", p50_ms: float = 0.25, min_ms: float | None = None,
             fixed_ms: float = 0.08, per_op_ms: float | None = 0.002, cv: float | None = 0.05,
             operators: list[Operator] | None = OPERATORS) -> dict[str, object]:
    return basis(p50_ms, HOST_FLOPS, HOST_CORE, fixed_ms, len(operators or []) or 40,
                 runtime, min_ms=min_ms, per_op_ms=per_op_ms, cv=cv, operators=operators)


def test_without_operators_it_is_flops_only_and_says_so() -> None:
    made = estimate(FLOPS, PI3, "int8")
    assert made is not None
    assert made.latency_ms == pytest.approx(estimate_latency_ms(FLOPS, PI3, "int8"))
    assert made.compute_ms == made.latency_ms
    assert made.overhead_ms is None and made.host_p50_ms is None and not made.top_ops
    assert made.threads is None and made.expected_error is None
    assert "FLOPs only" in made.method and "benchmark" in made.method
    assert "FLOPs only" in made.summary
    # a report from before the operators were recorded: FLOPs only, whatever it measured
    old = measured("tensorflow", operators=None)
    assert "operators" not in old
    from_old = estimate(FLOPS, PI3, "int8", old)
    assert from_old is not None and from_old.latency_ms == made.latency_ms
    assert "FLOPs only" in from_old.method
    assert estimate(None, PI3, "int8", old) is None  # no FLOPs, no operators: none
    # operators alone are enough (a .tflite whose FLOPs were not recorded)
    assert estimate(None, PI3, "int8", measured()) is not None


def test_the_operators_are_priced_on_the_big_cores_with_the_costliest_shown() -> None:
    made = estimate(FLOPS, PI4, "int8", measured())
    assert made is not None
    pricing = price(OPERATORS, PI4, "litert-xnnpack")
    # LiteRT's cost per run is in the calibrated dispatch: nothing added per run
    assert made.latency_ms == pytest.approx(pricing.total_ms)
    assert made.priced_as == "litert-xnnpack" and made.runtime == "litert"
    assert made.threads == 4 and made.threads_from == "big cores"
    assert made.thread_speedup == pytest.approx(pricing.speedup, abs=1e-3)
    assert made.compute_ms + made.overhead_ms == pytest.approx(made.latency_ms)
    cal = calibration()
    # per op: the calibrated dispatch, and a barrier as far as four threads split the op
    dispatch_ms, barrier_ms = cal.dispatch_cycles / 1.5e9 * 1e3, cal.sync_cycles / 1.5e9 * 1e3
    assert made.overhead_ms == pytest.approx(pricing.total_ms - pricing.kernel_ms)
    assert made.compute_ms == pytest.approx(pricing.kernel_ms)
    assert len(OPERATORS) * dispatch_ms < made.overhead_ms < len(OPERATORS) * (
        dispatch_ms + barrier_ms)
    assert made.per_op_ms == pytest.approx(made.overhead_ms / len(OPERATORS))
    assert made.fixed_ms == 0.0 and made.ops == len(OPERATORS)
    # the 5 costliest ops, costliest first, each with its share and why
    assert len(made.top_ops) == 5
    costs = [o["ms"] for o in made.top_ops]
    assert costs == sorted(costs, reverse=True)
    assert costs[0] == pytest.approx(max(o.ms for o in pricing.ops))
    assert {o["name"] for o in made.top_ops} <= {o.name for o in pricing.ops}
    assert all(o["why"] and 0 < o["share"] < 1 for o in made.top_ops)
    assert sum(made.by_kind_ms.values()) == pytest.approx(made.compute_ms, rel=1e-5)
    # how far the fit found estimates off on Arm out-of-order cores, in words
    assert made.expected_error is not None and made.expected_error["class"] == "arm-ooo"
    band = f"within {cal.expected_error['arm-ooo']['p80_factor']:.2f}x"
    assert made.expected_error["text"].startswith(band)
    assert band in made.method and f"expected error: {band}" in made.summary
    assert "calibrated dispatch" in made.method and "4 threads" in made.method
    assert len(made.summary) < 160  # one console line
    shown = made.to_json()
    assert "latency_ms" not in shown  # est_latency_ms stays the target's own key
    assert len(shown["top_ops"]) == 5 and shown["threads_from"] == "big cores"
    assert shown["ceiling_applied"] is False


def test_a_targets_threads_set_the_estimate() -> None:
    four = estimate(FLOPS, PI4, "int8", measured())
    two = estimate(FLOPS, PI4.model_copy(update={"threads": 2}), "int8", measured())
    one = estimate(FLOPS, PI4.model_copy(update={"threads": 1}), "int8", measured())
    assert four is not None and two is not None and one is not None
    assert (two.threads, two.threads_from) == (2, "target")
    assert "the target's `threads:`" in two.method
    assert two.latency_ms == pytest.approx(
        price(OPERATORS, PI4, "litert-xnnpack", threads=2).total_ms)
    # the convolutions split across threads: fewer threads, a longer run
    assert one.latency_ms > two.latency_ms > four.latency_ms
    assert one.thread_speedup == 1.0 and two.thread_speedup < four.thread_speedup
    assert one.by_kind_ms["conv"] / four.by_kind_ms["conv"] > 2


def test_a_tf_sessions_overhead_is_its_probed_cost_scaled_to_the_device() -> None:
    per_op, fixed = 0.002, 0.08
    made = estimate(FLOPS, PI3, "int8", measured("tensorflow", fixed_ms=fixed,
                                                 per_op_ms=per_op))
    assert made is not None
    slowdown = HOST_CORE / core_flops_per_second(PI3)  # a Cortex-A53 at 1.2 GHz
    assert made.device_slowdown == pytest.approx(slowdown, rel=1e-3)
    ops = len(OPERATORS)
    # and the calibrated thread barrier, as far as four Cortex-A53 threads split each op
    barrier = calibration().sync_cycles / 1.2e9 * 1e3
    assert made.fixed_ms == pytest.approx(fixed * slowdown)
    pricing = price(OPERATORS, PI3, "tensorflow", dispatch_ms=per_op * slowdown)
    per_node = made.overhead_ms - fixed * slowdown
    assert per_node == pytest.approx(pricing.total_ms - pricing.kernel_ms)
    assert ops * per_op * slowdown < per_node < ops * (per_op * slowdown + barrier)
    assert made.per_op_ms == pytest.approx(per_node / ops)
    assert made.latency_ms == pytest.approx(pricing.total_ms + fixed * slowdown)
    assert made.compute_ms + made.overhead_ms == pytest.approx(made.latency_ms)
    assert made.priced_as == "tensorflow" and made.runtime == "tensorflow"
    # no published row ran a TF session: its error is not claimed from LiteRT's rows
    assert made.expected_error is not None and made.expected_error["text"].startswith(
        "not measured: no published row ran a TF session")
    assert "expected error: not measured for a TF session" in made.summary
    assert "within" not in made.expected_error["short"]
    for words in (f"{ops} graph nodes", "probed on this host", "per run", "TF session"):
        assert words in made.method, (words, made.method)
    # a slower core: the same probe, ten times the overhead
    fast = Device(flops_per_second=5e9, cores=4, ram_mb=1024, core_flops_per_second=40e9)
    slow = Device(flops_per_second=5e9, cores=4, ram_mb=1024, core_flops_per_second=4e9)
    quick = estimate(FLOPS, fast, "int8", measured("tensorflow"))
    sluggish = estimate(FLOPS, slow, "int8", measured("tensorflow"))
    assert quick is not None and sluggish is not None
    assert sluggish.overhead_ms == pytest.approx(quick.overhead_ms * 10)
    assert sluggish.device_slowdown == pytest.approx(quick.device_slowdown * 10)
    assert sluggish.compute_ms == pytest.approx(quick.compute_ms * 10, rel=1e-6)


def test_a_tf_session_costs_more_than_litert_for_the_same_operators_where_probed_so() -> None:
    for device in (PI3, PI4, PHONE, PRESETS["hikey-960"]):
        session = estimate(FLOPS, device, "int8", measured("tensorflow"))
        lite = estimate(FLOPS, device, "int8", measured("litert"))
        assert session is not None and lite is not None
        assert session.overhead_ms > lite.overhead_ms
        assert session.latency_ms > lite.latency_ms, device.name
    # a probe cheaper than LiteRT's calibrated dispatch turns the overheads' order: the
    # probe decides, not the runtime's name
    cheap = estimate(FLOPS, PI4, "int8", measured("tensorflow", fixed_ms=0.0,
                                                  per_op_ms=1e-6))
    lite = estimate(FLOPS, PI4, "int8", measured("litert"))
    assert cheap is not None and lite is not None
    assert cheap.overhead_ms < lite.overhead_ms


def test_the_files_host_timings_do_not_change_the_estimate() -> None:
    quiet = estimate(FLOPS, PI4, "int8", measured(p50_ms=0.15, min_ms=0.15, cv=0.05))
    busy = estimate(FLOPS, PI4, "int8", measured(p50_ms=4.0, min_ms=0.2, cv=0.75))
    assert quiet is not None and busy is not None
    assert busy.latency_ms == quiet.latency_ms and busy.method == quiet.method
    assert (busy.host_p50_ms, busy.host_fastest_ms, busy.host_cv) == (4.0, 0.2, 0.75)
    assert quiet.host_p50_ms == 0.15  # each keeps its own timings beside the estimate
    # a TF session's too; but its probe ran on the busy host, and the method says so
    calm = estimate(FLOPS, PI4, "int8", measured("tensorflow", p50_ms=0.15, min_ms=0.15))
    noisy = estimate(FLOPS, PI4, "int8", measured("tensorflow", p50_ms=4.0, min_ms=0.2))
    assert calm is not None and noisy is not None
    assert noisy.latency_ms == calm.latency_ms
    assert "spread" not in calm.method
    assert "host timings spread (p50 20× the fastest run)" in noisy.method


def test_catalogue_core_speeds() -> None:
    # published one-core fp32 peaks (see orchestrator.spec.devices); a default from the total
    assert core_flops_per_second(PI3) == pytest.approx(1.2e9 * 8)
    assert core_flops_per_second(PI4) == pytest.approx(1.5e9 * 8)
    assert core_flops_per_second(PRESETS["hikey-960"]) == pytest.approx(2.36e9 * 8, rel=0.01)
    inline = Device(flops_per_second=8e9, cores=4, ram_mb=512)
    assert core_flops_per_second(inline) == 2e9
    for name, device in PRESETS.items():
        assert device.cpu, name  # named in each estimate's explanation
        # one core's peak is at least its share of the sustained all-core figure
        assert core_flops_per_second(device) >= device.flops_per_second / device.cores, name


def test_int16_activations_have_no_measured_error_and_say_so() -> None:
    """No published row ran int16 reference kernels: the estimate says its error is not
    known, while the same file's int8 operators get LiteRT's measured band."""
    from dataclasses import replace

    int16 = [replace(o, precision="int16") for o in OPERATORS]
    made = estimate(FLOPS, PI4, "int16", measured(operators=int16))
    known = estimate(FLOPS, PI4, "int8", measured())
    assert made is not None and known is not None
    assert made.expected_error is not None and known.expected_error is not None
    assert made.expected_error["unmeasured"] == "int16 activations (reference kernels)"
    assert made.expected_error["short"] == "not measured for int16 activations (reference " \
        "kernels)"
    assert "unmeasured" not in known.expected_error
    assert known.expected_error["short"].startswith("within ")
    # slower kernels than int8's, priced as such
    assert made.latency_ms > known.latency_ms
