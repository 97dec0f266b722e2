"""evaluate: accuracy and fidelity on graphs whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.errors import StageError
from orchestrator.measure.fidelity import (
    SQNR_CAP_DB,
    cosine,
    fidelity,
    output_kind,
    output_names,
    sqnr_db,
    threshold_agreement,
    top1_accuracy,
    top1_agreement,
    top_k_accuracy,
)
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.stages import get_stage
from orchestrator.stages.base import EvaluationData, StageContext

# Four samples of three class scores; their argmax is [0, 1, 2, 1].
SCORES = np.array([[0.9, 0.05, 0.05],
                   [0.1, 0.8, 0.1],
                   [0.2, 0.3, 0.5],
                   [0.3, 0.4, 0.3]], np.float32)


def scores_artifact(offset: np.ndarray | None = None, width: int = 3) -> ModelArtifact:
    """outputs = inputs (+ offset): a model whose every answer is known."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, width], name="x")
        shift = np.zeros(width, np.float32) if offset is None else offset
        tf.add(x, tf.constant(shift.astype(np.float32)), name="logits")
    return ModelArtifact(graph_def=graph.as_graph_def(),
                         inputs=(TensorSpec("x", "float32", (None, width)),),
                         outputs=("logits",))


def evaluate(artifact: ModelArtifact, labels: np.ndarray | None,
             reference: np.ndarray | None = SCORES, inputs: np.ndarray = SCORES, **params):
    data = EvaluationData(inputs=inputs, labels=labels)
    ctx = StageContext(pipeline="fp32", stage="evaluate", evaluation=lambda: data,
                       reference_outputs=None if reference is None else lambda: reference)
    stage = get_stage("evaluate")
    return stage.run(artifact, stage.params(**params), ctx)


def test_accuracy_and_fidelity_against_itself() -> None:
    artifact = scores_artifact()
    before = artifact.graph_bytes()
    result = evaluate(artifact, labels=np.array([0, 1, 2, 0]), batch_size=3)
    assert result.metrics["accuracy"] == 0.75
    assert result.metrics["fidelity"] == 1.0
    assert result.metrics["max_abs_diff"] == 0.0
    assert result.info["samples"] == 4 and result.info["output_kind"] == "class_scores"
    assert result.artifact is artifact and artifact.graph_bytes() == before


def test_perturbed_model_loses_fidelity() -> None:
    # +0.25 on class 2 flips sample 3 (0.3 + 0.25 > 0.4) and no other
    perturbed = scores_artifact(offset=np.array([0.0, 0.0, 0.25]))
    result = evaluate(perturbed, labels=np.array([0, 1, 2, 1]), top_k=2)
    assert result.metrics["fidelity"] == 0.75
    assert result.metrics["accuracy"] == 0.75
    assert result.metrics["max_abs_diff"] == pytest.approx(0.25)
    assert result.metrics["top2_accuracy"] == 1.0


def test_without_labels_fidelity_is_the_only_figure() -> None:
    result = evaluate(scores_artifact(), labels=None)
    assert result.info["accuracy"] is None and "accuracy" not in result.metrics
    assert result.metrics["fidelity"] == 1.0


def test_regression_outputs_are_compared_by_sqnr_not_a_tolerance() -> None:
    inputs = np.array([[1.0], [2.0], [1000.0], [0.0]], np.float32)
    # +0.5 on every value: far beyond a 1e-3 relative tolerance for three samples, yet the
    # signal keeps 1 - 4 * 0.25 / (1 + 4 + 1e6) of its energy
    artifact = scores_artifact(np.array([0.5]), width=1)
    result = evaluate(artifact, labels=np.array([1, 2, 3, 4]), reference=inputs, inputs=inputs)
    signal, noise = float(np.sum(inputs.astype(np.float64) ** 2)), 4 * 0.25
    assert result.info["output_kind"] == "values"
    assert result.metrics["sqnr_db.logits"] == pytest.approx(10 * np.log10(signal / noise))
    assert result.metrics["min_sqnr_db"] == result.metrics["sqnr_db.logits"]
    assert result.metrics["fidelity"] == pytest.approx(1 - noise / signal)
    assert result.metrics["max_abs_error.logits"] == pytest.approx(0.5)
    assert "threshold_agreement.logits" not in result.metrics  # 1000 is no probability
    assert result.info["accuracy"] is None
    assert any("no output is class scores" in w for w in result.warnings)


