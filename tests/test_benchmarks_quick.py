"""Every benchmark script, run end to end with `--quick` in a fresh process, so that `make test`
catches a benchmark that no longer runs (a renamed function, a changed report field, a stage
param gone). The numbers are not judged here: `make bench` and the full runs do that.

A new script in benchmarks/ must get a case below (or be listed as a helper another script
runs, or as run whole by a test): test_every_benchmark_has_a_quick_case fails until it does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

pytestmark = pytest.mark.slow

# script -> (arguments after --quick, with {tmp} for a scratch folder; a line its output
# must hold). Measured on the project's 2-core machine: about 3.5 minutes for all.
CASES: dict[str, tuple[list[str], str]] = {
    "int8_size.py": ([], "int8 size / 8-bit floor"),
    "log_ranges.py": ([], "default (batch 100, per sample): ratio"),
    "cached_rerun.py": ([], "warm machine"),
    "equalize.py": ([], "separable residual CNN"),
    "onet.py": (["--work", "{tmp}"], "| int8 |"),
    "make_mobilenet.py": (["{tmp}"], "model.keras"),
    "litert_side_by_side.py": (["--work", "{tmp}"], "litert_int8"),
    "benchmark_overhead.py": ([], "overhead: stage / bare at most"),
    "executors.py": ([], "per-task overhead"),
}
# scripts another benchmark runs (with --quick when it runs quick): not run alone
HELPERS = {"onet_data.py": "onet.py builds its model and crops with it"}
# scripts a test runs whole (their main, without --quick): a quick run here would repeat it
RUN_BY_TESTS = {"mini_xception.py": "tests/e2e/test_mini_xception.py (its acceptance run)"}
# run side by side, this many at a time, the longest first (measured; others after them)
JOBS = 2
ORDER = ["onet.py", "equalize.py", "cached_rerun.py",
         "litert_side_by_side.py", "log_ranges.py", "benchmark_overhead.py", "int8_size.py",
         "make_mobilenet.py", "executors.py"]
ORDER += sorted(set(CASES) - set(ORDER))


def test_every_benchmark_has_a_quick_case() -> None:
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    missing = sorted(scripts - set(CASES) - set(HELPERS) - set(RUN_BY_TESTS))
    assert not missing, (f"benchmarks without a quick run in {Path(__file__).name}: "
                         f"{', '.join(missing)}; give each a --quick flag (smallest settings, "
                         "still end to end) and a line in CASES")
    assert not (set(CASES) | set(RUN_BY_TESTS)) - scripts, "CASES names scripts that are gone"


@pytest.fixture(scope="module")
def bench_env(prefect_server: None) -> dict[str, str]:
    """The session's temporary Prefect server (PREFECT_API_URL): no script starts a local
    one or creates a Prefect database, and nothing lands in ~/.prefect."""
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_URL": str(PREFECT_API_URL.value())}


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_quick(script: str, folder: Path, env: dict[str, str]) -> Done:
    """`python benchmarks/SCRIPT --quick ...` in `folder`, with a store and an MLflow
    database of its own there (scripts run side by side)."""
    args, _ = CASES[script]
    folder.mkdir(parents=True)
    command = [sys.executable, str(BENCHMARKS / script), "--quick",
               *(a.replace("{tmp}", str(folder / "work")) for a in args)]
    env = {**env, "ORCHESTRATOR_HOME": str(folder / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    return Done(done.returncode, done.stdout, done.stderr, time.perf_counter() - started)


@pytest.fixture(scope="module")
def quick_runs(request: pytest.FixtureRequest, bench_env: dict[str, str],
               tmp_path_factory: pytest.TempPathFactory, digits_example: Path
               ) -> Iterator[dict[str, Future[Done]]]:
    """The selected scripts, started at once, JOBS at a time (longest first): most of a
    script's time is one core (imports, Python, one session), so two overlap well."""
    selected = [item.callspec.params["script"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_quick"
                and item.module is request.module]
    root = tmp_path_factory.mktemp("bench")
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        yield {script: pool.submit(run_quick, script, root / script.removesuffix(".py"),
                                   bench_env)
               for script in sorted(selected, key=ORDER.index)}


@pytest.mark.parametrize("script", sorted(CASES))
def test_quick(script: str, quick_runs: dict[str, Future[Done]]) -> None:
    done = quick_runs[script].result()
    _, expected = CASES[script]
    tail = f"\n--- stdout ---\n{done.stdout[-4000:]}\n--- stderr ---\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{script} --quick exited {done.returncode}{tail}"
    assert expected in done.stdout, f"{script} --quick printed no {expected!r}{tail}"
    print(f"{script} --quick: {done.seconds:.1f} s")
