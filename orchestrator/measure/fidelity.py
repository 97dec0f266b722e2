"""How close a model's outputs are to a reference's: the metrics of the evaluate stage, the
budgets and the guard, per output (top-1 agreement, SQNR, cosine, logit SQNR, KL) and across
outputs (fidelity). The evaluate stage's docstring says what each means.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orchestrator.model.artifact import node_name, tensor_name

# SQNR of identical outputs (and the floor, negated): finite, so that JSON and MLflow keep it.
SQNR_CAP_DB = 200.0
THRESHOLD = 0.5  # a probability counts as "on" above this
# softmax rows sum to 1 within this; sigmoid (multi-label) rows generally do not
ROW_SUM_TOLERANCE = 1e-3

CLASS_SCORES, CLASS_INDICES, PROBABILITIES, VALUES = (
    "class_scores", "class_indices", "probabilities", "values")
CLASS_KINDS = (CLASS_SCORES, CLASS_INDICES)
# per-output metrics, keyed `<metric>.<output>`; metric names hold no "."
OUTPUT_METRICS = ("top1_agreement", "sqnr_db", "cosine", "max_abs_error",
                  "threshold_agreement", "logit_sqnr_db", "kl_divergence",
                  # their bounds at the evaluation's confidence (orchestrator.measure.confidence)
                  "top1_agreement_low", "top1_agreement_high", "sqnr_db_low", "sqnr_db_high")
# figures where lower is better (every other one: higher is better)
LOWER_IS_BETTER = frozenset({"max_abs_error", "kl_divergence", "max_abs_diff", "accuracy_drop",
                             "accuracy_drop_low", "accuracy_drop_high"})
# probabilities are clipped this far from 0 and 1 before taking logs
PROBABILITY_EPSILON = 1e-7
# An output with at most this many distinct values, all on one grid, was quantized.
QUANTIZED_LEVELS = 256


def output_names(outputs: Sequence[str], metadata: Mapping[str, Any]) -> list[str]:
    """Each output's name in metrics: its signature name (metadata `output_names`, by tensor
    or else by position), else its graph tensor; characters outside [A-Za-z0-9_.-] become
    `_`, and a repeated name gets `_2`, `_3`..."""
    friendly: Mapping[str, str] = metadata.get("output_names") or {}
    by_tensor = {tensor_name(ref): name for name, ref in friendly.items()}
    by_position = list(friendly) if len(friendly) == len(outputs) else None
    names: list[str] = []
    for index, output in enumerate(outputs):
        raw = by_tensor.get(tensor_name(output)) or (
            by_position[index] if by_position else
            node_name(output) if tensor_name(output).endswith(":0") else output)
        name = safe_name(raw) or f"output_{index}"
        unique, n = name, 2
        while unique in names:
            unique, n = f"{name}_{n}", n + 1
        names.append(unique)
    return names


def safe_name(name: str) -> str:
    """`name` usable in an MLflow metric key after `<metric>.`: [A-Za-z0-9_.-] only."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


def output_kind(values: np.ndarray, labelled: bool = True) -> str:
    """How an output is compared (see the module doc): class_scores, class_indices,
    probabilities or values. Real-valued (N, C) rows are logits only when the data has
    labels: without them they are as likely a box or a landmark regression."""
    values = np.asarray(values)
    if _is_class_indices(values):
        return CLASS_INDICES
    in_unit = (values.size > 0 and np.issubdtype(values.dtype, np.floating)
               and float(values.min()) >= 0.0 and float(values.max()) <= 1.0)
    if is_class_scores(values):
        rows_sum_to_one = np.allclose(values.sum(axis=1), 1.0, atol=ROW_SUM_TOLERANCE)
        if rows_sum_to_one if in_unit else labelled:
            return CLASS_SCORES
    return PROBABILITIES if in_unit else VALUES


