"""mtcnn's ONet through the plain 8-bit pipeline: size and each of its three outputs vs float.

Builds once into --work (benchmarks/onet_data.py): the `mtcnn` package's ONet with its
shipped weights as a SavedModel, and 48x48 face / partial-face / non-face crops of the
photos scikit-image and scikit-learn ship (calibration and evaluation sets, split by
person). Writes the recipe a user writes from the README:

    fp32: [freeze, strip, fold, benchmark, evaluate]
    int8: {from: fp32, stages: [quantize_weights, {quantize_nodes: {guard: true}},
           log_ranges, freeze_ranges, benchmark, evaluate]}

runs it with a CLI (`--orchestrator`, default this checkout's; any older version of this
project works too), then compares, itself, every variant's shipped model.pb with ONet's
float outputs (computed by the package's Keras model), in a plain tf.compat.v1 Session
fetching all three outputs: per output SQNR in dB, cosine similarity, max abs error and
agreement (face_prob: face > 0.5 decided alike; box and landmarks: samples whose every
value is within 0.01). Prints a markdown table.

    .venv/bin/python benchmarks/onet.py [--work DIR] [--orchestrator CLI] [--label NAME]
        [--budgets '{min_fidelity: 0.98}'] [--quick]

--quick: fewer crops (onet_data.py --quick; in its own --work, default
.orchestrator/bench/onet-quick), the guard held to two trials; the same table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# TF's C++ start-up lines (oneDNN, CPU features) are not this table's
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mini_xception import ROOT, default_cli, quiet_env, run_recipe  # noqa: E402

DEFAULT_WORK = ROOT / ".orchestrator" / "bench" / "onet"
QUICK_WORK = DEFAULT_WORK.with_name("onet-quick")
QUICK_TUNE = "tune: {max_trials: 2}\n"
OUTPUTS = ("box", "landmarks", "face_prob")
WITHIN = 0.01          # box / landmarks: a sample agrees when every value is this close
FACE_THRESHOLD = 0.5   # face_prob: face or not

RECIPE = """\
version: 1
name: mtcnn-onet
description: mtcnn's ONet (shipped weights), calibrated on face crops of real photos
model:
  path: model/saved_model
data:
  representative: {{source: model/data.npz, array: x_calib, samples: 200}}
  evaluation: {{source: model/data.npz, inputs: x_eval}}
targets:
  - name: phone
    device: phone-2016
    budgets: {budgets}
pipelines:
  fp32:
    stages: [freeze, strip, fold, benchmark, evaluate]
  int8:
    from: fp32
    stages:
      - quantize_weights
      - quantize_nodes: {quantize_nodes}
      - log_ranges
      - freeze_ranges
      - benchmark
      - evaluate
"""


def build_data(folder: Path, rebuild: bool = False, quick: bool = False) -> dict[str, Any]:
    """saved_model/ and data.npz in `folder`, made in a fresh process unless present
    (quick: from fewer photos)."""
    facts_file = folder / "facts.json"
    if not rebuild and facts_file.is_file() and (folder / "saved_model").is_dir():
        return json.loads(facts_file.read_text())
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(HERE / "onet_data.py"), str(folder),
                           *(["--quick"] if quick else [])],
                          env=quiet_env(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"building ONet and its data failed:\n{done.stderr[-3000:]}")
    facts = json.loads(facts_file.read_text())
    print(f"built ONet and {facts['calib']} + {facts['eval']} crops in "
          f"{time.perf_counter() - started:.0f} s")
    return facts


def _ref(name: str) -> str:
    return name if ":" in name else f"{name}:0"


def run_variant(folder: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """The variant's model.pb in a plain tf.compat.v1 Session: every output, by name."""
    import tensorflow as tf

    signature = json.loads((folder / "signature.json").read_text())
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString((folder / "model.pb").read_bytes())
    refs = list(signature["outputs"])
    # the signature's friendly names (box, ...) -> tensors; else its order is the sorted keys
    named = signature.get("metadata", {}).get("output_names") or dict(
        zip(sorted(OUTPUTS), refs, strict=True))
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        fetched = session.run({k: _ref(v) for k, v in named.items()},
                              {_ref(signature["inputs"][0]["name"]): x})
    return {k: np.asarray(v, dtype=np.float64) for k, v in fetched.items()}


