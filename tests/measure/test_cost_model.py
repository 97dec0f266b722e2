"""The per-op cost model (orchestrator.measure.cost_model): each op's work at its kind's
fitted rate on the device's core, its bytes at the DRAM's bandwidth where that is longer,
the threads' speedup by the cores they get, and the op's dispatch. Operators are given
as rows (what report.json keeps); every figure is checked against the calibration's and
the catalogue's numbers. Nothing is timed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.measure.cost_model import (
    Calibration,
    calibration,
    core_speed,
    device_row,
    price,
    short_name,
    thread_speedup,
)
from orchestrator.model.operators import Operator
from orchestrator.spec.devices import PRESETS

PI4, RK3399, PIXEL4 = PRESETS["raspberry-pi-4"], PRESETS["rk3399"], PRESETS["pixel-4"]
XNN = "litert-xnnpack"


def op(kind: str, flops: int = 0, elements: int = 0, bytes_: int = 0, name: str = "",
       precision: str = "float32", detail: str = "") -> Operator:
    return Operator(name=name or kind, op=kind.upper(), kind=kind, precision=precision,
                    flops=flops, elements=elements, bytes=bytes_, detail=detail)


def compute_ms(operator: Operator, device: object = PI4, threads: int = 1) -> float:
    """The op's kernel time: no dispatch, no threads' barrier."""
    pricing = price([operator], device, XNN, threads=threads, dispatch_ms=0.0)  # type: ignore[arg-type]
    return pricing.kernel_ms


def test_a_depthwise_costs_more_than_a_1x1_of_the_same_work_by_the_fitted_ratio() -> None:
    cal = calibration()
    flops, elements = 20_000_000, 200_000
    depthwise = compute_ms(op("depthwise", flops, elements))
    pointwise = compute_ms(op("conv_1x1", flops, elements))
    eff = cal.efficiency["float32"]
    extra = cal.element_cost
    expected = ((flops + extra["depthwise"] * elements) / eff["depthwise"]) / (
        (flops + extra["conv_1x1"] * elements) / eff["conv_1x1"])
    assert expected > 2  # a depthwise sustains a small share of the core's peak
    assert depthwise / pointwise == pytest.approx(expected, rel=1e-9)
    # the absolute figure: work over the Cortex-A72's peak (1.5 GHz x 8 FLOP/cycle, at the
    # fitted speed of its class and design) at the kind's efficiency and XNNPACK's factor
    peak = 1.5e9 * 8 * core_speed(cal, "arm-ooo", "Cortex-A72")
    rate = peak * eff["conv_1x1"] * cal.runtime_factor[XNN]["float32"]
    assert pointwise == pytest.approx((flops + extra["conv_1x1"] * elements) / rate * 1e3)
    # int8 runs GEMMs on more lanes (no dot product on an A72)
    int8 = compute_ms(op("conv_1x1", flops, elements, precision="int8"))
    ratio = (eff["conv_1x1"] * cal.runtime_factor[XNN]["float32"]) / (
        cal.efficiency["int8"]["conv_1x1"] * cal.runtime_factor[XNN]["int8"] * cal.int8_gain)
    assert int8 / pointwise == pytest.approx(ratio, rel=1e-9)


def test_threads_speed_a_big_op_by_the_cores_and_a_tiny_one_hardly() -> None:
    cal = calibration()
    big = op("conv", 2_000_000_000, 500_000)
    work = big.flops + cal.element_cost["conv"] * big.elements
    split = work / (work + cal.parallel_work)
    full = 1 + cal.parallel_efficiency * 3  # four equal Cortex-A72 cores
    assert price([big], PI4, XNN, threads=4).speedup == pytest.approx(full)
    gain = compute_ms(big) / compute_ms(big, threads=4)
    assert gain == pytest.approx(1 + (full - 1) * split, rel=1e-9)
    assert gain == pytest.approx(full, rel=0.01)
    tiny = op("conv", 20_000, 100)
    tiny_work = tiny.flops + cal.element_cost["conv"] * tiny.elements
    tiny_gain = compute_ms(tiny) / compute_ms(tiny, threads=4)
    assert tiny_gain == pytest.approx(
        1 + (full - 1) * tiny_work / (tiny_work + cal.parallel_work), rel=1e-9)
    assert tiny_gain - 1 < (gain - 1) / 10  # a tenth of the big op's gain at most
    # its barrier is as small as its split: four threads run it about as fast as one
    four, one = (price([tiny], PI4, XNN, threads=n).total_ms for n in (4, 1))
    dispatch_ms, barrier_ms = (cycles / 1.5e9 * 1e3 for cycles in (cal.dispatch_cycles,
                                                                   cal.sync_cycles))
    assert four == pytest.approx(compute_ms(tiny, threads=4) + dispatch_ms + barrier_ms
                                 * tiny_work / (tiny_work + cal.parallel_work), rel=1e-6)
    assert abs(four / one - 1) < 0.1
    # the default: the big cores (all four of a Pi 4)
    assert price([big], PI4, XNN).threads == PI4.default_threads == 4


def test_little_cores_add_less_than_big_ones() -> None:
    cal = calibration()
    big = op("conv", 2_000_000_000, 500_000)
    # RK3399: 2 Cortex-A72 at 1.8 GHz, then A53s at 1.4 (in order); its default is the 2
    assert RK3399.default_threads == 2 and RK3399.big_cores == 2
    row = device_row(RK3399, 4)
    assert [core[1:] for core in row.cores] == [("arm-ooo", "Cortex-A72")] * 2 + [
        ("arm-in-order", "Cortex-A53")] * 2
    little = 1.4 / 1.8 * core_speed(cal, "arm-in-order", "Cortex-A53") / core_speed(
        cal, "arm-ooo", "Cortex-A72")
    assert little < 0.5
    assert thread_speedup(row, cal) == pytest.approx(
        1 + cal.parallel_efficiency * (1 + 2 * little))
    rk_gain = compute_ms(big, RK3399) / compute_ms(big, RK3399, threads=4)
    pi_gain = compute_ms(big, PI4) / compute_ms(big, PI4, threads=4)
    two_gain = compute_ms(big, RK3399) / compute_ms(big, RK3399, threads=2)
    assert rk_gain < pi_gain and rk_gain < 1.25 * two_gain
    assert price([big], RK3399, XNN, threads=4).speedup < price([big], PI4, XNN,
                                                                  threads=4).speedup


def test_a_huge_elementwise_add_is_priced_by_its_bytes() -> None:
    cal = calibration()
    elements = 5_000_000  # an add broadcast over 600 MB: its bytes dwarf its work
    add = op("elementwise", elements, elements, 600_000_000, detail="1x5000000")
    pricing = price([add], PI4, XNN, threads=1, dispatch_ms=0.0)
    memory_ms = add.bytes / (PI4.memory_gbs * 1e9 * cal.bandwidth_efficiency) * 1e3
    assert pricing.total_ms == pytest.approx(memory_ms, rel=1e-9)
    assert "bound by memory" in pricing.ops[0].why and "600 MB" in pricing.ops[0].why
    # a conv moving the same bytes computes for longer: priced by its work
    conv = op("conv", 200 * add.bytes, elements, add.bytes)
    priced = price([conv], PI4, XNN, threads=1, dispatch_ms=0.0)
    assert priced.total_ms > memory_ms and "MFLOP" in priced.ops[0].why
    assert "bound by memory" not in priced.ops[0].why
    # a device without a catalogued bandwidth prices the add by its elements
    bare = PI4.model_copy(update={"memory_gbs": None})
    assert price([add], bare, XNN, threads=1).total_ms < pricing.total_ms


def test_the_costliest_ops_and_the_kinds_add_up_to_the_total() -> None:
    operators = [op("conv", 40_000_000, 100_000, 500_000, "m/conv1/Relu;m/conv1/conv"),
                 op("depthwise", 3_000_000, 100_000, 400_000, "m/dw1/Relu6"),
                 op("conv_1x1", 20_000_000, 50_000, 300_000, "m/pw1/Relu6"),
                 op("elementwise", 0, 50_000, 400_000, "m/add"),
                 op("reshape", 0, 1000, 4000, "m/flatten/Reshape"),
                 op("pool", 50_000, 1000, 200_000, "m/gap/Mean"),
                 op("fully_connected", 2_000_000, 1000, 4_000_000, "m/dense/MatMul"),
                 op("softmax", 5000, 1000, 8000, "m/probs/Softmax")]
    pricing = price(operators, PIXEL4, XNN)
    assert len(pricing.ops) == len(operators) and pricing.threads == 4
    assert [o.name for o in pricing.ops][:3] == ["conv1", "dw1", "pw1"]  # short names
    top = pricing.top(5)
    assert len(top) == 5 and [o.ms for o in top] == sorted((o.ms for o in pricing.ops),
                                                           reverse=True)[:5]
    assert sum(o.ms for o in pricing.ops) == pytest.approx(pricing.total_ms)
    assert sum(o.share for o in pricing.ops) == pytest.approx(1.0)
    kinds = pricing.by_kind()  # kernel time: the dispatch and barriers are the runtime's
    assert set(kinds) == {o.kind for o in operators}
    assert sum(kinds.values()) == pytest.approx(pricing.kernel_ms)
    assert sum(o.kernel_ms for o in pricing.ops) == pytest.approx(pricing.kernel_ms)
    assert all(o.kernel_ms < o.ms for o in pricing.ops)
    assert list(kinds.values()) == sorted(kinds.values(), reverse=True)
    # a reshape moves nothing: only its dispatch (and the threads' barrier)
    reshape = next(o for o in pricing.ops if o.kind == "reshape")
    assert reshape.ms == pytest.approx(min(o.ms for o in pricing.ops))
    assert short_name("a/b/conv_pw_1_relu/Relu6;a/b/conv_pw_1/BiasAdd") == "conv_pw_1_relu"


def test_the_calibration_reads_back_as_written() -> None:
    cal = calibration()
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal
    assert set(cal.class_factor) >= {"arm-ooo", "arm-in-order", "apple", "x86"}
    assert all(0 < v <= 1 for per in cal.efficiency.values() for v in per.values())


ROWS = [["m/conv1/Relu", "CONV_2D", "conv", "int8", 40_000_000, 100_000, 500_000, "3x3/1"],
        ["m/dw/Relu6", "DEPTHWISE_CONV_2D", "depthwise", "int8", 3_000_000, 100_000,
         400_000, "3x3/2"],
        ["m/probs", "SOFTMAX", "softmax", "float32", 5000, 1000, 8000, "1x1000"]]
NO_TENSORFLOW = """
import json, sys
from orchestrator.measure.cost_model import price
from orchestrator.measure.estimates import basis, estimate
from orchestrator.model.operators import Operator
from orchestrator.spec.devices import PRESETS
operators = [Operator.from_row(row) for row in json.loads(sys.argv[1])]
priced = price(operators, PRESETS["pixel-4"], "litert-xnnpack")
made = estimate(None, PRESETS["pixel-4"], "int8",
                basis(1.0, 1e11, 5e10, 0.01, 3, "litert", operators=operators))