def compare(outputs: np.ndarray, reference: np.ndarray, kind: str) -> dict[str, float]:
    """The per-output figures of `kind` (see the module doc)."""
    figures: dict[str, float] = {}
    if kind in CLASS_KINDS:
        figures["top1_agreement"] = top1_agreement(outputs, reference)
    if kind != CLASS_INDICES:
        figures["sqnr_db"] = sqnr_db(outputs, reference)
        figures["cosine"] = cosine(outputs, reference)
        figures["max_abs_error"] = max_abs_diff(outputs, reference)
    if kind == PROBABILITIES:
        figures["threshold_agreement"] = threshold_agreement(outputs, reference)
    if kind != CLASS_INDICES:
        # below an 8-bit output's step (LiteRT's int8 softmax: 1/256) probabilities are 0
        # there: both sides are floored at half a step, else log(0) would swamp the figure
        floor = max(PROBABILITY_EPSILON, grid_step(outputs) / 2)
        figures["logit_sqnr_db"] = sqnr_db(logits(outputs, reference, kind, floor),
                                           logits(reference, reference, kind, floor))
    if kind == CLASS_SCORES and _is_softmax(reference):
        figures["kl_divergence"] = kl_divergence(outputs, reference)
    return figures


def grid_step(values: np.ndarray) -> float:
    """The step of the grid every value lies on, for an output quantized on the device
    (at most 256 levels per tensor, so few distinct values); 0.0 for a float output."""
    distinct = np.unique(np.asarray(values, np.float64).ravel())
    if len(distinct) < 2 or len(distinct) > QUANTIZED_LEVELS:
        return 0.0
    step = float(np.min(np.diff(distinct)))
    steps = (distinct - distinct[0]) / step
    return step if np.allclose(steps, np.round(steps), atol=1e-3) else 0.0


def _is_softmax(values: np.ndarray) -> bool:
    values = np.asarray(values)
    return (values.size > 0 and float(values.min()) >= 0.0 and float(values.max()) <= 1.0
            and np.allclose(values.sum(axis=1), 1.0, atol=ROW_SUM_TOLERANCE))


def logits(values: np.ndarray, reference: np.ndarray, kind: str,
           floor: float = PROBABILITY_EPSILON) -> np.ndarray:
    """`values` in the domain before their squashing, judged by the `reference`'s kind:
    softmax rows -> log-probabilities centred per row (the logits, up to the constant
    softmax ignores); sigmoid probabilities -> log(p / (1 - p)); anything else as it is
    (logit rows centred per row, since softmax ignores a per-row constant)."""
    values = np.asarray(values, np.float64)
    if kind == CLASS_SCORES:
        if _is_softmax(reference):
            values = np.log(np.clip(values, floor, 1.0))
        return values - values.mean(axis=1, keepdims=True)
    if kind == PROBABILITIES:
        p = np.clip(values, floor, 1.0 - floor)
        return np.log(p) - np.log1p(-p)
    return values


