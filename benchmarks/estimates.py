"""How far to trust a device estimate: the per-op model (orchestrator/measure/cost_model.py)
against published latencies of the same architectures, on the devices they were measured
on, at the thread counts and precisions published.

    .venv/bin/python benchmarks/estimates.py [--rows] [--work DIR]   # fit, the tables
    .venv/bin/python benchmarks/estimates.py --write   # and commit the fitted rates
    .venv/bin/python benchmarks/estimates.py --quick   # MobileNet v1 0.25 and 0.5 only

Each published row's architecture is built (keras.applications, weights=None: weights do
not change latency; testbed/published_architectures.py), converted to a .tflite of the
published precision (float32; uint8 QAT as full int8; "post-training quantized" of 2018 as
dynamic range) and read op by op (orchestrator.model.litert_model.operators), as a
recipe's shipped file is. The rates are fitted per kind of op and per core design, with a
pull towards physical priors, on the rows with a published thread count of
benchmarks/data/published_latency.csv (the calibration set) and
benchmarks/data/heldout_latency.csv (other publications). The figures printed:

- in-sample: the fit's own rows (how well the model can fit at all);
- held-out sources, each left out: each publication of the held-out file estimated by a
  fit on everything else; no row is estimated by a fit that saw its publication;
- leave-one-device-out: each device's rows estimated by a fit without that device;
- leave-one-model-out: each architecture's rows by a fit without that architecture;
- the rule the per-op model replaced, on the rows of its catalogue's devices.

Rows whose thread count was not published ("n/s") are estimated and shown, not scored.
The shipped calibration (--write: orchestrator/measure/latency_calibration.json) is the
fit on every scored row, with the leave-one-device-out errors per class of core: the
report quotes them beside every estimate.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
logging.getLogger("absl").setLevel(logging.ERROR)  # the converter's deprecation notes

from orchestrator.measure import cost_model  # noqa: E402
from orchestrator.measure.cost_model import Calibration  # noqa: E402
from orchestrator.model.operators import Operator  # noqa: E402
from orchestrator.spec.devices import Device, resolve_device  # noqa: E402

# the project's calibration set, as published (a copy of the shared data; its README cites
# every source)
PUBLISHED = ROOT / "benchmarks" / "data" / "published_latency.csv"
HELD_OUT = ROOT / "benchmarks" / "data" / "heldout_latency.csv"
# the converted files and their operators, kept between runs (a full run builds 40 files,
# about 5 minutes, once)
WORK = ROOT / ".orchestrator" / "bench" / "estimates"
QUICK = {"mobilenet_v1": (0.25, 0.5)}  # --quick: these widths only

# The catalogue device each published device name is, and what the published board ran
# at where it differs from the catalogue's figures (a Pi 4 rev 1.4 at 1.8 GHz)
DEVICES = {"Pixel 3": "pixel-3", "Pixel 4": "pixel-4", "Pixel 2": "pixel-2",
           "Pixel XL": "pixel-xl", "Pixel 1": "pixel-xl", "Pixel": "pixel-xl",
           "Pixel 3a": "pixel-3a", "iPhone XS": "iphone-xs", "iPhone 8": "iphone-8",
           "Raspberry Pi 4": "raspberry-pi-4", "Raspberry Pi 4 (Raspbian 32-bit)":
           "raspberry-pi-4", "Raspberry Pi 4 Model B Rev 1.4": "raspberry-pi-4@1.8",
           "Raspberry Pi 3 Model B Rev 1.2": "raspberry-pi-3", "Raspberry Pi 3 B+":
           "raspberry-pi-3@1.4", "Raspberry Pi 5": "raspberry-pi-5",
           "HiKey960": "hikey-960", "Firefly-RK3399": "rk3399"}


def device_of(name: str) -> Device:
    """A catalogue device, at another clock with `name@GHz`."""
    preset, _, ghz = name.partition("@")
    device = resolve_device(preset)
    if not ghz:
        return device
    clusters = [c.model_copy(update={"ghz": float(ghz)}) for c in device.cpu_clusters]
    return device.model_copy(update={"clusters": clusters})


@dataclass(frozen=True)
class Row:
    model: str
    variant: str
    size: int
    device: str  # catalogue name
    published_device: str
    threads: int | None
    runtime: str  # cost_model.RUNTIMES key
    published_ms: float
    source: str
    alpha: float | None
    precision: str  # float32 | int8 | dynamic


def _precision(variant: str) -> str:
    text = variant.lower()
    if "post-training" in text or "dynamic" in text or "hybrid" in text:
        return "dynamic"
    if "uint8" in text or "int8" in text or "quant" in text:
        return "int8"
    return "float32"


def _alpha(variant: str) -> float | None:
    first = variant.split()[0] if variant.split() else ""
    try:
        return float(first)
    except ValueError:
        return None


def _runtime(text: str) -> str:
    lowered = text.lower()
    if "xnnpack" in lowered:
        return "litert-xnnpack"
    if "2." in lowered and "tflite 2" in lowered and "builtin" not in lowered:
        return "litert-xnnpack"  # TFLite 2.3 on: XNNPACK is the default for float
    return "litert-builtin"


def read_rows(path: Path) -> list[Row]:
    rows = []
    with path.open() as handle:
        for line in csv.DictReader(handle):
            device = DEVICES.get(line["device"].strip())
            if device is None:
                print(f"  skipped (no catalogue device for {line['device']!r}): "
                      f"{line['model']} {line['variant']}", file=sys.stderr)
                continue
            threads = line["threads"].strip()
            minimalistic = "_minimalistic" if "minimalistic" in line["variant"] else ""
            rows.append(Row(
                model=line["model"].strip() + minimalistic, variant=line["variant"].strip(),
                size=int(line["input"]), device=device, published_device=line["device"],
                threads=int(threads) if threads.isdigit() else None,
                runtime=_runtime(line["runtime"]), published_ms=float(line["latency_ms"]),
                source=line["source"], alpha=_alpha(line["variant"]),
                precision=_precision(line["variant"])))
    return rows


_NOT_BUILT: set[str] = set()


def operators_of(row: Row, work: Path) -> list[Operator] | None:
    """The row's architecture as a .tflite, op by op (cached as JSON beside the file)."""
    from testbed.published_architectures import NotBuilt, tflite_file

    key = f"{row.model}_{row.alpha or 1.0}_{row.size}_{row.precision}"
    cached = work / f"{key}.ops.json"
    if cached.exists():
        return [Operator.from_row(r) for r in json.loads(cached.read_text())]
    try:
        path = tflite_file(row.model, row.alpha, row.size, row.precision, work)
    except NotBuilt as exc:
        if row.model not in _NOT_BUILT:
            _NOT_BUILT.add(row.model)
            print(f"  not built, its rows left out: {row.model} ({exc})", file=sys.stderr)
        return None
    from orchestrator.model.litert_model import operators

    found = operators(path.read_bytes())
    temporary = cached.with_suffix(".tmp")
    temporary.write_text(json.dumps([o.to_row() for o in found]))
    temporary.replace(cached)
    return found


