"""Full-integer LiteRT that keeps float's answers: the stock converter against the LiteRT
Quantizer and its guard, on four models, in one run each.

Models: the photo mini-Xception (separable convolutions, residual adds, batch norm, 7
classes; benchmarks/testbed/models_photo_xception.py), mtcnn's ONet (the package's own trained
weights; benchmarks/onet.py), the audio front-end model (a 40 dB filterbank, three sigmoid
heads; benchmarks/testbed/models_audio_frontend.py) and the digits CNN. Per model, one recipe:

    fp32:          [freeze, strip, fold, benchmark, evaluate]
    stock_int8:    convert_tflite {mode: int8}          (the converter's full integer)
    stock_dynamic: convert_tflite {mode: dynamic_range} (int8 weights, float compute)
    aeq_int8:      convert_tflite {mode: fp32}, quantize_tflite {scheme: static_wi8_ai8}
    aeq_guard:     the same with guard: true, under the budget below

Budget: top-1 agreement (fidelity) 0.99 for the classifiers; 20 dB SQNR on every head for
ONet's box and landmarks and the audio heads (a class-score output is judged by agreement).
Every benchmark runs with one thread. Printed per model: size against fp32's, agreement or
SQNR per output, what the file computes in, and the host's p50.

Goals (issue 27): aeq_guard computes in integer only (int8, or int8 with int16
activations) on every model, meets the budget, and is within 10% of stock_dynamic's size.
Exit 1 when one is missed.

    .venv/bin/python benchmarks/litert_quantizer.py [--models xception,onet,audio,digits]
        [--work DIR] [--board qemu://aarch64?cpu=cortex-a76] [--quick]

--board adds `connect:` to the target: every variant is also measured on that board (its
top-1 agreement with this host per class output, else its largest abs difference).
--quick: the digits CNN alone, 20 timed runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mini_xception import ROOT, quiet_env, run_models  # noqa: E402

DEFAULT_WORK = ROOT / ".orchestrator" / "bench" / "litert_quantizer"
DIGITS = ROOT / "examples" / "digits"
INTEGER = ("int8", "int8+int16")
MAX_SIZE_OVER_DYNAMIC = 1.10

PIPELINES = """\
pipelines:
  fp32:
    stages: [freeze, strip, fold, {{benchmark: {bench}}}, evaluate]
  stock_int8:
    from: fp32
    stages: [{{convert_tflite: {{mode: int8}}}}, {{benchmark: {bench}}}, evaluate]
  stock_dynamic:
    from: fp32
    stages: [{{convert_tflite: {{mode: dynamic_range}}}}, {{benchmark: {bench}}}, evaluate]
  aeq_int8:
    from: fp32
    stages: [{{convert_tflite: {{mode: fp32}}}}, quantize_tflite, {{benchmark: {bench}}},
             evaluate]
  aeq_guard:
    from: fp32
    stages: [{{convert_tflite: {{mode: fp32}}}}, {{quantize_tflite: {{guard: true}}}},
             {{benchmark: {bench}}}, evaluate]
"""

HEADER = """\
version: 1
name: {name}-litert-quantizer
model: {{path: {model}{shape}}}
data:
  representative: {{source: {data}, array: x_calib, samples: 200}}
  evaluation: {{source: {data}, inputs: {inputs}{labels}}}
targets: [{{name: phone, device: phone-2016, budgets: {budgets}{connect}}}]
"""

CLASSIFIER = "{min_fidelity: 0.99}"
HEADS = "{min_sqnr_db: 20}"


def _build_test_model(module: str, folder: Path) -> None:
    """A testbed model (committed weights: no training) in a fresh process."""
    if (folder / "model.keras").is_file():
        return
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); "
            f"from testbed import model_builds; from pathlib import Path; "
            f"model_builds.build({module!r}, Path({str(folder)!r}))")
    subprocess.run([sys.executable, "-c", code], env=quiet_env(), check=True)


def recipe_text(name: str, bench: str, root: Path, board: str | None = None) -> str:
    """The model's recipe (its files built once under root/models)."""
    work = root / "models" / name
    work.mkdir(parents=True, exist_ok=True)
    connect = f", connect: '{board}'" if board else ""
    if name == "digits":
        header = HEADER.format(name=name, model=DIGITS / "saved_model",
                               shape=", inputs: [{name: image, dtype: float32, "
                               "shape: [1, 8, 8, 1]}]", data=DIGITS / "data.npz",
                               inputs="x_test", labels=", labels: y_test",
                               budgets=CLASSIFIER, connect=connect)
    elif name == "xception":
        _build_test_model("models_photo_xception", work)
        header = HEADER.format(name=name, model=work / "model.keras", shape="",
                               data=work / "data.npz", inputs="x_test",
                               labels=", labels: y_test", budgets=CLASSIFIER, connect=connect)
    elif name == "audio":
        _build_test_model("models_audio_frontend", work)
        header = HEADER.format(name=name, model=work / "model.keras", shape="",
                               data=work / "data.npz", inputs="x_test", labels="",
                               budgets=HEADS, connect=connect)
    else:
        from onet import build_data

        build_data(work)
        # face_prob is a class score: judged by its agreement, the regressions by SQNR
        header = HEADER.format(name=name, model=work / "saved_model", shape="",
                               data=work / "data.npz", inputs="x_eval", labels="",
                               budgets="{min_sqnr_db: 20, min_fidelity: 0.99}", connect=connect)
    return header + PIPELINES.format(bench=bench)


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    fp32 = report["variants"]["fp32"]
    rows = []
    for name, variant in report["variants"].items():
        outputs = {o["name"]: o for o in variant.get("outputs") or []}
        rows.append({
            "variant": name, "bytes": variant["size_bytes"],
            "ratio": variant["size_bytes"] / fp32["size_bytes"],
            "fidelity": variant.get("fidelity"),
            "per_output": {n: (o.get("top1_agreement") if o.get("top1_agreement") is not None
                               else o.get("sqnr_db")) for n, o in outputs.items()},
            "kinds": {n: "agreement" if o.get("top1_agreement") is not None else "SQNR dB"
                      for n, o in outputs.items()},
            "computes_in": variant.get("computes_in") or _computes_in(variant),
            "p50_ms": (variant.get("latency_ms") or {}).get("p50"),
            "trials": len(variant.get("trials") or []),
            "board": _board(variant["targets"]["phone"].get("measured") or {}),
            "meets": not any(t.get("violations") for t in variant["targets"].values())})
    return rows


