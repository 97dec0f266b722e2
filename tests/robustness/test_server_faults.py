"""Issue 19, faults of the servers a scaled-out run depends on, injected for real into the
stack of tests/support/servers.py (PostgreSQL, Prefect and MLflow servers, an S3 store):

- the MLflow tracking server killed (`kill -9` of its process group) in the middle of a run;
- the Prefect server killed in the middle of a run;
- PostgreSQL restarted between two runs.

"In the middle" is found by watching the run, not by timing: the kill comes once the
run's progress shows a stage done, while stages remain. Each time: a clear error naming the
server and its URL (exit 2, no traceback), no output folder, every store entry in the
bucket verifies against its manifest, and the next run (server back) succeeds and reuses
every stage the killed run completed.

The MLflow server is killed under a run on the local executor (the run's own process):
tracking is the run's own worker process, whichever executor runs the stages. The Prefect
server is killed under a run on 2 Dask workers, where its loss reaches stage tasks on the
workers (on the local executor the stages finish, and only the run's own calls fail). The
re-runs and the PostgreSQL restart use the local executor: each Dask worker imports
TensorFlow again, and what they check does not depend on where stages run (a Dask run
against these servers is tests/e2e/test_scale_out.py). The killed run sets its clients'
retries low (PREFECT_CLIENT_MAX_RETRIES, MLFLOW_HTTP_REQUEST_MAX_RETRIES, the user's
settings for this): it fails after one retry instead of after minutes of back-off; what it
then says and leaves is what is checked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.robust_helpers import wait_for
from support.s3_entries import all_entries_verify
from support.servers import (
    RUN_TIMEOUT_S,
    STORE_BUCKET,
    ServerProcess,
    Stack,
    make_project,
    orchestrator,
    run_env,
    stack,  # noqa: F401  (the fixture)
)

pytestmark = [pytest.mark.servers, pytest.mark.slow]

# digits cut to two pipelines, stages remaining after the first ones end; the local
# executor unless a run says `--executor dask` (then 2 workers of 1 thread)
RECIPE = """version: 1
name: faults
model: {path: ../examples/digits/saved_model}
data: {evaluation: {source: ../examples/digits/data.npz, inputs: x_test, labels: y_test}}
execution: {executor: local, workers: 2, threads_per_worker: 1}
pipelines:
  fp32: {stages: [freeze, strip, fold, evaluate]}
  rounded: {from: fp32, stages: [{round_weights: {num_steps: 64}}, evaluate]}