# ------------------------------------------------------------------------------ the fit

# (name, prior, how far the prior holds: sd in log units). Efficiencies are shares of the
# core's peak; int8 ones are against int8's own peak (twice float's lanes).
FITTED = [("float32.conv_1x1", 0.5, 1.0), ("float32.conv", 0.4, 1.0),
          ("float32.depthwise", 0.15, 1.0), ("float32.fully_connected", 0.2, 1.0),
          ("float32.pool", 0.1, 1.0), ("float32.elementwise", 0.1, 1.5),
          ("int8.conv_1x1", 0.4, 1.0), ("int8.conv", 0.35, 1.0),
          ("int8.depthwise", 0.1, 1.0), ("int8.fully_connected", 0.2, 1.0),
          ("int8.elementwise", 0.1, 1.5), ("dynamic.gemm", 0.2, 1.0),
          ("class.arm-in-order", 0.5, 0.5), ("class.apple", 1.0, 0.7),
          ("parallel_efficiency", 0.7, 0.5), ("dispatch_cycles", 2000.0, 1.5),
          ("sync_cycles", 5000.0, 1.5), ("bandwidth_efficiency", 0.5, 0.7),
          ("dotprod_gain", 1.8, 0.3), ("element.conv_1x1", 4.0, 1.5),
          ("element.conv", 8.0, 1.5), ("element.depthwise", 20.0, 1.5),
          ("element.fully_connected", 4.0, 1.5), ("parallel_work", 1e6, 1.5),
          # XNNPACK over the builtin kernels: 2.3x on float, 1.3x on int8, "on average"
          # (TensorFlow blog, July 2020 and September 2021): the prior, where no XNNPACK
          # row is in the fit
          ("xnnpack.float32", 2.3, 0.3), ("xnnpack.int8", 1.3, 0.3),
          ("int8_gain", 2.0, 0.3)]
