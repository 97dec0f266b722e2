"""`orchestrator deploy` and `orchestrator serve` against a real Prefect server: a deployed
recipe runs to completion through Prefect's API, its schedule gets runs, Ctrl-C stops the
serving process; bad recipes, crons and time zones are refused before anything exists."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.error_lines import error_lines
from support.prefect_session_server import new_prefect_home

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "recipes"
NAME = "digits-deployed"
CRON, TIMEZONE = "0 3 * * *", "Europe/Berlin"
WAIT_S = 600  # generous bounds for a loaded 2-core machine; never an assertion on time


def make_project(base: Path) -> Path:
    """A project (pyproject.toml marks its root) with the digits recipe cut to its fp32
    pipeline of two stages, freeze and evaluate: the deployment's run is about Prefect, not
    about 8-bit or timings."""
    project = base / "project"
    (project / "recipes").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'models'\n")
    (project / "examples").symlink_to(ROOT / "examples")
    text = (ROOT / "recipes" / "digits.yaml").read_text()
    fp32_only, found, _ = text.partition("  int8:\n")
    assert found, "recipes/digits.yaml changed: update this test's cut"
    stages = "stages: [freeze, strip, fold, benchmark, evaluate]"
    assert stages in fp32_only, "recipes/digits.yaml changed: update this test's cut"
    (project / "recipes" / "digits.yaml").write_text(
        fp32_only.replace(stages, "stages: [freeze, evaluate]"))
    return project


def project_env(project: Path) -> dict[str, str]:
    """Its own store, MLflow and Prefect home (so the local server's database is new);
    no PREFECT_API_URL: deploy and serve start and share orchestrator's local server."""
    env = {**os.environ, "ORCHESTRATOR_HOME": str(project / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlruns' / 'mlflow.db'}",
           "PREFECT_HOME": str(project / ".prefect"), "PREFECT_LOGGING_LEVEL": "WARNING"}
    env.pop("PREFECT_API_URL", None)
    return env


def orchestrator(project: Path, *args: str, env: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=project,
                          env=env or project_env(project), capture_output=True, text=True,
                          timeout=WAIT_S)


def python_sigint() -> None:
    # a test run started in the background inherits SIGINT ignored; Python then installs
    # no Ctrl-C handler in the child. The serving process must get Python's own.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ---- what a deployment holds (no server) ----------------------------------------------

def test_plan_takes_the_recipes_schedule_unless_the_command_line_overrides_it(
        tmp_path: Path, digits_example: Path) -> None:
    from orchestrator.flow.deployments import plan_deployments

    project = make_project(tmp_path)
    recipes = project / "recipes"
    nightly = recipes / "nightly.yaml"
    nightly.write_text((recipes / "digits.yaml").read_text().replace(
        "name: digits-cnn", "name: nightly")
        + 'schedule: {cron: "30 2 * * 1-5", timezone: America/New_York}\n')
    plain, scheduled = plan_deployments([recipes])  # a folder: its recipes, sorted
    assert (plain.name, plain.cron, plain.timezone) == ("digits-cnn", None, "UTC")
    assert plain.recipe == recipes / "digits.yaml" and plain.recipe.is_absolute()
    assert plain.parameters == {"recipe": str(recipes / "digits.yaml"), "overrides": [],
                                "output": str(project / "out" / "digits-cnn")}
    assert (scheduled.name, scheduled.cron, scheduled.timezone) == (
        "nightly", "30 2 * * 1-5", "America/New_York")
    [item] = plan_deployments([nightly], ["name=other"], cron="0 4 * * *")
    assert (item.name, item.cron, item.timezone) == ("other", "0 4 * * *", "America/New_York")
    assert item.parameters["overrides"] == ["name=other"]
    assert item.parameters["output"] == str(project / "out" / "other")
    [item] = plan_deployments([nightly], timezone="Asia/Tokyo")
    assert (item.cron, item.timezone) == ("30 2 * * 1-5", "Asia/Tokyo")


# ---- refused before anything exists ---------------------------------------------------

# `orchestrator deploy` and `orchestrator serve` one after the other in one Python process
# of the project's (one interpreter start, not two): each command's exit code and all it
# wrote to the stderr file descriptor, into the JSON file named by argv[2].
BOTH_COMMANDS = """
import json, os, sys, tempfile
results = []
for args in json.loads(sys.argv[1]):
    with tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            from orchestrator.cli.main import main
            try:
                code = main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        results.append([code, err.read()])
with open(sys.argv[2], "w") as out:
    json.dump(results, out)
"""


@pytest.mark.parametrize("case", ["invalid_recipe", "bad_schedule_in_recipe", "cron",
                                  "timezone", "set", "folder_without_recipes", "same_name"])
def test_deploy_refuses_bad_input_and_creates_nothing(case: str, tmp_path: Path) -> None:
    project = make_project(tmp_path)
    recipe = project / "recipes" / "digits.yaml"
    args: list[str] = [str(recipe)]
    expected = ""
    if case == "invalid_recipe":
        shutil.copy(FIXTURES / "unknown_stage.yaml", project / "recipes" / "bad.yaml")
        args, expected = [str(recipe), str(project / "recipes" / "bad.yaml")], "bad.yaml"
    elif case == "bad_schedule_in_recipe":
        recipe.write_text(recipe.read_text() + 'schedule: {cron: "0 3 * *"}\n')
        expected = "invalid cron expression '0 3 * *'"
    elif case == "cron":
        args += ["--cron", "61 3 * * *"]
        expected = "invalid cron expression '61 3 * * *'"
    elif case == "timezone":
        args += ["--cron", CRON, "--timezone", "Mars/Olympus_Mons"]
        expected = "unknown time zone 'Mars/Olympus_Mons'"
    elif case == "set":
        args += ["--set", "pipelines.fp32.stages=[freez]"]
        expected = "freez"
    elif case == "folder_without_recipes":
        (project / "empty").mkdir()
        args, expected = [str(project / "empty")], "no recipes (*.yaml, *.yml) in the folder"
    elif case == "same_name":
        shutil.copy(recipe, project / "recipes" / "copy.yaml")
        args, expected = [str(project / "recipes")], "two recipes are named 'digits-cnn'"
    commands = ("deploy", "serve")
    results = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-c", BOTH_COMMANDS, json.dumps([[c, *args] for c in commands]),
         str(results)], cwd=project, env=project_env(project), capture_output=True,
        text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    for command, (code, stderr) in zip(commands, json.loads(results.read_text()),
                                       strict=True):
        assert code == 2, (command, stderr)
        assert expected in stderr, stderr
        error_lines(stderr)  # each error on its line, no traceback
    # no Prefect server was started, so no deployment can exist anywhere
    assert not (project / ".orchestrator").exists()
    assert not (project / ".prefect").exists()


# ---- deployed, served, run through Prefect's API -------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, digits_example: Path
           ) -> Iterator[dict[str, Any]]:
    """`orchestrator deploy`, then `orchestrator serve` running in the background; the
    local Prefect server they share is stopped at the end."""
    project = make_project(tmp_path_factory.mktemp("deploy"))
    env = project_env(project)
    new_prefect_home(Path(env["PREFECT_HOME"]))
    options = ["--cron", CRON, "--timezone", TIMEZONE, "--set", f"name={NAME}"]
    deployed = orchestrator(project, "deploy", "recipes/digits.yaml", *options, env=env)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    state = json.loads((project / ".orchestrator" / "prefect-server.json").read_text())
    log = open(project / "serve.log", "w+")  # noqa: SIM115  (read by the tests)
    serving = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "serve", "recipes/digits.yaml", *options],
        cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        preexec_fn=python_sigint)
    try:
        yield {"project": project, "deployed": deployed, "api_url": state["api_url"],
               "serving": serving, "log": project / "serve.log"}
    finally:
        if serving.poll() is None:
            serving.kill()
            serving.wait(timeout=60)
        log.close()
        orchestrator(project, "server", "stop", "--force", env=env)


