"""Convert a frozen graph to a LiteRT `.tflite` flatbuffer (the successor path).

Modes, as TFLite's converter names them:
- `fp32`: the same float model as a flatbuffer;
- `dynamic_range`: weights stored as int8, activations float (quantized on the fly inside
  the kernels that support it); no data needed;
- `float16`: weights stored as float16, computed in float32;
- `int8`: full integer: weights int8 per channel, activations int8 with ranges calibrated on
  the recipe's representative data. `io: int8` makes the model's inputs and outputs int8
  too (an app then quantizes its own inputs); `io: float` (default) keeps float edges.

Ops LiteRT has no builtin kernel for fail the conversion with their names, unless
`select_tf_ops` lets them run as TF ops (the app then links the Flex delegate, several MB).
`float_nodes` / `float_ops` keep named nodes or op types in float in int8 mode (the
quantization debugger's denylists): the closed-loop guard sets them.

`per_channel: false` keeps one scale per weight tensor, but for the filters of float-input
(hybrid: dynamic range) DEPTHWISE_CONV_2D ops, which stay per channel, with a warning:
LiteRT's only hybrid depthwise kernel reads one scale per output channel, and given one per
tensor reads past it (garbage outputs, NaN).
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from orchestrator.errors import DataError, ModelSourceError
from orchestrator.limits import bounded
from orchestrator.model import litert_precision, tflite_bytes
from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.native_output import native_output_held
from orchestrator.quant import fake_quant_ranges
from orchestrator.quant.knobs import FLOAT, FoundLayers, Knobs, with_params
from orchestrator.quant.litert_quantizer import DYNAMIC_RANGE_FALLBACK
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

# A layer's own error above this many quantization steps (RMSE/scale) is flagged, as
# freeze_ranges flags GraphDef layers; rounding alone gives 1/sqrt(12) = 0.29.
LAYER_ERROR_LIMIT = 0.7
# Float activations beyond this mean square are not values but an unset buffer.
SANE_POWER = 1e30
# LiteRT's hybrid DEPTHWISE_CONV_2D (float input, int8 filter: dynamic range) has one kernel,
# EvalHybridPerChannel, which multiplies output channel c by the filter's scale[c]. Prepare
# checks the scales' count against the filter's size along its quantized_dimension, which for
# a per-tensor filter (1, h, w, channels) is dimension 0, of size 1: one scale passes, and
# channels 1.. read past it. Such filters are kept per channel (PER_CHANNEL_ONLY_HYBRID).
PER_CHANNEL_ONLY_HYBRID = "DEPTHWISE_CONV_2D"
DEPTHWISE_CHANNEL_AXIS = 3  # a depthwise filter is (1, h, w, channels)


class Params(StageParams):
    mode: Literal["fp32", "dynamic_range", "float16", "int8"] = Field(
        "int8", description="fp32: float flatbuffer; dynamic_range: int8 weights, float "
        "activations; float16: float16 weights; int8: full integer, calibrated on the "
        "recipe's representative data, per-channel weights.")
    io: Literal["float", "int8"] = Field(
        "float", description="int8 mode only: the model's input and output type. int8 "
        "makes the app quantize its inputs and dequantize its outputs itself.")
    calibration_samples: bounded("samples") = Field(
        200, description="int8 mode: representative samples used to calibrate ranges.")
    select_tf_ops: bool = Field(
        False, description="Let ops with no LiteRT builtin run as TF ops (Flex delegate: "
        "the app must link it, several MB). Off: such ops fail the conversion, named.")
    float_nodes: list[str] = Field(
        [], description="int8 mode: names of nodes (tensor names in the converted model) "
        "kept in float (the quantization debugger's denylisted_nodes).")
    float_ops: list[str] = Field(
        [], description="int8 mode: builtin op types kept in float, e.g. [MEAN] "
        "(the quantization debugger's denylisted_ops).")
    per_channel: bool = Field(
        True, description="int8 / dynamic_range: one scale per output channel of a weight "
        "(more accurate). Each channel costs 12 bytes of quantization params (a float32 "
        "scale, an int64 zero point): on small models of thin layers that is a fifth of "
        "the file; false keeps one scale per tensor, but for the int8 filters of "
        "DEPTHWISE_CONV_2D ops with float input (dynamic_range), kept per channel with a "
        "warning: LiteRT's hybrid depthwise kernel reads one scale per channel.")
    strip_names: bool = Field(
        False, description="Drop tensor names and signatures from the shipped file "
        "(LiteRT's strip_strings): a few % smaller; the app then finds its input and output "
        "by index, not name.")
    diagnostic_samples: bounded("diagnostic_samples") = Field(
        50, description="int8 mode: representative samples on which the quantization "
        "debugger measures each layer's own error (rmse/scale, nmse); 0: none.")
    guard: bool = Field(
        False, description="int8 mode: when a target's quality budget breaks, keep the "
        "layers that add the most error in float (float_nodes), worst first, until it holds "
        "(see orchestrator/guard/); each trial is tracked.")


def run(given: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.model.litert_model import describe

    ctx, samples_used = counting_samples(ctx)
    model_ranges = [fq for fq in fake_quant_ranges.activations(given.graph_def) if fq.range]
    stripped: list[fake_quant_ranges.FakeQuant] = []
    if params.mode != "int8" and _has_fake_quant(given):
        # the converter would keep each FakeQuant as a QUANTIZE/DEQUANTIZE pair in float
        graph_def, stripped = fake_quant_ranges.strip(given.graph_def)
        given = given.replace(graph_def=graph_def)
    converter, output_shapes = _converter(given, params, ctx)
    flatbuffer = _convert(converter, given, params, ctx)
    warnings: list[str] = []
    kept_per_channel: dict[str, int] = {}
    if not params.per_channel:
        per_channel = params.model_copy(update={"per_channel": True})
        flatbuffer, kept = _depthwise_per_channel(flatbuffer, lambda: _convert(
            _converter(given, per_channel, ctx)[0], given, per_channel, ctx))
        if kept["filters"]:
            kept_per_channel = {PER_CHANNEL_ONLY_HYBRID: kept["filters"]}
            how = ("their per-channel conversion" if not kept["repeated"] else
                   f"{kept['repeated']} of them with their one scale repeated per channel, "
                   "their per-channel conversion not matching")
            warnings.append(
                f"per_channel: false: {kept['filters']} {PER_CHANNEL_ONLY_HYBRID} filter(s) "
                f"with float input kept per channel ({how}; +{kept['bytes']:,} bytes): "
                "LiteRT's hybrid depthwise kernel reads one scale per output channel, and "
                "with one per tensor reads past it (garbage outputs). The other weights are "
                "per tensor")
    # the graph's inputs and outputs in its order, named by a signature: the converter
    # keeps neither the order of several outputs nor, always, their names
    flatbuffer = _signed(flatbuffer, given, output_shapes)
    if params.strip_names:
        flatbuffer = _stripped(flatbuffer)
    facts = describe(flatbuffer)
    # the same arithmetic as the graph's: what benchmark's device estimates start from
    flops = _graph_flops(given, warnings)
    metadata = {k: v for k, v in given.metadata.items()
                if k not in (fake_quant_ranges.TRAINED_RANGES,
                             fake_quant_ranges.GRAPH_TRAINED_RANGES)}
    trained = _trained_ranges(flatbuffer, params, model_ranges, stripped, warnings)
    if params.mode == "fp32" and trained:  # for quantize_tflite, by this file's tensor names
        metadata[fake_quant_ranges.TRAINED_RANGES] = trained
    artifact = ModelArtifact(graph_def=None, kind="tflite", payload=flatbuffer,
                             inputs=given.inputs, outputs=given.outputs,
                             metadata={**metadata,
                                       "tflite": {"mode": params.mode, "io": params.io,
                                                  "flops": flops}})
    graph_bytes = len(given.graph_bytes())
    float_ops = litert_precision.float_ops(flatbuffer) if params.mode == "int8" else {}
    computes_in = litert_precision.computes_in(flatbuffer)
    info: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    diagnostics: list[str] = []
    if params.mode == "int8" and params.diagnostic_samples:
        rows = _layer_errors(_converter(given, params, ctx)[0], params, ctx)
        info["layer_errors"] = rows
        flagged = [r for r in rows if r["rmse_over_scale"] > LAYER_ERROR_LIMIT]
        metrics.update({"layer_error_max": max((r["rmse_over_scale"] for r in rows),
                                               default=0.0),
                        "layer_nmse_max": max((r["nmse"] or 0.0 for r in rows), default=0.0),
                        "layers_flagged": float(len(flagged))})
        if flagged:  # diagnostics: report.json and the page, not the console
            from orchestrator.formatting import layer_names

            short = layer_names([r["node"] for r in rows])  # as the page names them
            listed = ", ".join(f"{short[r['node']]} {r['rmse_over_scale']:.2f}"
                               for r in flagged[:3])
            diagnostics.append(f"{len(flagged)} layer(s) above {LAYER_ERROR_LIMIT} RMSE/scale "
                            f"(rounding alone: 0.29): {listed}. Where a quality budget "
                            "breaks, the guard (convert_tflite: {guard: true}) keeps such "
                            "layers in float")
    if float_ops:
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(float_ops.items()))
        diagnostics.append(f"stay float in the int8 model (no int8 kernel, or kept float): "
                        f"{listed}")
    metrics.update({"size_ratio": len(flatbuffer) / graph_bytes if graph_bytes else 1.0,
                    "tflite_ops": float(sum(facts.op_counts.values())),
                    "float_ops": float(sum(float_ops.values()))})
    info["computes_in"] = computes_in  # int8, int8+float, dynamic or float
    info["bytes_by_kind"] = tflite_bytes.bytes_by_kind(flatbuffer)
    info["tflite"] = {"mode": params.mode, "io": params.io, "ops": facts.op_counts,
                      "float_ops": float_ops, "float_nodes": list(params.float_nodes),
                      "float_op_types": list(params.float_ops)}
    if kept_per_channel:
        info["tflite"]["kept_per_channel"] = kept_per_channel
    if model_ranges and params.mode in ("int8", "fp32"):  # the model's own (FakeQuant)
        info["trained_ranges"] = len(trained)              # ranges it takes or carries
    if stripped:
        info["fake_quant_removed"] = len(stripped)
    if diagnostics:
        info["diagnostics"] = diagnostics
    if samples_used():  # int8: the representative samples it calibrated on
        info["samples"] = samples_used()
    return StageResult(artifact=artifact, metrics=metrics, info=info, warnings=warnings)


def _has_fake_quant(given: ModelArtifact) -> bool:
    return any(n.op in fake_quant_ranges.FAKE_QUANT_OPS for n in given.graph_def.node)


def _trained_ranges(flatbuffer: bytes, params: Params,
                    model_ranges: list[fake_quant_ranges.FakeQuant],
                    stripped: list[fake_quant_ranges.FakeQuant], warnings: list[str]
                    ) -> dict[str, list[float]]:
    """The model's FakeQuant ranges in the file: int8, the activation tensors whose range
    the converter took from one (its QAT mode reads them itself); fp32, {tensor name: [min,
    max]} of the stripped ones, for quantize_tflite."""
    if params.mode == "int8":
        return fake_quant_ranges.int8_tensors_with_ranges(
            flatbuffer, [fq.range for fq in model_ranges if fq.range])
    found, missing = fake_quant_ranges.tflite_ranges(flatbuffer, stripped)
    if missing and params.mode == "fp32":
        warnings.append(f"{len(missing)} FakeQuant range(s) name no tensor of the float "
                        f"file, so quantize_tflite calibrates those: {', '.join(missing[:3])}")
    return found


def _graph_flops(given: ModelArtifact, warnings: list[str]) -> int | None:
    """FLOPs of one sample through the graph (the v1 profiler, as benchmark counts them)."""
    from orchestrator.measure.flops import count_flops

    one_sample = {spec.name: (1, *[d or 1 for d in spec.shape[1:]]) for spec in given.inputs
                  if spec.shape}
    try:
        return count_flops(given.graph_def, one_sample, warnings)
    except (ValueError, TypeError) as exc:
        warnings.append(f"FLOPs not counted: {exc}")
        return None


def _signed(flatbuffer: bytes, given: ModelArtifact,
            shapes: list[list[int | None] | None]) -> bytes:
    """The flatbuffer's inputs and outputs in the graph's order, under a `serving_default`
    signature named as the graph names them (litert_model.with_signature), each output
    found by name, else by its `shapes` in the graph (`_converter`'s); one whose shape
    differs from the graph's is a stage error."""
    from orchestrator.errors import StageError
    from orchestrator.model.litert_model import with_signature

    try:
        return with_signature(flatbuffer, given.input_names, list(given.outputs), shapes,
                              replace=True)
    except ValueError as exc:
        raise StageError(str(exc)) from exc


def _concrete_function(given: ModelArtifact) -> Any:
    """The frozen graph as a TF2 concrete function from its inputs to its outputs (what the
    MLIR converter takes)."""
    import tensorflow as tf

    from orchestrator.model.artifact import tensor_name

    def imported() -> None:
        tf.compat.v1.import_graph_def(given.graph_def, name="")

    wrapped = tf.compat.v1.wrap_function(imported, [])
    graph = wrapped.graph
    return wrapped, wrapped.prune(
        feeds=[graph.get_tensor_by_name(tensor_name(n)) for n in given.input_names],
        fetches=[graph.get_tensor_by_name(tensor_name(n)) for n in given.outputs])


def _converter(given: ModelArtifact, params: Params, ctx: StageContext
               ) -> tuple[Any, list[list[int | None] | None]]:
    """The converter for `params`, and the graph's output shapes as the concrete function
    it converts has them (what `_signed` finds outputs by: the graph wrapped once)."""
    import tensorflow as tf

    wrapped, function = _concrete_function(given)
    shapes = [None if out.shape.rank is None else list(out.shape.as_list())
              for out in function.outputs]
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], wrapped)
    ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if params.mode != "fp32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if params.mode == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if params.mode == "int8":
        if ctx.representative is None:
            raise DataError("convert_tflite mode int8 calibrates activation ranges on "
                            "data.representative, and the recipe has none (or use mode "
                            "dynamic_range, which needs no data)")
        converter.representative_dataset = _calibration(ctx, params.calibration_samples)
        # int8 kernels first; an op without one falls back to float (and is named)
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
        if params.io == "int8":
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
    if params.select_tf_ops:
        ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
    if not params.per_channel:
        converter._experimental_disable_per_channel = True  # the converter's only switch
    converter.target_spec.supported_ops = ops
    return converter, shapes