assert "tensorflow" not in sys.modules, sorted(m for m in sys.modules if "tensorflow" in m)
print(json.dumps([priced.total_ms, made.latency_ms]))
"""


def test_pricing_a_new_model_on_a_catalogue_device_imports_no_tensorflow() -> None:
    done = subprocess.run([sys.executable, "-c", NO_TENSORFLOW, json.dumps(ROWS)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    total, latency = json.loads(done.stdout)
    here = price([Operator.from_row(r) for r in ROWS], PIXEL4, XNN).total_ms
    assert total == pytest.approx(here) and latency == pytest.approx(here)


def test_an_op_whose_tensors_fit_in_the_cache_is_priced_by_its_compute() -> None:
    cal = calibration()
    cache = PI4.cache_mb * 1e6  # the Pi 4's shared L2
    elements = 10_000
    fits = op("elementwise", 0, elements, int(cache * 0.9), "m/add_small")
    spills = op("elementwise", 0, elements, int(cache * 1.1), "m/add_big")
    small, big = (price([o], PI4, XNN, threads=1).ops[0] for o in (fits, spills))
    # in the cache: its elements at the elementwise rate, whatever its bytes
    rate = 1.5e9 * 8 * core_speed(cal, "arm-ooo", "Cortex-A72") * cal.efficiency["float32"][
        "elementwise"] * cal.runtime_factor[XNN].get("float32", 1.0)
    assert small.kernel_ms == pytest.approx(elements / rate * 1e3, rel=1e-9)
    assert "bound by memory" not in small.why
    # past it: its bytes at the DRAM's bandwidth
    streamed = cache * 1.1 / (PI4.memory_gbs * 1e9 * cal.bandwidth_efficiency) * 1e3
    assert big.kernel_ms == pytest.approx(streamed, rel=1e-6)
    assert "bound by memory" in big.why and big.kernel_ms > small.kernel_ms
