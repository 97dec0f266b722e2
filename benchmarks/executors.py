"""Wall time of recipes on `--executor local` against `--executor dask` (a LocalCluster of 2
worker processes, 1 thread each; and as 2 threads of the run's own process), side by side,
and the scheduler's overhead per task.

Each run is a fresh `orchestrator run` process with a fresh store (every stage computed) in
a temp project; the runs share one Prefect server (this script's own), after a throwaway
warm-up run. Each
recipe runs --repeat times on each executor, the executors interleaved (the machine's load
drifts); the table gives medians, and the ratio is the median of each repetition's
dask/local. It also prints the Amdahl floor: the ratio a perfect executor would reach if
only the stages ran twice as fast (what the run does outside them stays serial).
Recipes:

- recipes/digits.yaml: 5 pipelines, where int8 -> mobile is a chain and the guard waits;
- recipes/digits_variants.yaml: 8 variants that do not depend on each other, from one
  folded float graph.

"overlap" is the share of the summed stage time during which another stage ran too (0 for
a sequential run). The overhead per task is the mean gap between one stage's end and the
next one's start in a chain of N trivial stages (`summarize`), where each waits for the
one before: what Prefect's task bookkeeping plus the task runner add to every stage.

    .venv/bin/python benchmarks/executors.py [--quick] [--trivial N] [--repeat N]
        [--only digits|digits_variants]

--quick: only the overhead, on a chain of 3 trivial stages, local and dask-threads (the
dask code path without a cluster's worker processes), the two runs on one MLflow database.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.model.keys import encode_key, generate_key  # noqa: E402

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
        extra: list[str], suffix: str = "", shared_tracking: bool = False
        ) -> tuple[float, dict]:
    """One fresh run on `executor` (a key of EXECUTORS): its wall time and report.
    `shared_tracking`: on `work`'s one MLflow database (else one of its own, created by the
    run)."""
    label = f"{recipe.stem}-{executor}{suffix}"
    tracking = work / "mlflow.db" if shared_tracking else work / label / "mlflow.db"
    run_env = {**env, "ORCHESTRATOR_HOME": str(work / label / "store"),
               "MLFLOW_TRACKING_URI": f"sqlite:///{tracking}"}
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


def stage_span(report: dict) -> float:
    """Seconds from the first stage's start to the last stage's end."""
    intervals = spans(report)
    return max(e for _, e in intervals) - min(s for s, _ in intervals)


@contextmanager
def shared_server(work: Path, env: dict[str, str]) -> Iterator[None]:
    """Every run on one Prefect server, this script's own for as long as it runs (else each
    run, with a store of its own, would boot a server of its own); none when
    PREFECT_API_URL names one."""
    if "PREFECT_API_URL" in env:
        yield
        return
    from orchestrator.flow import local_server
    os.environ[local_server.IDLE_ENV] = "0"  # this script's own: stopped at the end
    server = local_server.attach_for_ui(work / "prefect")
    try:
        server.wait_ready()
        env["PREFECT_API_URL"] = server.api_url
        yield
    finally:
        server.release()


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="only the overhead: 3 trivial stages, local and dask-threads")
    parser.add_argument("--trivial", type=int, default=None,
                        help="trivial stages in the overhead chain (default 20; quick 3)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs of each recipe on each executor, interleaved (default 3; "
                        "quick 1)")
    parser.add_argument("--only", choices=("digits", "digits_variants"), default=None,
                        help="measure this recipe only (and the overhead chain)")
    args = parser.parse_args(argv)
    trivial = args.trivial or (3 if args.quick else 20)
    repeat = args.repeat or (1 if args.quick else 3)
    env = {**os.environ}
    env.setdefault(KEY_ENV, encode_key(generate_key()))  # a throwaway key for encrypt
    command = " ".join([".venv/bin/python benchmarks/executors.py", *sys.argv[1:]])
    load_before = os.getloadavg()
    rows = []
    notes = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="executors-")))
        recipes = project(work, args.quick, trivial)
        stack.enter_context(shared_server(work, env))
        if not args.quick:
            run(recipes["warm_up"], work, "local", env, [])  # page cache, the server's DB
        for name in [] if args.quick else [
                n for n in recipes if n not in ("warm_up", "trivial")
                and args.only in (None, n)]:
            measured: dict[str, list[dict]] = {executor: [] for executor in EXECUTORS}
            for rep in range(repeat):
                order = list(EXECUTORS)
                order = order[rep % len(order):] + order[:rep % len(order)]  # interleaved
                for executor in order:
                    cpu_before = os.times()
                    seconds, report = run(recipes[name], work, executor, env, [],
                                          suffix=f"-{rep}")
                    cpu_after = os.times()
                    cpu = (cpu_after.children_user - cpu_before.children_user
                           + cpu_after.children_system - cpu_before.children_system)
                    measured[executor].append({
                        "wall": seconds, "cpu": cpu, "span": stage_span(report),
                        "overlap": overlap(report), "variants": len(report["variants"])})
            local = measured["local"]
            for executor, runs in measured.items():
                ratio = None if executor == "local" else median(
                    [r["wall"] / base["wall"] for r, base in zip(runs, local, strict=True)])
                rows.append((name, executor, runs[0]["variants"],
                             median([r["wall"] for r in runs]), ratio,
                             median([r["cpu"] for r in runs]),
                             median([r["span"] for r in runs]),
                             median([r["overlap"] for r in runs]), None))
            # Amdahl: what the local run does outside its stages (imports, the flow, the
            # report and its plots) stays serial on any executor; at best the stages run
            # twice as fast on 2 cores
            floor = median([(r["wall"] - r["span"] / 2) / r["wall"] for r in local])
            notes.append(f"{name}: best possible ratio on 2 cores, if only the stages ran "
                         f"2x faster and nothing else changed: {floor:.2f}")
        for executor in ("local", "dask-threads") if args.quick else EXECUTORS:
            seconds, report = run(recipes["trivial"], work, executor, env, [],
                                  shared_tracking=args.quick)
            rows.append((f"trivial x{trivial}", executor, 1, seconds, None, None, None,
                         None, task_gap_ms(report)))
    load_after = os.getloadavg()
    print(f"$ {command}")
    print(f"{os.cpu_count()} cores; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; medians of {repeat} interleaved runs")
    print(f"{'recipe':<18} {'executor':<13} {'variants':>8} {'wall s':>7} {'ratio':>6} "
          f"{'cpu s':>6} {'stages s':>8} {'overlap':>8} {'per-task overhead ms':>21}")
    for name, executor, variants, wall, ratio, cpu, span, shared, gap in rows:
        def cell(value: float | None, fmt: str) -> str:
            return "" if value is None else format(value, fmt)
        print(f"{name:<18} {executor:<13} {cell(variants, 'd'):>8} {cell(wall, '.1f'):>7} "
              f"{cell(ratio, '.2f'):>6} {cell(cpu, '.1f'):>6} {cell(span, '.1f'):>8} "
              f"{cell(shared, '.0%'):>8} {cell(gap, '.0f'):>21}")
    for note in notes:
        print(note)
    print("ratio: the run's wall time over the local run's of the same repetition (goal for "
          "the 8 variants: <= 0.7); cpu s: of the run's process and every process it waited "
          "for (workers, load probe, tracking); stages s: first stage start to last stage "
          "end; dask-threads: the 2 workers as threads of the run's process "
          "(execution.processes: false); per-task overhead: mean gap between chained stages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
