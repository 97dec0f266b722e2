"""The plan: chained cache keys, from: wiring, measuring stages pass the model key through."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engine.plan import build_plan
from orchestrator.recipe.loading import load_recipe

RECIPE = """
version: 1
name: plan-test
model: {{path: {model}}}
data:
  representative: {{source: {data}, array: x_calib}}
  evaluation: {{source: {data}, inputs: x_test, labels: y_test}}
pipelines:
  fp32:
    stages: [freeze, strip, fold, benchmark, {{evaluate: {{batch_size: 16}}}}]
  int8:
    from: fp32
    stages: [{{quantize_nodes: {{}}}}, {{log_ranges: {{samples: {samples}}}}}, freeze_ranges]
"""


def plan_for(tmp_path: Path, digits: Path, samples: int = 10, overrides: list[str] | None = None):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(model=digits / "saved_model", data=digits / "data.npz",
                                    samples=samples))
    return build_plan(load_recipe(recipe, overrides, check_files=False), None,
                      {"representative": "fp"})


@pytest.fixture
def digits(digits_example: Path) -> Path:
    return digits_example


def test_from_starts_at_the_parents_last_transform(tmp_path: Path, digits: Path) -> None:
    plan = plan_for(tmp_path, digits)
    fp32 = plan.pipelines["fp32"]
    fold = fp32[2]
    assert [n.kind for n in fp32] == ["transform"] * 3 + ["measure"] * 2
    # measuring stages pass the model through unchanged
    assert fp32[3].output_model_key == fold.output_model_key == fp32[4].output_model_key
    assert plan.start_keys["int8"] == fold.key
    assert plan.pipelines["int8"][0].input_model_key == fold.key
    assert fp32[0].input_model_key == plan.source_key
    assert len({n.key for n in plan.nodes}) == len(plan.nodes)


def test_keys_chain_from_parents(tmp_path: Path, digits: Path) -> None:
    base = plan_for(tmp_path, digits)
    changed = plan_for(tmp_path, digits, samples=20)
    same = plan_for(tmp_path, digits)
    assert [n.key for n in base.nodes] == [n.key for n in same.nodes]
    # log_ranges' params change its key and every key after it, nothing before it
    b, c = base.pipelines["int8"], changed.pipelines["int8"]
    assert b[0].key == c[0].key
    assert b[1].key != c[1].key and b[2].key != c[2].key
    assert base.pipelines["fp32"][0].key == changed.pipelines["fp32"][0].key


def test_variant_selection_includes_ancestors(tmp_path: Path, digits: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(model=digits / "saved_model", data=digits / "data.npz",
                                    samples=10))
    plan = build_plan(load_recipe(recipe, check_files=False), ["int8"], {})
    assert list(plan.pipelines) == ["fp32", "int8"]


def _key_for(tmp_path: Path, model_path: str) -> str:
    from orchestrator.engine.plan import source_key

    recipe = tmp_path / "k.yaml"
    recipe.write_text(f"version: 1\nname: k\nmodel: {{path: {model_path}}}\n"
                      "pipelines: {p: {stages: [freeze]}}\n")
    return source_key(load_recipe(recipe, check_files=False))


def test_source_key_covers_weights_next_to_a_named_graph_file(tmp_path: Path) -> None:
    weights = tmp_path / "sm" / "variables" / "variables.data-00000-of-00001"
    weights.parent.mkdir(parents=True)
    (tmp_path / "sm" / "saved_model.pb").write_bytes(b"graph")
    weights.write_bytes(b"weights v1")
    first = _key_for(tmp_path, "sm/saved_model.pb")
    weights.write_bytes(b"weights v2")  # nightly retrain: same graph, new weights
    assert _key_for(tmp_path, "sm/saved_model.pb") != first


def test_source_key_covers_a_checkpoint_named_by_its_prefix(tmp_path: Path) -> None:
    for suffix, content in ((".meta", b"graph"), (".index", b"index"),
                            (".data-00000-of-00001", b"w1")):
        (tmp_path / f"model.ckpt{suffix}").write_bytes(content)
    first = _key_for(tmp_path, "model.ckpt")
    assert _key_for(tmp_path, "model.ckpt.meta") == first  # the same files either way
    (tmp_path / "model.ckpt.data-00000-of-00001").write_bytes(b"w2")
    assert _key_for(tmp_path, "model.ckpt") != first


EIGHT_BIT_RECIPE = """
version: 1
name: float-model-test
model: {{path: {model}}}
data:
  representative: {{source: {data}, array: x_calib}}
pipelines:
  fp32:
    stages: [freeze, strip, fold]
  int8:
    from: fp32
    stages: [quantize_weights, quantize_nodes, log_ranges, freeze_ranges]
  shipped:
    from: int8
    stages: [compact_names]
"""


def test_freeze_ranges_nodes_know_the_float_model(tmp_path: Path, digits: Path) -> None:
    """The float model of an 8-bit lineage is the input of its first 8-bit stage; the
    executor hands it to freeze_ranges (layer diagnostics), and the representative data,
    which freeze_ranges uses when there is some, is part of its key."""
    from orchestrator.engine.node_run import RunData
    from orchestrator.model.artifact import ModelArtifact

    recipe = tmp_path / "r.yaml"
    recipe.write_text(EIGHT_BIT_RECIPE.format(model=digits / "saved_model",
                                              data=digits / "data.npz"))
    loaded = load_recipe(recipe, check_files=False)
    plan = build_plan(loaded, None, {"representative": "a"})
    fp32, int8, shipped = (plan.pipelines[p] for p in ("fp32", "int8", "shipped"))
    assert [n.float_model_key for n in fp32] == [None] * 3
    fold_key = fp32[-1].output_model_key
    assert int8[0].stage == "quantize_weights" and int8[0].input_model_key == fold_key
    freeze_ranges = int8[3]
    assert freeze_ranges.stage == "freeze_ranges"
    assert {n.float_model_key for n in int8 + shipped} == {fold_key}
    assert freeze_ranges.input_model_key != fold_key  # not simply its own input

    other = build_plan(loaded, None, {"representative": "b"}).pipelines["int8"]
    assert other[0].key == int8[0].key  # quantize_weights reads no data
    assert other[1].key != int8[1].key  # quantize_nodes does: its bias correction
    assert other[3].key != freeze_ranges.key

    float_model = ModelArtifact(graph_def=None, inputs=(), outputs=())
    data = RunData(plan, store=None, load_source=lambda: float_model, devices={})
    data.unstored_models[fold_key] = float_model
    ctx = data.context(freeze_ranges)
    assert ctx.float_model is not None and ctx.float_model() is float_model
    assert ctx.representative is not None
    assert data.context(fp32[-1]).float_model is None
