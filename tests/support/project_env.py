"""A module-scoped fixture's way to run commands in a project folder of its own, and a new
MLflow database for one."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def in_project(work: Path, env: Mapping[str, str]) -> Iterator[None]:
    """The cwd at `work` and `env` set in os.environ; both as they were afterwards."""
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    cwd = Path.cwd()
    os.chdir(work)
    try:
        yield
    finally:
        os.chdir(cwd)
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def new_mlflow_database(template: Path, folder: Path) -> str:
    """folder/mlflow.db, a copy of `template` (tests/conftest.py: mlflow_template) as MLflow
    would have made it there, its Default experiment's artifacts in folder/0 (MLflow's
    default, ./mlruns, for a project whose database is in its mlruns/); its tracking URI."""
    folder.mkdir(parents=True, exist_ok=True)
    database = folder / "mlflow.db"
    shutil.copyfile(template, database)
    with sqlite3.connect(database) as connection:
        connection.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                           (str(folder.resolve() / "0"),))
    connection.close()
    return f"sqlite:///{database}"


def run_recipe_in(work: Path, recipe_text: str, out: Path, *args: str) -> int:
    """`orchestrator run` in process of `recipe_text`, written to `work`/recipe.yaml, with
    `work` as the project: its cwd, its store and its own MLflow database."""
    from orchestrator.cli.main import main

    recipe = work / "recipe.yaml"
    recipe.write_text(recipe_text)
    (work / "mlruns").mkdir(exist_ok=True)
    env = {"ORCHESTRATOR_HOME": str(work / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlruns' / 'mlflow.db'}"}
    with in_project(work, env):
        return main(["run", str(recipe), "-o", str(out), *args])


def run_recipe(work: Path, recipe: str) -> tuple[int, dict[str, Any]]:
    """`orchestrator run` of `recipe` (YAML text, written to work/recipe.yaml) in `work`,
    with its own store and MLflow database as the workspace fixture gives a test, for a
    module-scoped fixture; returns the exit code and report.json."""
    code = run_recipe_in(work, recipe, work / "out")
    return code, json.loads((work / "out" / "report.json").read_text())