def test_needs_evaluation_data() -> None:
    stage = get_stage("evaluate")
    with pytest.raises(StageError, match="data.evaluation"):
        stage.run(scores_artifact(), stage.params(),
                  StageContext(pipeline="fp32", stage="evaluate"))
    assert stage.uses_data == ("evaluation",) and stage.kind == "measure"


def test_helpers() -> None:
    labels = np.array([0, 1, 2, 0])
    assert top1_accuracy(SCORES, labels) == 0.75
    assert top_k_accuracy(SCORES, labels, 2) == 1.0
    assert top_k_accuracy(SCORES, labels, 10) == 1.0  # k beyond the class count
    assert top1_accuracy(np.array([0, 1, 1, 0]), labels) == 0.75  # class indices
    assert top1_accuracy(np.array([[0.2], [0.9], [0.1], [0.7]]), labels) is None
    # reversing the classes keeps only the symmetric rows 1 and 3 on the same argmax
    assert fidelity(SCORES, SCORES[:, ::-1]) == 0.5
    assert top1_agreement(SCORES, SCORES[:, ::-1]) == 0.5
    assert top1_agreement(np.array([1, 2, 3]), np.array([1, 2, 0])) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        top1_accuracy(SCORES, labels[:3])


def test_labels_outside_the_classes_are_bad_data() -> None:
    from orchestrator.errors import DataError

    with pytest.raises(DataError, match="outside the model's 3 classes"):
        evaluate(scores_artifact(), np.array([0, 1, 7, 1]))


# --- per-output figures, against numpy computed here


def test_sqnr_cosine_and_threshold_agreement_match_numpy() -> None:
    rng = np.random.default_rng(7)
    ref = rng.uniform(0, 1, size=(50, 4, 3))
    out = np.clip(ref + rng.normal(0, 0.05, size=ref.shape), 0, 1)
    expected_sqnr = 10 * np.log10((ref ** 2).sum() / ((out - ref) ** 2).sum())
    assert sqnr_db(out, ref) == pytest.approx(expected_sqnr, rel=1e-9)
    a, b = out.ravel(), ref.ravel()
    assert cosine(out, ref) == pytest.approx(a @ b / np.sqrt((a @ a) * (b @ b)), rel=1e-9)
    assert threshold_agreement(out, ref) == pytest.approx(np.mean((a > 0.5) == (b > 0.5)))
    # 10x the noise amplitude is 20 dB less
    assert sqnr_db(ref + 10 * (out - ref), ref) == pytest.approx(expected_sqnr - 20, abs=1e-6)


def test_sqnr_and_cosine_are_inf_and_zero_safe() -> None:
    ref = np.array([[0.2, 0.7]], np.float32)
    zeros = np.zeros_like(ref)
    assert sqnr_db(ref, ref) == SQNR_CAP_DB
    assert sqnr_db(zeros, zeros) == SQNR_CAP_DB
    assert sqnr_db(ref, zeros) == -SQNR_CAP_DB
    assert cosine(zeros, zeros) == 1.0 and cosine(ref, zeros) == 0.0
    assert cosine(-ref, ref) == pytest.approx(-1.0)
    assert fidelity(zeros, ref) == 0.0 and fidelity(ref, ref) == 1.0


def test_output_kinds() -> None:
    assert output_kind(SCORES) == "class_scores"  # softmax rows: sum to 1
    assert output_kind(np.array([[3.0, -1.0], [0.5, 2.0]])) == "class_scores"  # logits
    assert output_kind(np.array([[0.9, 0.8, 0.1], [0.2, 0.1, 0.1]])) == "probabilities"
    assert output_kind(np.array([[0.9], [0.2]])) == "probabilities"  # one sigmoid unit
    assert output_kind(np.array([[1.5], [-0.2]])) == "values"
    assert output_kind(np.array([2, 0, 1], np.int64)) == "class_indices"