def _calibration(ctx: StageContext, samples: int) -> Any:
    """The converter's representative_dataset: one sample at a time, as a list of inputs."""
    assert ctx.representative is not None

    def dataset() -> Iterator[list[np.ndarray]]:
        for batch in ctx.representative(samples, 1):
            yield [np.asarray(batch, dtype=np.float32)]
    return dataset


def _convert(converter: Any, given: ModelArtifact, params: Params, ctx: StageContext
             ) -> bytes:
    """The flatbuffer; ops LiteRT lacks are a ModelSourceError naming them. What the
    converter prints goes to the stage's debug log, not the console."""
    caught: list[str] = []
    try:
        with native_output_held(caught), warnings.catch_warnings(record=True) as notes:
            warnings.simplefilter("always")
            if params.mode == "int8" and (params.float_nodes or params.float_ops):
                return _convert_with_float_layers(converter, params, ctx)
            return bytes(converter.convert())
    except Exception as exc:  # noqa: BLE001  (ConverterError and friends: read the text)
        missing = sorted(set(re.findall(r"'tf\.(\w+)' op is neither a custom op nor a flex "
                                        r"op", str(exc))))
        if missing and params.select_tf_ops:
            raise ModelSourceError(
                f"LiteRT has neither a builtin nor a select-TF-ops (Flex) kernel for "
                f"{', '.join(missing)}: replace them in the model") from exc
        if missing:
            raise ModelSourceError(
                f"LiteRT has no builtin kernel for {', '.join(missing)}: set "
                "select_tf_ops: true to run them as TF ops (the app then links LiteRT's "
                "Flex delegate, several MB), or replace them in the model") from exc
        raise
    finally:
        for line in caught + [str(n.message) for n in locals().get("notes") or []]:
            ctx.log.debug("converter: %s", line.strip())


