"""The LiteRT variants measured on the emulated Cortex-A76 beside this host, and what a
device measurement costs beyond its runs, over SSH on loopback.

1. For each model (the digits CNN; mtcnn's ONet with its shipped weights, built by
   benchmarks/onet_data.py), one recipe with its float graph and LiteRT's int8 and
   dynamic-range files, each measured on `qemu://aarch64?cpu=cortex-a76` (`orchestrator
   run`, real Prefect and MLflow). Per variant: accuracy on this host and on the board,
   the board's top-1 agreement with this host and its largest abs difference per output,
   both p50s (the board's is qemu's, marked emulated), and what the measurement cost
   (the stage's wall time).
2. The overhead: the same file measured over a real OpenSSH server on loopback (the board
   behind it is the emulated one), a warm session reused as in a run: per measurement,
   the wall time on this host minus the board's own time for the runs (`seconds` in its
   reply), and the first connection (ssh + the runner's start).

    .venv/bin/python benchmarks/on_device.py [--models digits,onet] [--work DIR] [--quick]

--quick: the digits model alone, two overhead measurements; the same tables (each run's
console is kept in WORK/<model>/console.txt). tests/e2e/test_device_runs.py runs it so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

CONNECT = "qemu://aarch64?cpu=cortex-a76"
DIGITS = ROOT / "examples" / "digits"

RECIPE = """\
version: 1
name: {name}-on-device
model: {{path: {model}}}
data:
  representative: {{source: {data}, array: x_calib, samples: 200}}
  evaluation: {{source: {data}, inputs: {inputs}{labels}}}
targets:
  - name: arm
    device: phone-modern
    connect: '{connect}'
pipelines:
  fp32: {{stages: [freeze, strip, fold, evaluate]}}
  litert_int8:
    from: fp32
    stages: [{{convert_tflite: {{mode: int8}}}}, benchmark, evaluate]
  litert_dynamic:
    from: fp32
    stages: [{{convert_tflite: {{mode: dynamic_range}}}}, benchmark, evaluate]
"""


def model_files(name: str, work: Path) -> tuple[Path, Path, str, str]:
    """(model, data.npz, evaluation inputs, labels clause) for `name`."""
    if name == "digits":
        return DIGITS / "saved_model", DIGITS / "data.npz", "x_test", ", labels: y_test"
    from onet import build_data

    folder = ROOT / ".orchestrator" / "bench" / "onet" / "model"  # as benchmarks/onet.py
    folder.mkdir(parents=True, exist_ok=True)
    build_data(folder)
    return folder / "saved_model", folder / "data.npz", "x_eval", ""


def run(name: str, work: Path) -> dict[str, Any]:
    model, data, inputs, labels = model_files(name, work)
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / "recipe.yaml"
    recipe.write_text(RECIPE.format(name=name, model=model, data=data, inputs=inputs,
                                    labels=labels, connect=CONNECT))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlflow.db",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(recipe), "-o",
                           str(folder / "out"), "--force"], cwd=folder, env=env,
                          capture_output=True, text=True, check=False)
    (folder / "console.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{name}: orchestrator run failed:\n{done.stderr[-3000:]}")
    return json.loads((folder / "out" / "report.json").read_text())


def rows(report: dict[str, Any]) -> list[str]:
    lines = []
    for variant, figures in report["variants"].items():
        measured = figures["targets"]["arm"].get("measured") or {}
        stage = next((s for s in figures["stages"] if s["name"] == "measure_on_device"), {})
        if not measured.get("measured"):
            lines.append(f"| {variant} | {fmt(figures.get('accuracy'))} | not measured: "
                         f"{measured.get('reason', '-')} | | | | | | |")
            continue
        worst = {n: o["max_abs_diff"] for n, o in measured["outputs"].items()}
        agreement = {n: o["top1_agreement"] for n, o in measured["outputs"].items()
                     if "top1_agreement" in o}
        lines.append(
            f"| {variant} | {fmt(figures.get('accuracy'))} | {fmt(measured.get('accuracy'))} "
            f"| {', '.join(f'{n} {v:.4f}' for n, v in agreement.items()) or '-'} "
            f"| {measured['fidelity']:.4f} "
            f"| {', '.join(f'{n} {v:.3g}' for n, v in worst.items())} "
            f"| {fmt((figures.get('latency_ms') or {}).get('p50'), '.4f')} "
            f"| {measured['latency_ms']['p50']:.4f} (emulated) | {stage.get('seconds', 0):.1f} |")
    return lines


def fmt(value: Any, form: str = ".4f") -> str:
    return "-" if value is None else format(value, form)


def overhead(work: Path, model: Path, repeats: int) -> list[str]:
    """Wall time per measurement over SSH beyond the board's own time for the runs."""
    import numpy as np
    from testbed.ssh_board import start_ssh_board

    from orchestrator.boards import emulated_board, measurement
    from orchestrator.boards.session import BoardSession
    from orchestrator.boards.transports import transport_for
    from orchestrator.boards.urls import parse_device_url
    from orchestrator.model.files import open_model

    board = start_ssh_board(work / "sshd")
    try:
        os.environ["ORCHESTRATOR_SSH_CONFIG"] = str(board.config)
        url = parse_device_url(board.url(python=str(emulated_board.python_for("cortex-a76"))))
        artifact = open_model(model).artifact
        inputs = np.load(DIGITS / "data.npz")["x_test"]
        started = time.perf_counter()
        session = BoardSession(transport_for(url), url.text)
        session.start()
        first = time.perf_counter() - started
        extra = []
        for _ in range(repeats):
            began = time.perf_counter()
            reply = measurement.measure(session, artifact, None, inputs, [1], warmup=5,
                                        runs=50, samples=len(inputs), timeout=300)
            extra.append(time.perf_counter() - began - reply["seconds"])
        session.close()
    finally:
        board.stop()
    return [f"- first connection (ssh, control master, the board's Python and runner "
            f"started): {first:.2f} s",
            f"- per measurement beyond the board's own time (push of the file and "
            f"{len(inputs)} inputs, replies, over one reused connection), {repeats} "
            f"measurements: median {statistics.median(extra):.3f} s, max {max(extra):.3f} s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,onet")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="the digits model alone, two overhead measurements")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.repeats = "digits", 2
    work = args.work or Path(tempfile.mkdtemp(prefix="on-device-"))
    print(f"# On the emulated Cortex-A76 ({CONNECT}) beside this host\n")
    reports = {}
    for name in args.models.split(","):
        started = time.perf_counter()
        reports[name] = run(name, work)
        print(f"## {name} (the whole run: {time.perf_counter() - started:.0f} s)\n")
        print("| variant | accuracy (host) | accuracy (board) | top-1 agreement with host "
              "(class outputs) | fidelity to host | max abs diff | host p50 ms | board p50 ms "
              "| measurement s |")
        print("|---|---:|---:|---|---:|---|---:|---:|---:|")
        print("\n".join(rows(reports[name])) + "\n")
    model = work / "digits" / "out" / "litert_int8" / "model.tflite"
    if model.is_file():
        print("# Overhead per device measurement, SSH on loopback\n")
        print("\n".join(overhead(work, model, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
