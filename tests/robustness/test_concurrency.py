"""Issue 9, concurrency on a new machine: four `orchestrator run`s started together on an
empty store (ORCHESTRATOR_HOME) and an empty tracking folder (mlruns/, sqlite) used to fail
three times in four, each run creating MLflow's tables at once. All four must succeed,
with the same report apart from per-run fields (timings, measured memory, run ids, which
stages came from the cache), and leave a consistent store.

The runs share the session's Prefect server (PREFECT_API_URL): the race under test is the
store's and MLflow's; tests/flow/test_prefect_server.py covers runs sharing a local server.
The recipe is small (the stages are not under test, the first writes to an empty store
and an empty MLflow database are): two pipelines, one an 8-bit lineage from the other,
an evaluation, so that the four runs race for shared cache entries, metrics and the
report's pictures."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from support.robust_helpers import (
    RUN_TIMEOUT_S,
    base_env,
    comparable_report,
    output_is_whole_or_absent,
    partial_cache_entries,
    small_recipe,
    start_cli,
    wait_all,
    write_yaml,
)

pytestmark = pytest.mark.slow

RUNS = 4


def test_four_cold_starts_at_once(digits_example: Path, tmp_path: Path,
                                  prefect_api_url: str) -> None:
    home, mlruns = tmp_path / ".orchestrator", tmp_path / "mlruns"
    mlruns.mkdir()
    assert not home.exists() and not any(mlruns.iterdir())
    env = base_env(home, f"sqlite:///{mlruns / 'mlflow.db'}", prefect_api_url)
    data = small_recipe("cold-starts", stages=["freeze", "strip", "fold", "evaluate"],
                        evaluation=True)
    data["pipelines"]["int8"] = {"from": "fp32", "stages": ["quantize_weights", "evaluate"]}
    recipe = write_yaml(tmp_path / "recipes" / "cold.yaml", data)
    runs = [start_cli(["run", recipe, "-o", tmp_path / f"out{i}"], env,
                      tmp_path, tmp_path / f"logs{i}") for i in range(RUNS)]
    codes = wait_all(runs, RUN_TIMEOUT_S * 2)
    for i, (run, code) in enumerate(zip(runs, codes, strict=True)):
        print(f"run {i}: exit {code}")
        assert code == 0, f"run {i} exit {code}:\n{run.stderr()[-3000:]}"
        assert "Traceback" not in run.stderr()
    reports = []
    for i in range(RUNS):
        out = tmp_path / f"out{i}"
        assert output_is_whole_or_absent(out) == "whole"
        reports.append(comparable_report(json.loads((out / "report.json").read_text()), out))
    for i in range(1, RUNS):
        assert reports[i] == reports[0], _first_difference(reports[0], reports[i])
    assert partial_cache_entries(home) == []
    # four parent runs in one experiment, each with its own id
    with sqlite3.connect(mlruns / "mlflow.db") as db:
        ids = [json.loads((tmp_path / f"out{i}" / "report.json").read_text())["mlflow_run_id"]
               for i in range(RUNS)]
        assert len(set(ids)) == RUNS
        found = {row[0] for row in db.execute("SELECT run_uuid FROM runs")}
        assert set(ids) <= found


def _first_difference(a: object, b: object, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"reports differ at {path or '<top>'}: {a!r} != {b!r}"