# per core design, where a device with that core has scored rows: prior 1 (its class's)
CORE_PRIOR_SPREAD = 0.3
SHARED_WITH_ELEMENTWISE = ("softmax", "resize", "data", "reshape", "other")
SOFTMAX_SHARE = 0.1  # a softmax's exp costs ~10 elementwise ops per element


def calibration_of(values: Sequence[float], base: Calibration,
                   designs: Sequence[str] = ()) -> Calibration:
    names = [n for n, _, _ in FITTED] + [f"core.{d}" for d in designs]
    named = dict(zip(names, values, strict=True))
    efficiency = {p: dict(k) for p, k in base.efficiency.items()}
    for precision in ("float32", "int8"):
        for kind in ("conv_1x1", "conv", "depthwise", "fully_connected", "pool",
                     "elementwise"):
            key = f"{precision}.{kind}"
            if key in named:
                efficiency[precision][kind] = named[key]
        efficiency["int8"].setdefault("pool", efficiency["float32"]["pool"])
        element = efficiency[precision]["elementwise"]
        for kind in SHARED_WITH_ELEMENTWISE:
            efficiency[precision][kind] = element * (SOFTMAX_SHARE if kind == "softmax"
                                                     else 1.0)
    efficiency["int8"]["pool"] = efficiency["int8"]["elementwise"]
    for kind in ("conv_1x1", "conv", "depthwise", "fully_connected"):
        efficiency["dynamic"][kind] = named["dynamic.gemm"] * (
            efficiency["int8"][kind] / efficiency["int8"]["conv_1x1"])
    for kind in ("pool", "elementwise", *SHARED_WITH_ELEMENTWISE):
        efficiency["dynamic"][kind] = efficiency["float32"][kind]
    return replace(base, efficiency=efficiency,
                   class_factor={**base.class_factor, "arm-in-order":
                                 named["class.arm-in-order"], "apple": named["class.apple"]},
                   parallel_efficiency=min(named["parallel_efficiency"], 1.0),
                   dispatch_cycles=named["dispatch_cycles"],
                   sync_cycles=named["sync_cycles"],
                   bandwidth_efficiency=named["bandwidth_efficiency"],
                   dotprod_gain=named["dotprod_gain"], int8_gain=named["int8_gain"],
                   core_factor={d: named[f"core.{d}"] for d in designs},
                   element_cost={kind: named[f"element.{kind}"] for kind in (
                       "conv_1x1", "conv", "depthwise", "fully_connected")},
                   parallel_work=named["parallel_work"],
                   runtime_factor={**base.runtime_factor, "litert-xnnpack": {
                       "float32": named["xnnpack.float32"], "int8": named["xnnpack.int8"],
                       "dynamic": named["xnnpack.int8"]}})


def source_group(source: str) -> str:
    """The publication a row comes from: one MLPerf submission's board, one README."""
    if "/results/" in source:
        head, _, rest = source.partition("/results/")
        return f"{head}/results/{rest.split('/')[0]}"
    return source


@dataclass(frozen=True)
class Case:
    """A row with its operators and its device at its threads, ready to price."""

    row: Row
    ops: cost_model.OpArrays
    device: cost_model.DeviceRow


def case_of(row: Row, ops: cost_model.OpArrays) -> Case:
    device = device_of(row.device)
    return Case(row, ops, cost_model.device_row(device, row.threads or
                                                device.default_threads))


def estimate_ms(case: Case, cal: Calibration) -> float:
    total, _, _ = cost_model.seconds(case.ops, case.device, case.row.runtime, cal)
    return float(total.sum()) * 1e3


def fit(cases: list[Case], base: Calibration) -> Calibration:
    from scipy.optimize import least_squares

    # a factor per core design that rows in this fit ran on (the others keep their class's)
    designs = sorted({c.device.core for c in cases})
    priors = np.log([p for _, p, _ in FITTED] + [1.0] * len(designs))
    spreads = np.array([s for _, _, s in FITTED] + [CORE_PRIOR_SPREAD] * len(designs))

    # the prior weighs as one row per parameter: the data decide where they speak
    def residuals(theta: np.ndarray) -> np.ndarray:
        cal = calibration_of(np.exp(theta), base, designs)
        errors = [math.log(estimate_ms(c, cal) / c.row.published_ms) for c in cases]
        return np.concatenate([errors, (theta - priors) / spreads * 0.3])

    found = least_squares(residuals, priors, method="trf", x_scale=1.0, max_nfev=400)
    return calibration_of(np.exp(found.x), base, designs)