def _convert_with_float_layers(converter: Any, params: Params, ctx: StageContext) -> bytes:
    """int8 with named nodes / op types kept in float: the quantization debugger's
    selective quantization."""
    import tensorflow as tf

    options = tf.lite.experimental.QuantizationDebugOptions(
        denylisted_nodes=list(params.float_nodes) or None,
        denylisted_ops=list(params.float_ops) or None,
        fully_quantize=params.io == "int8")  # True makes the edges int8 too
    debugger = tf.lite.experimental.QuantizationDebugger(
        converter=converter, debug_dataset=_calibration(ctx, params.calibration_samples),
        debug_options=options)
    return bytes(debugger.get_nondebug_quantized_model())


def _per_tensor_hybrid_depthwise(model: Any) -> list[tuple[int, int, int]]:
    """(subgraph, operator, filter tensor) of each DEPTHWISE_CONV_2D with a float input and
    an int8 filter that has one scale for several output channels: what LiteRT's hybrid
    kernel misreads (PER_CHANNEL_ONLY_HYBRID)."""
    from ai_edge_litert.tools import flatbuffer_utils

    float32, int8 = flatbuffer_utils.TensorType.FLOAT32, flatbuffer_utils.TensorType.INT8
    found = []
    for g, subgraph in enumerate(model.subgraphs):
        for o, op in enumerate(subgraph.operators or []):
            if (flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
                    != PER_CHANNEL_ONLY_HYBRID or len(op.inputs) < 2 or min(op.inputs[:2]) < 0):
                continue
            given, kernel = (subgraph.tensors[int(i)] for i in op.inputs[:2])
            scales = kernel.quantization.scale if kernel.quantization is not None else None
            if (given.type == float32 and kernel.type == int8 and scales is not None
                    and len(scales) == 1 and kernel.shape is not None
                    and len(kernel.shape) == 4 and kernel.shape[DEPTHWISE_CHANNEL_AXIS] > 1):
                found.append((g, o, int(op.inputs[1])))
    return found


