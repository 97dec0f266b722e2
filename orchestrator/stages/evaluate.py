"""Evaluate on the recipe's evaluation data: accuracy, and fidelity per output to the source.

Each output is compared with the same output of the source model on the same inputs, and
named by the model's output name (its Keras/signature name when known, else the graph
tensor's), made safe for an MLflow metric key. What is compared fits the output, judged from
the source's values:

- class scores, (N, C) with C > 1 (softmax rows; logits when the data has labels):
  `top1_agreement.<output>`, the fraction of samples whose argmax equals the source's; a
  model that outputs one integer class per sample is compared exactly. An (N, C) output
  whose every value lies in [0, 1] with rows that do not sum to 1 is multi-label
  probabilities (sigmoid units), and real-valued rows without labels are values (a box
  regression, say), not classes.
- every float output: `sqnr_db.<output>`, 10*log10(sum ref^2 / sum (out - ref)^2) over the
  whole tensor (capped at +-200 dB: 200 means identical), `cosine.<output>` (of the
  flattened tensors) and `max_abs_error.<output>`.
- probabilities (not class scores, every source value in [0, 1], e.g. sigmoid heads):
  `threshold_agreement.<output>`, the fraction of values on the same side of 0.5.
- every float output: `logit_sqnr_db.<output>`, the SQNR in the domain before the output's
  squashing, where a small move is still visible: the logits recovered from softmax rows
  (log-probabilities, centred per row) or from sigmoid probabilities (log(p / (1 - p))),
  the values themselves otherwise. An output quantized on the device (LiteRT's int8
  softmax has 1/256 steps) is compared above half its step: below it, it has no values.
  Softmax saturates: a probability SQNR or a top-1
  agreement hardly moves while the logits drift, so this is what the accuracy guard ranks
  its candidates by. Softmax rows also get `kl_divergence.<output>`, the mean
  KL(source || this) in nats.

Across outputs:
- `accuracy`: top-1 agreement with the labels of the first class output; null without
  labels or without one. `top<k>_accuracy` with `top_k` > 1. `source_accuracy` and
  `accuracy_drop` (source - this): the source's outputs scored the same way.
- `fidelity`: the top-1 agreement of the first class output. A model without one gets the
  lowest over its outputs of 1 - sum (out - ref)^2 / sum ref^2 (the share of the source's
  signal energy kept, i.e. 1 - 10^(-SQNR/10)): 0.99 at 20 dB, 0.999 at 30 dB.
- `min_sqnr_db`: the lowest SQNR of the outputs that are not class scores.
- `min_logit_sqnr_db`: the lowest `logit_sqnr_db` over the outputs.
- `max_abs_diff`: the largest |out - ref| over every output.

`info["outputs"]` tables them per output (report.json: the variant's `outputs`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import Field, PositiveInt

from orchestrator.errors import DataError, StageError
from orchestrator.model.artifact import ModelArtifact, node_name, tensor_name
from orchestrator.stages import register
from orchestrator.stages.base import ANY_KIND, Stage, StageContext, StageParams, StageResult

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
                  "threshold_agreement", "logit_sqnr_db", "kl_divergence")
# probabilities are clipped this far from 0 and 1 before taking logs
PROBABILITY_EPSILON = 1e-7
# An output with at most this many distinct values, all on one grid, was quantized.
QUANTIZED_LEVELS = 256


class Params(StageParams):
    batch_size: PositiveInt = Field(
        64, description="Samples per run (a model with a fixed batch size uses its own).")
    top_k: PositiveInt = Field(
        1, description="Also report top-k accuracy (`top<k>_accuracy`) when above 1.")


def run(given: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.measure.tf_runtime import open_runner

    if ctx.evaluation is None:
        raise StageError("evaluate needs data.evaluation in the recipe",
                         pipeline=ctx.pipeline, stage=ctx.stage)
    data = ctx.evaluation()
    # a memmapped or encrypted model runs as the graph rebuilt from it (decrypted in memory),
    # a tflite model in LiteRT's interpreter
    with open_runner(given, ctx.model_key) as runner:
        outputs = runner.predict_all(data.inputs, params.batch_size)
    names = output_names(given.outputs, given.metadata)
    references, warnings = _references(ctx, outputs, names)

    rows = [{"name": name, "tensor": tensor, "shape": list(out.shape[1:]),
             "kind": output_kind(ref if ref is not None else out, data.labels is not None)}
            for name, tensor, out, ref in zip(names, given.outputs, outputs, references,
                                              strict=True)]
    metrics: dict[str, float] = {}
    for row, out, ref in zip(rows, outputs, references, strict=True):
        if ref is None:
            continue
        if ref.shape != out.shape:
            raise StageError(f"output {row['name']!r}: shape {out.shape} differs from the "
                             f"source model's {ref.shape}", pipeline=ctx.pipeline,
                             stage=ctx.stage)
        row.update(compare(out, ref, row["kind"]))
        metrics.update({f"{m}.{row['name']}": row[m] for m in OUTPUT_METRICS if m in row})

    info: dict[str, Any] = {"samples": len(data.inputs), "output_kind": rows[0]["kind"],
                            "outputs": rows, "accuracy": None, "fidelity": None,
                            "max_abs_diff": None}
    labelled = next((i for i, r in enumerate(rows) if r["kind"] in CLASS_KINDS), None)
    if data.labels is not None:
        if labelled is None:
            warnings.append("no accuracy: no output is class scores (N, C); fidelity is the "
                            "quality figure")
        else:
            _check_labels(outputs[labelled], data.labels)
            info["accuracy"] = top1_accuracy(outputs[labelled], data.labels)
            if params.top_k > 1 and rows[labelled]["kind"] == CLASS_SCORES:
                info[f"top{params.top_k}_accuracy"] = top_k_accuracy(
                    outputs[labelled], data.labels, params.top_k)
    compared = [(r, out, ref) for r, out, ref in zip(rows, outputs, references, strict=True)
                if ref is not None]
    if compared:
        info["fidelity"] = fidelity_of(
            [(r["kind"], out, ref) for r, out, ref in compared])
        info["max_abs_diff"] = max(max_abs_diff(out, ref) for _, out, ref in compared)
        sqnrs = [r["sqnr_db"] for r, _, _ in compared
                 if r["kind"] not in CLASS_KINDS and "sqnr_db" in r]
        if sqnrs:
            info["min_sqnr_db"] = min(sqnrs)
        logit_sqnrs = [r["logit_sqnr_db"] for r, _, _ in compared if "logit_sqnr_db" in r]
        if logit_sqnrs:
            info["min_logit_sqnr_db"] = min(logit_sqnrs)
        if info["accuracy"] is not None and references[labelled] is not None:
            info["source_accuracy"] = top1_accuracy(references[labelled], data.labels)
            info["accuracy_drop"] = round(info["source_accuracy"] - info["accuracy"], 6)
    metrics.update({k: float(v) for k, v in info.items()
                    if isinstance(v, int | float) and k != "samples"})
    return StageResult(artifact=given, metrics=metrics, info=info, warnings=warnings)


def _references(ctx: StageContext, outputs: list[np.ndarray], names: list[str]
                ) -> tuple[list[np.ndarray | None], list[str]]:
    """The source's outputs, one per output (None where there is none to compare)."""
    given = ctx.reference_outputs() if ctx.reference_outputs is not None else None
    if given is None:
        return [None] * len(outputs), []
    if isinstance(given, np.ndarray):  # the first output only
        given = [given]
    references: list[np.ndarray | None] = [np.asarray(r) for r in given]
    if len(references) > len(outputs):
        raise StageError(f"the model has {len(outputs)} outputs, the source model "
                         f"{len(references)}", pipeline=ctx.pipeline, stage=ctx.stage)
    missing = names[len(references):]
    references += [None] * len(missing)
    warnings = [f"no source outputs to compare output(s) {', '.join(missing)} with: they are "
                "not in the fidelity figures"] if missing else []
    return references, warnings


def _check_labels(outputs: np.ndarray, labels: np.ndarray) -> None:
    if not is_class_scores(outputs):
        return
    classes = outputs.shape[1]
    bad = (labels < 0) | (labels >= classes)
    if bad.any():  # wrong labels would silently pass for a less accurate model
        raise DataError(f"{int(bad.sum())} evaluation labels are outside the model's "
                        f"{classes} classes (e.g. {int(labels[bad][0])} at sample "
                        f"{int(np.flatnonzero(bad)[0])})")


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


STAGE = register(Stage(name="evaluate", run=run, params=Params, doc=__doc__,
                       kind="measure", uses_data=("evaluation",),
                       accepts=ANY_KIND))
