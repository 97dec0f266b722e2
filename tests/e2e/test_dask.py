"""The digits recipe on Dask (`--executor dask`, a LocalCluster of 2 workers): pipelines that
do not depend on each other run at the same time, and the report is the local run's."""

from __future__ import annotations

import json
import shutil
import sys
from itertools import combinations
from pathlib import Path

import pytest
from project_env import in_project

from orchestrator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "robustness"))
from robust_helpers import comparable_report  # noqa: E402

pytestmark = pytest.mark.slow

# the LocalCluster: 2 worker processes of 1 thread each (the recipe's execution block)
EXECUTION = "execution: {executor: local, workers: 2, threads_per_worker: 1}\n"


@pytest.fixture(scope="module")
def dask_runs(digits_example: Path, prefect_server: None,
              tmp_path_factory: pytest.TempPathFactory) -> dict:
    """recipes/digits.yaml run locally, then on Dask with every stage computed again."""
    work = tmp_path_factory.mktemp("dask")
    recipe = work / "recipes" / "digits.yaml"
    recipe.parent.mkdir()
    recipe.write_text((ROOT / "recipes" / "digits.yaml").read_text() + EXECUTION)
    (work / "examples").symlink_to(ROOT / "examples")
    env = {"ORCHESTRATOR_HOME": str(work / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    with in_project(work, env):
        local = main(["run", str(recipe), "-o", str(work / "local")])
        # the command line wins over the recipe's `executor: local`
        dask = main(["run", str(recipe), "-o", str(work / "dask"), "--no-cache",
                     "--executor", "dask"])
        bad = main(["run", str(recipe), "-o", str(work / "bad"), "--executor", "dask",
                    "--dask-address", "tcp://127.0.0.1:1"])
    reports = {name: json.loads((work / name / "report.json").read_text())
               for name in ("local", "dask")}
    return {"work": work, "codes": (local, dask, bad), "reports": reports}


def intervals(report: dict) -> dict[str, list[tuple[float, float]]]:
    """Each pipeline's stages as (started, finished), wall clock."""
    return {name: [(s["started"], s["finished"]) for s in variant["stages"]]
            for name, variant in report["variants"].items()}


def test_pipelines_overlap_on_dask(dask_runs: dict) -> None:
    assert dask_runs["codes"][:2] == (0, 0)
    spans = intervals(dask_runs["reports"]["dask"])
    assert all(start <= end for stages in spans.values() for start, end in stages)
    overlapping = {(a, b) for a, b in combinations(spans, 2)
                   if any(s1 < e2 and s2 < e1 for s1, e1 in spans[a] for s2, e2 in spans[b])}
    assert overlapping, f"no two pipelines ran a stage at the same time: {spans}"
    # parents still come first: a from: child starts after its parent's last transform
    fp32 = dict(zip([s["name"] for s in dask_runs["reports"]["dask"]["variants"]["fp32"][
        "stages"]], spans["fp32"], strict=True))
    for child in ("int8", "litert_int8", "litert_dynamic"):
        assert spans[child][0][0] >= fp32["fold"][1], child


def test_local_run_is_sequential(dask_runs: dict) -> None:
    stages = sorted(span for spans in intervals(dask_runs["reports"]["local"]).values()
                    for span in spans)
    assert all(e1 <= s2 for (_, e1), (s2, _) in zip(stages, stages[1:], strict=False))


def test_same_report_as_local(dask_runs: dict) -> None:
    work, reports = dask_runs["work"], dask_runs["reports"]
    assert not any(s["cached"] for v in reports["dask"]["variants"].values()
                   for s in v["stages"])  # --no-cache: every stage ran on a worker
    assert comparable_report(reports["dask"], work / "dask") == comparable_report(
        reports["local"], work / "local")
    for name in reports["local"]["variants"]:
        artifact = reports["local"]["variants"][name]["artifact"]
        assert (work / "dask" / artifact).read_bytes() == (work / "local" / artifact
                                                           ).read_bytes() or name == "mobile"


def test_unreachable_scheduler_writes_nothing(dask_runs: dict) -> None:
    assert dask_runs["codes"][2] == 2
    assert not (dask_runs["work"] / "bad").exists()  # nothing written


def test_unreachable_scheduler_message(digits_example: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "recipes" / "digits.yaml"
    recipe.parent.mkdir()
    shutil.copy(ROOT / "recipes" / "digits.yaml", recipe)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {"ORCHESTRATOR_HOME": str(tmp_path / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    with in_project(tmp_path, env):
        code = main(["run", str(recipe), "-o", str(tmp_path / "out"), "--executor", "dask",
                     "--dask-address", "tcp://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "tcp://127.0.0.1:1" in err and "no Dask scheduler" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


SKIPPING = """version: 1
name: skipping
model: {path: ../examples/digits/saved_model}
data: {evaluation: {source: ../examples/digits/data.npz, inputs: x_test, labels: y_test}}
execution: {executor: dask, workers: 2, threads_per_worker: 1}
pipelines:
  base:
    stages: [freeze, {transform: {transforms: no_such_transform, ignore_errors: true}}]
  stripped: {from: base, stages: [strip, evaluate]}
  folded: {from: base, stages: [strip, fold, evaluate]}
"""


def test_skipped_stage_model_reaches_other_workers(digits_example: Path, prefect_server: None,
                                                   tmp_path: Path) -> None:
    """ignore_errors passes its input on outside the cache: on Dask through the run's
    scratch store, so the children on the other worker read it; none of it is cached, and
    the scratch store is gone after the run."""
    recipe = tmp_path / "recipes" / "skipping.yaml"
    recipe.parent.mkdir()
    recipe.write_text(SKIPPING)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    store = tmp_path / ".orchestrator"
    env = {"ORCHESTRATOR_HOME": str(store),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    runs = {"dask": ["--executor", "dask"], "local": ["--executor", "local"],
            # the LocalCluster's workers as threads of this process
            "threads": ["--executor", "dask", "--set", "execution.processes=false"]}
    with in_project(tmp_path, env):
        codes = [main(["run", str(recipe), "-o", str(tmp_path / name), *args])
                 for name, args in runs.items()]
    assert codes == [0, 0, 0]
    reports = {name: json.loads((tmp_path / name / "report.json").read_text())
               for name in runs}
    for name in ("base", "stripped", "folded"):
        for run in ("dask", "threads"):
            assert (tmp_path / run / name / "model.pb").read_bytes() == (
                tmp_path / "local" / name / "model.pb").read_bytes(), (run, name)
    # the local run computed everything again: nothing after the skipped stage was cached
    assert [s["cached"] for s in reports["local"]["variants"]["folded"]["stages"]] == [
        False, False, False]
    for run in ("dask", "threads"):
        assert comparable_report(reports[run], tmp_path / run) == comparable_report(
            reports["local"], tmp_path / "local")
    assert not any((store / "scratch").iterdir())


FAILING = """version: 1
name: failing
model: {path: ../examples/digits/saved_model}
execution: {executor: dask, workers: 2, threads_per_worker: 1}
pipelines:
  base: {stages: [freeze]}
  good: {from: base, stages: [strip, fold, summarize]}
  bad: {from: base, stages: [{transform: {transforms: no_such_transform}}, summarize]}
"""


def test_failing_stage_on_a_worker_exits_3_naming_it(
        digits_example: Path, prefect_server: None, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "recipes" / "failing.yaml"
    recipe.parent.mkdir()
    recipe.write_text(FAILING)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {"ORCHESTRATOR_HOME": str(tmp_path / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    with in_project(tmp_path, env):
        code = main(["run", str(recipe), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 3
    assert "stage bad/transform failed" in err and "no_such_transform" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # outputs discarded
    assert not list((tmp_path / ".orchestrator" / "cache").rglob("*.tmp"))


def test_a_flow_prefect_starts_follows_the_recipes_execution_block(
        digits_example: Path, prefect_server: None, tmp_path: Path) -> None:
    """A deployment's worker, or `orchestrator serve`, calls the flow itself, whose task
    runner is Prefect's default: the recipe's `execution: dask` must still fan out."""
    from pipelines.recipe_flow import recipe_flow

    recipe = tmp_path / "recipes" / "digits.yaml"
    recipe.parent.mkdir()
    recipe.write_text((ROOT / "recipes" / "digits.yaml").read_text() +
                      "execution: {executor: dask, workers: 2, threads_per_worker: 1}\n")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {"ORCHESTRATOR_HOME": str(tmp_path / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    with in_project(tmp_path, env):
        report = recipe_flow(str(recipe), variants=["fp32", "int8", "litert_int8"],
                             output=str(tmp_path / "out"))
    spans = intervals(report)
    assert set(spans) == {"fp32", "int8", "litert_int8"}
    overlapping = [(a, b) for a, b in combinations(spans, 2)
                   if any(s1 < e2 and s2 < e1 for s1, e1 in spans[a] for s2, e2 in spans[b])]
    assert overlapping, f"no two pipelines ran a stage at the same time: {spans}"
    assert json.loads((tmp_path / "out" / "report.json").read_text())["variants"].keys() == \
        spans.keys()
    assert not list((tmp_path / ".orchestrator").glob("scratch/*"))  # the run's scratch: gone