def api(served: dict[str, Any]) -> Any:
    """Prefect settings pointing at the served project's server (whatever server the
    session's other tests use)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: served["api_url"]})


def read_deployment(served: dict[str, Any]) -> Any:
    from prefect.client.orchestration import get_client

    with api(served), get_client(sync_client=True) as client:
        return client.read_deployment_by_name(f"orchestrator-recipe/{NAME}")


@pytest.mark.slow
def test_deploy_registers_the_recipe_with_its_parameters_and_schedule(
        served: dict[str, Any]) -> None:
    project = served["project"]
    out = served["deployed"].stdout
    assert f"deployed orchestrator-recipe/{NAME} (" in out
    assert f"cron '{CRON}' ({TIMEZONE})" in out
    assert "orchestrator serve recipes/digits.yaml --cron '0 3 * * *'" in out  # what next
    deployment = read_deployment(served)
    assert deployment.parameters == {
        "recipe": str(project / "recipes" / "digits.yaml"), "overrides": [f"name={NAME}"],
        "output": str(project / "out" / NAME)}
    assert deployment.entrypoint == "pipelines.recipe_flow.recipe_flow"  # any working dir
    assert [(s.schedule.cron, s.schedule.timezone) for s in deployment.schedules] == [
        (CRON, TIMEZONE)]
    assert "orchestrator" in deployment.tags and f"recipe:{NAME}" in deployment.tags
    assert deployment.work_pool_name is None  # served, not a pool's


@pytest.mark.slow
def test_a_cron_only_prefect_refuses_is_exit_2_before_any_deployment(
        served: dict[str, Any]) -> None:
    from prefect.client.orchestration import get_client

    project = served["project"]
    recipes = project / "recipes"
    first, second = recipes / "first.yaml", recipes / "second.yaml"
    text = (recipes / "digits.yaml").read_text()
    first.write_text(text.replace("name: digits-cnn", "name: digits-first"))
    # `1L` (last Monday) passes the recipe's own check; Prefect's parser refuses it
    second.write_text(text.replace("name: digits-cnn", "name: digits-badcron")
                      + 'schedule: {cron: "0 3 * * 1L"}\n')
    try:
        done = orchestrator(project, "deploy", str(first), str(second))
    finally:
        first.unlink()
        second.unlink()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Prefect refuses the schedule cron '0 3 * * 1L' (UTC)" in done.stderr
    assert len(error_lines(done.stderr)) == 1
    with api(served), get_client(sync_client=True) as client:
        names = {d.name for d in client.read_deployments()}
    assert not names & {"digits-first", "digits-badcron"}  # not even the valid one


@pytest.mark.slow
def test_a_triggered_run_of_the_served_deployment_completes(served: dict[str, Any]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    with api(served):
        flow_run = run_deployment(f"orchestrator-recipe/{NAME}", timeout=WAIT_S,
                                  poll_interval=2, as_subflow=False)
        with get_client(sync_client=True) as client:
            flow_run = client.read_flow_run(flow_run.id)
    log = served["log"].read_text()
    assert flow_run.state is not None and flow_run.state.is_completed(), (
        flow_run.state, log[-3000:])
    assert flow_run.name.startswith(f"{NAME}@")  # named like the MLflow parent run
    output = Path(flow_run.parameters["output"])
    report = json.loads((output / "report.json").read_text())
    assert report["recipe"] == NAME  # the deployment's --set override reached the run
    assert set(report["variants"]) == {"fp32"}
    assert report["variants"]["fp32"]["accuracy"] > 0.9
    assert report["mlflow_run_id"]
    assert (served["project"] / "mlruns" / "mlflow.db").is_file()


@pytest.mark.slow
def test_serve_schedules_the_next_runs_of_the_cron(served: dict[str, Any]) -> None:
    """The local server runs no scheduler service: serve asks it for the next runs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    deployment = read_deployment(served)
    deadline = time.monotonic() + WAIT_S
    scheduled: list[Any] = []
    while not scheduled and time.monotonic() < deadline:
        with api(served), get_client(sync_client=True) as client:
            scheduled = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))))
        if not scheduled:
            assert served["serving"].poll() is None, served["log"].read_text()[-3000:]
            time.sleep(1)
    assert scheduled, "serve scheduled no runs: " + served["log"].read_text()[-3000:]
    from zoneinfo import ZoneInfo

    for run in scheduled:
        local = run.expected_start_time.astimezone(ZoneInfo(TIMEZONE))
        assert (local.hour, local.minute) == (3, 0)  # 03:00 in Berlin, whatever UTC says