"""
KILL_AFTER = "fp32 › strip"  # its progress line: freeze and strip are done, 4 stages remain
# the killed run's clients: one retry each, no minutes of back-off (users set these too)
FEW_RETRIES = {"PREFECT_CLIENT_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}
DONE_LINE = re.compile(r"✓ (\S+) › (\S+)")


def completed_stages(err: str) -> set[str]:
    return {f"{pipeline}.{stage}" for pipeline, stage in DONE_LINE.findall(err)}


def run_and_kill(project: Path, env: dict[str, str], server: ServerProcess, executor: str
                 ) -> tuple[int, str]:
    """A run on `executor` whose `server` is killed once KILL_AFTER is done; its exit code
    and stderr."""
    err_path = project / "killed.stderr"
    with open(err_path, "wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "run", "recipes/digits.yaml", "-o", "out",
             "--executor", executor],
            cwd=project, env={**env, **FEW_RETRIES}, stdout=subprocess.DEVNULL, stderr=err,
            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        seen = wait_for(lambda: KILL_AFTER in err_path.read_text(errors="replace")
                        or process.poll() is not None, RUN_TIMEOUT_S, 0.05)
        assert seen and process.poll() is None, (
            f"the run ended before {KILL_AFTER} was done: exit {process.poll()}\n"
            + err_path.read_text(errors="replace")[-3000:])
        server.kill()
        killed = time.monotonic()
        code = process.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    err = err_path.read_text(errors="replace")
    print(f"{server.name} killed after {KILL_AFTER}: exit {code} "
          f"{time.monotonic() - killed:.1f} s later; last line: {err.strip().splitlines()[-1]}")
    return code, err


def check_named_error(code: int, err: str, *names: str) -> str:
    """Exit 2 (the user's to fix, never 70, a bug), no traceback, and one `error: ` line
    naming each of `names`. (Other lines may come before it: the progress, and warnings of
    libraries, e.g. Dask's about a dashboard port another cluster holds.)"""
    assert code != 70, f"internal error (exit 70):\n{err[-4000:]}"
    # no Python traceback; Dask's worker logs "Compute Failed ... Traceback: '<repr>'" for
    # a task that could not reach the Prefect API (a worker's log line, not our error)
    assert "Traceback (most recent call last)" not in err, err[-4000:]
    assert code == 2, f"exit {code}, expected 2:\n{err[-4000:]}"
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err[-4000:]
    for name in names:
        assert name in lines[0], f"the error does not name {name!r}: {lines[0]}"
    return lines[0]


def check_store(prefix: str, stack: Stack) -> int:  # noqa: F811
    entries = all_entries_verify(stack.s3, STORE_BUCKET, prefix)
    return len(entries)


def rerun_reuses(project: Path, env: dict[str, str], completed: set[str]) -> dict[str, Any]:
    done = orchestrator(project, env, "run", "recipes/digits.yaml", "-o", "out")
    assert done.returncode == 0, done.stderr[-5000:]
    report = json.loads((project / "out" / "report.json").read_text())
    cached = {f"{name}.{stage['name']}" for name, variant in report["variants"].items()
              for stage in variant["stages"] if stage["cached"]}
    assert completed <= cached, (sorted(completed), sorted(cached))
    print(f"re-run: exit 0, {len(cached)} stages reused (the killed run completed "
          f"{len(completed)})")
    return report


@pytest.mark.parametrize("which", ["mlflow", "prefect"])
def test_server_killed_mid_run(which: str, stack: Stack, digits_example: Path,  # noqa: F811
                               tmp_path: Path) -> None:
    server = stack.mlflow if which == "mlflow" else stack.prefect
    project = make_project(tmp_path, RECIPE)
    prefix = f"faults-{which}"
    env = run_env(stack, project, f"s3://{STORE_BUCKET}/{prefix}")
    try:
        code, err = run_and_kill(project, env, server,
                                 "local" if which == "mlflow" else "dask")
    finally:
        if server.process is None:
            server.start()  # the next test needs it, however this one ends
    if which == "mlflow":
        check_named_error(code, err, "MLflow tracking", stack.mlflow.url)
    else:
        check_named_error(code, err, "Prefect API", stack.prefect_api_url)
    # the folder did not exist: a run that failed before its outputs were in leaves none;
    # one whose outputs were swapped in before the server's loss was noticed (Dask's
    # workers go on without Prefect) leaves them complete, and its last line says which
    out = project / "out"
    if out.exists() and any(out.iterdir()):
        report = json.loads((out / "report.json").read_text())
        assert all((out / name).is_dir() for name in report["variants"])
        assert "holds this run's outputs, complete" in err.strip().splitlines()[-1]
    else:
        assert "holds this run's outputs" not in err and "still holds" not in err, err
    print(f"store after the kill: {check_store(prefix, stack)} entries, each verifies")
    completed = completed_stages(err)
    assert {"fp32.freeze", "fp32.strip"} <= completed
    rerun_reuses(project, env, completed)
    check_store(prefix, stack)


def test_postgresql_restart_between_two_runs(stack: Stack, digits_example: Path,  # noqa: F811
                                             tmp_path: Path) -> None:
    """Both servers keep their connection pools across the restart: they must reconnect
    (both pre-ping pooled connections), not fail the next run. The pools are filled by a
    request to each server that reads its database (what a run before the restart did),
    and PostgreSQL shows both servers' connections open before it restarts."""
    from mlflow.tracking import MlflowClient

    project = make_project(tmp_path, RECIPE)
    env = run_env(stack, project, f"s3://{STORE_BUCKET}/faults-postgres")
    MlflowClient(tracking_uri=stack.mlflow.url).search_experiments()
    with urllib.request.urlopen(urllib.request.Request(
            stack.prefect_api_url + "/flow_runs/filter", data=b"{}", method="POST",
            headers={"Content-Type": "application/json"}), timeout=30) as answer:
        assert answer.status == 200
    held = dict(stack.postgres.query("postgres", "SELECT datname, count(*) FROM "
                                     "pg_stat_activity WHERE datname IN ('prefect', 'mlflow') "
                                     "GROUP BY datname"))
    assert held.get("prefect", 0) > 0 and held.get("mlflow", 0) > 0, held
    started = time.monotonic()
    stack.postgres.restart("fast")  # every open connection of both servers is closed
    print(f"PostgreSQL restarted in {time.monotonic() - started:.1f} s (it closed "
          f"{held} connections)")
    done = orchestrator(project, env, "run", "recipes/digits.yaml", "-o", "out")
    assert done.returncode == 0, done.stderr[-5000:]
    assert "Traceback" not in done.stderr

    report = json.loads((project / "out" / "report.json").read_text())
    run = MlflowClient(tracking_uri=stack.mlflow.url).get_run(report["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    flow_run_id = run.data.tags["prefect.flow_run_id"]
    assert stack.postgres.query("prefect", "SELECT state_type FROM flow_run WHERE id = "
                                f"'{flow_run_id}'") == [("COMPLETED",)]
