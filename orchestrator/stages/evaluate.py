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

How sure each figure is (orchestrator/measure/confidence.py), at `confidence` (0.9): every
agreement and accuracy gets one-sided bounds, `<figure>_low` / `<figure>_high` (the true
figure lies above `_low` 9 times in 10 at 0.9): `fidelity_low`, `accuracy_low`,
`top1_agreement_low.<output>` by the Wilson score interval over the samples; the SQNR of
each output, `sqnr_db_low.<output>` and `min_sqnr_db_low`, and `accuracy_drop_high` by a
seeded bootstrap over the samples (a fidelity of energy kept: from its SQNR's bounds; an
accuracy drop with no sample where the two differ has bounds of 0).
Quality budgets are met only at the bound (orchestrator/measure/budgets.py).
`info["highest_meetable_agreement"]` is the lower bound of a perfect score on these samples:
an agreement budget above it cannot be shown met.

Which samples are judged:
- evaluation samples that are also representative samples (the same bytes once fitted to
  the model), which every method was fit on, are left out, with a warning (all are kept,
  with a louder one, when no other is left);
- `part`: "all", or "search" / "held_out": the evaluation set split by a seeded permutation
  of its sample indices (the same every run), `held_out_share` of them held out. A search
  that picks among trials judges them on "search" and confirms its choice on "held_out",
  which it did not select on. `info["part"]` says which and how many.

Kernel sets: a `.tflite` runs once under each of `kernel_sets` (LiteRT's default, with the
XNNPACK delegate where it takes the ops, and its builtin kernels; "reference" on request).
Every figure, per output and across outputs, is the WORST over the kernel sets (the lowest
agreement or SQNR, the highest error), so a budget holds only where it holds under each;
`info["kernel_sets"]` gives each set's figures, and the metrics `fidelity_<set>` and
`fidelity_low_<set>` each set's fidelity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field

from orchestrator.data.evaluation_parts import Part, overlapping, part_rows
from orchestrator.errors import DataError, StageError
from orchestrator.limits import bounded
from orchestrator.measure.confidence import (
    energy_fidelity_of_db,
    lowest_meetable,
    mean_bounds,
    proportion_bounds,
    sqnr_bounds,
)
from orchestrator.measure.fidelity import (
    CLASS_KINDS,
    CLASS_SCORES,
    LOWER_IS_BETTER,
    OUTPUT_METRICS,
    compare,
    fidelity_of,
    is_class_scores,
    max_abs_diff,
    output_kind,
    output_names,
    top1_accuracy,
    top1_hits,
    top_k_accuracy,
)
from orchestrator.model.artifact import ModelArtifact
from orchestrator.stages import register
from orchestrator.stages.base import ANY_KIND, Stage, StageContext, StageParams, StageResult

KernelSet = Literal["default", "builtin", "reference"]


class Params(StageParams):
    batch_size: bounded("batch") = Field(
        64, description="Samples per run (a model with a fixed batch size uses its own).")
    top_k: bounded("top_k") = Field(
        1, description="Also report top-k accuracy (`top<k>_accuracy`) when above 1.")
    confidence: float = Field(
        0.9, ge=0.5, lt=1.0, description="One-sided confidence of each figure's bounds "
        "(`<figure>_low`, `<figure>_high`): quality budgets are met only at the bound.")
    part: Part = Field(
        "all", description="Which evaluation samples to judge: all, the search part, or the "
        "held-out part (`held_out_share` of them, the same every run).")
    held_out_share: float = Field(
        0.25, gt=0.0, lt=1.0, description="The share of evaluation samples held out from "
        "the search part.")
    kernel_sets: tuple[KernelSet, ...] = Field(
        ("default", "builtin"), min_length=1, description="A .tflite's kernel sets to judge "
        "under (every figure is the worst over them): default (XNNPACK where it takes the "
        "ops), builtin, reference.")


