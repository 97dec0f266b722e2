"""Both paths side by side: the classic GraphDef variants and the LiteRT ones, per model.

For each model (the digits CNN, the mini-Xception of benchmarks/mini_xception.py, mtcnn's
ONet of benchmarks/onet.py) it writes one recipe with the pipelines

    fp32:           [freeze, strip, fold, benchmark, evaluate]
    int8:           GraphDef eight-bit (quantize_weights, quantize_nodes, log_ranges,
                    freeze_ranges)
    weights8:       GraphDef quantize_weights only (8-bit weights, float compute)
    litert_fp32 / litert_dynamic / litert_int8:  convert_tflite fp32 / dynamic_range / int8
    litert_int8_small:  int8 with one scale per tensor and no tensor names (per_channel:
                    false, strip_names: true): what small models of thin layers need

every benchmark with `threads: 1` (a phone's one big core; the host measures each alike),
runs it with the real CLI in a fresh process (its own store, Prefect server and MLflow
database under --work), and prints one markdown table per model from report.json:
shipped size, its ratio to fp32's, accuracy (where the data has labels), fidelity (top-1
agreement with the source model; for ONet the lowest over its outputs), the lowest logit
SQNR over the outputs, and the host's measured p50 with 1 thread.

Goals (issue 18), for the smaller LiteRT int8 variant: digits within 0.005 of fp32's
accuracy at <= 0.27 of its size and faster than fp32 on this host; mini-Xception <= 0.30
of fp32 at >= 0.99 agreement. Exit 1 when a goal is missed.

    .venv/bin/python benchmarks/litert_side_by_side.py [--models digits,xception,onet]
        [--work DIR] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mini_xception import ROOT, build_model, run_models  # noqa: E402

DEFAULT_WORK = ROOT / ".orchestrator" / "bench" / "litert"
DIGITS = ROOT / "examples" / "digits"

PIPELINES = """\
pipelines:
  fp32:
    stages: [freeze, strip, fold, {{benchmark: {bench}}}, evaluate]
  int8:
    from: fp32
    stages: [quantize_weights, quantize_nodes, log_ranges, freeze_ranges,
             {{benchmark: {bench}}}, evaluate]
  weights8:
    from: fp32
    stages: [quantize_weights, {{benchmark: {bench}}}, evaluate]
  litert_fp32:
    from: fp32
    stages: [{{convert_tflite: {{mode: fp32}}}}, {{benchmark: {bench}}}, evaluate]
  litert_dynamic:
    from: fp32
    stages: [{{convert_tflite: {{mode: dynamic_range}}}}, {{benchmark: {bench}}}, evaluate]
  litert_int8:
    from: fp32
    stages: [{{convert_tflite: {{mode: int8}}}}, {{benchmark: {bench}}}, evaluate]
  litert_int8_small:
    from: fp32
    stages: [{{convert_tflite: {{mode: int8, per_channel: false, strip_names: true}}}},
             {{benchmark: {bench}}}, evaluate]
"""

MODELS: dict[str, str] = {
    "digits": """\
version: 1
name: digits-side-by-side
model: {{path: {model}, inputs: [{{name: image, dtype: float32, shape: [1, 8, 8, 1]}}]}}
data:
  representative: {{source: {data}, array: x_calib, samples: 200}}
  evaluation: {{source: {data}, inputs: x_test, labels: y_test}}
""",
    "xception": """\
version: 1
name: mini-xception-side-by-side
model: {{path: {model}}}
data:
  representative: {{source: {data}, array: x_calib, samples: 200}}
  evaluation: {{source: {data}, inputs: x_test, labels: y_test}}
""",
    "onet": """\
version: 1
name: onet-side-by-side
model: {{path: {model}}}
data:
  representative: {{source: {data}, array: x_calib, samples: 200}}
  evaluation: {{source: {data}, inputs: x_eval}}