def _board(measured: dict[str, Any]) -> str:
    """The board's top-1 agreement with this host per class output (else the largest
    abs difference), or why it was not measured."""
    if not measured:
        return ""
    if not measured.get("measured"):
        return f"not measured: {measured.get('reason', '-')}"
    return ", ".join(f"{n} {o['top1_agreement']:.3f}" if "top1_agreement" in o
                     else f"{n} ±{o['max_abs_diff']:.2g}"
                     for n, o in measured["outputs"].items())


def _computes_in(variant: dict[str, Any]) -> str:
    return "float (GraphDef)" if variant.get("kind") != "tflite" else "?"


def table(name: str, rows: list[dict[str, Any]]) -> str:
    def num(value: Any, form: str) -> str:
        return "n/a" if value is None else format(value, form)

    lines = [f"### {name}", "",
             "| variant | size KiB | / fp32 | per output (agreement, or SQNR dB) | computes in "
             "| meets budget | host p50 ms, 1 thread | guard trials |"
             + (" board vs host (agreement, or max abs diff) |" if any(r["board"] for r in rows)
                else ""),
             "|---|---:|---:|---|---|---|---:|---:|" + ("---|" if any(r["board"] for r in rows)
                                                        else "")]
    for r in rows:
        outputs = ", ".join(f"{n} {num(v, '.3f' if r['kinds'][n] == 'agreement' else '.1f')}"
                            for n, v in r["per_output"].items())
        lines.append(f"| {r['variant']} | {r['bytes'] / 1024:,.1f} | {r['ratio']:.3f} | "
                     f"{outputs} | {r['computes_in']} | {'yes' if r['meets'] else 'no'} | "
                     f"{num(r['p50_ms'], '.3f')} | {r['trials'] or ''} |"
                     + (f" {r['board']} |" if r["board"] else ""))
    return "\n".join(lines)


def goals(name: str, rows: list[dict[str, Any]]) -> list[str]:
    by = {r["variant"]: r for r in rows}
    guard, dynamic = by["aeq_guard"], by["stock_dynamic"]
    missed = []
    if guard["computes_in"] not in INTEGER:
        missed.append(f"{name}: aeq_guard computes in {guard['computes_in']}, not integer")
    if not guard["meets"]:
        missed.append(f"{name}: aeq_guard breaks the budget")
    if guard["bytes"] > MAX_SIZE_OVER_DYNAMIC * dynamic["bytes"]:
        missed.append(f"{name}: aeq_guard is {guard['bytes'] / dynamic['bytes']:.3f}x "
                      f"stock_dynamic's size (goal <= {MAX_SIZE_OVER_DYNAMIC})")
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="xception,onet,audio,digits")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--board", help="also measure every variant on this board (a "
                        "target's connect: URL, e.g. qemu://aarch64?cpu=cortex-a76)")
    parser.add_argument("--quick", action="store_true",
                        help="digits only, 20 timed runs: proves the script still works")
    args = parser.parse_args(argv)
    models = ["digits"] if args.quick else args.models.split(",")
    bench = "{threads: 1, runs: 20}" if args.quick else "{threads: 1, runs: 100}"
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    return run_models(models, work, lambda name: recipe_text(name, bench, work, args.board),
                      figures, table, goals, "litert_quantizer.json")


if __name__ == "__main__":
    sys.exit(main())
