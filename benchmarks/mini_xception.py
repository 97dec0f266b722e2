"""Acceptance on a real-style model: a mini-Xception through the plain 8-bit pipeline.

Builds (once, cached in --work) the mini-Xception of benchmarks/testbed/models_xception.py
trained on digits upscaled to 32x32, writes the recipe a user writes from the README:

    fp32: [freeze, strip, fold, benchmark, evaluate]
    int8: {from: fp32, stages: [quantize_weights, {quantize_nodes: {guard: true}},
           log_ranges, freeze_ranges, benchmark, evaluate]}

with the target budget `min_fidelity: 0.98` (top-1 agreement with float), runs it with the
real CLI (`orchestrator run RECIPE -o OUT`, a fresh process, its own store, Prefect server
and MLflow database in --work), and prints from report.json: shipped sizes, their ratio,
accuracy, agreement and the guard's trials. PASS (exit 0) when int8 is at most 0.35 of
fp32's size and agrees with fp32 on at least 98% of the test images; FAIL is exit 1.

    .venv/bin/python benchmarks/mini_xception.py [--work DIR] [--orchestrator CLI] [--rebuild]
        [--quick]

--quick: the guard held to two trials (`tune: {max_trials: 2}`), in its own --work (default
.orchestrator/bench/mini_xception-quick); the table is printed, the acceptance not judged
(exit 0 once the run finished). The model is the full one: the suite commits its trained
weights (benchmarks/testbed/model_builds.py), so building it loads them, which takes less than one
epoch of training would (10 s of CPU against 21, and a model that has learned something).
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

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"  # testbed/: the model, shared with the tests
DEFAULT_WORK = ROOT / ".orchestrator" / "bench" / "mini_xception"
QUICK_WORK = DEFAULT_WORK.with_name("mini_xception-quick")
QUICK_TUNE = "tune: {max_trials: 2}\n"
MAX_SIZE_RATIO = 0.35
MIN_AGREEMENT = 0.98

RECIPE = """\
version: 1
name: mini-xception
description: mini-Xception (SeparableConv2D, BN, residual adds) on digits upscaled to 32x32
model:
  path: model/model.keras
data:
  representative: {{source: model/data.npz, array: x_calib, samples: 200}}
  evaluation: {{source: model/data.npz, inputs: x_test, labels: y_test}}
targets:
  - name: phone
    device: phone-2016
    budgets: {{min_fidelity: {min_fidelity}}}
pipelines:
  fp32:
    stages: [freeze, strip, fold, benchmark, evaluate]
  int8:
    from: fp32
    stages:
      - quantize_weights
      - quantize_nodes: {{guard: true}}
      - log_ranges
      - freeze_ranges
      - benchmark
      - evaluate
"""


def default_cli() -> list[str]:
    """The console script next to this interpreter (this checkout's orchestrator)."""
    script = Path(sys.executable).parent / "orchestrator"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "orchestrator"]


def quiet_env(**extra: str) -> dict[str, str]:
    # TF's C++ log lines (oneDNN notes, Keras' "use_unbounded_threadpool") are not ours
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0",
            "CUDA_VISIBLE_DEVICES": "", **extra}


def build_model(folder: Path, epochs: int | None = None, rebuild: bool = False
                ) -> dict[str, Any]:
    """model.keras and data.npz in `folder`, trained in a fresh process unless present
    (trained for as many epochs as asked)."""
    facts_file = folder / "facts.json"
    if (not rebuild and all((folder / f).is_file()
                            for f in ("model.keras", "data.npz", "facts.json"))
            and epochs in (None, json.loads(facts_file.read_text()).get("epochs"))):
        return json.loads(facts_file.read_text())
    started = time.perf_counter()
    command = [sys.executable, "-m", "testbed.models_xception", str(folder)]
    if epochs is not None:
        command += ["--epochs", str(epochs)]
    env = {**quiet_env(), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(BENCHMARKS), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"training the mini-Xception failed:\n{done.stderr[-3000:]}")
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    facts["train_seconds"] = round(time.perf_counter() - started, 1)
    facts_file.write_text(json.dumps(facts))
    return facts


