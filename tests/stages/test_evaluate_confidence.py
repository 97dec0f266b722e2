"""evaluate's verdicts with their uncertainty: Wilson and bootstrap bounds of its figures,
budgets met only at the bound, the held-out split, evaluation samples that are also
representative ones, and a .tflite judged under each LiteRT kernel set."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from support import quant_fixtures
from support.quant_fixtures import apply

from orchestrator.data.evaluation_parts import held_out_rows
from orchestrator.errors import DataError
from orchestrator.measure.budgets import quality_violations
from orchestrator.measure.confidence import proportion_bounds, sqnr_bounds
from orchestrator.measure.fidelity import sqnr_db
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.stages import get_stage
from orchestrator.stages.base import EvaluationData, StageContext

cnn, digits = quant_fixtures.cnn, quant_fixtures.digits


def identity(width: int = 3) -> ModelArtifact:
    """outputs = inputs: the references alone decide every figure."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, width], name="x")
        tf.identity(x, name="out")
    return ModelArtifact(graph_def=graph.as_graph_def(),
                         inputs=(TensorSpec("x", "float32", (None, width)),), outputs=("out",))


def scores(n: int, seed: int = 0) -> np.ndarray:
    """n softmax rows of 3 classes."""
    logits = np.random.default_rng(seed).normal(size=(n, 3)).astype(np.float32)
    e = np.exp(logits)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def flipped(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`x` with the top class of `rows` moved elsewhere: the model disagrees there."""
    ref = x.copy()
    ref[rows] = np.roll(ref[rows], 1, axis=1)
    return ref


def evaluate(artifact: ModelArtifact, inputs: np.ndarray, reference, labels=None,
             representative: np.ndarray | None = None, **params):
    data = EvaluationData(inputs=inputs, labels=labels)

    def batches(samples, size):
        for start in range(0, len(representative), size):
            yield representative[start:start + size]

    ctx = StageContext(pipeline="p", stage="evaluate", evaluation=lambda: data,
                       reference_outputs=lambda: reference,
                       representative=None if representative is None else batches)
    stage = get_stage("evaluate")
    return stage.run(artifact, stage.params(**params), ctx)


def budgets(**given) -> SimpleNamespace:
    fields = {"max_accuracy_drop": None, "min_fidelity": None, "min_sqnr_db": None,
              "outputs": None}
    return SimpleNamespace(**{**fields, **given})


@pytest.mark.parametrize(("n", "disagree", "met"), [(300, 0, True), (300, 2, False),
                                                    (100, 0, False)])
def test_fidelity_bounds_and_the_budget_judged_at_the_lower_one(n, disagree, met) -> None:
    x = scores(n)
    result = evaluate(identity(), x, flipped(x, np.arange(disagree)))
    m = result.metrics
    assert m["fidelity"] == pytest.approx((n - disagree) / n)
    assert (m["fidelity_low"], m["fidelity_high"]) == pytest.approx(
        proportion_bounds((n - disagree) / n, n, 0.9))
    assert m["top1_agreement_low.out"] == m["fidelity_low"] and m["confidence"] == 0.9
    assert m["evaluation_samples"] == n
    violations = quality_violations(m, budgets(min_fidelity=0.99))
    assert (not violations) == met
    if n == 300 and disagree == 2:
        # 0.9933 would pass on its face; its lower bound 0.9841 does not
        assert violations == ["fidelity 0.9933 (90% lower bound 0.9841) < min_fidelity 0.99"]
    if n == 100:
        assert "100 evaluation samples cannot show 0.99 met at 90%" in violations[0]
        assert "it needs 163" in violations[0]
    # a surer verdict has a lower bound further down
    surer = evaluate(identity(), x, flipped(x, np.arange(disagree)), confidence=0.99)
    assert surer.metrics["fidelity_low"] < m["fidelity_low"]


def test_accuracy_and_sqnr_get_bounds() -> None:
    n = 200
    x = scores(n)
    labels = x.argmax(axis=1)
    reference = flipped(x, np.arange(4))  # the source wrong on 4: this model is better
    m = evaluate(identity(), x, reference, labels=labels).metrics
    assert m["accuracy"] == 1.0
    assert m["accuracy_low"] == pytest.approx(proportion_bounds(1.0, n)[0])
    assert m["accuracy_drop"] == pytest.approx(-0.02)
    assert m["accuracy_drop_low"] < -0.02 < m["accuracy_drop_high"] < 0.0
    # values (no labels, not probabilities): SQNR with its bootstrap bounds
    rng = np.random.default_rng(1)
    values = rng.normal(size=(n, 3)).astype(np.float32)
    ref = values + rng.normal(scale=0.05, size=values.shape).astype(np.float32)
    m = evaluate(identity(), values, ref).metrics
    assert m["sqnr_db.out"] == pytest.approx(sqnr_db(values, ref))
    assert (m["sqnr_db_low.out"], m["sqnr_db_high.out"]) == pytest.approx(
        sqnr_bounds(values, ref, 0.9))
    assert m["sqnr_db_low.out"] < m["sqnr_db.out"] < m["sqnr_db_high.out"]
    assert m["min_sqnr_db_low"] == m["sqnr_db_low.out"]
    assert m["fidelity_low"] == pytest.approx(1 - 10 ** (-m["sqnr_db_low.out"] / 10))
    # an SQNR budget between the bound and the figure: broken, at the bound
    limit = (m["sqnr_db_low.out"] + m["sqnr_db.out"]) / 2
    [broken] = quality_violations(m, budgets(min_sqnr_db=limit))
    assert "90% lower bound" in broken and broken.kind == "sqnr"


def test_the_held_out_part_is_fixed_and_apart_from_the_search_part() -> None:
    n = 300
    held = held_out_rows(n, 0.25)
    assert len(held) == 75 and np.array_equal(held, held_out_rows(n, 0.25))
    x = scores(n)
    disagree = held[:3]  # every disagreement is held out
    reference = flipped(x, disagree)
    parts = {part: evaluate(identity(), x, reference, part=part)
             for part in ("all", "search", "held_out")}
    assert parts["all"].metrics["fidelity"] == pytest.approx(297 / 300)
    assert parts["search"].metrics["fidelity"] == 1.0
    assert parts["held_out"].metrics["fidelity"] == pytest.approx(72 / 75)
    assert parts["search"].info["part"] == {"part": "search", "of": 300, "samples": 225,
                                            "held_out_share": 0.25}
    assert parts["held_out"].info["samples"] == 75
    assert parts["held_out"].metrics["evaluation_samples"] == 75
    with pytest.raises(DataError, match="cannot be split"):
        held_out_rows(1, 0.25)


def test_evaluation_samples_that_are_representative_ones_are_left_out() -> None:
    x = scores(120)
    reference = flipped(x, np.arange(10))  # the model disagrees on the first 10 only
    representative = np.concatenate([x[:30], scores(50, seed=9)])  # 30 shared rows
    result = evaluate(identity(), x, reference, representative=representative)
    assert ("30 of 120 evaluation samples are also representative samples, which every "
            "method was fit on: judged on the other 90") in result.warnings
    assert result.info["samples"] == 90 and result.info["part"]["representative_overlap"] == 30
    assert result.metrics["fidelity"] == 1.0  # the 10 disagreements were all shared rows
    # all shared: kept, with a louder warning
    everything = evaluate(identity(), x, reference, representative=x)
    assert everything.info["samples"] == 120
    assert any(w.startswith("ALL 120 evaluation samples") for w in everything.warnings)
    assert everything.metrics["fidelity"] == pytest.approx(110 / 120)


@pytest.fixture(scope="module")
def int8_tflite(cnn: ModelArtifact, digits: dict[str, np.ndarray]) -> ModelArtifact:
    return apply("convert_tflite", cnn, digits["x_calib"], mode="int8").artifact


def test_a_tflite_is_judged_under_each_kernel_set_at_its_worst(
        int8_tflite: ModelArtifact, cnn: ModelArtifact, digits: dict[str, np.ndarray]) -> None:
    from orchestrator.measure.litert_runtime import LiteRTRunner

    x, labels = digits["x_test"][:200], digits["y_test"][:200]
    reference = quant_fixtures.predict(cnn, x)
    result = evaluate(int8_tflite, x, reference, labels=labels)
    sets = result.info["kernel_sets"]
    name = result.info["outputs"][0]["name"]
    assert list(sets) == ["default", "builtin"]
    for kernels, figures in sets.items():  # each set's figures are its own runs'
        with LiteRTRunner(int8_tflite, kernels=kernels) as runner:
            out = runner.predict_all(x)[0]
        assert figures["outputs"][name]["sqnr_db"] == pytest.approx(
            sqnr_db(out, reference))
        assert figures["fidelity"] == pytest.approx(
            np.mean(out.argmax(1) == reference.argmax(1)))
        assert result.metrics[f"fidelity_{kernels}"] == figures["fidelity"]
    # XNNPACK and the builtin kernels round differently: not the same outputs
    per_set = [f["outputs"][name]["sqnr_db"] for f in sets.values()]
    assert per_set[0] != per_set[1]
    # the headline is the worst of them
    assert result.metrics[f"sqnr_db.{name}"] == min(per_set)
    assert result.metrics["fidelity"] == min(f["fidelity"] for f in sets.values())
    assert result.metrics["accuracy"] == min(f["accuracy"] for f in sets.values())
    assert result.info["worst_kernel_set"] in sets
    one = evaluate(int8_tflite, x, reference, kernel_sets=["builtin"])
    assert "kernel_sets" not in one.info
    assert one.metrics[f"sqnr_db.{name}"] == sets["builtin"]["outputs"][name]["sqnr_db"]


def test_the_report_judges_a_variant_at_its_bounds() -> None:
    from orchestrator.measure.budgets import variant_quality_metrics

    x = scores(300)
    m = evaluate(identity(), x, flipped(x, np.arange(2))).metrics
    variant = {"fidelity": m["fidelity"], "accuracy_drop": None, "metrics": m,
               "outputs": [{"name": "out", "top1_agreement": m["top1_agreement.out"],
                            "top1_agreement_low": m["top1_agreement_low.out"]}]}
    judged = variant_quality_metrics(variant)
    assert judged["fidelity_low"] == m["fidelity_low"] and judged["confidence"] == 0.9
    assert quality_violations(judged, budgets(min_fidelity=0.99)) == [
        "fidelity 0.9933 (90% lower bound 0.9841) < min_fidelity 0.99"]
    # a per-output agreement budget: at its output's bound too
    own = SimpleNamespace(min_agreement=0.99, min_sqnr_db=None, min_cosine=None,
                          max_abs_error=None)
    [broken] = quality_violations(judged, budgets(outputs={"out": own}))
    assert broken.startswith("agreement (out) 0.9933 (90% lower bound 0.9841) < "
                             "outputs.out.min_agreement 0.99")
