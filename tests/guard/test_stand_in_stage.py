"""The seam: a quantization method is one module. A stand-in quantizing stage, declared here
and nowhere else, with knobs of its own (layers back to float, a whole-stage `levels`
alternative, a fallback), is searched by the accuracy guard through a real recipe run
(Prefect flow, MLflow, the store) without a line changed outside this file."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import Field

from orchestrator.cli.main import main
from orchestrator.model.graph_rewrite import const_value, copy_graph, set_const_value
from orchestrator.quant.knobs import (
    FLOAT,
    Alternative,
    Candidate,
    Fallback,
    FoundLayers,
    Knobs,
    Layer,
    LayerSource,
    with_params,
)
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageParams, StageResult

ROOT = Path(__file__).resolve().parents[2]
WEIGHT_OPS = ("Conv2D", "MatMul")
STAND_IN = "coarse_weights_stand_in"

pytestmark = pytest.mark.slow


class Params(StageParams):
    levels: int = Field(2, description="Uniform levels per weight tensor.")
    keep_float: list[str] = Field([], description="Weight ops whose weights stay float.")
    guard: bool = Field(False, description="Accuracy guard.")


def _weights(graph):  # noqa: ANN001, ANN202  the Const each weight op reads
    nodes = {n.name: n for n in graph.node}
    for node in graph.node:
        if node.op in WEIGHT_OPS and nodes[node.input[1]].op == "Const":
            yield node, nodes[node.input[1]]


def run(artifact, params: Params, ctx) -> StageResult:  # noqa: ANN001
    """Every weight tensor rounded to `levels` levels over its range, but `keep_float`'s;
    per layer, the error its weights took (normalized MSE) for the guard's ranking."""
    graph, rows = copy_graph(artifact.graph_def), []
    for op, const in _weights(graph):
        value = const_value(const)
        if op.name in params.keep_float:
            continue
        low, high = float(value.min()), float(value.max())
        step = (high - low) / max(params.levels - 1, 1)
        rounded = (np.round((value - low) / step) * step + low).astype(np.float32)
        set_const_value(const, rounded)
        nmse = float(np.mean((rounded - value) ** 2) / max(np.mean(value ** 2), 1e-12))
        rows.append({"node": op.name, "op": op.op, "nmse": nmse})
    return StageResult(dataclasses.replace(artifact, graph_def=graph),
                       info={"layer_errors": rows})


def _candidate(params: Params, candidate: Candidate) -> Params:
    if candidate.fallback:  # the whole-model answer: 8-bit weights everywhere
        return with_params(params, levels=256, keep_float=[])
    update: dict[str, object] = {"keep_float": sorted({*params.keep_float,
                                                       *candidate.nodes_in(FLOAT.name)})}
    if candidate.option("levels") is not None:
        update["levels"] = candidate.option("levels")
    return with_params(params, **update)


def _layers(source: LayerSource) -> FoundLayers:
    return FoundLayers([Layer(r["node"], (r["node"],), True)
                        for r in source.info.get("layer_errors") or []])


KNOBS = Knobs(
    steers=lambda params: True, guarded=lambda params: params.guard, layers=_layers,
    ladder=(FLOAT,), kernels="coarse weights", guard_setting=f"{STAND_IN}: {{guard: true}}",
    fallback=Fallback("8-bit weights", "8-bit weights", "coarse variant",
                      change="every layer -> 8-bit weights"),
    alternatives=(Alternative("levels", lambda params, tune, errors: (16,),
                              lambda value: f"{value} levels", lambda value: f"levels {value}"),))

RECIPE = f"""\
version: 1
name: stand-in
model:
  path: {ROOT}/examples/digits/saved_model
  inputs: [{{name: image, dtype: float32, shape: [1, 8, 8, 1]}}]
  outputs: [probs]
data:
  evaluation: {{source: {ROOT}/examples/digits/data.npz, inputs: x_test, labels: y_test}}
targets:
  - {{name: phone, device: phone-2016, budgets: {{max_accuracy_drop: 0.02}}}}
pipelines:
  fp32: {{stages: [freeze, strip, fold, evaluate]}}
  coarse:
    from: fp32
    stages: [{{{STAND_IN}: {{levels: 2, guard: true}}}}, evaluate]
"""


@pytest.fixture
def stand_in_stage() -> Stage:
    """Registered for this test only (the registry is the process's)."""
    from orchestrator.stages import _REGISTRY

    stage = register(Stage(name=STAND_IN, run=run, params=Params, doc="A stand-in.",
                           knobs=KNOBS, candidate=_candidate))
    yield stage
    _REGISTRY.pop(STAND_IN, None)


def test_the_guard_searches_a_stage_it_has_never_heard_of(
        stand_in_stage: Stage, workspace: Path, digits_example: Path, prefect_server: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = workspace / "stand_in.yaml"
    recipe.write_text(RECIPE)
    monkeypatch.chdir(workspace)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(["run", str(recipe), "--output", str(workspace / "out")])
    report = json.loads((workspace / "out" / "report.json").read_text())
    # its rows carry only what the guard needs (node, op, nmse): the page shows them anyway
    assert "not written" not in printed.getvalue(), printed.getvalue()
    page = (workspace / "out" / "report.html").read_text()
    variant = report["variants"]["coarse"]
    trials = variant["trials"]
    assert code == 0, variant.get("warnings")
    # the recipe's own 2-level weights break the budget; the search moved layers to float
    assert not trials[0]["meets_budgets"] and trials[0]["accuracy_drop"] > 0.02
    chosen = [t for t in trials if t["chosen"]]
    assert len(chosen) == 1 and chosen[0]["meets_budgets"]
    assert chosen[0]["accuracy_drop"] <= 0.02 < trials[0]["accuracy_drop"]
    # it got there through the stand-in's own knobs: layers to float, or its `levels`
    assert chosen[0]["settings"]["float"] or chosen[0]["settings"]["levels"] == 16
    weights = {r["node"] for r in variant["layer_errors"]}  # the chosen file's coarse ones
    assert not weights & set(chosen[0]["settings"]["float"])
    # every trial's settings list the stand-in's own knob beside the others, and the page too
    assert all("levels" in t["settings"] for t in trials)
    if chosen[0]["settings"]["levels"] is not None:
        assert f"levels: {chosen[0]['settings']['levels']}" in page
    # trials are judged on the search part of the evaluation data; the chosen one again on
    # the held-out part (a check), then on every sample: those are the variant's figures
    confirmed = variant["guard_confirmation"]
    assert confirmed["trial"] == chosen[0]["trial"]
    assert confirmed["search"]["accuracy_drop"] == chosen[0]["accuracy_drop"]
    samples = confirmed["search"]["evaluation_samples"], confirmed["held_out"][
        "evaluation_samples"]
    assert samples[1] < samples[0] and abs(samples[1] / sum(samples) - 0.25) < 0.02
    assert variant["metrics"]["evaluation_samples"] == sum(samples)
    # the held-out part contradicts the budget only where even its optimistic bound misses
    assert confirmed["consistent"] == (not confirmed["contradicted"])
    assert confirmed["consistent"] == (confirmed["held_out"]["accuracy_drop_low"] <= 0.02)
    assert [d["trial"] for d in variant["guard_decisions"]] == [
        t["trial"] for t in trials[1:]]