def kl_divergence(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Mean over samples of KL(reference || outputs), in nats, of softmax rows. KL is never
    negative; rows that sum to 1 only up to float rounding can make the sum a hair below
    zero (-1e-8 for identical models), which is clamped to 0."""
    p = np.clip(np.asarray(reference, np.float64), PROBABILITY_EPSILON, 1.0)
    q = np.clip(np.asarray(outputs, np.float64), PROBABILITY_EPSILON, 1.0)
    if not len(p):
        return 0.0
    return max(float(np.mean(np.sum(p * (np.log(p) - np.log(q)), axis=1))), 0.0)


def is_class_scores(outputs: np.ndarray) -> bool:
    """True for one row of two or more scores per sample, shape (N, C)."""
    return outputs.ndim == 2 and outputs.shape[1] > 1


def _is_class_indices(outputs: np.ndarray) -> bool:
    """One integer per sample: a model that outputs its predicted class."""
    return np.issubdtype(outputs.dtype, np.integer) and outputs.size == len(outputs)


def top1_accuracy(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Fraction of samples whose highest score is at their label's index.

    `scores` may also be integer class indices, one per sample. None when they are neither
    (see `is_class_scores`).
    """
    return top_k_accuracy(scores, labels, 1)


def top_k_accuracy(scores: np.ndarray, labels: np.ndarray, k: int) -> float | None:
    """Fraction of samples whose label is among their `k` highest scores (None as above)."""
    scores = np.asarray(scores)
    labels = np.asarray(labels).reshape(-1)
    if len(labels) != len(scores):
        raise ValueError(f"{len(scores)} score rows but {len(labels)} labels")
    if _is_class_indices(scores) and k == 1:  # the model outputs its predicted class
        return float(np.mean(scores.reshape(-1) == labels))
    if not is_class_scores(scores):
        return None
    if k == 1:
        return float(np.mean(scores.argmax(axis=1) == labels))
    top = np.argpartition(-scores, min(k, scores.shape[1]) - 1, axis=1)[:, :k]
    return float(np.mean((top == labels[:, None]).any(axis=1)))


def top1_hits(scores: np.ndarray, labels: np.ndarray) -> np.ndarray | None:
    """Per sample, whether its highest score (or its class index) is its label; None when
    `scores` are neither class scores nor class indices."""
    scores, labels = np.asarray(scores), np.asarray(labels).reshape(-1)
    if _is_class_indices(scores):
        return scores.reshape(-1) == labels
    return scores.argmax(axis=1) == labels if is_class_scores(scores) else None


def top1_agreement(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Fraction of samples with the reference's class: the same argmax of class scores, or
    the same class index (1.0 for no samples)."""
    outputs, reference = np.asarray(outputs), np.asarray(reference)
    if len(outputs) == 0:
        return 1.0
    if is_class_scores(outputs):
        return float(np.mean(outputs.argmax(axis=1) == reference.argmax(axis=1)))
    return float(np.mean(outputs.reshape(-1) == reference.reshape(-1)))


def _energies(outputs: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(sum ref^2, sum (out - ref)^2), in float64."""
    ref = np.asarray(reference, np.float64)
    return float(np.sum(ref ** 2)), float(np.sum((np.asarray(outputs, np.float64) - ref) ** 2))


def sqnr_db(outputs: np.ndarray, reference: np.ndarray) -> float:
    """10*log10(sum ref^2 / sum (out - ref)^2), within +-SQNR_CAP_DB: the cap when they are
    identical, minus the cap for any error against an all-zero reference."""
    signal, noise = _energies(outputs, reference)
    if noise == 0.0:
        return SQNR_CAP_DB
    if signal == 0.0:
        return -SQNR_CAP_DB
    return float(np.clip(10.0 * np.log10(signal / noise), -SQNR_CAP_DB, SQNR_CAP_DB))


def energy_fidelity(outputs: np.ndarray, reference: np.ndarray) -> float:
    """1 - sum (out - ref)^2 / sum ref^2, within [0, 1] (1 when identical)."""
    signal, noise = _energies(outputs, reference)
    if noise == 0.0:
        return 1.0
    return 0.0 if signal == 0.0 else float(min(1.0, max(0.0, 1.0 - noise / signal)))


def cosine(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Cosine similarity of the flattened tensors (1.0 when both are all zeros, 0.0 when
    only one is)."""
    a = np.asarray(outputs, np.float64).reshape(-1)
    b = np.asarray(reference, np.float64).reshape(-1)
    norms = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
    if norms == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.clip(np.dot(a, b) / norms, -1.0, 1.0))


def threshold_agreement(outputs: np.ndarray, reference: np.ndarray,
                        threshold: float = THRESHOLD) -> float:
    """Fraction of values on the same side of `threshold` as the reference's (1.0 if none)."""
    outputs, reference = np.asarray(outputs), np.asarray(reference)
    if outputs.size == 0:
        return 1.0
    return float(np.mean((outputs > threshold) == (reference > threshold)))


def max_abs_diff(outputs: np.ndarray, reference: np.ndarray) -> float:
    """The largest |outputs - reference| (0.0 for empty outputs)."""
    diff = np.abs(np.asarray(outputs, np.float64) - np.asarray(reference, np.float64))
    return float(diff.max()) if diff.size else 0.0


def fidelity_of(compared: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> float:
    """The scalar fidelity of (kind, outputs, reference) per output: the top-1 agreement of
    the first class output, else the lowest energy fidelity (see `energy_fidelity`)."""
    for kind, out, ref in compared:
        if kind in CLASS_KINDS:
            return top1_agreement(out, ref)
    return min((energy_fidelity(out, ref) for _, out, ref in compared), default=1.0)


def fidelity(outputs: np.ndarray, reference: np.ndarray) -> float:
    """The scalar fidelity of a single output (see `fidelity_of`)."""
    return fidelity_of([(output_kind(reference), np.asarray(outputs), np.asarray(reference))])
