"""The whole run is one module-level Prefect flow: what Prefect records of it, where a run
keeps its files, and the retrain step's failures."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import time
from pathlib import Path

import pytest

from orchestrator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def make_project(base: Path, recipe: str = "digits.yaml") -> Path:
    """A project folder (pyproject.toml marks its root) with the example recipe and data."""
    project = base / "project"
    (project / "recipes").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'models'\n")
    shutil.copy(ROOT / "recipes" / recipe, project / "recipes" / recipe)
    (project / "examples").symlink_to(ROOT / "examples")
    return project


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digits_example: Path,
              prefect_server: None) -> tuple[Path, Path]:
    """(project, an unrelated working directory), with no store or tracking env vars."""
    project = make_project(tmp_path)
    cwd = tmp_path / "somewhere-else"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("ORCHESTRATOR_HOME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return project, cwd


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory: pytest.TempPathFactory, digits_example: Path,
             prefect_server: None) -> dict:
    """The digits recipe's fp32 pipeline, run once from an unrelated working directory with
    no store or tracking env vars, with a `--set`; what it printed and the flow run."""
    base = tmp_path_factory.mktemp("recipe-flow")
    project = make_project(base)
    cwd = base / "somewhere-else"
    cwd.mkdir()
    recipe = project / "recipes" / "digits.yaml"
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(cwd)
        monkeypatch.delenv("ORCHESTRATOR_HOME", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        with contextlib.redirect_stdout(out):
            code = main(["run", str(recipe), "--variant", "fp32", "--set",
                         "description=flow test"])
        flow_run = _read_flow_run("digits-cnn@", recipe)
    return {"project": project, "cwd": cwd, "recipe": recipe, "code": code,
            "stdout": out.getvalue(), "flow_run": flow_run}


def test_run_from_another_directory_writes_only_into_the_project(fp32_run: dict) -> None:
    project, cwd = fp32_run["project"], fp32_run["cwd"]
    assert fp32_run["code"] in (0, 1)
    out = fp32_run["stdout"]
    assert list(cwd.iterdir()) == []  # nothing where the command was started
    report = json.loads((project / "out" / "digits-cnn" / "report.json").read_text())
    assert set(report["variants"]) == {"fp32"}
    assert (project / ".orchestrator").is_dir()
    assert (project / "mlruns" / "mlflow.db").is_file()
    # the end of the run says where things are and how to look at them
    assert f"MLflow run {report['mlflow_run_id']}" in out
    assert str(project / ".orchestrator") in out and str(project / "mlruns") in out
    assert "orchestrator ui" in out


def _read_flow_run(name_prefix: str, recipe: Path) -> tuple[object, list, list]:
    """The newest flow run of `recipe` (xdist's workers share the session's server) whose
    name starts with `name_prefix`, its task runs and logs
    (the log worker sends in batches: wait for the stage lines to arrive)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=200)
                if r.name.startswith(name_prefix)
                and r.parameters.get("recipe") == str(recipe)]
        assert runs, f"no flow run named {name_prefix}..."
        run = runs[0]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [run.id]}))
        deadline = time.monotonic() + 60
        while True:
            logs = client.read_logs(log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[run.id])))
            if any("ran in" in log.message or "cached result" in log.message for log in logs):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return run, tasks, logs


def test_prefect_sees_a_named_run_with_parameters_task_names_and_stage_logs(
        fp32_run: dict) -> None:
    project, recipe = fp32_run["project"], fp32_run["recipe"]
    assert fp32_run["code"] in (0, 1)
    report = json.loads((project / "out" / "digits-cnn" / "report.json").read_text())
    run, tasks, logs = fp32_run["flow_run"]
    # outside git: <recipe>@<UTC time>, the name MLflow's parent run has too
    assert run.name.startswith("digits-cnn@") and run.state.is_completed()
    assert run.parameters["recipe"] == str(recipe)
    assert run.parameters["overrides"] == ["description=flow test"]
    assert run.parameters["variants"] == ["fp32"]
    names = {t.name for t in tasks}
    assert {"fp32.freeze", "fp32.strip", "fp32.fold", "fp32.benchmark",
            "fp32.evaluate"} <= names, names
    messages = [log.message for log in logs]
    assert any(m.startswith("fp32/4:evaluate:") and "accuracy" in m for m in messages), messages
    assert report["mlflow_run_id"]


RETRAIN_MODULE = '''
from pathlib import Path

def fails(output_dir, **params):
    raise RuntimeError("out of GPUs")

def nowhere(output_dir, **params):
    return str(Path(output_dir) / "never-written")

def half_written(output_dir, **params):
    (Path(output_dir) / "partial.bin").write_bytes(b"x")
    raise ValueError("diverged at epoch 3")
'''


@pytest.mark.parametrize(("callable_", "code", "words"), [
    ("no_such_module:train", 2, ["retrain.callable", "cannot import module 'no_such_module'"]),
    ("trainers:missing", 2, ["retrain.callable", "has no function 'missing'", "fails"]),
    ("trainers:fails", 3, ["retrain/trainers:fails", "RuntimeError: out of GPUs"]),
    ("trainers:nowhere", 2, ["retrain.callable", "never-written", "does not exist"]),
    ("trainers:half_written", 3, ["retrain/trainers:half_written", "diverged at epoch 3"]),
])
def test_a_bad_retrain_step_is_a_clear_error_and_leaves_nothing(
        elsewhere: tuple[Path, Path], capsys: pytest.CaptureFixture[str], callable_: str,
        code: int, words: list[str]) -> None:
    project, cwd = elsewhere
    (project / "recipes" / "trainers.py").write_text(RETRAIN_MODULE)
    recipe = project / "recipes" / "digits.yaml"
    assert main(["run", str(recipe), "--variant", "fp32", "--set",
                 f"retrain.callable={callable_}"]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err
    assert not (project / "out").exists()
    retrained = project / ".orchestrator" / "retrained"
    assert not retrained.exists() or not any(retrained.rglob("*.bin"))
    assert list(cwd.iterdir()) == []