def compare(out: np.ndarray, ref: np.ndarray, output: str) -> dict[str, float]:
    """SQNR (dB), cosine similarity, max abs error and agreement of one output."""
    error = out - ref
    noise = float(np.sum(error ** 2))
    signal = float(np.sum(ref ** 2))
    if output == "face_prob":
        agree = np.mean((out[:, 1] > FACE_THRESHOLD) == (ref[:, 1] > FACE_THRESHOLD))
    else:
        agree = np.mean(np.all(np.abs(error) <= WITHIN, axis=1))
    return {"sqnr_db": float("inf") if noise == 0 else 10 * np.log10(signal / noise),
            "cosine": float(np.dot(out.ravel(), ref.ravel())
                            / (np.linalg.norm(out) * np.linalg.norm(ref))),
            "max_abs_err": float(np.abs(error).max()),
            "agreement": float(agree)}


def measure(out_dir: Path, report: dict[str, Any], data: Any) -> list[dict[str, Any]]:
    rows = []
    fp32_bytes = (out_dir / "fp32" / "model.pb").stat().st_size
    for variant in report["variants"]:
        folder = out_dir / variant
        if not (folder / "model.pb").is_file():
            rows.append({"variant": variant, "missing": True})
            continue
        size = (folder / "model.pb").stat().st_size
        outputs = run_variant(folder, data["x_eval"])
        for output in OUTPUTS:
            rows.append({"variant": variant, "size_bytes": size,
                         "size_ratio": size / fp32_bytes, "output": output,
                         **compare(outputs[output], data[f"ref_{output}"], output)})
    return rows


def markdown(rows: list[dict[str, Any]], label: str, samples: int) -> str:
    lines = [f"ONet, {label}: each output vs float ONet on {samples} evaluation crops",
             "",
             "| variant | size KiB | vs fp32 | output | SQNR dB | cosine | max abs err "
             "| agreement |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    for row in rows:
        if row.get("missing"):
            lines.append(f"| {row['variant']} | no model.pb | | | | | | |")
            continue
        lines.append(f"| {row['variant']} | {row['size_bytes'] / 1024:,.1f} "
                     f"| {row['size_ratio']:.3f} | {row['output']} | {row['sqnr_db']:.1f} "
                     f"| {row['cosine']:.5f} | {row['max_abs_err']:.4f} "
                     f"| {row['agreement']:.4f} |")
    lines += ["", f"agreement: face_prob > {FACE_THRESHOLD} decided alike; box, landmarks: "
              f"every value within {WITHIN}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the model, data, recipe, store and outputs "
                        f"(default {DEFAULT_WORK.relative_to(ROOT)}; --quick: "
                        f"{QUICK_WORK.relative_to(ROOT)})")
    parser.add_argument("--orchestrator", default=None,
                        help="the CLI to run, e.g. /work/wt-before/.venv/bin/orchestrator "
                        "(default: this interpreter's)")
    parser.add_argument("--label", default=None,
                        help="names the output folder (out-LABEL) and the table")
    parser.add_argument("--budgets", default="{}",
                        help="the target's budgets, a YAML flow mapping (default none: "
                        "the guard then has nothing to enforce)")
    parser.add_argument("--quantize-nodes", default="{guard: true}",
                        help="quantize_nodes' params, a YAML flow mapping (default "
                        "'{guard: true}'; e.g. add 'bias_correction: false' to compare)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the model and data")
    parser.add_argument("--quick", action="store_true",
                        help="fewer crops, two guard trials at most")
    args = parser.parse_args(argv)
    work = (args.work or (QUICK_WORK if args.quick else DEFAULT_WORK)).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cli = shlex.split(args.orchestrator) if args.orchestrator else default_cli()
    label = args.label or ("this checkout" if args.orchestrator is None
                           else Path(cli[0]).resolve().parents[2].name)
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)

    facts = build_data(work / "model", args.rebuild, args.quick)
    print(f"ONet: {facts['params']:,} params; crops: {facts['calib']} calibration, "
          f"{facts['eval']} evaluation {facts['eval_kinds']}")
    recipe = work / f"recipe-{slug}.yaml"
    recipe.write_text(RECIPE.format(budgets=args.budgets, quantize_nodes=args.quantize_nodes)
                      + (QUICK_TUNE if args.quick else ""))
    out = work / f"out-{slug}"
    print(f"running: {' '.join(cli)} run {recipe} -o {out}")
    code, report, console, seconds = run_recipe(cli, recipe, out, work)
    print(f"exit {code} after {seconds:.0f} s")
    if report is None:
        print(console)
        print(f"FAIL: the run wrote no report.json (exit {code}); the console's tail is above")
        return 1
    if code not in (0, 1):
        print(console)
    trials = report["variants"].get("int8", {}).get("trials")
    print(f"guard trials: {len(trials) if isinstance(trials, list) else 0}")
    with np.load(work / "model" / "data.npz") as npz:
        data = {k: npz[k] for k in npz.files}
    rows = measure(out, report, data)
    print()
    print(markdown(rows, label, len(data["x_eval"])))
    (work / f"compare-{slug}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