# the devices the catalogue had before the per-op model, as published rows name them
# (a Pixel XL's Snapdragon 821 is phone-2016's 820 at a higher clock), and their figures
PREVIOUS_CATALOGUE = {"raspberry-pi-4": 10e9, "raspberry-pi-3": 5e9, "pixel-xl": 20e9,
                      "hikey-960": 14.5e9}


def _previous_rule_ms(case: Case) -> float:
    flops = float(case.ops.work[np.isin(case.ops.kind, [
        cost_model.KIND_LIST.index(k) for k in cost_model.GEMM_KINDS])].sum())
    factor = 0.52 if case.row.precision == "int8" else 1.0
    return flops / PREVIOUS_CATALOGUE[case.row.device.partition("@")[0]] * factor * 1e3


def summary(ratios: Sequence[float]) -> dict[str, Any]:
    factors = [max(r, 1 / r) for r in ratios]
    if not factors:
        return {"rows": 0}
    return {"rows": len(factors), "median_factor": round(float(np.median(factors)), 3),
            "within_1_25": round(float(np.mean([f <= 1.25 for f in factors])), 3),
            "within_2": round(float(np.mean([f <= 2.0 for f in factors])), 3),
            "worst_factor": round(float(max(factors)), 3),
            "p80_factor": round(float(np.quantile(factors, 0.8)), 3)}