""",
}


def model_files(name: str, work: Path) -> tuple[Path, Path]:
    """(model path, data.npz) for `name`, built into `work` once."""
    if name == "digits":
        return DIGITS / "saved_model", DIGITS / "data.npz"
    if name == "xception":  # the model benchmarks/mini_xception.py trains, shared with it
        folder = ROOT / ".orchestrator" / "bench" / "mini_xception" / "model"
        folder.mkdir(parents=True, exist_ok=True)
        build_model(folder)
        return folder / "model.keras", folder / "data.npz"
    from onet import build_data

    folder = ROOT / ".orchestrator" / "bench" / "onet" / "model"  # as benchmarks/onet.py
    folder.mkdir(parents=True, exist_ok=True)
    build_data(folder)
    return folder / "saved_model", folder / "data.npz"


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    fp32 = report["variants"]["fp32"]
    rows = []
    for name, variant in report["variants"].items():
        metrics = variant.get("metrics") or {}
        sqnr = variant.get("min_logit_sqnr_db", metrics.get("min_logit_sqnr_db"))
        rows.append({"variant": name, "kind": variant.get("kind", "graphdef"),
                     "bytes": variant["size_bytes"],
                     "ratio": variant["size_bytes"] / fp32["size_bytes"],
                     "accuracy": variant.get("accuracy"), "fidelity": variant.get("fidelity"),
                     "min_logit_sqnr_db": sqnr,
                     "p50_ms": (variant.get("latency_ms") or {}).get("p50")})
    return rows


def table(name: str, rows: list[dict[str, Any]]) -> str:
    def num(value: Any, form: str) -> str:
        return "n/a" if value is None else format(value, form)

    lines = [f"### {name}", "",
             "| variant | kind | size KiB | / fp32 | accuracy | fidelity | min logit SQNR dB "
             "| host p50 ms, 1 thread (measured) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['kind']} | {r['bytes'] / 1024:,.1f} | "
                     f"{r['ratio']:.3f} | {num(r['accuracy'], '.4f')} | "
                     f"{num(r['fidelity'], '.4f')} | {num(r['min_logit_sqnr_db'], '.1f')} | "
                     f"{num(r['p50_ms'], '.3f')} |")
    return "\n".join(lines)


def goals(name: str, rows: list[dict[str, Any]]) -> list[str]:
    """The issue's goals for this model that were missed."""
    by = {r["variant"]: r for r in rows}
    fp32 = by["fp32"]
    lite = min((r for r in rows if r["variant"].startswith("litert_int8")),
               key=lambda r: r["bytes"], default=None)  # the smallest LiteRT int8
    missed = []
    if lite is None:
        return ["no litert_int8 variant"]
    if name == "digits":
        if fp32["accuracy"] - lite["accuracy"] > 0.005:
            missed.append(f"digits: {lite['variant']} accuracy {lite['accuracy']:.4f} more than "
                          f"0.005 below fp32's {fp32['accuracy']:.4f}")
        if lite["ratio"] > 0.27:
            missed.append(f"digits: {lite['variant']} is {lite['ratio']:.3f} of fp32 (> 0.27)")
        if lite["p50_ms"] >= fp32["p50_ms"]:
            missed.append(f"digits: {lite['variant']} p50 {lite['p50_ms']:.3f} ms is not faster "
                          f"than fp32's {fp32['p50_ms']:.3f} ms")
    if name == "xception":
        if lite["ratio"] > 0.30 or (lite["fidelity"] or 0) < 0.99:
            missed.append(f"mini-Xception: {lite['variant']} {lite['ratio']:.3f} of fp32 at "
                          f"agreement {lite['fidelity']} (goal <= 0.30 at >= 0.99)")
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,xception,onet")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--quick", action="store_true",
                        help="digits only, 20 timed runs: proves the script still works")
    args = parser.parse_args(argv)
    models = ["digits"] if args.quick else args.models.split(",")
    bench = "{threads: 1, runs: 20}" if args.quick else "{threads: 1, runs: 200}"
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)

    def write_recipe(name: str) -> str:
        model, data = model_files(name, work)
        return MODELS[name].format(model=model, data=data) + PIPELINES.format(bench=bench)

    return run_models(models, work, write_recipe, figures, table, goals, "side_by_side.json")


if __name__ == "__main__":
    sys.exit(main())