def test_output_names_come_from_the_signature_made_safe() -> None:
    metadata = {"output_names": {"onset prob": "Identity:0", "frame": "Identity_1:0"}}
    assert output_names(("Identity", "Identity_1:0"), metadata) == ["onset_prob", "frame"]
    # refs renamed by a stage: by position
    assert output_names(("a", "b"), metadata) == ["onset_prob", "frame"]
    assert output_names(("dense/Sigmoid", "split:1", "dense/Sigmoid:0"), {}) == [
        "dense_Sigmoid", "split_1", "dense_Sigmoid_2"]


def two_heads_artifact(noise: float = 0.0) -> ModelArtifact:
    """x (N, 4) -> 'tones' sigmoid(x @ w) (N, 3), 'level' x @ v (N, 1) (+ noise on both:
    a model whose outputs drift from the source's by a known amount)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3) / 6 - 1)
        v = tf.constant(np.ones((4, 1), np.float32))
        tf.sigmoid(tf.matmul(x, w) + noise, name="tones/Sigmoid")
        tf.add(tf.matmul(x, v), noise, name="level")
    return ModelArtifact(graph_def=graph.as_graph_def(),
                         inputs=(TensorSpec("x", "float32", (None, 4)),),
                         outputs=("tones/Sigmoid", "level"),
                         metadata={"output_names": {"tones": "tones/Sigmoid:0",
                                                    "level": "level:0"}})


def test_every_output_of_a_multi_output_model_is_reported() -> None:
    from orchestrator.measure.tf_runtime import predict_all

    x = np.random.default_rng(3).normal(size=(40, 4)).astype(np.float32)
    source = two_heads_artifact()
    reference = predict_all(source, x)
    result = evaluate(two_heads_artifact(noise=0.05), labels=None, reference=reference,
                      inputs=x, batch_size=16)
    out = predict_all(two_heads_artifact(noise=0.05), x)
    rows = {r["name"]: r for r in result.info["outputs"]}
    assert list(rows) == ["tones", "level"]
    assert rows["tones"]["kind"] == "probabilities" and rows["level"]["kind"] == "values"
    assert rows["tones"]["shape"] == [3] and rows["tones"]["tensor"] == "tones/Sigmoid"
    for name, got, ref in (("tones", out[0], reference[0]), ("level", out[1], reference[1])):
        ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
        expected = 10 * np.log10((ref64 ** 2).sum() / ((got64 - ref64) ** 2).sum())
        assert result.metrics[f"sqnr_db.{name}"] == pytest.approx(expected, rel=1e-6)
        assert rows[name]["sqnr_db"] == result.metrics[f"sqnr_db.{name}"]
        assert result.metrics[f"max_abs_error.{name}"] == pytest.approx(
            np.abs(got64 - ref64).max(), rel=1e-6)
        assert 0.99 < result.metrics[f"cosine.{name}"] < 1.0
    assert result.metrics["max_abs_error.level"] == pytest.approx(0.05, rel=1e-4)
    assert result.metrics["threshold_agreement.tones"] == pytest.approx(
        np.mean((out[0] > 0.5) == (reference[0] > 0.5)))
    assert "threshold_agreement.level" not in result.metrics
    assert result.metrics["min_sqnr_db"] == min(rows["tones"]["sqnr_db"],
                                                rows["level"]["sqnr_db"])
    # no class output: fidelity is the lowest share of signal energy kept, not 0
    energy = [1 - ((o.astype(np.float64) - r) ** 2).sum() / (r.astype(np.float64) ** 2).sum()
              for o, r in zip(out, reference, strict=True)]
    assert result.metrics["fidelity"] == pytest.approx(min(energy), rel=1e-6)
    assert result.metrics["fidelity"] > 0.9
    same = evaluate(source, labels=None, reference=reference, inputs=x)
    assert same.metrics["sqnr_db.tones"] == SQNR_CAP_DB and same.metrics["fidelity"] == 1.0


def test_only_the_first_output_has_a_reference() -> None:
    """A reference of the first output alone (an older caller): the others are named, and
    said not to be compared."""
    from orchestrator.measure.tf_runtime import predict

    x = np.random.default_rng(4).normal(size=(8, 4)).astype(np.float32)
    result = evaluate(two_heads_artifact(), labels=None,
                      reference=predict(two_heads_artifact(), x), inputs=x)
    assert "sqnr_db.tones" in result.metrics and "sqnr_db.level" not in result.metrics
    assert [r["name"] for r in result.info["outputs"]] == ["tones", "level"]
    assert any("level" in w and "not in the fidelity" in w for w in result.warnings)


def test_class_output_beside_others_gives_accuracy_and_fidelity() -> None:
    """A class head after a regression head: accuracy and fidelity come from the class head."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        tf.multiply(tf.reduce_sum(x, axis=1, keepdims=True), 2.0, name="box")
        tf.nn.softmax(x, name="probs")
    artifact = ModelArtifact(graph_def=graph.as_graph_def(),
                             inputs=(TensorSpec("x", "float32", (None, 3)),),
                             outputs=("box", "probs"))
    flipped = SCORES[:, ::-1].copy()
    reference = [2 * SCORES.sum(axis=1, keepdims=True), np.exp(flipped) / np.exp(
        flipped).sum(axis=1, keepdims=True)]
    result = evaluate(artifact, labels=np.array([0, 1, 2, 1]), reference=reference)
    assert [r["kind"] for r in result.info["outputs"]] == ["values", "class_scores"]
    assert result.metrics["accuracy"] == 1.0  # argmax [0, 1, 2, 1]
    # the source's classes reversed: argmax [2, 1, 0, 1]
    assert result.metrics["fidelity"] == 0.5 == result.metrics["top1_agreement.probs"]
    assert result.metrics["source_accuracy"] == 0.5
    assert result.metrics["accuracy_drop"] == -0.5
    assert result.metrics["sqnr_db.box"] > 100  # the same sums, up to float32 rounding
    assert result.metrics["min_sqnr_db"] == result.metrics["sqnr_db.box"]  # class heads aside