def run(given: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    if ctx.evaluation is None:
        raise StageError("evaluate needs data.evaluation in the recipe",
                         pipeline=ctx.pipeline, stage=ctx.stage)
    data = ctx.evaluation()
    names = output_names(given.outputs, given.metadata)
    references, warnings = _references(ctx, len(given.outputs), names)
    chosen, part = _judged_rows(data.inputs, params, ctx, warnings)
    inputs = data.inputs[chosen]
    labels = None if data.labels is None else data.labels[chosen]
    references = [None if r is None else r[chosen] for r in references]

    judged = {kernels: _judge(outputs, references, labels, names, given, params, ctx)
              for kernels, outputs in _runs(given, inputs, params, ctx)}
    first = next(iter(judged.values()))
    warnings += first.warnings
    rows, info = first.rows, first.info
    if len(judged) > 1:
        rows, info = _worst(judged)
    metrics: dict[str, float] = {}
    for row in rows:
        metrics.update({f"{m}.{row['name']}": row[m] for m in OUTPUT_METRICS if m in row})
    info = {"samples": len(inputs), "output_kind": rows[0]["kind"], "outputs": rows,
            "part": part, **info}
    metrics.update({k: float(v) for k, v in info.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                    and k != "samples"})
    metrics["evaluation_samples"] = float(len(inputs))
    if len(judged) > 1:
        info["kernel_sets"] = {k: j.summary() for k, j in judged.items()}
        for kernels, j in judged.items():
            for key in ("fidelity", "fidelity_low"):
                if j.info.get(key) is not None:
                    metrics[f"{key}_{kernels}"] = float(j.info[key])
    return StageResult(artifact=given, metrics=metrics, info=info, warnings=warnings)


@dataclass
class _Judged:
    """The figures of one run of the model (one kernel set) against the references."""

    rows: list[dict[str, Any]]
    info: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """This kernel set's headline figures and per-output agreement and SQNR."""
        keys = ("fidelity", "fidelity_low", "fidelity_high", "accuracy", "accuracy_low",
                "min_sqnr_db", "min_sqnr_db_low")
        made: dict[str, Any] = {k: self.info[k] for k in keys if self.info.get(k) is not None}
        made["outputs"] = {r["name"]: {m: r[m] for m in ("top1_agreement", "sqnr_db",
                                                         "sqnr_db_low") if m in r}
                           for r in self.rows}
        return made


def _runs(given: ModelArtifact, inputs: np.ndarray, params: Params, ctx: StageContext):
    """(kernel set, outputs) per run: one per kernel set for a .tflite, one ("tensorflow")
    for a graph; a memmapped or encrypted model runs as the graph rebuilt from it
    (decrypted in memory)."""
    from orchestrator.measure.tf_runtime import open_runner
    from orchestrator.model.kinds import runnable

    model = runnable(given, ctx.model_key)
    if model.kind != "tflite":
        with open_runner(model, ctx.model_key) as runner:
            yield "tensorflow", runner.predict_all(inputs, params.batch_size)
        return
    from orchestrator.measure.litert_runtime import LiteRTRunner

    for kernels in dict.fromkeys(params.kernel_sets):
        with LiteRTRunner(model, kernels=kernels) as runner:
            yield kernels, runner.predict_all(inputs, params.batch_size)


def _judge(outputs: list[np.ndarray], references: list[np.ndarray | None],
           labels: np.ndarray | None, names: list[str], given: ModelArtifact,
           params: Params, ctx: StageContext) -> _Judged:
    """Every figure of `outputs` against `references` and `labels`, with its bounds."""
    confidence, n = params.confidence, len(outputs[0]) if outputs else 0
    rows = [{"name": name, "tensor": tensor, "shape": list(out.shape[1:]),
             "kind": output_kind(ref if ref is not None else out, labels is not None)}
            for name, tensor, out, ref in zip(names, given.outputs, outputs, references,
                                              strict=True)]
    warnings: list[str] = []
    for row, out, ref in zip(rows, outputs, references, strict=True):
        if ref is None:
            continue
        if ref.shape != out.shape:
            raise StageError(f"output {row['name']!r}: shape {out.shape} differs from the "
                             f"source model's {ref.shape}", pipeline=ctx.pipeline,
                             stage=ctx.stage)
        row.update(compare(out, ref, row["kind"]))
        if "top1_agreement" in row:
            row["top1_agreement_low"], row["top1_agreement_high"] = proportion_bounds(
                row["top1_agreement"], n, confidence)
        if "sqnr_db" in row:
            row["sqnr_db_low"], row["sqnr_db_high"] = sqnr_bounds(out, ref, confidence)

    info: dict[str, Any] = {"confidence": confidence, "accuracy": None, "fidelity": None,
                            "max_abs_diff": None,
                            "highest_meetable_agreement": lowest_meetable(n, confidence)}
    labelled = next((i for i, r in enumerate(rows) if r["kind"] in CLASS_KINDS), None)
    if labels is not None:
        if labelled is None:
            warnings.append("no accuracy: no output is class scores (N, C); fidelity is the "
                            "quality figure")
        else:
            _check_labels(outputs[labelled], labels)
            info["accuracy"] = top1_accuracy(outputs[labelled], labels)
            info["accuracy_low"], info["accuracy_high"] = proportion_bounds(
                info["accuracy"], n, confidence)
            if params.top_k > 1 and rows[labelled]["kind"] == CLASS_SCORES:
                info[f"top{params.top_k}_accuracy"] = top_k_accuracy(
                    outputs[labelled], labels, params.top_k)
    compared = [(r, out, ref) for r, out, ref in zip(rows, outputs, references, strict=True)
                if ref is not None]
    if compared:
        info["fidelity"] = fidelity_of([(r["kind"], out, ref) for r, out, ref in compared])
        info["fidelity_low"], info["fidelity_high"] = _fidelity_bounds(
            [r for r, _, _ in compared], n, confidence)
        info["max_abs_diff"] = max(max_abs_diff(out, ref) for _, out, ref in compared)
        others = [r for r, _, _ in compared if r["kind"] not in CLASS_KINDS and "sqnr_db" in r]
        if others:
            info["min_sqnr_db"] = min(r["sqnr_db"] for r in others)
            info["min_sqnr_db_low"] = min(r["sqnr_db_low"] for r in others)
        logit_sqnrs = [r["logit_sqnr_db"] for r, _, _ in compared if "logit_sqnr_db" in r]
        if logit_sqnrs:
            info["min_logit_sqnr_db"] = min(logit_sqnrs)
        if info["accuracy"] is not None and references[labelled] is not None:
            info["source_accuracy"] = top1_accuracy(references[labelled], labels)
            info["accuracy_drop"] = round(info["source_accuracy"] - info["accuracy"], 6)
            # per sample: the source right and this wrong (1), or the other way (-1)
            drops = (top1_hits(references[labelled], labels).astype(np.float64)
                     - top1_hits(outputs[labelled], labels))
            info["accuracy_drop_low"], info["accuracy_drop_high"] = mean_bounds(
                drops, confidence)
    return _Judged(rows, info, warnings)


def _fidelity_bounds(rows: list[dict[str, Any]], n: int, confidence: float
                     ) -> tuple[float, float]:
    """The bounds of `fidelity_of`'s figure: the first class output's agreement bounds,
    else the lowest energy fidelity's, from each output's SQNR bounds."""
    for row in rows:
        if row["kind"] in CLASS_KINDS:
            return row["top1_agreement_low"], row["top1_agreement_high"]
    lows = [energy_fidelity_of_db(r["sqnr_db_low"]) for r in rows if "sqnr_db_low" in r]
    highs = [energy_fidelity_of_db(r["sqnr_db_high"]) for r in rows if "sqnr_db_high" in r]
    return min(lows, default=1.0), min(highs, default=1.0)


def _worst(judged: dict[str, _Judged]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per output and across outputs, each figure's worst over the kernel sets."""
    runs = list(judged.values())

    def worst(key: str, values: list[Any]) -> Any:
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numbers) != len(values) or not numbers:
            return values[0]
        return max(numbers) if key in LOWER_IS_BETTER else min(numbers)

    rows = [{key: worst(key, [run.rows[i].get(key) for run in runs]) for key in row}
            for i, row in enumerate(runs[0].rows)]
    info = {key: worst(key, [run.info.get(key) for run in runs]) for key in runs[0].info}
    info["confidence"], info["highest_meetable_agreement"] = (
        runs[0].info["confidence"], runs[0].info["highest_meetable_agreement"])
    info["worst_kernel_set"] = min(judged, key=lambda k: (
        judged[k].info.get("fidelity_low") or 0.0, judged[k].info.get("min_sqnr_db_low") or 0))
    return rows, info


def _judged_rows(inputs: np.ndarray, params: Params, ctx: StageContext, warnings: list[str]
                 ) -> tuple[np.ndarray, dict[str, Any]]:
    """The indices of the evaluation samples to judge (see the module doc: overlap with the
    representative data, and `part`), and what `info["part"]` says of them."""
    total = len(inputs)
    chosen = part_rows(total, params.part, params.held_out_share)
    part: dict[str, Any] = {"part": params.part, "of": total}
    if params.part != "all":
        part["held_out_share"] = params.held_out_share
    overlap = (overlapping(inputs[chosen], ctx.representative(None, 256))
               if ctx.representative is not None and len(chosen) else np.zeros(0, bool))
    if overlap.any():
        count, size = int(overlap.sum()), len(chosen)
        if count < size:
            warnings.append(f"{count} of {size} evaluation samples are also representative "
                            "samples, which every method was fit on: judged on the other "
                            f"{size - count}")
            chosen = chosen[~overlap]
        else:
            warnings.append(f"ALL {size} evaluation samples are also representative samples, "
                            "which every method was fit on: the figures are judged on them "
                            "all and overstate how it does on new data; give data.evaluation "
                            "samples of its own")
        part["representative_overlap"] = count
    part["samples"] = len(chosen)
    return chosen, part


def _references(ctx: StageContext, count: int, names: list[str]
                ) -> tuple[list[np.ndarray | None], list[str]]:
    """The source's outputs, one per output (None where there is none to compare)."""
    given = ctx.reference_outputs() if ctx.reference_outputs is not None else None
    if given is None:
        return [None] * count, []
    if isinstance(given, np.ndarray):  # the first output only
        given = [given]
    references: list[np.ndarray | None] = [np.asarray(r) for r in given]
    if len(references) > count:
        raise StageError(f"the model has {count} outputs, the source model "
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


def _searched(params: Params, _candidate: Any) -> Params:
    """A guard trial is judged on the search part, whatever part the recipe judges on."""
    return params.model_copy(update={"part": "search"})


def _held_out(params: Params) -> Params:
    """The guard's chosen trial is confirmed on the part no trial was selected on."""
    return params.model_copy(update={"part": "held_out"})


STAGE = register(Stage(name="evaluate", run=run, params=Params, doc=__doc__,
                       kind="measure", uses_data=("evaluation",),
                       optional_data=("representative",),
                       accepts=ANY_KIND, judges_quality=True, variant_metrics=True,
                       candidate=_searched, confirm=_held_out))
