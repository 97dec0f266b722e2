"""A recipe on Dask (a LocalCluster of 2 workers): pipelines that do not depend on each other
run at the same time, parents before their `from:` children, and the report and files are the
local run's. The recipe is the digits model cut to what a scheduler sees: a skipped stage
(ignore_errors) whose model the children on other workers must read, siblings, a
grandchild, a LiteRT file and two benchmarked variants of near-equal latency (the
selection must not follow their race). The full digits recipe (guard, mobile, LiteRT) on
Dask is run by tests/e2e/test_scale_out.py."""

from __future__ import annotations

import json
import re
import shutil
from itertools import combinations
from pathlib import Path

import pytest
from support.project_env import in_project

from orchestrator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

# the recipe's own execution block: Dask, 2 worker processes of 1 thread each
RECIPE = """version: 1
name: dask-digits
model:
  path: ../examples/digits/saved_model
  inputs: [{name: image, dtype: float32, shape: [1, 8, 8, 1]}]
  outputs: [probs]
data:
  representative: {source: ../examples/digits/data.npz, array: x_calib, samples: 200}
  evaluation: {source: ../examples/digits/data.npz, inputs: x_test, labels: y_test}
targets:
  - name: pi
    device: raspberry-pi-3
    budgets: {max_size_mb: 2.0, max_accuracy_drop: 0.02, max_latency_ms: 100}
execution: {executor: dask, workers: 2, threads_per_worker: 1}
pipelines:
  base:
    stages: [freeze, {transform: {transforms: no_such_transform, ignore_errors: true}}]
  # two benchmarked variants of near-equal latency: the selection must not follow their
  # race (a tie within the timings' noise goes to the smaller file, on every runner)
  stripped: {from: base, stages: [strip, benchmark, evaluate]}
  folded: {from: base, stages: [strip, fold, benchmark, evaluate]}
  litert: {from: folded, stages: [{convert_tflite: {mode: dynamic_range}}, evaluate]}
"""
PIPELINES = ["base", "stripped", "folded", "litert"]
# a child starts from its parent's model after this stage (before its measuring stages)
BRANCHES = {"stripped": ("base", "transform"), "folded": ("base", "transform"),
            "litert": ("folded", "fold")}


