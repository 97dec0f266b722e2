"""`orchestrator history`: real digits runs tracked in a real MLflow (sqlite under tmp), then
the selected variant per target across them, as rows, a table and history.png."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from support.project_env import in_project

from orchestrator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "recipes"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VARIANT_FIGURES = ("size_bytes", "accuracy", "fidelity")

pytestmark = pytest.mark.slow


def _git(work: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(work), "-c", "user.name=test",
                           "-c", "user.email=test@example.com", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def history_runs(digits_example: Path, prefect_server: None,
                 tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The digits recipe (fp32 only, then fp32 + litert_dynamic after a committed budget
    change) in a git project of its own, then a run that died: three parent runs."""
    work = tmp_path_factory.mktemp("history")
    recipe = work / "recipes" / "digits.yaml"
    recipe.parent.mkdir()
    shutil.copy(ROOT / "recipes" / "digits.yaml", recipe)
    (work / "examples").symlink_to(ROOT / "examples")
    _git(work, "init", "-q")
    _git(work, "add", "recipes/digits.yaml")
    _git(work, "commit", "-q", "-m", "digits")
    env = {"ORCHESTRATOR_HOME": str(work / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlruns' / 'mlflow.db'}"}
    commits, codes = [], []
    with in_project(work, env):
        commits.append(_git(work, "rev-parse", "HEAD"))
        codes.append(main(["run", str(recipe), "-o", str(work / "out1"), "--variant", "fp32"]))
        # the pi's size budget now excludes fp32: its selection must change
        text = recipe.read_text()
        assert "max_size_mb: 2.0" in text
        recipe.write_text(text.replace("max_size_mb: 2.0", "max_size_mb: 0.5"))
        _git(work, "commit", "-q", "-am", "pi: 0.5 MB")
        commits.append(_git(work, "rev-parse", "HEAD"))
        codes.append(main(["run", str(recipe), "-o", str(work / "out2"), "--variant", "fp32",
                           "--variant", "litert_dynamic"]))
        died = _died_run(env["MLFLOW_TRACKING_URI"], recipe)
        interrupted = _died_run(env["MLFLOW_TRACKING_URI"], recipe, "KILLED")
    reports = [json.loads((work / f"out{i}" / "report.json").read_text()) for i in (1, 2)]
    return {"work": work, "recipe": recipe, "env": env, "codes": codes, "commits": commits,
            "reports": reports, "died": died, "interrupted": interrupted}


def _died_run(uri: str, recipe: Path, status: str = "FAILED") -> str:
    """A parent run as the tracking worker leaves one whose run died before `finish`:
    its tags and params, no figures, no selection, FAILED (KILLED: as it leaves an
    interrupted run's)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("digits-cnn").experiment_id
    run = client.create_run(experiment, run_name=f"digits-cnn@{status.lower()}",
                            tags={"orchestrator.recipe": str(recipe),
                                  "orchestrator.recipe_name": "digits-cnn"})
    client.log_param(run.info.run_id, "targets", "phone, pi")
    client.log_param(run.info.run_id, "recipe.git_commit", "none")
    client.set_terminated(run.info.run_id, status)
    return run.info.run_id


@pytest.fixture
def tracked(history_runs: dict, monkeypatch: pytest.MonkeyPatch) -> dict:
    for key, value in history_runs["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(history_runs["work"])
    return history_runs


def _history(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["history", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_rows_equal_each_runs_report(tracked: dict, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    first, second = tracked["reports"]
    assert tracked["codes"] == [1, 0]  # the first run's phone had no fp32 within budgets
    assert first["selected"] != second["selected"]  # the change the chart must show
    code, out, _ = _history(capsys, str(tracked["recipe"]), "--json")
    assert code == 0
    rows = json.loads(out)
    run_order = list(dict.fromkeys(row["run_id"] for row in rows))
    assert run_order == [first["mlflow_run_id"], second["mlflow_run_id"], tracked["died"],
                         tracked["interrupted"]]
    assert [row["start_time"] for row in rows] == sorted(row["start_time"] for row in rows)
    for report, commit in zip(tracked["reports"], tracked["commits"], strict=True):
        mine = [row for row in rows if row["run_id"] == report["mlflow_run_id"]]
        assert [row["target"] for row in mine] == list(report["selected"])
        for row in mine:
            assert row["status"] == "FINISHED"
            assert row["git_commit"] == commit[:7]
            assert row["device"] == report["targets"][row["target"]]["device"]
            chosen = report["selected"][row["target"]]
            assert row["selected"] == chosen
            if chosen is None:
                assert "no variant met the budgets" in row["note"]
                assert row["size_bytes"] is None and row["latency_p50_ms"] is None
                continue
            variant = report["variants"][chosen]
            # MLflow holds each figure to 6 significant digits (as its UI shows them)
            rounded = 1e-5
            for key in VARIANT_FIGURES:
                assert row[key] == pytest.approx(variant[key], rel=rounded), key
            assert row["quality_metric"] == "accuracy"  # digits has labels
            assert row["quality"] == pytest.approx(variant["accuracy"], rel=rounded)
            assert row["size_mib"] == pytest.approx(variant["size_bytes"] / 1048576, abs=1e-6)
            assert row["latency_p50_ms"] == pytest.approx(variant["latency_ms"]["p50"],
                                                          rel=rounded)
            assert row["est_latency_ms"] == pytest.approx(
                variant["targets"][row["target"]]["est_latency_ms"], rel=rounded)
            assert row["host"].startswith(variant["host"]["cpu"])
            assert f"{variant['host']['cores']} cores" in row["host"]
    died = [row for row in rows if row["run_id"] == tracked["died"]]
    assert [row["target"] for row in died] == ["phone", "pi"]  # listed, not dropped
    for row in died:
        assert row["status"] == "FAILED" and row["selected"] is None
        assert "failed" in row["note"]
    interrupted = [row for row in rows if row["run_id"] == tracked["interrupted"]]
    assert [(row["status"], row["note"]) for row in interrupted] == [
        ("KILLED", "interrupted")] * 2  # issue 39: not "run failed"


def test_table_and_chart(tracked: dict, capsys: pytest.CaptureFixture[str]) -> None:
    work = tracked["work"]
    code, out, err = _history(capsys, str(tracked["recipe"]))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split()[:5] == ["started", "(UTC)", "recipe", "commit", "target"]
    assert "p50 measured" in lines[1] and "MiB" in lines[1] and "accuracy" in lines[1]
    second = tracked["reports"][1]
    chosen = second["selected"]["phone"]
    size = f"{second['variants'][chosen]['size_bytes']:,}"
    assert any(chosen in line and size in line and tracked["commits"][1][:7] in line
               for line in lines)
    assert "no variant met the budgets" in out and "run failed" in out
    assert sum("interrupted" in line for line in lines) == 2  # a row per target
    assert "p50 measured on: " in out and "estimated for the target's device" in out
    assert "MiB = 1,048,576 bytes" in out
    # timings with 3 significant digits, in µs below 1 ms (LiteRT's are a few µs)
    litert = [line for line in lines if "litert_dynamic" in line]
    assert litert and all(re.search(r"\d+(\.\d+)? µs", line) for line in litert), litert
    # the default folder: out/<recipe name> at the recipe's project root (its git folder)
    chart = work / "out" / "digits-cnn" / "history.png"
    assert f"chart: {chart}" in out
    data = chart.read_bytes()
    assert data.startswith(PNG_MAGIC) and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert 700 <= width <= 2500 and 700 <= height <= 1500, (width, height)
    assert 20_000 < len(data) < 2_000_000
    assert [p.name for p in chart.parent.iterdir()] == ["history.png"]  # no temp file left
    assert not (work / "mlflow.db").exists()


def test_last_runs_into_a_folder(tracked: dict, capsys: pytest.CaptureFixture[str],
                                 tmp_path: Path) -> None:
    code, out, err = _history(capsys, str(tracked["recipe"]), "--last", "2", "-o",
                              str(tmp_path / "charts"), "--json")
    assert code == 0, err
    runs = list(dict.fromkeys(row["run_id"] for row in json.loads(out)))
    assert runs == [tracked["died"], tracked["interrupted"]]
    assert (tmp_path / "charts" / "history.png").read_bytes().startswith(PNG_MAGIC)
    assert f"chart: {tmp_path / 'charts' / 'history.png'}" in err


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = _history(capsys, *args)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and "Traceback" not in err
    assert out == ""
    return err


def test_bad_cases_exit_2(tracked: dict, capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    recipe = str(tracked["recipe"])
    out = ["-o", str(tmp_path / "out")]
    # an invalid recipe: located like `validate` says it
    err = _refused(capsys, str(FIXTURES / "bad_param_type.yaml"), *out)
    assert "bad_param_type.yaml:" in err
    # tracking unreachable (nothing listens on port 1)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert "unreachable" in _refused(capsys, recipe, *out)
    # no store yet: said so, and none is created by asking
    empty = tmp_path / "empty" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{empty}")
    err = _refused(capsys, recipe, *out)
    assert "no runs recorded for recipe 'digits-cnn' yet" in err
    assert f"orchestrator run {recipe}" in err
    assert not empty.exists() and not empty.parent.exists()
    # a store with runs, but none of this recipe
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracked["env"]["MLFLOW_TRACKING_URI"])
    other = tmp_path / "other.yaml"
    other.write_text(Path(recipe).read_text().replace("name: digits-cnn", "name: other")
                     .replace("../examples", str(tracked["work"] / "examples")))
    err = _refused(capsys, str(other), *out)
    assert "no runs recorded for recipe 'other' yet" in err
    assert not (tmp_path / "out" / "history.png").exists()
    with pytest.raises(SystemExit) as exit_info:  # argparse: usage error, exit 2
        main(["history", recipe, "--last", "0"])
    assert exit_info.value.code == 2
    assert "--last" in capsys.readouterr().err


def test_without_labels_the_quality_is_fidelity(
        tracked: dict, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The same recipe (same name, same runs) with unlabelled evaluation data: its history
    charts fidelity, the only quality figure such a recipe has."""
    text = tracked["recipe"].read_text()
    unlabelled = tracked["recipe"].parent / "unlabelled.yaml"  # inside the same project
    unlabelled.write_text(text.replace(", labels: y_test", ""))
    assert unlabelled.read_text() != text
    try:
        code, out, err = _history(capsys, str(unlabelled), "--json", "-o", str(tmp_path))
    finally:
        unlabelled.unlink()
    assert code == 0, err
    second = tracked["reports"][1]
    rows = [row for row in json.loads(out) if row["run_id"] == second["mlflow_run_id"]]
    for row in rows:
        assert row["quality_metric"] == "fidelity"
        assert row["quality"] == pytest.approx(second["variants"][row["selected"]]["fidelity"])
