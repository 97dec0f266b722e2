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

from typing import Any

import numpy as np
from pydantic import Field

from orchestrator.errors import DataError, StageError
from orchestrator.limits import bounded
from orchestrator.measure.fidelity import (
    CLASS_KINDS,
    CLASS_SCORES,
    OUTPUT_METRICS,
    compare,
    fidelity_of,
    is_class_scores,
    max_abs_diff,
    output_kind,
    output_names,
    top1_accuracy,
    top_k_accuracy,
)
from orchestrator.model.artifact import ModelArtifact
from orchestrator.stages import register
from orchestrator.stages.base import ANY_KIND, Stage, StageContext, StageParams, StageResult


class Params(StageParams):
    batch_size: bounded("batch") = Field(
        64, description="Samples per run (a model with a fixed batch size uses its own).")
    top_k: bounded("top_k") = Field(
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


STAGE = register(Stage(name="evaluate", run=run, params=Params, doc=__doc__,
                       kind="measure", uses_data=("evaluation",),
                       accepts=ANY_KIND, judges_quality=True, variant_metrics=True))
