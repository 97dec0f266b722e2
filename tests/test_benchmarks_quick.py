"""Every benchmark script, run end to end with `--quick` as its own `__main__`, so that `make test`
catches a benchmark that no longer runs (a renamed function, a changed report field, a stage
param gone). The numbers are not judged here: `make bench` and the full runs do that.

The scripts run in JOBS fresh processes side by side, each running its share one after the
other (runpy), as `python benchmarks/SCRIPT --quick` would: in its own folder, with its own
arguments, environment, store and MLflow database, its output (its subprocesses' too) in
files of its own; what one script changed (environment, sys.path, the benchmarks' own
modules, the Ctrl-C handler, the working folder) is undone before the next. Most scripts
import TensorFlow: a process each paid that import (~9 s of CPU) nine times.

A new script in benchmarks/ must get a case below (or be listed as a helper another script
runs, or as run whole by a test): test_every_benchmark_has_a_quick_case fails until it does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    "litert_quantizer.py": (["--work", "{tmp}"], "| aeq_guard |"),
    "benchmark_overhead.py": ([], "overhead: stage / bare at most"),
    "executors.py": ([], "per-task overhead"),
    "estimates.py": (["--work", "{tmp}"], "leave-one-device-out"),
}
# scripts another benchmark runs (with --quick when it runs quick): not run alone
HELPERS = {"onet_data.py": "onet.py builds its model and crops with it"}
# scripts a test runs whole (their main, without --quick): a quick run here would repeat it
RUN_BY_TESTS = {"mini_xception.py": "tests/e2e/test_mini_xception.py (its acceptance run)",
                "on_device.py": "tests/e2e/test_device_runs.py (its emulated board's run)"}
# this many processes side by side; the scripts go to them longest first (measured), each to
# the one with the least work so far (by SECONDS, CPU seconds measured on the project's
# 2-core machine; a script not listed counts as the longest)
JOBS = 2
SECONDS = {"cached_rerun.py": 60, "executors.py": 35, "equalize.py": 31, "onet.py": 29,
           "litert_side_by_side.py": 25, "litert_quantizer.py": 20, "log_ranges.py": 20,
           "benchmark_overhead.py": 15, "estimates.py": 15,
           "int8_size.py": 13, "make_mobilenet.py": 13}
ORDER = sorted(set(CASES) - set(SECONDS)) + sorted(SECONDS, key=lambda script: -SECONDS[script])


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


# Runs scripts one after the other as their own __main__, each as the command line would:
# argv, folder, environment, its output (file descriptors 1 and 2, for its subprocesses
# too) in its folder; then undoes what it changed. Prints one JSON result per script.
DRIVER = """
import json, os, runpy, signal, sys, time, traceback
results = []
for script, folder, argv, env in json.loads(sys.argv[1]):
    saved_env, saved_path, saved_modules = dict(os.environ), list(sys.path), set(sys.modules)
    saved_sigint = signal.getsignal(signal.SIGINT)
    os.makedirs(folder)
    os.chdir(folder)
    os.environ.update(env)
    sys.argv = [script, *argv]
    sys.stdout.flush(); sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    out = os.open(os.path.join(folder, "stdout"), os.O_WRONLY | os.O_CREAT)
    err = os.open(os.path.join(folder, "stderr"), os.O_WRONLY | os.O_CREAT)
    os.dup2(out, 1); os.dup2(err, 2)
    started = time.perf_counter()
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:  # sys.exit(N), or sys.exit("message"): printed, exit 1
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    seconds = time.perf_counter() - started
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(saved_fds[0], 1); os.dup2(saved_fds[1], 2)
    for fd in (out, err, *saved_fds):
        os.close(fd)
    os.environ.clear(); os.environ.update(saved_env)
    sys.path[:] = saved_path
    for name in set(sys.modules) - saved_modules:  # the benchmarks' own modules
        if os.path.dirname(getattr(sys.modules[name], "__file__", None) or "") == \\
                os.path.dirname(script):
            del sys.modules[name]
    signal.signal(signal.SIGINT, saved_sigint)
    results.append({"returncode": code, "seconds": seconds})
print(json.dumps(results))
"""


def run_quick_scripts(scripts: list[str], root: Path, env: dict[str, str]
                      ) -> dict[str, Done]:
    """`python benchmarks/SCRIPT --quick ...` for each script, one after the other in one
    fresh process (DRIVER), each in root/SCRIPT with a store and an MLflow database of its
    own there (two such processes run side by side)."""
    jobs = []
    for script in scripts:
        args, _ = CASES[script]
        folder = root / script.removesuffix(".py")
        jobs.append([str(BENCHMARKS / script), str(folder),
                     ["--quick", *(a.replace("{tmp}", str(folder / "work")) for a in args)],
                     {"ORCHESTRATOR_HOME": str(folder / ".orchestrator"),
                      "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}])
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(jobs)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900 * len(scripts),
                          check=False)
    assert done.returncode == 0, f"the driver failed: {done.stderr[-4000:]}"
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == len(scripts), done.stdout[-2000:]
    ran = {}
    for script, job, result in zip(scripts, jobs, results, strict=True):
        folder = Path(job[1])
        ran[script] = Done(result["returncode"],
                           (folder / "stdout").read_text(errors="replace"),
                           (folder / "stderr").read_text(errors="replace"), result["seconds"])
    return ran


def shares(scripts: list[str], jobs: int) -> list[list[str]]:
    """The scripts split into `jobs` lists, longest first, each to the lightest list."""
    lists: list[list[str]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    longest = max(SECONDS.values()) + 1
    for script in sorted(scripts, key=ORDER.index):
        lightest = load.index(min(load))
        lists[lightest].append(script)
        load[lightest] += SECONDS.get(script, longest)
    return [share for share in lists if share]


@pytest.fixture(scope="module")
def quick_runs(request: pytest.FixtureRequest, bench_env: dict[str, str],
               tmp_path_factory: pytest.TempPathFactory, digits_example: Path
               ) -> Iterator[dict[str, Future[dict[str, Done]]]]:
    """The selected scripts, started at once in JOBS processes: most of a script's time is
    one core (imports, Python, one session), so two overlap well."""
    selected = [item.callspec.params["script"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_quick"
                and item.module is request.module]
    root = tmp_path_factory.mktemp("bench")
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        futures = {}
        for share in shares(selected, JOBS):
            future = pool.submit(run_quick_scripts, share, root, bench_env)
            futures.update({script: future for script in share})
        yield futures


@pytest.mark.parametrize("script", sorted(CASES))
def test_quick(script: str, quick_runs: dict[str, Future[dict[str, Done]]]) -> None:
    done = quick_runs[script].result()[script]
    _, expected = CASES[script]
    tail = f"\n--- stdout ---\n{done.stdout[-4000:]}\n--- stderr ---\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{script} --quick exited {done.returncode}{tail}"
    assert expected in done.stdout, f"{script} --quick printed no {expected!r}{tail}"
    print(f"{script} --quick: {done.seconds:.1f} s")