def run_recipe(cli: list[str], recipe: Path, out: Path, work: Path
               ) -> tuple[int, dict[str, Any] | None, str, float]:
    """`CLI run RECIPE -o OUT` in a fresh process with its store, Prefect server (stopped
    at the end of the run) and MLflow database under `work`: exit code, report.json (None
    if not written), the console's tail, seconds."""
    env = quiet_env(ORCHESTRATOR_HOME=str(work / "home"),
                    MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}",
                    ORCHESTRATOR_PREFECT_IDLE_S="0")  # leave no server behind
    started = time.perf_counter()
    done = subprocess.run([*cli, "run", str(recipe), "-o", str(out)], env=env, cwd=work,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    report_file = out / "report.json"
    report = json.loads(report_file.read_text()) if report_file.is_file() else None
    console = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, report, "\n".join(console[-40:]), seconds


def run_models(models: list[str], work: Path, write_recipe: Any, figures: Any, table: Any,
               goals: Any, results_file: str) -> int:
    """For each model: its recipe (write_recipe(name) -> text) run with the real CLI under
    `work`, its rows (figures(report)) printed as a table, the goals it missed; the rows of
    all in `work/results_file`. Exit 1 when a run failed or a goal was missed."""
    import shutil

    missed: list[str] = []
    results = {}
    for name in models:
        recipe = work / f"{name}.yaml"
        recipe.write_text(write_recipe(name))
        out = work / f"out_{name}"
        shutil.rmtree(out, ignore_errors=True)
        code, report, console, seconds = run_recipe(default_cli(), recipe, out, work)
        if report is None:
            print(console)
            print(f"{name}: the run failed (exit {code})")
            return 1
        rows = figures(report)
        results[name] = rows
        print(table(name, rows))
        print(f"\n({seconds:.0f} s: orchestrator run {recipe} -o {out})\n")
        missed += goals(name, rows)
    (work / results_file).write_text(json.dumps(results, indent=2))
    for line in missed:
        print(f"MISSED {line}")
    return 1 if missed else 0


def find_key(tree: Any, key: str) -> Any:
    """The first value under `key` anywhere in a JSON tree (depth first), or None."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        children = list(tree.values())
    elif isinstance(tree, list):
        children = tree
    else:
        return None
    for child in children:
        found = find_key(child, key)
        if found is not None:
            return found
    return None


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The acceptance figures from a report.json."""
    fp32, int8 = report["variants"]["fp32"], report["variants"]["int8"]
    trials = find_key(int8, "trials")
    return {"fp32_bytes": fp32["size_bytes"], "int8_bytes": int8["size_bytes"],
            "size_ratio": int8["size_bytes"] / fp32["size_bytes"],
            "fp32_accuracy": fp32.get("accuracy"), "int8_accuracy": int8.get("accuracy"),
            "agreement": int8.get("fidelity"),
            "trials": len(trials) if isinstance(trials, list) else 0,
            "trials_table": trials if isinstance(trials, list) else [],
            "selected": report.get("selected", {}).get("phone")}


def verdict(s: dict[str, Any]) -> tuple[bool, bool]:
    """(size ok, agreement ok) against the acceptance."""
    return (s["size_ratio"] <= MAX_SIZE_RATIO,
            s["agreement"] is not None and s["agreement"] >= MIN_AGREEMENT)


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_table(s: dict[str, Any]) -> bool:
    size_ok, agree_ok = verdict(s)
    mark = {True: "PASS", False: "FAIL"}
    rows = [
        ("fp32 shipped size", f"{s['fp32_bytes']:,} B ({s['fp32_bytes'] / 1024:,.1f} KiB)", ""),
        ("int8 shipped size", f"{s['int8_bytes']:,} B ({s['int8_bytes'] / 1024:,.1f} KiB)", ""),
        ("int8 / fp32 size", f"{s['size_ratio']:.4f}", f"<= {MAX_SIZE_RATIO}: {mark[size_ok]}"),
        ("accuracy fp32", _fmt(s["fp32_accuracy"], ".4f"), ""),
        ("accuracy int8", _fmt(s["int8_accuracy"], ".4f"), ""),
        ("top-1 agreement int8 vs fp32", _fmt(s["agreement"], ".4f"),
         f">= {MIN_AGREEMENT}: {mark[agree_ok]}"),
        ("guard trials (incl. baseline)", str(s["trials"]), ""),
        ("selected for phone", str(s["selected"]), ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\n| {'mini-Xception':<{width}} | {'value':<28} | acceptance |")
    print(f"|{'-' * (width + 2)}|{'-' * 30}|------------|")
    for label, value, check in rows:
        print(f"| {label:<{width}} | {value:<28} | {check} |")
    for row in s["trials_table"]:
        print(f"  trial {row.get('trial')}: {json.dumps(row.get('settings'))} "
              f"fidelity={_fmt(row.get('fidelity'), '.4f')} "
              f"meets={row.get('meets_budgets')}")
    ok = size_ok and agree_ok
    print(f"\n{mark[ok]}: int8 {s['size_ratio']:.3f} of fp32's size, "
          f"agreement {_fmt(s['agreement'], '.4f')}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the model, data, recipe, store and outputs "
                        f"(default {DEFAULT_WORK.relative_to(ROOT)}; --quick: "
                        f"{QUICK_WORK.relative_to(ROOT)})")
    parser.add_argument("--orchestrator", default=None,
                        help="the CLI to run, e.g. /work/other/.venv/bin/orchestrator "
                        "(default: this interpreter's)")
    parser.add_argument("--out", default="out", help="output folder name inside --work")
    parser.add_argument("--epochs", type=int, default=None,
                        help="training epochs (default: models_xception's); retrains when "
                        "the cached model had others")
    parser.add_argument("--rebuild", action="store_true", help="retrain the model")
    parser.add_argument("--quick", action="store_true",
                        help="two guard trials; acceptance not judged")
    args = parser.parse_args(argv)
    work = (args.work or (QUICK_WORK if args.quick else DEFAULT_WORK)).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cli = shlex.split(args.orchestrator) if args.orchestrator else default_cli()

    facts = build_model(work / "model", args.epochs, args.rebuild)
    print(f"mini-Xception: {facts['params']:,.0f} params, Keras test accuracy "
          f"{facts['accuracy']:.4f} (model in {work / 'model'})")
    recipe = work / "recipe.yaml"
    recipe.write_text(RECIPE.format(min_fidelity=MIN_AGREEMENT)
                      + (QUICK_TUNE if args.quick else ""))
    out = work / args.out
    print(f"running: {' '.join(cli)} run {recipe} -o {out}")
    code, report, console, seconds = run_recipe(cli, recipe, out, work)
    print(f"exit {code} after {seconds:.0f} s")
    if code not in (0, 1) or report is None:
        print(console)
        print(f"FAIL: the run did not finish (exit {code})")
        return 1
    ok = print_table(summarize(report))
    if args.quick:
        print("--quick: two guard trials; acceptance not judged")
        return 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