def _depthwise_per_channel(flatbuffer: bytes, per_channel: Callable[[], bytes]
                           ) -> tuple[bytes, dict[str, int]]:
    """A per-tensor model (per_channel: false) whose hybrid depthwise filters are made per
    channel: each is replaced by its own per-channel quantization from `per_channel()` (the
    same model converted per channel, called only when some filter needs it), matched by
    operator position and checked to hold the same weights. Where that conversion does not
    match, the filter keeps its int8 values and one scale, repeated per channel (the same
    arithmetic as per tensor, which the kernel then reads right). Returns the model and
    {filters: kept per channel, repeated: of them by repetition, bytes: added}."""
    import copy

    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    broken = _per_tensor_hybrid_depthwise(model)
    if not broken:
        return flatbuffer, {"filters": 0, "repeated": 0, "bytes": 0}
    other = flatbuffer_utils.convert_bytearray_to_object(bytearray(per_channel()))
    users = Counter(tensor.buffer for subgraph in model.subgraphs
                    for tensor in subgraph.tensors)
    repeated = 0
    for g, o, t in broken:
        tensor = model.subgraphs[g].tensors[t]
        data = _per_channel_twin(model, other, g, o)
        if data is None:  # the one scale, once per channel: per-tensor values, read right
            repeated += 1
            channels = int(tensor.shape[DEPTHWISE_CHANNEL_AXIS])
            tensor.quantization.scale = [float(tensor.quantization.scale[0])] * channels
            tensor.quantization.zeroPoint = [0] * channels
            tensor.quantization.quantizedDimension = DEPTHWISE_CHANNEL_AXIS
            continue
        values, quantization = data
        tensor.quantization = copy.deepcopy(quantization)
        if users[tensor.buffer] > 1:  # shared: this tensor gets a buffer of its own
            users[tensor.buffer] -= 1
            model.buffers.append(flatbuffer_utils.BufferT())
            tensor.buffer = len(model.buffers) - 1
        model.buffers[tensor.buffer].data = values
    made = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    return made, {"filters": len(broken), "repeated": repeated,
                  "bytes": len(made) - len(flatbuffer)}


