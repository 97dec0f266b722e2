"""`orchestrator ui` on bad input: exit 2 with one line naming the thing, nothing started.

The dashboards themselves (real MLflow and Prefect servers, a real browser) are tested in
tests/e2e/test_dashboards.py.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.cli.ui import CLASSIC_VIEW, mlflow_url


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with a recipe and an MLflow store, and no env overrides."""
    for name in ("ORCHESTRATOR_HOME", "MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "proj"
    (root / "recipes").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (root / "recipes" / "r.yaml").write_text("version: 1\nname: my-recipe\n")
    (root / "mlruns").mkdir()
    (root / "mlruns" / "mlflow.db").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    return root


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def listing(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


@pytest.mark.parametrize("option", ["--mlflow-port", "--prefect-port"])
def test_a_taken_port_is_exit_2_naming_it(project: Path, taken_port: int, option: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    before = listing(project)
    code = cli.main(["ui", str(project / "recipes" / "r.yaml"), option, str(taken_port)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"port {taken_port} is taken ({option} {taken_port})" in err
    assert len(err.strip().splitlines()) == 1
    assert listing(project) == before  # no store folder, no server record, no log


def test_a_missing_target_is_exit_2_naming_it(project: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["ui", str(project / "recipes" / "nope.yaml")])
    assert code == 2
    assert "nope.yaml: no such recipe file or project folder" in capsys.readouterr().err


def test_a_project_without_runs_is_exit_2_naming_the_store(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "mlruns" / "mlflow.db").unlink()
    code = cli.main(["ui", str(project)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{project / 'mlruns' / 'mlflow.db'}: no MLflow runs here yet" in err
    assert not (project / "mlruns" / "mlflow.db").exists()  # not created by the UI


def test_a_recipe_without_a_name_is_exit_2(project: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (project / "recipes" / "r.yaml").write_text("version: 1\n")
    code = cli.main(["ui", str(project / "recipes" / "r.yaml")])
    assert code == 2
    assert "r.yaml [name]: the recipe has no `name`" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["0", "65536", "web"])
def test_a_bad_port_is_a_usage_error(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["ui", "--mlflow-port", port])
    assert caught.value.code == 2
    assert "is not a port" in capsys.readouterr().err


def test_mlflow_links_open_the_classic_tracking_view() -> None:
    base = "http://127.0.0.1:5000"
    assert mlflow_url(base, "7") == f"{base}/#/experiments/7/runs?{CLASSIC_VIEW}"
    assert mlflow_url(base, None) == f"{base}/#/experiments?{CLASSIC_VIEW}"
    assert CLASSIC_VIEW == "workflowType=machine_learning"


def test_prefect_keeps_its_runs_in_the_project_as_mlflow_does(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cache.project import local_home
    from orchestrator.flow.local_server import DATABASE_ENV, database_env

    monkeypatch.delenv("PREFECT_HOME", raising=False)
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    home = local_home(project)
    # the server `run`, `ui` and `serve` share is given the project's database: its UI
    # lists this project's flow runs, not every project's on the machine (~/.prefect)
    assert database_env(home) == {
        DATABASE_ENV: f"sqlite+aiosqlite:///{project / '.orchestrator' / 'prefect.db'}"}
    # a database the user names stays theirs
    monkeypatch.setenv("PREFECT_HOME", str(project / "elsewhere"))
    assert database_env(home) == {}
    monkeypatch.delenv("PREFECT_HOME")
    monkeypatch.setenv(DATABASE_ENV, "postgresql+asyncpg://db/prefect")
    assert database_env(home) == {}
