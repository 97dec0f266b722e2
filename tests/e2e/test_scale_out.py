"""Issue 19, the servers tested for real: PostgreSQL, a Prefect server and an MLflow tracking
server on it, artifacts and the orchestrator store in an S3 bucket (moto), all on loopback.
The digits recipe runs on a Dask LocalCluster of 2 workers against them; then the flow run
is read back from Prefect's API, the runs, params, metrics and artifacts from MLflow's (and
the artifacts from the bucket), and the store's entries from the bucket, each verified
against its manifest. The figures docs/scale-out.md quotes are printed (run with -s).

The servers are shared by the test files one test process runs (tests/support/servers.py): what is
read back is this run's (its flow run, its MLflow runs, its store prefix), and the database
figures are the rows this run added."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from support.s3_entries import all_entries_verify
from support.servers import (
    MLFLOW_BUCKET,
    STORE_BUCKET,
    Stack,
    make_project,
    orchestrator,
    run_env,
    stack,  # noqa: F401  (the fixture)
)

pytestmark = [pytest.mark.servers, pytest.mark.slow]


MLFLOW_TABLES = ("runs", "params", "metrics", "latest_metrics", "tags")
PREFECT_TABLES = ("flow_run", "task_run", "task_run_state", "log", "events")


def row_counts(stack: Stack) -> dict[str, dict[str, int]]:  # noqa: F811
    """database -> table -> rows, for the tables whose growth docs/scale-out.md quotes."""
    return {db: {table: stack.postgres.query(db, f"SELECT count(*) FROM {table}")[0][0]
                 for table in tables}
            for db, tables in (("mlflow", MLFLOW_TABLES), ("prefect", PREFECT_TABLES))}


@pytest.fixture(scope="module")
def scaled(stack: Stack, digits_example: Path,  # noqa: F811
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    project = make_project(tmp_path_factory.mktemp("scale-out"))
    env = run_env(stack, project)
    rows_before = row_counts(stack)
    flow_runs_before = {row[0] for row in stack.postgres.query("prefect",
                                                               "SELECT id FROM flow_run")}
    started = time.monotonic()
    done = orchestrator(project, env, "run", "recipes/digits.yaml", "-o", "out",
                        "--executor", "dask")
    seconds = time.monotonic() - started
    print(f"digits on dask (2 workers) against the servers: exit {done.returncode} in "
          f"{seconds:.1f} s (servers up in {stack.seconds_to_start:.1f} s)")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads((project / "out" / "report.json").read_text())
    flow_runs = {row[0] for row in stack.postgres.query("prefect", "SELECT id FROM flow_run")}
    return {"project": project, "report": report, "done": done, "seconds": seconds,
            "rows_before": rows_before, "new_flow_runs": flow_runs - flow_runs_before}


def stage_names(report: dict[str, Any]) -> set[str]:
    return {f"{name}.{stage['name']}" for name, variant in report["variants"].items()
            for stage in variant["stages"]}


def test_the_flow_run_and_its_task_runs_are_in_prefect(stack: Stack,  # noqa: F811
                                                        scaled: dict[str, Any]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    [flow_run_id] = scaled["new_flow_runs"]  # the run made one flow run
    with temporary_settings(updates={PREFECT_API_URL: stack.prefect_api_url}), \
            get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(UUID(str(flow_run_id)))
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[flow_run.id])))
    assert flow_run.state is not None and flow_run.state.is_completed(), flow_run.state
    assert flow_run.name.startswith("digits-cnn@")
    names = {run.name for run in task_runs}
    assert stage_names(scaled["report"]) <= names, names
    assert all(run.state is not None and run.state.is_completed() for run in task_runs), [
        (run.name, run.state) for run in task_runs if not run.state.is_completed()]
    print(f"Prefect: 1 flow run, {len(task_runs)} task runs "
          f"({len(stage_names(scaled['report']))} stages)")
    scaled["flow_run_id"] = str(flow_run.id)


def test_the_runs_params_metrics_and_artifacts_are_in_mlflow(stack: Stack,  # noqa: F811
                                                             scaled: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    report = scaled["report"]
    client = MlflowClient(tracking_uri=stack.mlflow.url)
    parent = client.get_run(report["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["recipe.name"] == "digits-cnn"
    assert parent.data.metrics["fp32.accuracy"] == pytest.approx(
        report["variants"]["fp32"]["accuracy"])
    if "flow_run_id" in scaled:
        assert parent.data.tags["prefect.flow_run_id"] == scaled["flow_run_id"]
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {run.info.run_name for run in children} == set(report["variants"])
    assert all(run.info.status == "FINISHED" for run in children)
    # artifacts go through the server (proxied) into the bucket: every file MLflow lists
    # is an object of the same size under --artifacts-destination
    assert parent.info.artifact_uri.startswith("mlflow-artifacts:/")
    objects = stack.objects(MLFLOW_BUCKET, "mlflow/")
    listed = 0
    for run in [parent, *children]:
        files = _artifact_files(client, run.info.run_id)
        assert files, f"no artifacts on run {run.info.run_name}"
        for path, size in files.items():
            key = f"mlflow/{run.info.experiment_id}/{run.info.run_id}/artifacts/{path}"
            assert objects.get(key) == size, (key, size, objects.get(key))
            listed += 1
    assert {"report.json", "recipe/recipe.yaml"} <= set(
        _artifact_files(client, parent.info.run_id))
    params = sum(len(r.data.params) for r in [parent, *children])
    metrics = sum(len(r.data.metrics) for r in [parent, *children])
    print(f"MLflow: {1 + len(children)} runs, {params} params, {metrics} metrics (latest), "
          f"{listed} artifacts, {sum(objects.values()):,} bytes in the bucket")


def _artifact_files(client: Any, run_id: str, path: str | None = None) -> dict[str, int]:
    found: dict[str, int] = {}
    for item in client.list_artifacts(run_id, path):
        if item.is_dir:
            found.update(_artifact_files(client, run_id, item.path))
        else:
            found[item.path] = int(item.file_size)
    return found


def test_the_store_entries_are_in_the_bucket_and_verify(stack: Stack,  # noqa: F811
                                                        scaled: dict[str, Any]) -> None:
    entries = all_entries_verify(stack.s3, STORE_BUCKET, "store")
    stages = stage_names(scaled["report"])
    # one entry per stage that ran (guard trials may add more)
    assert len(entries) >= len(stages), (len(entries), sorted(stages))
    objects = stack.objects(STORE_BUCKET, "store/")
    assert not [key for key in objects if "/scratch/" in key]  # the run's scratch is gone
    assert not (scaled["project"] / ".orchestrator").exists()  # nothing stored locally
    print(f"store: {len(entries)} entries, {len(objects)} objects, "
          f"{sum(objects.values()):,} bytes in the bucket")


def test_postgresql_holds_both_servers_records(stack: Stack,  # noqa: F811
                                               scaled: dict[str, Any]) -> None:
    """What one run costs each database (the figures docs/scale-out.md quotes): the rows
    it added."""
    after = row_counts(stack)
    added = {db: {table: rows - scaled["rows_before"][db][table]
                  for table, rows in tables.items()} for db, tables in after.items()}
    mlflow_rows, prefect_rows = added["mlflow"], added["prefect"]
    sizes = {db: stack.postgres.query("postgres", f"SELECT pg_database_size('{db}')")[0][0]
             for db in ("mlflow", "prefect")}
    print(f"PostgreSQL rows the run added: mlflow {mlflow_rows}; prefect {prefect_rows}; "
          f"database bytes {sizes}")
    assert mlflow_rows["runs"] == 1 + len(scaled["report"]["variants"])
    assert prefect_rows["flow_run"] == 1
    [flow_run_id] = scaled["new_flow_runs"]
    task_runs = stack.postgres.query("prefect", "SELECT count(*) FROM task_run WHERE "
                                     f"flow_run_id = '{flow_run_id}'")[0][0]
    assert task_runs >= len(stage_names(scaled["report"]))