@pytest.fixture(scope="module")
def dask_runs(digits_example: Path, prefect_server: None,
              tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One store, three runs of RECIPE: the flow as a deployment's worker or `orchestrator
    serve` calls it (its task runner Prefect's default, the recipe's `execution: dask` must
    still fan out: worker processes), then `orchestrator run --executor local` (the command
    line wins over the recipe), then the LocalCluster's workers as threads of this process."""
    from pipelines.recipe_flow import recipe_flow

    work = tmp_path_factory.mktemp("dask")
    recipe = work / "recipes" / "dask.yaml"
    recipe.parent.mkdir()
    recipe.write_text(RECIPE)
    (work / "examples").symlink_to(ROOT / "examples")
    store = work / ".orchestrator"
    env = {"ORCHESTRATOR_HOME": str(store),
           "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    with in_project(work, env):
        flow_report = recipe_flow(str(recipe), variants=PIPELINES, no_cache=True,
                                  output=str(work / "dask"))
        scratch_after_flow = list(store.glob("scratch/*"))
        codes = [main(["run", str(recipe), "-o", str(work / "local"), "--executor", "local"]),
                 main(["run", str(recipe), "-o", str(work / "threads"), "--executor", "dask",
                       "--set", "execution.processes=false"])]
    reports = {name: json.loads((work / name / "report.json").read_text())
               for name in ("dask", "local", "threads")}
    return {"work": work, "store": store, "codes": codes, "reports": reports,
            "flow_report": flow_report, "scratch_after_flow": scratch_after_flow}


def intervals(report: dict) -> dict[str, list[tuple[float, float]]]:
    """Each pipeline's stages as (started, finished), wall clock."""
    return {name: [(s["started"], s["finished"]) for s in variant["stages"]]
            for name, variant in report["variants"].items()}


def overlapping(spans: dict[str, list[tuple[float, float]]]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in combinations(spans, 2)
            if any(s1 < e2 and s2 < e1 for s1, e1 in spans[a] for s2, e2 in spans[b])}


def test_a_flow_prefect_starts_follows_the_recipes_execution_block(dask_runs: dict) -> None:
    """A deployment's worker, or `orchestrator serve`, calls the flow itself: the recipe's
    `execution: dask` fans its pipelines out."""
    report = dask_runs["flow_report"]
    spans = intervals(report)
    assert json.loads((dask_runs["work"] / "dask" / "report.json").read_text())[
        "variants"].keys() == spans.keys()
    assert set(spans) == set(PIPELINES)
    assert all(start <= end for stages in spans.values() for start, end in stages)
    assert overlapping(spans), f"no two pipelines ran a stage at the same time: {spans}"
    # parents still come first: a from: child starts after its parent's last transform
    for child, (parent, stage) in BRANCHES.items():
        ends = dict(zip([s["name"] for s in report["variants"][parent]["stages"]],
                        [end for _, end in spans[parent]], strict=True))
        assert spans[child][0][0] >= ends[stage], child
    assert not dask_runs["scratch_after_flow"]  # the run's scratch: gone


def test_local_run_is_sequential(dask_runs: dict) -> None:
    assert dask_runs["codes"][0] == 0
    stages = sorted(span for spans in intervals(dask_runs["reports"]["local"]).values()
                    for span in spans)
    assert all(e1 <= s2 for (_, e1), (s2, _) in zip(stages, stages[1:], strict=False))


# Stages whose figures are timings (or memory): they differ between any two runs.
MEASURING = {"benchmark", "measure_on_device"}
# A number in a reason or violation, with its unit: this run's timing, or derived from one.
_FIGURE = re.compile(r"\d[\d.,]*(?:\s*(?:%|µs|ms|s|MiB|x))?")


def decisions(report: dict) -> dict:
    """What every run of the recipe must give, on any runner however loaded the host: the
    variant selected per target and which budgets each variant met, each variant's file and
    its quality, the stages' own warnings, the verdict of each reason. Never a timing nor
    what is derived from one (estimates, the figures in the reasons, memory): those differ
    between two correct runs, and the selection must not follow them."""
    def verdict(why: str) -> str:
        return _FIGURE.sub("#", why.split(";")[0].split(",")[0])

    return {
        "selected": report["selected"],
        "reasons": {target: {name: verdict(why) for name, why in reasons.items()}
                    for target, reasons in report["selection_reasons"].items()},
        "variants": {name: {
            **{key: v.get(key) for key in ("artifact", "kind", "size_bytes", "gzip_size_bytes",
                                           "params", "ops", "flops", "precision", "accuracy",
                                           "accuracy_drop", "fidelity")},
            "outputs": [{k: o.get(k) for k in ("name", "shape", "kind", "top1_agreement")}
                        for o in v.get("outputs") or []],
            "stages": [(s["name"], s.get("warnings")) for s in v["stages"]
                       if s["name"] not in MEASURING],
            "targets": {t: {"budgets_ok": r["budgets_ok"], "broken": r.get("broken"),
                            "violations": [_FIGURE.sub("#", x) for x in r["violations"]]}
                        for t, r in v["targets"].items()}}
            for name, v in report["variants"].items()}}


def test_same_report_as_local(dask_runs: dict) -> None:
    work, reports = dask_runs["work"], dask_runs["reports"]
    assert not any(s["cached"] for v in reports["dask"]["variants"].values()
                   for s in v["stages"])  # --no-cache: every stage ran on a worker
    assert dask_runs["codes"] == [0, 0]
    # two variants meet the budgets, and both were timed: the selection had to decide
    passing = [n for n, v in reports["local"]["variants"].items()
               if v["targets"]["pi"]["budgets_ok"]]
    assert {"stripped", "folded"} <= set(passing), passing
    assert all(reports["local"]["variants"][n]["latency_ms"] for n in ("stripped", "folded"))
    for run in ("dask", "threads"):
        assert decisions(reports[run]) == decisions(reports["local"]), run
        for name, variant in reports["local"]["variants"].items():
            artifact = variant["artifact"]
            assert (work / run / artifact).read_bytes() == (
                work / "local" / artifact).read_bytes(), (run, name)


def test_skipped_stage_model_reaches_other_workers(dask_runs: dict) -> None:
    """ignore_errors passes its input on outside the cache: on Dask through the run's
    scratch store, so the children on the other worker read it; none of it is cached, and
    the scratch store is gone after the run."""
    work, reports = dask_runs["work"], dask_runs["reports"]
    for name in ("base", "stripped", "folded"):
        for run in ("dask", "threads"):
            assert (work / run / name / "model.pb").read_bytes() == (
                work / "local" / name / "model.pb").read_bytes(), (run, name)
    # the local run, after the Dask one in the same store: freeze was cached, and everything
    # after the skipped stage was computed again
    local = reports["local"]["variants"]
    assert [s["cached"] for s in local["base"]["stages"]] == [True, False]
    assert [s["cached"] for s in local["folded"]["stages"]] == [False] * 4
    assert "ignore_errors" in local["base"]["stages"][1]["warnings"][0]
    assert not any((dask_runs["store"] / "scratch").iterdir())


def test_unreachable_scheduler_exits_2_and_writes_nothing(
        digits_example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
    assert not (tmp_path / "out").exists()  # nothing written


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
    assert not (tmp_path / "out").exists()  # nothing written
    assert not list((tmp_path / ".orchestrator" / "cache").rglob("*.tmp"))