def _line(name: str, figures: dict[str, Any]) -> str:
    if not figures.get("rows"):
        return f"| {name} | 0 | | | | |"
    return (f"| {name} | {figures['rows']} | {figures['median_factor']:.2f}x | "
            f"{figures['within_1_25']:.0%} | {figures['within_2']:.0%} | "
            f"{figures['worst_factor']:.2f}x |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="write the fit to orchestrator/measure/latency_calibration.json")
    parser.add_argument("--rows", action="store_true", help="print every row")
    parser.add_argument("--work", type=Path, default=None,
                        help=f"where the converted files are kept (default {WORK})")
    parser.add_argument("--quick", action="store_true",
                        help="MobileNet v1 at widths 0.25 and 0.5 only; nothing written")
    args = parser.parse_args(argv)
    work = args.work or (WORK.with_name("estimates-quick") if args.quick else WORK)
    work.mkdir(parents=True, exist_ok=True)
    base = cost_model.calibration()
    if args.quick:
        args.write = False

    def built(rows: list[Row]) -> list[Case]:
        out = []
        for row in rows:
            if args.quick and row.alpha not in QUICK.get(row.model, ()):
                continue
            ops = operators_of(row, work)
            if ops is not None:
                out.append(case_of(row, cost_model.op_arrays(ops)))
        return out

    calib = built(read_rows(PUBLISHED))
    held = built(read_rows(HELD_OUT)) if HELD_OUT.exists() else []
    scored_calib = [c for c in calib if c.row.threads is not None]
    held_scored = [c for c in held if c.row.threads is not None]
    every = scored_calib + held_scored
    cal = fit(every, base)

    def ratios(cases: list[Case], using: Calibration) -> list[float]:
        return [estimate_ms(c, using) / c.row.published_ms for c in cases]

    by_device: dict[str, list[float]] = {}
    by_model: dict[str, list[float]] = {}
    by_source: dict[str, list[float]] = {}
    device_ratio: dict[int, float] = {}
    # the held-out sources, each estimated by a fit on the calibration file and the
    # other held-out sources: a row is never estimated by a fit that saw its source
    for group in sorted({source_group(c.row.source) for c in held_scored}):
        without = fit([c for c in every if source_group(c.row.source) != group], base)
        by_source[group] = ratios([c for c in held_scored
                                   if source_group(c.row.source) == group], without)
    for device in sorted({c.row.device.partition("@")[0] for c in every}):
        without = fit([c for c in every if c.row.device.partition("@")[0] != device],
                      base)
        for index, case in enumerate(every):
            if case.row.device.partition("@")[0] == device:
                device_ratio[index] = estimate_ms(case, without) / case.row.published_ms
                by_device.setdefault(device, []).append(device_ratio[index])
    for model in sorted({c.row.model for c in every}):
        without = fit([c for c in every if c.row.model != model], base)
        by_model[model] = ratios([c for c in every if c.row.model == model], without)

    print("| rows | n | median error factor | within 1.25x | within 2x | worst |")
    print("|---|---|---|---|---|---|")
    print(_line("calibration file, in-sample", summary(ratios(scored_calib, cal))))
    print(_line("every scored row, in-sample", summary(ratios(every, cal))))
    if by_device:
        print(_line("held-out sources, each left out", summary(
            [x for v in by_source.values() for x in v])))
        print(_line("leave-one-device-out", summary([x for v in by_device.values()
                                                     for x in v])))
        print(_line("leave-one-model-out", summary([x for v in by_model.values()
                                                    for x in v])))
        print("\n| held-out source left out | n | median | within 1.25x | within 2x | worst |")
        print("|---|---|---|---|---|---|")
        for group, values in by_source.items():
            print(_line(group, summary(values)))
    # the rule this model replaced, on the rows of the devices its catalogue had: FLOPs /
    # the device's all-core FLOP/s x its precision factor (0.52 for int8)
    before = [_previous_rule_ms(c) / c.row.published_ms for c in every
              if c.row.device.partition("@")[0] in PREVIOUS_CATALOGUE]
    if before:
        print("\n| the previous rule, on its catalogue's devices | n | median | within 1.25x"
              " | within 2x | worst |")
        print("|---|---|---|---|---|---|")
        print(_line("FLOPs / device FLOP/s x precision factor", summary(before)))
        print(_line("per-op model, same rows, each device left out", summary(
            [device_ratio[i] for i, c in enumerate(every)
             if i in device_ratio and c.row.device.partition("@")[0] in PREVIOUS_CATALOGUE])))
    held_ratios = [x for v in by_source.values() for x in v]
    scored = every
    if by_device:
        print("\n| device left out | n | median | within 1.25x | within 2x | worst |")
        print("|---|---|---|---|---|---|")
        for device, values in by_device.items():
            print(_line(device, summary(values)))
        print("\n| model left out | n | median | within 1.25x | within 2x | worst |")
        print("|---|---|---|---|---|---|")
        for model, values in by_model.items():
            print(_line(model, summary(values)))
    if args.rows:
        print("\n| set | model | variant | input | device | threads | runtime | published ms |"
              " estimated ms | est / pub |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for label, cases in (("calibration", calib), ("held-out", held)):
            for case in cases:
                row, est = case.row, estimate_ms(case, cal)
                print(f"| {label} | {row.model} | {row.variant} | {row.size} | "
                      f"{row.published_device} | {row.threads or 'n/s'} | {row.runtime} | "
                      f"{row.published_ms:g} | {est:.3g} | {est / row.published_ms:.2f} |")
    # what a cached estimate costs: a model's operators (read from the stored rows) priced
    # on a device, the largest model here, its slowest of 5
    import time

    from orchestrator.measure.cost_model import price

    largest = max(calib + held, key=lambda c: len(c.ops.kind))
    stored = operators_of(largest.row, work) or []
    seconds_taken = []
    for _ in range(5):
        start = time.perf_counter()
        price(stored, device_of(largest.row.device), largest.row.runtime)
        seconds_taken.append(time.perf_counter() - start)
    print(f"\npricing {largest.row.model} ({len(stored)} ops) on {largest.row.device}: "
          f"{max(seconds_taken) * 1e3:.1f} ms (slowest of 5)")
    if args.write:
        classes: dict[str, list[float]] = {}
        for index, case in enumerate(scored):
            if index in device_ratio:
                core = device_of(case.row.device).cpu_clusters[0].core_class
                classes.setdefault(core, []).append(device_ratio[index])
        expected = {core: summary(values) for core, values in classes.items()}
        expected["all"] = summary(list(device_ratio.values()))
        expected["held_out"] = summary(held_ratios)
        written = replace(cal, expected_error=expected,
                          fitted_on=f"{len(scored_calib)} rows of {PUBLISHED.name} and "
                                    f"{len(held_scored)} of {HELD_OUT.name} "
                                    "(benchmarks/estimates.py --fit --write)")
        target = cost_model.CALIBRATION_FILE
        temporary = target.with_suffix(".tmp")
        temporary.write_text(json.dumps(_rounded(written.to_json()), indent=1) + "\n")
        temporary.replace(target)
        print(f"\nwrote {target.relative_to(ROOT)}")
    return 0


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


if __name__ == "__main__":
    raise SystemExit(main())
