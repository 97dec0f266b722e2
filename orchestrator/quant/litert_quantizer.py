"""The LiteRT Quantizer (`ai-edge-quantizer`): a float `.tflite` in, a quantized one out.

Google's supported path since quantizing inside the TFLite converter was deprecated. What
this module adds around it:
- schemes by the quantizer's own recipe names, one for the model and any per layer (a
  regular expression searched in an op's name: its output tensors' names, as the quantizer
  matches them), `float` keeping a layer out;
- float model inputs and outputs by default (the app feeds floats; QUANTIZE / DEQUANTIZE
  at the edges), or int8 ones;
- calibration on the recipe's representative data in batches (the true min and max over
  all of them), or ranges chosen by error (`ranges="mse"`: quant/range_search), or ranges
  given by tensor name (`fixed_ranges`: trained, or read from FakeQuant nodes);
- the quantizer's own per-tensor comparison (float model against quantized, every tensor,
  on the same inputs) as per-layer error rows, and each layer's inputs, so that the
  guard can rank layers by the error each one adds.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from orchestrator.model.litert_model import tensor_name
from orchestrator.quant.knobs import Fallback

# The quantizer's recipe names (ai_edge_quantizer.recipe), plus `float` for "leave out".
Scheme = Literal["static_wi8_ai8", "static_wi8_ai16", "dynamic_wi8_afp32",
                 "dynamic_wi4_afp32", "weight_only_wi8_afp32", "weight_only_wi4_afp32",
                 "float"]
SCHEME_DOCS = {
    "static_wi8_ai8": "full integer: int8 weights, int8 activations (calibrated)",
    "static_wi8_ai16": "integer: int8 weights, int16 activations (a16w8, calibrated)",
    "dynamic_wi8_afp32": "int8 weights, float activations quantized on the fly",
    "dynamic_wi4_afp32": "int4 weights, float activations quantized on the fly",
    "weight_only_wi8_afp32": "int8 weights dequantized to float, float compute",
    "weight_only_wi4_afp32": "int4 weights dequantized to float, float compute",
    "float": "not quantized",
}
STATIC = ("static_wi8_ai8", "static_wi8_ai16")
# The schemes the accuracy guard moves a layer to, and the whole-model fallback.
WIDE_SCHEME, FLOAT_SCHEME, DYNAMIC_SCHEME = "static_wi8_ai16", "float", "dynamic_wi8_afp32"
# The guard's whole-model fallback on the LiteRT path, whichever stage made the int8 file
# (convert_tflite's int8 mode, quantize_tflite): dynamic range.
DYNAMIC_RANGE_FALLBACK = Fallback(
    "LiteRT dynamic range (int8 weights, float activations)",
    "LiteRT dynamic range (int8 weights, float activations)", "8-bit LiteRT variant",
    change="every layer -> weights-only 8-bit (dynamic range)")
FLOAT32, INT16 = 0, 7  # schema TensorType


@dataclass(frozen=True)
class Layer:
    """One op of the float model, named as the quantizer names it: its first output."""

    name: str
    op: str
    inputs: tuple[str, ...]  # the names of the tensors it reads
    has_weights: bool


def layer_pattern(name: str) -> str:
    """The regular expression that matches exactly the op whose first output is `name` (the
    quantizer matches `out1;out2;` against a recipe's regex)."""
    return f"^{re.escape(name)};"


def quantizer_for(float_model: bytes, scheme: Scheme, layers: Mapping[str, Scheme],
                  per_channel: bool, float_io: bool) -> Any:
    """The quantizer with its recipe: `scheme` for every op, then each of `layers`
    (pattern -> scheme, later ones win), then float edges when `float_io`."""
    from ai_edge_quantizer import qtyping, quantizer

    granularity = qtyping.QuantGranularity.CHANNELWISE if per_channel \
        else qtyping.QuantGranularity.TENSORWISE
    made = quantizer.Quantizer(bytearray(float_model))
    for pattern, each in [(".*", scheme), *layers.items()]:
        _add(made, pattern, each, granularity)
    if float_io:  # a key of its own, added last: no layer pattern overrides the edges
        for edge in ("INPUT", "OUTPUT"):
            made.update_quantization_recipe("(?s).*", edge, algorithm_key="no_quantize")
    return made


def _add(made: Any, pattern: str, scheme: Scheme, granularity: Any) -> None:
    if scheme == "float":
        made.update_quantization_recipe(pattern, "*", algorithm_key="no_quantize")
    elif scheme.startswith("static_"):
        made.add_static_config(pattern, "*", activation_num_bits=int(scheme[-2:].lstrip("i")),
                               weight_num_bits=8, weight_granularity=granularity)
    elif scheme.startswith("dynamic_"):
        made.add_dynamic_config(pattern, "*", num_bits=_weight_bits(scheme),
                                granularity=granularity)
        # LiteRT's one float-input depthwise kernel reads a scale per channel: one scale
        # per tensor makes every channel but the first read past it (convert_tflite's
        # per_channel: false met it), so depthwise filters stay per channel
        made.add_dynamic_config(pattern, "DEPTHWISE_CONV_2D", num_bits=_weight_bits(scheme),
                                granularity=type(granularity).CHANNELWISE)
    else:
        made.add_weight_only_config(pattern, "*", num_bits=_weight_bits(scheme),
                                    granularity=granularity)


def _weight_bits(scheme: str) -> int:
    return int(re.search(r"wi(\d+)", scheme).group(1))  # type: ignore[union-attr]


def with_signature(float_model: bytes, inputs: list[str], outputs: list[str]) -> bytes:
    """`float_model` with a `serving_default` signature over its inputs and outputs, named
    as the graph named them (litert_model.signature_name: `node`, or `node:k` for another
    output of a multi-output op), when it has none (convert_tflite writes one; a file
    whose names were stripped has none): the quantizer feeds and compares a model through
    its signature, and an app and the runtime find the shipped file's tensors by these
    names, not their position."""
    from orchestrator.model.litert_model import with_signature as signed

    return signed(float_model, inputs, outputs)


def signature(float_model: bytes) -> tuple[str, list[str]]:
    """The model's signature key and its input names; ValueError when it has none (a
    file whose names were stripped)."""
    from orchestrator.model.litert_model import interpreter

    signatures = interpreter(float_model, allocate=False).get_signature_list()
    if not signatures:
        raise ValueError("the float .tflite has no signature (were its names stripped?)")
    key = next(iter(signatures))
    return key, list(signatures[key]["inputs"])


def signature_batches(float_model: bytes, batches: Iterable[np.ndarray]
                      ) -> dict[str, list[dict[str, np.ndarray]]]:
    """The quantizer's data format: {signature: [{input: batch}, ...]} (one input)."""
    key, inputs = signature(float_model)
    if len(inputs) != 1:
        raise ValueError(f"the model has {len(inputs)} inputs; representative data feeds "
                         "one")
    return {key: [{inputs[0]: np.asarray(b, dtype=np.float32)} for b in batches]}


Ranges = Literal["min_max", "mse"]
RANGES_DOCS = {
    "min_max": "each activation's range: its min and max on the representative data",
    "mse": "each activation's range clipped where that loses least (rounding + clipping "
           "error, from its histogram on the representative data; see quant/range_search)",
}
# Ops whose output range LiteRT fixes (1/256 steps over [0, 1] or [-1, 1]): never searched.
FIXED_RANGE_OPS = ("SOFTMAX", "LOGISTIC", "TANH", "LOG_SOFTMAX")


def quantize(made: Any, calibration: Mapping[str, list[dict[str, np.ndarray]]] | None,
             log: Any, *, ranges: Ranges = "min_max",
             fixed_ranges: Mapping[str, tuple[float, float]] | None = None) -> bytes:
    """Calibrate where the recipe needs it, then quantize; what the quantizer prints
    (progress bars, reports) goes to `log` at debug level.

    ranges: how each activation's range is chosen from the calibration data (RANGES_DOCS).
    fixed_ranges: tensor name (the float model's) -> (min, max) replacing the calibrated
    range of that tensor (ranges trained or read from FakeQuant nodes); ValueError for a
    name that is no calibrated activation. An op that keeps its input's scale (pooling,
    reshape) takes its input's range whatever its output's says, so the range to fix is
    the input's (a row in the log names any that the file does not hold)."""
    if ranges not in RANGES_DOCS:
        raise ValueError(f"ranges must be one of {', '.join(RANGES_DOCS)}, not {ranges!r}")
    with _quiet(log):
        result = None
        if made.need_calibration:
            if not calibration:
                raise ValueError("this scheme calibrates activation ranges on "
                                 "representative data")
            result = _min_max(made, calibration)
            if ranges == "mse":
                result = _searched(made, calibration, result, log)
            if fixed_ranges:
                result = _fixed(result, fixed_ranges, _tensor_names(made), log)
        quantized = made.quantize(result, enable_progress_report=False)
    model = bytes(quantized.quantized_model)
    if result is None and (fixed_ranges or ranges != "min_max"):
        log.info("ranges=%s and fixed_ranges unused: this scheme calibrates no activation "
                 "ranges", ranges)
    elif fixed_ranges:
        _check_fixed(model, fixed_ranges, log)
    return model


def _tensor_names(made: Any) -> set[str]:
    """Every tensor name of the quantizer's float model."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(made._float_model_buffer)
    return {tensor_name(t) for subgraph in model.subgraphs for t in subgraph.tensors}


def _fixed(result: dict[str, Any], fixed: Mapping[str, tuple[float, float]],
           tensors: set[str], log: Any) -> dict[str, Any]:
    """`result` with the ranges of `fixed`; a tensor of the model that calibrates no range
    (a layer the recipe keeps in float) is skipped, a name the model lacks is an error."""
    import difflib

    known = [name for name, qsv in result.items() if qsv and _is_float_range(qsv)]
    uncalibrated = [name for name in fixed if name not in known and name in tensors]
    if uncalibrated:
        log.debug("fixed ranges of %d tensor(s) not calibrated here (kept in float): %s",
                  len(uncalibrated), ", ".join(uncalibrated[:5]))
        fixed = {name: span for name, span in fixed.items() if name not in uncalibrated}
    unknown = [name for name in fixed if name not in known]
    if unknown:
        near = {n: difflib.get_close_matches(n, known, n=1, cutoff=0.5) for n in unknown[:3]}
        raise ValueError(
            f"fixed_ranges names {len(unknown)} tensor(s) the quantizer calibrates no range "
            "for: " + "; ".join(f"{n!r}" + (f' (did you mean "{m[0]}"?)' if m else "")
                                for n, m in near.items())
            + f". Calibrated activations include: {', '.join(map(repr, known[:4]))}")
    merged = dict(result)
    for name, (low, high) in fixed.items():
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"fixed range of {name!r} must be finite with min < max, "
                             f"not ({low}, {high})")
        qsv = merged[name]
        merged[name] = {**qsv, "min": np.full_like(qsv["min"], low),
                        "max": np.full_like(qsv["max"], high)}
    return merged


def _is_float_range(qsv: Mapping[str, Any]) -> bool:
    return "min" in qsv and np.asarray(qsv["min"]).dtype.kind == "f"


def _check_fixed(model: bytes, fixed: Mapping[str, tuple[float, float]], log: Any) -> None:
    """Log the fixed ranges the file does not hold (an op that keeps its input's scale, a
    softmax's fixed output range), with the range it holds instead."""
    held = _output_ranges(model)
    for name, (low, high) in fixed.items():
        got = held.get(name)
        wanted = (min(low, 0.0), max(high, 0.0))
        if got and not np.allclose(got, wanted, rtol=0.02, atol=(high - low) / 255):
            log.info("fixed range of %s: (%.4g, %.4g) asked, the file holds (%.4g, %.4g) "
                     "(its op keeps another tensor's scale)", name, low, high, *got)


def _output_ranges(model: bytes) -> dict[str, tuple[float, float]]:
    """Tensor name -> the range its (per-tensor) scale and zero point cover."""
    from ai_edge_litert.tools import flatbuffer_utils

    parsed = flatbuffer_utils.convert_bytearray_to_object(bytearray(model))
    found = {}
    for tensor in parsed.subgraphs[0].tensors:
        q = tensor.quantization
        if q is None or q.scale is None or len(q.scale) != 1:
            continue
        levels = 65535 if tensor.type == INT16 else 255
        low = -(float(q.zeroPoint[0]) + (32768 if tensor.type == INT16 else 128))
        found[tensor_name(tensor)] = (
            low * float(q.scale[0]), (low + levels) * float(q.scale[0]))
    return found


def _searched(made: Any, calibration: Mapping[str, list[dict[str, np.ndarray]]],
              result: dict[str, Any], log: Any) -> dict[str, Any]:
    """`result` with each activation's range chosen by error (quant/range_search) from a
    histogram of its values on the calibration data (the float model run again with every
    tensor kept), except the outputs of ops whose range LiteRT fixes."""
    from ai_edge_quantizer.utils import tfl_interpreter_utils as tfl_utils

    from orchestrator.quant import range_search

    float_model = bytes(made._float_model_buffer)  # the quantizer's copy of the float model
    fixed_by_op = {layer.name for layer in float_layers(float_model)
                   if layer.op in FIXED_RANGE_OPS}
    spans = {name: range_search.histogram_range(np.min(qsv["min"]), np.max(qsv["max"]))
             for name, qsv in result.items()
             if qsv and _is_float_range(qsv) and np.size(qsv["min"]) == 1
             and name not in fixed_by_op}
    counts = {name: np.zeros(range_search.BINS) for name in spans}
    interpreter = tfl_utils.create_tfl_interpreter(float_model,
                                                   num_threads=os.cpu_count() or 1)
    for key, batches in calibration.items():
        subgraph = tfl_utils.get_signature_main_subgraph_index(interpreter, key)
        for batch in batches:
            tfl_utils.invoke_interpreter_signature(interpreter, batch, key)
            for detail in interpreter.get_tensor_details(subgraph):
                name = detail["name"]
                if name in counts and spans[name][1] > spans[name][0]:
                    values = interpreter.get_tensor(detail["index"], subgraph)
                    counts[name] += np.histogram(values, range_search.BINS, spans[name])[0]
    levels = _levels(made, result)
    searched = dict(result)
    for name, (lo, hi) in spans.items():
        low, high = range_search.best_range(counts[name], lo, hi, levels.get(name, 256))
        if (low, high) != (lo, hi):
            log.debug("range of %s: [%.4g, %.4g] -> [%.4g, %.4g]", name, lo, hi, low, high)
            qsv = result[name]
            searched[name] = {**qsv, "min": np.full_like(qsv["min"], low),
                              "max": np.full_like(qsv["max"], high)}
    return searched


def _levels(made: Any, result: dict[str, Any]) -> dict[str, int]:
    """Tensor name -> its quantization levels where not 256: int16 activations (a recipe
    with a16w8 layers, read from a min-max quantized file); int8 everywhere else."""
    recipe = made.get_quantization_recipe()
    if not any(((entry.get("op_config") or {}).get("activation_tensor_config") or {})
               .get("num_bits") == 16 for entry in recipe):
        return {}
    from ai_edge_litert.tools import flatbuffer_utils

    parsed = flatbuffer_utils.convert_bytearray_to_object(
        bytearray(made.quantize(result, enable_progress_report=False).quantized_model))
    return {tensor_name(t): 65536
            for t in parsed.subgraphs[0].tensors if t.type == INT16}


def _min_max(made: Any, calibration: Mapping[str, list[dict[str, np.ndarray]]]
             ) -> dict[str, Any]:
    """Each tensor's min and max over all the data. The quantizer's own calibration keeps a
    moving average of each batch's (0.95 old, 0.05 new), which sits inside the true range:
    an audio front end's loud clips then clip, at int8 and at int16 alike (the audio model
    of benchmarks/litert_quantizer.py: 14 dB on a head with int16 everywhere, 41 dB with
    the true range). So each batch is calibrated alone and the ranges merged."""
    merged: dict[str, Any] = {}
    threads = os.cpu_count() or 1
    for key, batches in calibration.items():
        for batch in batches:
            for name, qsv in made.calibrate({key: [batch]}, num_threads=threads).items():
                if name not in merged or not merged[name]:
                    merged[name] = dict(qsv)
                elif qsv:
                    merged[name] = {**qsv, "min": np.minimum(merged[name]["min"], qsv["min"]),
                                    "max": np.maximum(merged[name]["max"], qsv["max"])}
    return merged


@contextlib.contextmanager
def _quiet(log: Any) -> Iterator[None]:
    from orchestrator.model.native_output import native_output_held

    caught: list[str] = []
    text = io.StringIO()
    try:  # its warnings too ("experimental_preserve_all_tensors ... for debugging")
        with native_output_held(caught), contextlib.redirect_stderr(text), \
                contextlib.redirect_stdout(text), warnings.catch_warnings(record=True) as notes:
            warnings.simplefilter("always")
            yield
    finally:
        said = [str(n.message) for n in locals().get("notes") or []]
        for line in [*caught, *said, *text.getvalue().replace("\r", "\n").splitlines()]:
            if line.strip():
                log.debug("quantizer: %s", line.strip())


def float_layers(float_model: bytes) -> list[Layer]:
    """The float model's ops that compute on floats, in order, as layers."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(float_model))
    subgraph = model.subgraphs[0]

    def name(index: int) -> str:
        return tensor_name(subgraph.tensors[index])

    def constant(index: int) -> bool:
        return model.buffers[subgraph.tensors[index].buffer].data is not None

    found = []
    for op in subgraph.operators:
        kind = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) or "CUSTOM"
        if kind in ("QUANTIZE", "DEQUANTIZE") or op.outputs is None or not len(op.outputs) \
                or subgraph.tensors[op.outputs[0]].type != FLOAT32:  # shape arithmetic
            continue
        inputs = [i for i in (op.inputs if op.inputs is not None else []) if i >= 0]
        found.append(Layer(name(op.outputs[0]), kind,
                           tuple(name(i) for i in inputs if not constant(i)),
                           any(constant(i) and subgraph.tensors[i].shape is not None
                               and len(subgraph.tensors[i].shape) >= 2 for i in inputs)))
    return found


def tensor_errors(float_model: bytes, quantized: bytes,
                  data: Mapping[str, list[dict[str, np.ndarray]]], layers: list[Layer],
                  log: Any) -> list[dict[str, Any]]:
    """Rows as freeze_ranges' layer_errors, worst first: each layer's output, float model
    against quantized (the file as shipped: learned rounding and trained weights
    included), from the quantizer's own comparison on `data`. `nmse` is the
    error's power over the float tensor's (what has piled up by then: the guard ranks by
    what a layer adds to its inputs'); `rmse_over_scale` is that added share in 8-bit
    quantization steps of the tensor's range (0 for a tensor left in float); `inputs`
    name the tensors it reads."""
    from ai_edge_quantizer import model_validator
    from ai_edge_quantizer.utils.validation_utils import ValidationErrorMetric

    with _quiet(log):
        compared = model_validator.compare_model(
            bytearray(float_model), bytearray(quantized), dict(data),
            [ValidationErrorMetric.MSE, ValidationErrorMetric.SNR], compare_fns=None,
            use_xnnpack=True, num_threads=os.cpu_count() or 1)
    results = compared.get_all_tensor_results()
    scales = _output_scales(quantized)
    nmse: dict[str, float] = {}
    for layer in layers:
        measured = results.get(layer.name) or {}
        mse, snr = measured.get("mse"), measured.get("snr")  # snr: a power ratio, not dB
        if mse is not None and math.isfinite(mse):
            nmse[layer.name] = 0.0 if mse == 0 else 1 / snr if snr and snr > 0 else math.inf
    rows = []
    for layer in layers:
        if layer.name not in nmse or not math.isfinite(nmse[layer.name]):
            continue
        mse = float(results[layer.name]["mse"])
        given = max((nmse.get(name, 0.0) for name in layer.inputs), default=0.0)
        added = max(nmse[layer.name] - given, 0.0) if math.isfinite(given) else 0.0
        scale = scales.get(layer.name)
        # the error this layer adds, in its own quantization steps (the share of the
        # error power it added, of the error at its output)
        own_mse = mse * added / nmse[layer.name] if nmse[layer.name] else 0.0
        rows.append({
            "node": layer.name, "op": layer.op, "inputs": list(layer.inputs),
            "rmse_over_scale": round(math.sqrt(own_mse) / scale, 6) if scale else 0.0,
            "nmse": float(f"{nmse[layer.name]:.6g}"), "added_nmse": float(f"{added:.6g}"),
            "sqnr_db": round(-10 * math.log10(nmse[layer.name]), 3)
            if nmse[layer.name] else None,
            "scale": float(f"{scale:.6g}") if scale else None})
    return sorted(rows, key=lambda r: (r["added_nmse"], r["nmse"]), reverse=True)


def _output_scales(quantized: bytes) -> dict[str, float]:
    """Tensor name -> the step of an 8-bit quantization of its range: its own scale, or for
    an int16 tensor 256 of its steps (so that an error reads in the same units whatever
    the width: rounding alone is 0.29 of an int8 step, 0.29/256 at int16)."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(quantized))
    scales = {}
    for tensor in model.subgraphs[0].tensors:
        quantization = tensor.quantization
        if quantization is not None and quantization.scale is not None \
                and len(quantization.scale):
            wide = 256.0 if tensor.type == INT16 else 1.0
            scales[tensor_name(tensor)] = \
                float(quantization.scale[0]) * wide
    return scales