def test_real_valued_rows_are_logits_only_with_labels() -> None:
    """A box regression (N, 4) is not class scores; logits are, when labels say so."""
    from orchestrator.measure.fidelity import CLASS_SCORES, VALUES, output_kind

    boxes = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    assert output_kind(boxes, labelled=False) == VALUES
    assert output_kind(boxes, labelled=True) == CLASS_SCORES
    softmax = np.exp(boxes) / np.exp(boxes).sum(axis=1, keepdims=True)
    assert output_kind(softmax, labelled=False) == CLASS_SCORES


def test_an_output_quantized_on_the_device_is_compared_above_half_its_step() -> None:
    from orchestrator.measure.fidelity import compare, grid_step, logits, sqnr_db

    rng = np.random.default_rng(0)
    logits_ = rng.normal(0, 4, (200, 7))
    probs = np.exp(logits_) / np.exp(logits_).sum(axis=1, keepdims=True)
    quantized = np.round(probs * 256) / 256  # LiteRT's int8 softmax output, dequantized
    assert grid_step(probs) == 0.0  # a float output has no grid
    assert grid_step(quantized) == pytest.approx(1 / 256)
    figures = compare(quantized, probs, "class_scores")
    # most small probabilities are exact zeros on the grid; above half a step the logits
    # still agree well, as the top-1 agreement says
    assert (quantized == 0).mean() > 0.2
    assert figures["top1_agreement"] > 0.97
    assert figures["logit_sqnr_db"] > 15.0
    # without the floor, log(0) clipped at 1e-7 swamps the figure
    unfloored = sqnr_db(logits(quantized, probs, "class_scores"),
                        logits(probs, probs, "class_scores"))
    assert unfloored < figures["logit_sqnr_db"] - 10
    # the same rounding of a float output, not on a grid, keeps the fine floor
    assert compare(probs * (1 + 1e-6), probs, "class_scores")["logit_sqnr_db"] > 100


def test_kl_divergence_is_never_negative() -> None:
    from orchestrator.measure.fidelity import kl_divergence

    reference = np.array([[0.5, 0.5], [0.25, 0.75]])
    # float rounding: the 8-bit side's rows sum to a hair above 1 (KL would be -1e-8)
    nudged = reference + np.array([[0.0, 2e-8], [1e-8, 1e-8]])
    assert kl_divergence(nudged, reference) == 0.0
    assert kl_divergence(reference[:, ::-1], reference) > 0.1  # a real difference stays
