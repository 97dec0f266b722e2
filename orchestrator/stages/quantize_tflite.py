"""Quantize a float `.tflite` with the LiteRT Quantizer (`ai-edge-quantizer`).

Google's supported path: convert to float (`convert_tflite: {mode: fp32}`), then this. The
scheme is one of the quantizer's recipes, for the whole model and, through `layers`, per
layer by a regular expression searched in an op's name (its output tensors' names):

    - convert_tflite: {mode: fp32}
    - quantize_tflite:
        scheme: static_wi8_ai8            # full integer: what int8 kernels, DSPs, NPUs run
        layers: {"dense_1/": static_wi8_ai16, "softmax": float}

The static schemes calibrate activation ranges on the recipe's representative data, in
batches. The quantizer's own comparison of every tensor (float model against quantized,
on representative inputs) becomes the layer_errors of the report, the page and MLflow;
the accuracy guard (`guard: true`) ranks layers by it when a quality budget breaks, and
moves the worst to int16 activations (a16w8) before float. The report says what the file
computes in (full integer, int8 with int16 activations, int8 with float layers, dynamic,
float): that decides whether a DSP or an NPU can run it.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from orchestrator.errors import DataError, ModelSourceError
from orchestrator.limits import bounded
from orchestrator.model.artifact import ModelArtifact
from orchestrator.quant.knobs import (
    FLOAT,
    INT16_ACTIVATIONS,
    FoundLayers,
    Knobs,
    Method,
    with_params,
)
from orchestrator.quant.litert_quantizer import (
    DYNAMIC_RANGE_FALLBACK,
    DYNAMIC_SCHEME,
    FLOAT_SCHEME,
    SCHEME_DOCS,
    STATIC,
    WIDE_SCHEME,
    Scheme,
    layer_pattern,
)
from orchestrator.stages import register
from orchestrator.stages.base import (
    Stage,
    StageContext,
    StageParams,
    StageResult,
    counting_samples,
)

if TYPE_CHECKING:
    from orchestrator.quant.knobs import Candidate, LayerSource

# A layer above this many quantization steps of error at its output is flagged (as
# convert_tflite flags the debugger's figures).
LAYER_ERROR_LIMIT = 0.7


# Learned rounding's optimizer steps per layer (most of its gain by then: docs/litert.md).
ROUNDING_ITERATIONS = 300
TSV_FIELDS = ("node", "op", "rmse_over_scale", "nmse", "added_nmse", "sqnr_db", "scale")
# What the file computes in, as convert_tflite's modes name it for the runtime's cost
# (benchmark's device estimate takes "int8" as int8 kernels' speed). Int16 activations run
# on LiteRT's reference kernels on a CPU, slower than float (15.7 ms against 0.79 for int8
# on the mini-Xception, this host): they are for NPUs and DSPs, not an int8 speed-up.
MODES = {"int8": "int8", "int8+int16": "int16_activations", "int8+float": "mixed",
         "dynamic": "dynamic_range", "float": "fp32"}


class Params(StageParams):
    scheme: Scheme = Field(
        "static_wi8_ai8", description="The quantizer's recipe for the whole model: " + "; ".join(
            f"{name}: {doc}" for name, doc in SCHEME_DOCS.items()) + ".")
    layers: dict[str, Scheme] = Field(
        {}, description="Per layer: a regular expression searched in an op's name (its "
        "output tensors' names) -> a scheme; later entries win. E.g. {\"conv2d_3\": "
        "static_wi8_ai16, \"logits\": float}.")
    io: Literal["float", "int8"] = Field(
        "float", description="Static schemes: the model's input "
        "and output type. float (default): the app feeds floats (QUANTIZE / DEQUANTIZE at "
        "the edges); int8: the app quantizes its inputs and dequantizes its outputs.")
    per_channel: bool = Field(
        True, description="One weight scale per output channel (more accurate; each "
        "channel costs 12 bytes of quantization params); false: one per tensor.")
    calibration_samples: bounded("samples") = Field(
        200, description="Static schemes: representative samples that calibrate the "
        "activation ranges.")
    calibration_batch: bounded("batch") = Field(
        32, description="Samples per calibration batch (the quantizer keeps a moving "
        "average of each batch's min and max).")
    diagnostic_samples: bounded("diagnostic_samples") = Field(
        50, description="Representative samples on which the quantizer compares every "
        "tensor with the float model's (layer_errors); 0: none.")
    shrink: bool = Field(
        True, description="Drop what the app does not use: the names of intermediate "
        "tensors and the conversion metadata (the signature and the input and output "
        "names stay). Per-channel zero points stay: LiteRT refuses a file without one "
        "per scale.")
    ranges: Literal["min_max", "mse"] = Field(
        "min_max", description="Static schemes: each activation's range from the "
        "representative data. min_max: the smallest range that holds every value seen; "
        "mse: the clipping that minimises int8's squared error (clipping plus rounding), "
        "so that rare large values no longer widen every step.")
    rounding: Literal["nearest", "learned"] = Field(
        "nearest", description="Static schemes: int8 weights rounded to the nearest step, "
        "or learned: each layer's weights rounded up or down to match the float layer's "
        "outputs on the representative data (AdaRound), layer by layer on what the "
        "quantized layers before it give, then its bias corrected.")
    fine_tune: bool = Field(
        False, description="Static schemes: trained ranges. Before quantizing, the float "
        "model's weights and activation ranges are fine-tuned with LiteRT's int8 "
        "arithmetic simulated (fake quantization), to match the float model's own outputs "
        "on the representative data (no labels needed); the file is quantized with the "
        "trained ranges. Works from every model source: it trains the float .tflite's "
        "weights.")
    fine_tune_steps: bounded("train_steps") = Field(
        300, description="fine_tune: optimizer steps, one representative batch each.")
    guard: bool = Field(
        False, description="When a target's quality budget breaks, try the int8 methods "
        "(ranges by error, learned rounding, trained ranges), then move the layers that "
        "add the most error to int16 activations (a16w8), and to float only where no "
        "integer scheme holds (see orchestrator/guard/); each trial is tracked.")

    @model_validator(mode="after")
    def _methods_need_a_static_scheme(self) -> Params:
        """An int8 method on a scheme that calibrates nothing would be silently ignored."""
        asked = [f"{name}: {value}" for name, value, default in (
            ("ranges", self.ranges, "min_max"), ("rounding", self.rounding, "nearest"),
            ("fine_tune", self.fine_tune, False)) if value != default]
        if asked and not _calibrates(self):
            raise ValueError(f"{', '.join(asked)} change(s) how static int8 is found; "
                             f"scheme {self.scheme} calibrates nothing (use static_wi8_ai8, "
                             "or a static scheme in `layers`)")
        return self

    @field_validator("layers")
    @classmethod
    def _patterns_compile(cls, layers: dict[str, Any]) -> dict[str, Any]:
        for pattern in layers:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"layer pattern {pattern!r} is not a regular expression: "
                                 f"{exc}") from exc
        return layers


def run(given: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.model import tflite_bytes
    from orchestrator.model.litert_model import describe
    from orchestrator.model.litert_precision import DESCRIPTIONS, computes_in, float_ops
    from orchestrator.quant import litert_quantizer as aeq
    from orchestrator.quant.litert_rewrites import rewrite_for_quantizer

    float_model = given.payload
    assert float_model is not None
    if computes_in(float_model) != "float":
        raise ModelSourceError("quantize_tflite takes a float .tflite: put "
                               "convert_tflite: {mode: fp32} before it")
    float_model = aeq.with_signature(float_model, given.input_names, list(given.outputs))
    float_model, rewritten = rewrite_for_quantizer(float_model)
    static = _calibrates(params)
    ctx, samples_used = counting_samples(ctx)
    info: dict[str, Any] = {}
    batches = list(_batches(ctx, params.calibration_samples, params.calibration_batch)) \
        if static else []
    try:
        tuned, fixed_ranges = _trained(float_model, given, params, batches, ctx, info)
        made = aeq.quantizer_for(tuned, params.scheme, params.layers,
                                 params.per_channel, float_io=params.io == "float")
        calibration = aeq.signature_batches(tuned, batches) if static else None
        quantized = aeq.quantize(made, calibration, ctx.log, ranges=params.ranges,
                                 fixed_ranges=fixed_ranges or None)
        if params.rounding == "learned" and static:
            from orchestrator.quant.learned_rounding import learn_rounding

            with _timed(info, "learned_rounding"):
                quantized, info["learned_rounding"] = learn_rounding(
                    tuned, quantized, batches, iterations=ROUNDING_ITERATIONS, log=ctx.log)
    except ValueError as exc:
        raise ModelSourceError(f"the LiteRT Quantizer could not quantize this model with "
                               f"{params.scheme}{_methods_words(params)}: {exc}") from exc
    named, shrunk = quantized, {}  # the quantizer's comparison goes by the tensors' names
    if params.shrink:
        quantized, shrunk = tflite_bytes.shrink(quantized)
    verdict = computes_in(quantized)
    float_left = float_ops(quantized) if verdict == "int8+float" else {}
    info.update({"computes_in": verdict, "bytes_by_kind": tflite_bytes.bytes_by_kind(quantized)})
    if shrunk:
        info["shrink"] = {k: v for k, v in shrunk.items() if v}
    if rewritten:  # ops the quantizer has no rule for, as equivalents it has
        info["rewritten_ops"] = rewritten
    metrics: dict[str, float] = {"size_ratio": len(quantized) / len(float_model)}
    diagnostics: list[str] = []
    if params.diagnostic_samples and ctx.representative is not None:
        data = aeq.signature_batches(float_model, _batches(
            ctx, params.diagnostic_samples, params.calibration_batch))
        info["layer_errors"] = aeq.tensor_errors(float_model, named, data,
                                                 aeq.float_layers(float_model), ctx.log)
        metrics.update(_error_metrics(info["layer_errors"]))
        diagnostics += _flagged(info["layer_errors"])
    if float_left:
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(float_left.items()))
        diagnostics.append(f"computes in float in the quantized model: {listed}")
    info["tflite"] = {"mode": MODES[verdict], "scheme": params.scheme,
                      "layers": dict(params.layers), "io": params.io,
                      "int8_methods": _methods_used(params, static),
                      "computes_in": verdict, "computes_in_text": DESCRIPTIONS[verdict],
                      "ops": describe(quantized).op_counts, "float_ops": float_left}
    if diagnostics:
        info["diagnostics"] = diagnostics
    if samples_used():  # static schemes: the representative samples it calibrated on
        info["samples"] = samples_used()
    metadata = {**given.metadata, "tflite": {**(given.metadata.get("tflite") or {}),
                                             "mode": info["tflite"]["mode"],
                                             "scheme": params.scheme, "io": params.io,
                                             "computes_in": verdict}}
    artifact = ModelArtifact(graph_def=None, kind="tflite", payload=quantized,
                             inputs=given.inputs, outputs=given.outputs, metadata=metadata)
    result = StageResult(artifact=artifact, metrics=metrics, info=info)
    if info.get("layer_errors"):  # beside the model, and in MLflow with the run
        from orchestrator.quant.layer_errors import table_tsv

        result.files["layer_errors.tsv"] = table_tsv(info["layer_errors"], TSV_FIELDS).encode()
    return result


def _trained(float_model: bytes, given: ModelArtifact, params: Params,
             batches: list[np.ndarray], ctx: StageContext, info: dict[str, Any]
             ) -> tuple[bytes, dict[str, tuple[float, float]]]:
    """The float model to quantize and the ranges that replace calibrated ones: the
    model's own trained ranges (FakeQuant nodes, carried by convert_tflite), then, with
    fine_tune, the weights and ranges trained here."""
    fixed = {name: (float(low), float(high)) for name, (low, high)
             in (given.metadata.get("trained_ranges") or {}).items()}
    if fixed:
        info["trained_ranges_from_model"] = len(fixed)
    if not (params.fine_tune and batches):
        return float_model, fixed
    from orchestrator.quant.trained_ranges import fine_tune

    with _timed(info, "fine_tune"):
        trained = fine_tune(float_model, batches, steps=params.fine_tune_steps, log=ctx.log,
                            initial_ranges=fixed or None)  # a model's own ranges: the start
    info["fine_tune"] = trained.report
    return trained.float_model, {**fixed, **trained.ranges}


@contextlib.contextmanager
def _timed(info: dict[str, Any], method: str) -> Iterator[None]:
    """info["method_seconds"][method]: what an int8 method took to find its numbers."""
    started = time.monotonic()
    yield
    info.setdefault("method_seconds", {})[method] = round(time.monotonic() - started, 3)


def _methods_used(params: Params, static: bool) -> list[str]:
    """The int8 methods this file was made with (none but min-max for dynamic schemes)."""
    if not static:
        return []
    return [f"ranges: {params.ranges}", f"rounding: {params.rounding}",
            *(["fine_tune (trained ranges)"] if params.fine_tune else [])]


def _methods_words(params: Params) -> str:
    words = [w for w, on in (("ranges by error", params.ranges == "mse"),
                             ("learned rounding", params.rounding == "learned"),
                             ("trained ranges", params.fine_tune)) if on]
    return f" ({', '.join(words)})" if words else ""


def _batches(ctx: StageContext, samples: int, batch: int) -> Any:
    if ctx.representative is None:
        raise DataError("quantize_tflite's static schemes calibrate activation ranges on "
                        "data.representative, and the recipe has none (or use "
                        "dynamic_wi8_afp32, which needs no data)")
    return ctx.representative(samples, batch)


def _flagged(rows: list[dict[str, Any]]) -> list[str]:
    """The diagnostic line for layers that add more than LAYER_ERROR_LIMIT steps."""
    flagged = [r for r in rows if r["rmse_over_scale"] > LAYER_ERROR_LIMIT]
    if not flagged:
        return []
    from orchestrator.formatting import layer_names

    short = layer_names([r["node"] for r in rows])
    listed = ", ".join(f"{short[r['node']]} {r['rmse_over_scale']:.2f}" for r in flagged[:3])
    return [f"{len(flagged)} layer(s) add above {LAYER_ERROR_LIMIT} quantization steps of "
            f"error (rounding alone: 0.29): {listed}. Where a quality budget breaks, the "
            "guard (quantize_tflite: {guard: true}) moves such layers to int16 activations, "
            "then float"]


def _calibrates(params: Params) -> bool:
    """Whether a static scheme is in use (for the model or a layer): ranges from data."""
    return params.scheme in STATIC or any(s in STATIC for s in params.layers.values())


def _error_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    metrics = {"layers_flagged": float(sum(r["rmse_over_scale"] > LAYER_ERROR_LIMIT
                                           for r in rows))}
    if rows:
        metrics["layer_error_max"] = max(r["rmse_over_scale"] for r in rows)
        known = [r["nmse"] for r in rows if r["nmse"] is not None]
        if known:
            metrics["layer_nmse_max"] = max(known)
    return metrics


def data_for(params: Params) -> dict[str, str]:
    """The static schemes calibrate on the representative data; the others need none."""
    return {"representative": f"scheme {params.scheme} calibrates its activation ranges "
            "on it"} if _calibrates(params) else {}


def _candidate(params: Params, candidate: Candidate) -> Params:
    """The int8 methods a guard candidate turns on, and the layers it moves, by exact name,
    on top of the recipe's own patterns (later patterns win); the fallback is dynamic
    range everywhere."""
    if candidate.fallback:  # no int8 op: no int8 method either
        return with_params(params, scheme=DYNAMIC_SCHEME, layers={}, ranges="min_max",
                           rounding="nearest", fine_tune=False)
    methods = {name: value for name, value in candidate.options
               if name in METHOD_OPTIONS and value is not None}
    if methods:
        params = with_params(params, **methods)
    wide, floats = candidate.nodes_in(INT16_ACTIVATIONS.name), candidate.nodes_in(FLOAT.name)
    if not (wide or floats):
        return params
    layers = dict(params.layers)
    layers.update({layer_pattern(n): WIDE_SCHEME for n in wide})
    layers.update({layer_pattern(n): FLOAT_SCHEME for n in floats})
    return with_params(params, layers=layers)


def _layers(source: LayerSource) -> FoundLayers:
    """The quantizer's rows name each op's inputs: ops grouped with the pass-through ops
    that feed them, ranked by the error each adds on what it was given."""
    from orchestrator.quant.layer_groups import grouped_layers

    rows = list(source.info.get("layer_errors") or [])
    return FoundLayers(grouped_layers(rows), {r["node"]: list(r.get("inputs") or [])
                                              for r in rows}, ranking_rows=rows)


# Quantization noise on a deep CNN piles up a little in every layer, so taking a layer or two
# out of int8 moves the output little; wider activations on many layers at once do help, and
# keep the int8 weights and integer compute: every layer a16w8, then bisect the fewest that
# need it (orchestrator/guard/bisect.py).
# The int8 methods, cheapest to find first (seconds on the photo mini-Xception, this host:
# docs/litert.md); each keeps every layer in int8. The int16 ladder climbs from ranges by
# error only: learned rounding would be learned again for every one of its trials (a
# minute each on the mini-Xception), and ranges trained for int8 clip what int16 keeps.
METHODS = (
    Method("ranges chosen by error", "ranges -> chosen by error (mse)", (("ranges", "mse"),)),
    Method("learned rounding, ranges by error", "weights -> learned rounding, ranges by error",
           (("ranges", "mse"), ("rounding", "learned")), stacks=False),
    Method("trained ranges (quantization-aware fine-tuning)",
           "fine-tuned with int8 simulated -> trained ranges", (("fine_tune", True),),
           stacks=False),
)
METHOD_OPTIONS = frozenset(name for method in METHODS for name, _ in method.options)

KNOBS = Knobs(
    layers=_layers,
    ladder=(INT16_ACTIVATIONS, FLOAT),
    methods=METHODS,
    search="bisect",
    kernels="an integer LiteRT file (int8, int16 activations where needed, float only "
            "where neither held)",
    guard_setting="quantize_tflite: {guard: true}",
    fallback=DYNAMIC_RANGE_FALLBACK,
    shows_compute=True)

STAGE = register(Stage(name="quantize_tflite", run=run, params=Params, doc=__doc__ or "",
                       accepts=frozenset({"tflite"}), optional_data=("representative",),
                       data_for=data_for, knobs=KNOBS, candidate=_candidate))