def _per_channel_twin(model: Any, other: Any, g: int, o: int) -> tuple[np.ndarray, Any] | None:
    """The int8 values and quantization of operator `o`'s filter in `other`, the same model
    converted per channel, if `other` has the same operators and that filter is per channel
    over the same shape and dequantizes to the same weights (within both roundings)."""
    from ai_edge_litert.tools import flatbuffer_utils

    def names(m: Any, index: int) -> list[str]:
        return [flatbuffer_utils.opcode_to_name(m, op.opcodeIndex)
                for op in m.subgraphs[index].operators or []]

    if len(other.subgraphs) != len(model.subgraphs) or names(model, g) != names(other, g):
        return None
    mine = model.subgraphs[g].tensors[int(model.subgraphs[g].operators[o].inputs[1])]
    twin = other.subgraphs[g].tensors[int(other.subgraphs[g].operators[o].inputs[1])]
    quantization = twin.quantization
    channels = int(mine.shape[DEPTHWISE_CHANNEL_AXIS])
    if (twin.type != mine.type or list(twin.shape) != list(mine.shape)
            or quantization is None or quantization.scale is None
            or len(quantization.scale) != channels
            or quantization.quantizedDimension != DEPTHWISE_CHANNEL_AXIS
            or quantization.zeroPoint is None or any(int(z) for z in quantization.zeroPoint)):
        return None
    values = _buffer(other, twin.buffer)
    per_tensor = _buffer(model, mine.buffer)
    if values is None or per_tensor is None or values.size != per_tensor.size:
        return None
    shape = [int(d) for d in mine.shape]
    scales = np.asarray(quantization.scale, dtype=np.float64)
    scale = float(mine.quantization.scale[0])
    weights = values.view(np.int8).reshape(shape) * scales
    before = per_tensor.view(np.int8).reshape(shape) * scale
    if np.abs(weights - before).max() > (scale + scales.max()) / 2 * 1.001:
        return None
    return values, quantization


