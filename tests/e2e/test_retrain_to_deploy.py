"""Retrain-to-deploy, end to end: recipes/digits_nightly.yaml retrains the digits CNN (its
`retrain:` step is a task of the flow), runs fp32 and 8-bit on the new model, registers the
selection as `candidate` when every gate passes, and `promote` moves it to `production`. A
tightened budget makes the same flow refuse, saying why in the output and in MLflow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
NAME = "digits-nightly"
FAST = ["--set", "retrain.params.epochs=4"]  # a shorter training: the same code path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nightly(tmp_path_factory: pytest.TempPathFactory, digits_example: Path,
            prefect_server: None) -> dict:
    """A project with the nightly recipe; the store and MLflow inside it."""
    project = tmp_path_factory.mktemp("nightly")
    (project / "recipes").mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'models'\n")
    shutil.copy(ROOT / "recipes" / "digits_nightly.yaml", project / "recipes")
    (project / "examples").symlink_to(ROOT / "examples")
    return {"project": project, "recipe": project / "recipes" / "digits_nightly.yaml",
            "tracking": f"sqlite:///{project / 'mlruns' / 'mlflow.db'}"}


@pytest.fixture
def in_project(nightly: dict, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(nightly["project"])
    monkeypatch.delenv("ORCHESTRATOR_HOME", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", nightly["tracking"])
    return nightly


def client(nightly: dict):  # noqa: ANN201
    from mlflow.tracking import MlflowClient

    return MlflowClient(nightly["tracking"])


def test_retrained_model_is_registered_as_candidate_then_promoted(
        in_project: dict, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = in_project["recipe"]
    assert main(["run", str(recipe), *FAST]) == 0
    out = capsys.readouterr().out
    report = json.loads((in_project["project"] / "out" / NAME / "report.json").read_text())
    # the pipelines ran on the retrained model, not on the recipe's model.path
    retrained = list((in_project["project"] / ".orchestrator" / "retrained" / NAME).iterdir())
    assert len(retrained) == 1 and (retrained[0] / "saved_model").is_dir()
    assert report["selected"] == {"phone": "int8"}
    assert f"Registered {NAME} version 1 as 'candidate'" in out, out

    mlflow = client(in_project)
    version = mlflow.get_model_version_by_alias(NAME, "candidate")
    assert str(version.version) == "1"
    tags = version.tags
    int8 = report["variants"]["int8"]
    assert tags["phone.variant"] == "int8"
    assert float(tags["phone.accuracy"]) == pytest.approx(int8["accuracy"])
    assert float(tags["phone.size_bytes"]) == int8["size_bytes"]
    assert tags["git_commit"]  # "none" outside git, else the commit
    assert tags["data_fingerprint.evaluation"]

    assert main(["promote", str(recipe), "--to", "production"]) == 0
    promoted = mlflow.get_model_version_by_alias(NAME, "production")
    assert promoted.version == version.version


def test_a_tightened_budget_refuses_registration_and_says_why(
        in_project: dict, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = in_project["recipe"]
    mlflow = client(in_project)
    before = {v.version for v in mlflow.search_model_versions(f"name='{NAME}'")}
    code = main(["run", str(recipe), *FAST, "--set", "targets.0.budgets.max_size_mb=0.1"])
    captured = capsys.readouterr()
    assert code == 1  # the gate failed
    assert "Not registered" in captured.out and "phone" in captured.out
    assert "max_size_mb 0.1" in captured.out, captured.out
    after = {v.version for v in mlflow.search_model_versions(f"name='{NAME}'")}
    assert after == before  # nothing registered, candidate unchanged
    report = json.loads((in_project["project"] / "out" / NAME / "report.json").read_text())
    status = mlflow.get_run(report["mlflow_run_id"]).data.tags["registry.status"]
    assert "max_size_mb 0.1" in status