@pytest.mark.slow
def test_a_work_pool_deployment_runs_on_a_prefect_worker(served: dict[str, Any]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments import run_deployment

    project, env = served["project"], project_env(served["project"])
    missing = orchestrator(project, "deploy", "recipes/digits.yaml", "--work-pool", "nowhere",
                           "--set", "name=digits-pooled", env=env)
    assert missing.returncode == 2 and "no work pool 'nowhere'" in missing.stderr
    with api(served), get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="local", type="process"))
        assert not [d for d in client.read_deployments() if d.name == "digits-pooled"]
    done = orchestrator(project, "deploy", "recipes/digits.yaml", "--work-pool", "local",
                        "--set", "name=digits-pooled", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "prefect worker start --pool local" in done.stdout
    with api(served):
        flow_run = run_deployment("orchestrator-recipe/digits-pooled", timeout=0,
                                  as_subflow=False)
    # one polling round of a process worker, from another working directory: it imports
    # the flow by module path and runs it in a child process
    worker = subprocess.run(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", "local", "--type",
         "process", "--run-once"], cwd=project.parent,
        env={**env, "PREFECT_API_URL": served["api_url"]}, capture_output=True, text=True,
        timeout=WAIT_S)
    with api(served), get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run.id)
    assert flow_run.state is not None and flow_run.state.is_completed(), (
        flow_run.state, worker.stdout[-2000:], worker.stderr[-3000:])
    report = json.loads((project / "out" / "digits-pooled" / "report.json").read_text())
    assert report["recipe"] == "digits-pooled"


@pytest.mark.slow
def test_ctrl_c_stops_serving_cleanly(served: dict[str, Any]) -> None:
    serving = served["serving"]
    assert serving.poll() is None, served["log"].read_text()[-3000:]
    serving.send_signal(signal.SIGINT)
    assert serving.wait(timeout=WAIT_S) == 0
    log = served["log"].read_text()
    assert "stopped serving" in log and "Traceback" not in log, log[-3000:]
    assert read_deployment(served).paused  # Prefect pauses a served schedule when it stops