def _buffer(model: Any, index: int) -> np.ndarray | None:
    """A buffer's bytes (uint8), or None where it has none inside the flatbuffer."""
    data = model.buffers[index].data if 0 <= index < len(model.buffers) else None
    return None if data is None else np.asarray(data, dtype=np.uint8)


def _stripped(flatbuffer: bytes) -> bytes:
    """The model without tensor names, subgraph names and signatures."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    flatbuffer_utils.strip_strings(model)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _layer_errors(converter: Any, params: Params, ctx: StageContext) -> list[dict[str, Any]]:
    """Each quantized op's own error, as the quantization debugger measures it: the op run
    in float on the same 8-bit inputs against its 8-bit output. Rows as freeze_ranges'
    layer_errors (node = the output tensor's name, which float_nodes takes back), worst
    first."""
    import csv
    import io

    import tensorflow as tf

    def power(float_tensors: Any, quant_tensors: Any, scale: float, zero_point: int) -> float:
        return float(np.mean(np.square(np.asarray(float_tensors[0], dtype=np.float64))))

    options = tf.lite.experimental.QuantizationDebugOptions(
        layer_direct_compare_metrics={"float_power": power})
    caught: list[str] = []
    with native_output_held(caught), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=_calibration(ctx, params.diagnostic_samples),
            debug_options=options)
        debugger.run()
        dump = io.StringIO()
        debugger.layer_statistics_dump(dump)
    rows = []
    for row in csv.DictReader(io.StringIO(dump.getvalue())):
        scale, mse = float(row["scale"]), float(row["mean_squared_error"])
        power_value = float(row["float_power"])
        if not math.isfinite(power_value) or power_value > SANE_POWER:
            power_value = 0.0  # the debugger's float side read an unset buffer: no nmse
        rows.append({"node": row["tensor_name"], "op": row["op_name"],
                     "rmse_over_scale": round(math.sqrt(mse) / scale, 6) if scale else 0.0,
                     "nmse": float(f"{mse / power_value:.6g}") if power_value > 0 else None,
                     "scale": float(f"{scale:.6g}")})
    return sorted(rows, key=lambda r: r["rmse_over_scale"], reverse=True)


def data_for(params: Params) -> dict[str, str]:
    """int8 calibrates on the representative data; the other modes need none."""
    return {"representative": "mode int8 calibrates its activation ranges on it; mode "
            "dynamic_range needs no data"} if params.mode == "int8" else {}


def _candidate(params: Params, candidate: Candidate) -> Params:
    """int8 mode: a guard candidate's float layers join float_nodes; the fallback is
    dynamic range (int8 weights, float activations). The other modes are no candidate's."""
    if params.mode != "int8":
        return params
    if candidate.fallback:
        return with_params(params, mode="dynamic_range", float_nodes=[], float_ops=[])
    moved = candidate.nodes_in(FLOAT.name)
    return with_params(params, float_nodes=sorted({*params.float_nodes, *moved})) \
        if moved else params


def _layers(source: LayerSource) -> FoundLayers:
    """The int8 model's ops the quantization debugger measured (this stage's layer_errors)."""
    from orchestrator.quant.layer_groups import litert_layers

    return FoundLayers(litert_layers(list(source.info.get("layer_errors") or [])))


# int8 mode: each op the debugger measured, worst first, back to float through float_nodes
KNOBS = Knobs(
    steers=lambda params: params.mode == "int8",
    layers=_layers,
    ladder=(FLOAT,),
    kernels="LiteRT's int8 model",
    guard_setting="convert_tflite: {mode: int8, guard: true}",
    fallback=DYNAMIC_RANGE_FALLBACK)

STAGE = register(Stage(name="convert_tflite", run=run, params=Params, doc=__doc__ or "",
                       optional_data=("representative",), produces="tflite",
                       data_for=data_for, knobs=KNOBS, candidate=_candidate))
