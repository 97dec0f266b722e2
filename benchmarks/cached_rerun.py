"""First run vs cached re-run of a recipe, as a user runs it (the console script).

Each run is a fresh process. Each setting gets a fresh store in a temp folder and MLflow in
that folder. Prints a table of wall times and whether every stage of the second run was a
cache hit. Settings:

- "warm machine": Prefect's database already exists (as after any earlier run); the first
  run starts the local Prefect server, the second attaches to it (the default);
- "new machine": also a new PREFECT_HOME, so the first run creates Prefect's database, as a
  user's very first run does;
- "server per run": ORCHESTRATOR_PREFECT_IDLE_S=0, each run starts and stops its own server.

With PREFECT_API_URL set, every setting uses that server instead. Without
ORCHESTRATOR_MODEL_KEY, a throwaway key serves the recipe's encrypt stage.

    .venv/bin/python benchmarks/cached_rerun.py [recipes/digits.yaml] [--quick]

--quick: the "warm machine" setting alone, on the recipe's fp32 pipeline (`--variant fp32`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.flow.local_server import IDLE_ENV, STATE_FILE  # noqa: E402
from orchestrator.model.keys import encode_key, generate_key  # noqa: E402

KEY_ENV = "ORCHESTRATOR_MODEL_KEY"  # the digits recipe's encrypt stage reads its key here


def run_once(recipe: Path, work: Path, out: str, env: dict[str, str],
             extra: list[str] | None = None) -> tuple[float, dict]:
    started = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "orchestrator"), "run",
                           str(recipe), "-o", str(work / out), *(extra or [])], env=env,
                          cwd=work, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, json.loads((work / out / "report.json").read_text())


def measure(recipe: Path, label: str, new_machine: bool = False,
            server_per_run: bool = False, extra: list[str] | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="cached-rerun-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "ORCHESTRATOR_HOME": str(work / ".orchestrator"),
               "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
        # a throwaway key, as `make demo` makes one, unless the caller gave theirs
        env.setdefault(KEY_ENV, encode_key(generate_key()))
        if new_machine:
            env["PREFECT_HOME"] = str(work / "prefect-home")
        if server_per_run:
            env[IDLE_ENV] = "0"
        try:
            first, report1 = run_once(recipe, work, "out1", env, extra)
            second, report2 = run_once(recipe, work, "out2", env, extra)
        finally:  # the server the first run left for later runs: not for after this one
            state = work / ".orchestrator" / STATE_FILE
            if state.is_file():
                pid = json.loads(state.read_text())["pid"]
                os.kill(pid, signal.SIGTERM)
                # it writes into .orchestrator until it exits: removing the folder before
                # that failed with "Directory not empty" on a loaded machine
                for _ in range(300):
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.1)
    stages = [s for v in report2["variants"].values() for s in v["stages"]]
    cached = sum(s["cached"] for s in stages)
    stage_seconds = sum(s["seconds"] for v in report1["variants"].values()
                        for s in v["stages"])
    print(f"{label:<16}{first:>10.2f}{second:>10.2f}{second / first:>8.2f}"
          f"{stage_seconds:>12.2f}   {cached}/{len(stages)} cached")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", nargs="?", type=Path,
                        default=ROOT / "recipes" / "digits.yaml")
    parser.add_argument("--quick", action="store_true",
                        help="the warm-machine setting alone, fp32 pipeline only")
    args = parser.parse_args(argv)
    recipe = args.recipe
    print(f"recipe: {recipe}" + (" (--quick: --variant fp32, warm machine only)"
                                 if args.quick else ""))
    print(f"{'':<16}{'first s':>10}{'second s':>10}{'ratio':>8}{'stages s':>12}")
    if args.quick:
        measure(recipe.resolve(), "warm machine", extra=["--variant", "fp32"])
        return
    measure(recipe.resolve(), "warm machine")
    measure(recipe.resolve(), "new machine", new_machine=True)
    measure(recipe.resolve(), "server per run", server_per_run=True)


if __name__ == "__main__":
    main()
