"""Wall time of recipes on `--executor local` against `--executor dask` (a LocalCluster of 2
worker processes, 1 thread each; and as 2 threads of the run's own process), side by side,
and the scheduler's overhead per task.

Each run is a fresh `orchestrator run` process with a fresh store (every stage computed) in
a temp project; the runs share one Prefect server (a throwaway warm-up run starts it).
Recipes:

- recipes/digits.yaml: 5 pipelines, where int8 -> mobile is a chain and the guard waits;
- recipes/digits_variants.yaml: 8 variants that do not depend on each other, from one
  folded float graph.

"overlap" is the share of the summed stage time during which another stage ran too (0 for
a sequential run). The overhead per task is the mean gap between one stage's end and the
next one's start in a chain of N trivial stages (`summarize`), where each waits for the
one before: what Prefect's task bookkeeping plus the task runner add to every stage.

    .venv/bin/python benchmarks/executors.py [--quick] [--trivial N]

--quick: only the overhead, on a chain of 3 trivial stages, local and dask (about 1 min).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.keys import encode_key, generate_key  # noqa: E402

KEY_ENV = "ORCHESTRATOR_MODEL_KEY"  # the digits recipe's encrypt stage reads its key here
EXECUTION = "\nexecution: {executor: local, workers: 2, threads_per_worker: 1}\n"
# label -> orchestrator run arguments
EXECUTORS = {"local": ["--executor", "local"], "dask": ["--executor", "dask"],
             "dask-threads": ["--executor", "dask", "--set", "execution.processes=false"]}


def trivial_recipe(stages: int) -> str:
    return ("version: 1\nname: trivial\nmodel: {path: ../examples/digits/saved_model}\n"
            f"pipelines:\n  chain:\n    stages: [freeze{', summarize' * stages}]\n")


def project(work: Path, quick: bool, trivial: int) -> dict[str, Path]:
    """The recipes under `work`/recipes, each with a 2-worker execution block."""
    recipes = work / "recipes"
    recipes.mkdir(parents=True)
    (work / "examples").symlink_to(ROOT / "examples")
    found = {}
    for name in ("digits", *(() if quick else ("digits_variants",))):
        text = (ROOT / "recipes" / f"{name}.yaml").read_text()
        if "\nexecution:" not in text:
            text += EXECUTION
        found[name] = recipes / f"{name}.yaml"
        found[name].write_text(text)
    for name, stages in (("warm_up", 1), ("trivial", trivial)):
        found[name] = recipes / f"{name}.yaml"
        found[name].write_text(trivial_recipe(stages) + EXECUTION)
    return found


def run(recipe: Path, work: Path, executor: str, env: dict[str, str],
        extra: list[str]) -> tuple[float, dict]:
    """One fresh run on `executor` (a key of EXECUTORS): its wall time and report."""
    label = f"{recipe.stem}-{executor}"
    run_env = {**env, "ORCHESTRATOR_HOME": str(work / label / "store"),
               "MLFLOW_TRACKING_URI": f"sqlite:///{work / label / 'mlflow.db'}"}
    (work / label).mkdir()
    started = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "orchestrator"), "run",
                           str(recipe), "-o", str(work / label / "out"),
                           *EXECUTORS[executor], *extra], env=run_env, cwd=work,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"{label} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, json.loads((work / label / "out" / "report.json").read_text())


def spans(report: dict) -> list[tuple[float, float]]:
    return [(s["started"], s["finished"]) for v in report["variants"].values()
            for s in v["stages"]]


def overlap(report: dict) -> float:
    """Share of the summed stage time during which at least one other stage also ran."""
    intervals = spans(report)
    total = sum(e - s for s, e in intervals)
    shared = 0.0
    for i, (s1, e1) in enumerate(intervals):
        cuts = sorted((max(s1, s2), min(e1, e2)) for j, (s2, e2) in enumerate(intervals)
                      if j != i and s2 < e1 and s1 < e2)
        end = s1
        for start, stop in cuts:  # the union of the overlaps with the others
            shared += max(0.0, stop - max(start, end))
            end = max(end, stop)
    return shared / total if total else 0.0


def task_gap_ms(report: dict) -> float:
    """Mean gap between a stage's end and the next stage's start, in a chain."""
    stages = sorted(spans(report))
    gaps = [s2 - e1 for (_, e1), (s2, _) in zip(stages[1:], stages[2:], strict=False)]
    return 1000 * sum(gaps) / len(gaps)  # (the first gap follows freeze: TF's import)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="only the overhead: 3 trivial stages, local and dask")
    parser.add_argument("--trivial", type=int, default=None,
                        help="trivial stages in the overhead chain (default 20; quick 3)")
    args = parser.parse_args(argv)
    trivial = args.trivial or (3 if args.quick else 20)
    env = {**os.environ}
    env.setdefault(KEY_ENV, encode_key(generate_key()))  # a throwaway key for encrypt
    rows = []
    with tempfile.TemporaryDirectory(prefix="executors-") as tmp:
        work = Path(tmp)
        recipes = project(work, args.quick, trivial)
        if not args.quick:
            run(recipes["warm_up"], work, "local", env, [])  # starts the Prefect server
        for name in [] if args.quick else [
                n for n in recipes if n not in ("warm_up", "trivial")]:
            extra: list[str] = []
            times = {}
            for executor in EXECUTORS:
                seconds, report = run(recipes[name], work, executor, env, extra)
                times[executor] = seconds
                stage_s = sum(s["seconds"] for v in report["variants"].values()
                              for s in v["stages"])
                rows.append((name, executor, len(report["variants"]), seconds, stage_s,
                             overlap(report), None))
            for executor in EXECUTORS:
                if executor != "local":
                    rows.append((name, f"{executor}/local", None,
                                 times[executor] / times["local"], None, None, None))
        for executor in ("local", "dask") if args.quick else EXECUTORS:
            seconds, report = run(recipes["trivial"], work, executor, env, [])
            rows.append((f"trivial x{trivial}", executor, 1, seconds, None, None,
                         task_gap_ms(report)))
    print(f"{'recipe':<18} {'executor':<18} {'variants':>8} {'wall s':>8} "
          f"{'stage s':>8} {'overlap':>8} {'per-task overhead ms':>21}")
    for name, executor, variants, wall, stage_s, shared, gap in rows:
        def cell(value: float | None, fmt: str) -> str:
            return "" if value is None else format(value, fmt)
        wall_fmt = ".2f" if executor.endswith("/local") else ".1f"
        print(f"{name:<18} {executor:<18} {cell(variants, 'd'):>8} {cell(wall, wall_fmt):>8} "
              f"{cell(stage_s, '.1f'):>8} {cell(shared, '.0%'):>8} {cell(gap, '.0f'):>21}")
    print("dask/local: the dask run's wall time over the local run's (goal for the 8 "
          "variants: <= 0.7); dask-threads: the 2 workers as threads of the run's process "
          "(execution.processes: false); per-task overhead: mean gap between chained stages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
