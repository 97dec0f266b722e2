"""A run's own cost: a recipe's first run and its cached re-run, as a user runs them (the
console script), and how much of the first run is not its stages' work.

Each run is a fresh process. Each setting gets a fresh store in a temp folder and MLflow in
that folder, and runs the recipe twice: the first run computes every stage, the second finds
every one cached (the table says whether it did). Per setting:

- first run s: the whole first run's wall time, from the command's start to its exit;
- stages s: the seconds its stages took, as its report.json has them (summed);
- overhead s: first run s - stages s, what the run costs beyond the work asked of it
  (imports, the Prefect server and flow run, MLflow, the report, its pictures, the exit);
- cached re-run s: the whole second run, which does no model work at all.

Settings:

- "warm machine": Prefect's database already exists (as after any earlier run); the first
  run starts the local Prefect server, the second attaches to it (the default);
- "new machine": also a new PREFECT_HOME, so the first run creates Prefect's database, as a
  user's very first run does;
- "server per run": ORCHESTRATOR_PREFECT_IDLE_S=0, each run starts and stops its own server.

With PREFECT_API_URL set, every setting uses that server instead. Without
ORCHESTRATOR_MODEL_KEY, a throwaway key serves the recipe's encrypt stage. With
--repeat N, each setting is measured N times (each time afresh) and the table shows the
medians. The machine's load average is printed with the table: figures taken on a busy
machine are inflated, and compare only with figures taken under the same load.

    .venv/bin/python benchmarks/cached_rerun.py [recipes/digits.yaml] [--quick] [--repeat N]

--quick: the "warm machine" setting alone, on the recipe's fp32 pipeline (`--variant fp32`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.flow.local_server import IDLE_ENV, STATE_FILE  # noqa: E402
from orchestrator.model.keys import encode_key, generate_key  # noqa: E402

KEY_ENV = "ORCHESTRATOR_MODEL_KEY"  # the digits recipe's encrypt stage reads its key here
# The goals for a run's own cost: what the table is read against
OVERHEAD_GOAL_S = 5.0
RERUN_GOAL_S = 2.0


@dataclass
class Measured:
    first: float  # the first run's wall seconds
    stages: float  # its stages' seconds (report.json)
    rerun: float  # the cached re-run's wall seconds
    cached: int  # the re-run's stages found cached
    total: int  # of so many

    @property
    def overhead(self) -> float:
        return self.first - self.stages


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


def measure(recipe: Path, new_machine: bool = False, server_per_run: bool = False,
            extra: list[str] | None = None) -> Measured:
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
            _stop_server(work / ".orchestrator" / STATE_FILE)
    stages = [s for v in report2["variants"].values() for s in v["stages"]]
    stage_seconds = sum(s["seconds"] for v in report1["variants"].values()
                        for s in v["stages"])
    return Measured(first, stage_seconds, second, sum(s["cached"] for s in stages),
                    len(stages))


def _stop_server(state: Path) -> None:
    if not state.is_file():
        return
    pid = json.loads(state.read_text())["pid"]
    os.kill(pid, signal.SIGTERM)
    # it writes into .orchestrator until it exits: removing the folder before that failed
    # with "Directory not empty" on a loaded machine
    for _ in range(300):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)


def median_of(runs: list[Measured]) -> Measured:
    """Each figure's median over the runs (the cached count: the fewest found)."""
    def med(name: str) -> float:
        return statistics.median(getattr(r, name) for r in runs)

    return Measured(med("first"), med("stages"), med("rerun"),
                    min(r.cached for r in runs), runs[0].total)


COLUMNS = (("", 16), ("first run s", 13), ("stages s", 10), ("overhead s", 12),
           ("cached re-run s", 17), ("re-run cached", 15))


def row(label: str, m: Measured) -> str:
    cells = [f"{label:<16}", f"{m.first:>13.2f}", f"{m.stages:>10.2f}",
             f"{m.overhead:>12.2f}", f"{m.rerun:>17.2f}", f"{m.cached:>8}/{m.total}"]
    return "".join(cells)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", nargs="?", type=Path,
                        default=ROOT / "recipes" / "digits.yaml")
    parser.add_argument("--quick", action="store_true",
                        help="the warm-machine setting alone, fp32 pipeline only")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="measure each setting N times and show the medians")
    args = parser.parse_args(argv)
    recipe = args.recipe.resolve()
    settings: list[tuple[str, dict]] = [("warm machine", {})]
    if args.quick:
        settings = [("warm machine", {"extra": ["--variant", "fp32"]})]
    else:
        settings += [("new machine", {"new_machine": True}),
                     ("server per run", {"server_per_run": True})]
    print(f"recipe: {args.recipe}" + (" (--quick: --variant fp32, warm machine only)"
                                      if args.quick else "")
          + (f"; medians of {args.repeat} measurements" if args.repeat > 1 else ""))
    print(f"load average before: {_load()}")
    print("".join(f"{name:<{width}}" if i == 0 else f"{name:>{width}}"
                  for i, (name, width) in enumerate(COLUMNS)))
    for label, options in settings:
        runs = [measure(recipe, **options) for _ in range(max(1, args.repeat))]
        print(row(label, median_of(runs)), flush=True)
    print(f"load average after: {_load()}")
    print(f"goals: overhead under {OVERHEAD_GOAL_S:.0f} s; a cached re-run under "
          f"{RERUN_GOAL_S:.0f} s")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
