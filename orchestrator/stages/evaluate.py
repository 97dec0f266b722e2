"""Evaluate the model on the recipe's evaluation data: accuracy, and fidelity to the source.

Only the first output is compared. It counts as class scores when it has one row of two or
more scores per sample, shape (N, C):

- `accuracy`: top-1 agreement of the argmax with the labels (or of the output itself, for
  a model that outputs integer class indices); null without labels, or when the output
  is neither. With `top_k` > 1, `top<k>_accuracy` too.
- `fidelity`: agreement with the source model's own outputs on the same inputs. For class
  scores, the fraction of samples whose argmax equals the source's argmax. For any other
  output (one value per sample, regression, images...), the fraction of samples whose
  every value is within 1e-3 relative of the source's: |out - ref| <= 1e-3 * |ref| + 1e-6.
- `max_abs_diff`: the largest |out - ref| over all outputs.

- `source_accuracy` and `accuracy_drop` (source accuracy - this accuracy): the source
  model's outputs scored by the same formula, so a cached result carries its own baseline.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field, PositiveInt

from orchestrator.errors import DataError, StageError
from orchestrator.model import ModelArtifact
from orchestrator.stages import register
from orchestrator.stages.base import ANY_KIND, Stage, StageContext, StageParams, StageResult

# A sample "agrees" with a non-classifier reference within these tolerances (np.isclose).
RELATIVE_TOLERANCE = 1e-3
ABSOLUTE_TOLERANCE = 1e-6


class Params(StageParams):
    batch_size: PositiveInt = Field(
        64, description="Samples per run (a model with a fixed batch size uses its own).")
    top_k: PositiveInt = Field(
        1, description="Also report top-k accuracy (`top<k>_accuracy`) when above 1.")


def run(given: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.kinds import runnable
    from orchestrator.runtime import GraphRunner

    if ctx.evaluation is None:
        raise StageError("evaluate needs data.evaluation in the recipe",
                         pipeline=ctx.pipeline, stage=ctx.stage)
    data = ctx.evaluation()
    # a memmapped or encrypted model runs as the graph rebuilt from it (decrypted in memory)
    artifact = runnable(given, ctx.model_key)
    with GraphRunner.for_artifact(artifact) as runner:
        outputs = runner.predict(data.inputs, params.batch_size)
    reference = ctx.reference_outputs() if ctx.reference_outputs is not None else None

    warnings: list[str] = []
    info: dict[str, Any] = {"samples": int(len(outputs)),
                            "output_kind": "class_scores" if is_class_scores(outputs)
                            else "values",
                            "accuracy": None, "fidelity": None, "max_abs_diff": None}
    if data.labels is not None and is_class_scores(outputs):
        classes = outputs.shape[1]
        bad = (data.labels < 0) | (data.labels >= classes)
        if bad.any():  # wrong labels would silently pass for a less accurate model
            raise DataError(f"{int(bad.sum())} evaluation labels are outside the model's "
                            f"{classes} classes (e.g. {int(data.labels[bad][0])} at sample "
                            f"{int(np.flatnonzero(bad)[0])})")
    if data.labels is not None:
        info["accuracy"] = top1_accuracy(outputs, data.labels)
        if info["accuracy"] is None:
            warnings.append(f"no accuracy: output shape {outputs.shape} is not class scores "
                            "(N, C); fidelity is the quality figure")
        elif params.top_k > 1:
            info[f"top{params.top_k}_accuracy"] = top_k_accuracy(outputs, data.labels,
                                                                 params.top_k)
    if reference is not None:
        if reference.shape != outputs.shape:
            raise StageError(f"output shape {outputs.shape} differs from the source model's "
                             f"{reference.shape}", pipeline=ctx.pipeline, stage=ctx.stage)
        info["fidelity"] = fidelity(outputs, reference)
        info["max_abs_diff"] = max_abs_diff(outputs, reference)
        if data.labels is not None and info["accuracy"] is not None:
            info["source_accuracy"] = top1_accuracy(reference, data.labels)
            info["accuracy_drop"] = round(info["source_accuracy"] - info["accuracy"], 6)
    metrics = {k: float(v) for k, v in info.items()
               if k not in ("samples", "output_kind") and v is not None}
    return StageResult(artifact=given, metrics=metrics, info=info, warnings=warnings)


def is_class_scores(outputs: np.ndarray) -> bool:
    """True for one row of two or more class scores per sample, shape (N, C)."""
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


def fidelity(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Agreement with the reference: top-1 for class scores, else the fraction of samples
    whose every value is within 1e-3 relative (np.isclose, atol 1e-6) of the reference."""
    outputs, reference = np.asarray(outputs), np.asarray(reference)
    if len(outputs) == 0:
        return 1.0
    if is_class_scores(outputs):
        return float(np.mean(outputs.argmax(axis=1) == reference.argmax(axis=1)))
    close = np.isclose(outputs, reference, rtol=RELATIVE_TOLERANCE, atol=ABSOLUTE_TOLERANCE)
    return float(np.mean(close.reshape(len(close), -1).all(axis=1)))


def max_abs_diff(outputs: np.ndarray, reference: np.ndarray) -> float:
    """The largest |outputs - reference| (0.0 for empty outputs)."""
    diff = np.abs(np.asarray(outputs, np.float64) - np.asarray(reference, np.float64))
    return float(diff.max()) if diff.size else 0.0


STAGE = register(Stage(name="evaluate", run=run, params=Params, doc=__doc__,
                       kind="measure", uses_data=("evaluation",),
                       accepts=ANY_KIND))
