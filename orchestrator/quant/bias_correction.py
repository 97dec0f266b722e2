"""Empirical bias correction (as AIMET and NNCF do it) for quantize_nodes.

Storing a layer's weights in 8 bits moves its output: E[op(x, W8)] - E[op(x, W)] is, per
output channel, rarely zero, and the error of a biased layer adds up through the next
ones. Where the layer is followed by a BiasAdd of a constant, subtracting that expected
shift from the bias cancels it on average. Here:

- W is the float weight of the lineage's float model (same node names), x the layer's
  input in that float model on representative batches;
- W8 is the weight as the 8-bit graph will use it: the quint8 constant quantize_weights
  stored, exactly as stored; or, for a float weight of an op quantize_nodes converts, what
  its QuantizeV2 (MIN_FIRST) will make of it. A float weight of an op that stays float
  has no shift and is left alone;
- the shift is measured by running op(x, W8) (the op's own attributes) beside the float
  model and subtracting op(x, W), averaged over samples and positions. Linear ops that
  feed each other directly (a SeparableConv2D's depthwise then pointwise conv, with no
  bias between) are one chain: the depthwise shift reaches the pointwise conv's bias.

Only bias constants change; a bias quantize_weights stored in 8 bits is stored again in 8
bits, in its new range. A bias right after a Conv2D/MatMul that quantize_nodes converts is
then added in float32 to that op's accumulator (orchestrator.quant.integer_bias), so its
correction survives whole; the "bias scale" reported here is the step an 8-bit bias of
that range would have, for comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.model.artifact import tensor_name
from orchestrator.model.graph_rewrite import (
    GraphIndex,
    const_value,
    copy_graph,
    is_nhwc,
    make_const,
    output_index,
    unique_name,
)
from orchestrator.quant.numerics import dequantize, float_to_quint8

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef

LINEAR_OPS = ("Conv2D", "MatMul", "DepthwiseConv2dNative")
_DT_FLOAT, _DT_QUINT8 = 1, 12
# QuantizeV2's ensure_minimum_range default: the narrowest range it quantizes into,
# relative to the largest magnitude (at least 1).
ENSURE_MINIMUM_RANGE = 0.01
# quantize_weights' rule for an all-zero tensor (stages/quantize_weights.py).
_DEGENERATE_RANGE, _MINIMUM_RANGE = 1e-6, 0.01
BATCH_SIZE = 64


@dataclass(frozen=True)
class LayerCorrection:
    """What was done to one layer's bias."""

    layer: str            # the linear op (chains: "depthwise+pointwise")
    bias: str             # the bias constant changed (a quint8 one for an 8-bit bias)
    channels: int
    mean_abs_shift: float  # mean over channels of |E[op(x, W8) - op(x, W)]|
    max_abs_shift: float
    bias_scale: float     # the step quantize_nodes will quantize the corrected bias with

    @property
    def relative_shift(self) -> float:
        """Mean |shift| in units of the bias's 8-bit step."""
        return self.mean_abs_shift / self.bias_scale if self.bias_scale else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "bias": self.bias, "channels": self.channels,
                "mean_abs_shift": self.mean_abs_shift, "max_abs_shift": self.max_abs_shift,
                "bias_scale": self.bias_scale, "shift_over_bias_scale": self.relative_shift}


@dataclass
class _Layer:
    chain: list[tuple[NodeDef, np.ndarray]]  # linear ops (graph being corrected), W8 each;
    #                                          more than one when nothing lies between them
    bias: list[NodeDef]           # [Const] or [quint8 Const, min Const, max Const]
    bias_value: np.ndarray        # as the graph holds it (dequantized for an 8-bit bias)
    x: str                        # the chain's input tensor in the float model
    y: str                        # its output tensor in the float model


def quantize_range(values: np.ndarray) -> tuple[float, float]:
    """The range QuantizeV2 (MIN_FIRST) quantizes a constant into: its min and max with
    zero included, widened to ensure_minimum_range (quantize_op.cc)."""
    lo, hi = float(np.min(values)), float(np.max(values))
    epsilon = max(1.0, abs(lo), abs(hi)) * ENSURE_MINIMUM_RANGE
    lo = min(0.0, lo)
    return lo, max(0.0, hi, lo + epsilon)


def _weights8(index: GraphIndex, linear: NodeDef, converts: bool) -> np.ndarray | None:
    """The linear op's weights as the 8-bit graph uses them, or None when they stay float
    (or are not constant)."""
    producer = index.producer(linear.input[1])
    if producer is not None and producer.op == "Dequantize" \
            and output_index(linear.input[1]) == 0:
        parts = [index.resolve_const(i) for i in producer.input[:3]]
        mode = producer.attr["mode"].s if "mode" in producer.attr else b"MIN_COMBINED"
        if None in parts or mode != b"MIN_FIRST" or parts[0].attr["dtype"].type != _DT_QUINT8:
            return None
        values, lo, hi = (const_value(p) for p in parts)
        return dequantize(values, float(lo), float(hi))
    weights = index.const_input(linear.input[1])
    if weights is None or weights.dtype != np.float32 or not converts:
        return None
    lo, hi = quantize_range(weights)
    return dequantize(float_to_quint8(weights, lo, hi), lo, hi)


def _bias_nodes(index: GraphIndex, bias_add: NodeDef, bias_input: str
                ) -> tuple[list[NodeDef], np.ndarray] | None:
    """The constant(s) behind a bias input and its value, if only this BiasAdd (or Add)
    reads them (changing a shared constant would change other ops too)."""
    producer = index.producer(bias_input)
    if producer is None or output_index(bias_input) != 0 \
            or not index.only_consumer_is(producer.name, bias_add):
        return None
    if producer.op == "Const" and producer.attr["dtype"].type == _DT_FLOAT:
        return [producer], const_value(producer)
    if producer.op != "Dequantize" or len(producer.input) < 3 or \
            ("mode" in producer.attr and producer.attr["mode"].s != b"MIN_FIRST"):
        return None
    parts = [index.producer(i) for i in producer.input[:3]]
    if any(p is None or p.op != "Const" or not index.only_consumer_is(p.name, producer)
           for p in parts) or parts[0].attr["dtype"].type != _DT_QUINT8:
        return None
    values, lo, hi = (const_value(p) for p in parts)
    return parts, dequantize(values, float(lo), float(hi))


def _output_channels(linear: NodeDef, shape: tuple[int, ...]) -> int:
    if linear.op == "MatMul":
        transposed = "transpose_b" in linear.attr and linear.attr["transpose_b"].b
        return shape[0] if transposed else shape[-1]
    if len(shape) != 4:
        return -1
    return shape[2] * shape[3] if linear.op == "DepthwiseConv2dNative" else shape[3]


def _biased_linear(index: GraphIndex, node: NodeDef) -> tuple[NodeDef, str] | None:
    """(linear op, bias input) when `node` adds a bias to a linear op's output: a BiasAdd
    (NHWC), or an Add/AddV2 that rewrite_bias_adds could not turn into one (it does not
    look through quantize_weights' Dequantize)."""
    if len(node.input) != 2 or any(i.startswith("^") for i in node.input):
        return None
    if node.op == "BiasAdd":
        if not is_nhwc(node):
            return None
        pairs = [(node.input[0], node.input[1])]
    elif node.op in ("Add", "AddV2"):
        pairs = [(node.input[0], node.input[1]), (node.input[1], node.input[0])]
    else:
        return None
    for data, bias in pairs:
        linear = index.producer(data)
        if linear is not None and output_index(data) == 0 and linear.op in LINEAR_OPS \
                and len(linear.input) >= 2 and is_nhwc(linear):
            return linear, bias
    return None


def _chain(index: GraphIndex, float_index: GraphIndex, last: NodeDef,
           converts: Callable[[NodeDef], bool]) -> list[tuple[NodeDef, np.ndarray]] | None:
    """`last` and the linear ops feeding it directly (a depthwise conv before its pointwise
    one: its shift reaches the bias too), head first, each with its weights as the 8-bit
    graph uses them; None unless the float model has them all and one has 8-bit weights."""
    chain: list[tuple[NodeDef, np.ndarray]] = []
    eight_bit = False
    node: NodeDef | None = last
    while node is not None:
        original = float_index.nodes.get(node.name)
        w = None if original is None or original.op != node.op else \
            float_index.const_input(original.input[1])
        if w is None or w.dtype != np.float32:
            break
        w8 = _weights8(index, node, converts(node))
        if w8 is not None and w8.shape != w.shape:
            break
        eight_bit |= w8 is not None
        chain.insert(0, (node, w if w8 is None else w8))
        head = index.producer(node.input[0])
        if head is None or output_index(node.input[0]) != 0 or head.op not in LINEAR_OPS \
                or (head.op == "MatMul") != (node.op == "MatMul") or len(head.input) < 2 \
                or not index.only_consumer_is(head.name, node) or not is_nhwc(head):
            break
        node = head
    return chain if eight_bit else None


def find_layers(graph_def: GraphDef, float_graph: GraphDef,
                converts: Callable[[NodeDef], bool]) -> list[_Layer]:
    """The layers to correct: a linear op (or a chain of them) with 8-bit weights, whose
    output gets a constant per-channel bias, and that the float model has by name."""
    index, float_index = GraphIndex.build(graph_def), GraphIndex.build(float_graph)
    layers = []
    for node in graph_def.node:
        found = _biased_linear(index, node)
        if found is None:
            continue
        linear, bias_input = found
        bias = _bias_nodes(index, node, bias_input)
        chain = _chain(index, float_index, linear, converts)
        if bias is None or chain is None \
                or bias[1].shape != (_output_channels(linear, chain[-1][1].shape),):
            continue
        head = float_index.nodes[chain[0][0].name]
        layers.append(_Layer(chain, bias[0], bias[1], tensor_name(head.input[0]),
                             tensor_name(linear.name)))
    return layers


def _probe_graph(float_graph: GraphDef, layers: Sequence[_Layer]) -> tuple[GraphDef, list[str]]:
    """The float model plus, per layer, its chain again with W8 on the float model's input,
    minus the float output, averaged over all but the batch and channel axes: one tensor
    [batch, channels] per layer."""
    from tensorflow.core.framework import node_def_pb2

    graph = copy_graph(float_graph)
    taken = {n.name for n in graph.node}
    scope = unique_name("bias_correction", taken)
    graph.node.append(make_const(f"{scope}/spatial", np.asarray([1, 2], np.int32)))
    fetches = []
    for k, layer in enumerate(layers):
        base, data = f"{scope}/{k}", layer.x
        for j, (linear, w8) in enumerate(layer.chain):
            graph.node.append(make_const(f"{base}/w8_{j}", w8.astype(np.float32)))
            op = node_def_pb2.NodeDef()
            op.CopyFrom(linear)
            op.name = f"{base}/op_{j}"
            del op.input[:]
            op.input.extend([data, f"{base}/w8_{j}"])
            graph.node.append(op)
            data = op.name
        delta = graph.node.add(name=f"{base}/delta", op="Sub", input=[data, layer.y])
        delta.attr["T"].type = _DT_FLOAT
        if layer.chain[-1][0].op == "MatMul":
            fetches.append(f"{base}/delta:0")
            continue
        mean = graph.node.add(name=f"{base}/mean", op="Mean",
                              input=[f"{base}/delta", f"{scope}/spatial"])
        mean.attr["T"].type = _DT_FLOAT
        mean.attr["Tidx"].type = 3  # int32
        mean.attr["keep_dims"].b = False
        fetches.append(f"{base}/mean:0")
    return graph, fetches


def measure_shifts(float_graph: GraphDef, inputs: Sequence[str], outputs: Sequence[str],
                   layers: Sequence[_Layer], batches: Iterable[np.ndarray]
                   ) -> tuple[list[np.ndarray], int]:
    """Per layer, E[chain(x, W8) - chain(x, W)] per output channel over the batches' samples;
    and the number of samples."""
    from orchestrator.measure.tf_runtime import GraphRunner

    graph, fetches = _probe_graph(float_graph, layers)
    sums = [np.zeros(layer.bias_value.shape, np.float64) for layer in layers]
    seen = 0
    with GraphRunner(graph, inputs, outputs) as runner:
        fixed = runner.fixed_batch_size()
        for chunk in batches:
            chunk = np.asarray(chunk)
            size = fixed or BATCH_SIZE
            for start in range(0, len(chunk), size):
                batch = chunk[start:start + size]
                count = len(batch)
                if fixed and count < fixed:  # pad with repeats; only `count` rows are used
                    batch = np.concatenate([batch, np.repeat(batch[-1:], fixed - count, 0)])
                for total, value in zip(sums, runner.run(batch, fetches=fetches), strict=True):
                    total += np.asarray(value, np.float64)[:count].sum(axis=0)
                seen += count
    return [total / max(seen, 1) for total in sums], seen


def _write_bias(layer: _Layer, corrected: np.ndarray) -> float:
    """Store the corrected bias in place (8-bit again when it was 8-bit); returns the step
    quantize_nodes will quantize it with."""
    import tensorflow as tf

    corrected = corrected.astype(np.float32)
    if len(layer.bias) == 1:
        layer.bias[0].attr["value"].tensor.CopyFrom(tf.make_tensor_proto(corrected))
    else:
        data, lo_node, hi_node = layer.bias
        lo, hi = min(0.0, float(corrected.min())), max(0.0, float(corrected.max()))
        if hi - lo < _DEGENERATE_RANGE:
            hi = lo + _MINIMUM_RANGE
        values = float_to_quint8(corrected, lo, hi)
        data.attr["value"].tensor.CopyFrom(
            tf.make_tensor_proto(values, dtype=tf.quint8, shape=values.shape))
        lo_node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.float32(lo)))
        hi_node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.float32(hi)))
        corrected = dequantize(values, lo, hi)
    lo, hi = quantize_range(corrected)
    return (hi - lo) / 255.0


def correct_biases(graph_def: GraphDef, float_graph: GraphDef, inputs: Sequence[str],
                   outputs: Sequence[str], batches: Iterable[np.ndarray],
                   converts: Callable[[NodeDef], bool]) -> tuple[list[LayerCorrection], int]:
    """Subtract each layer's expected 8-bit weight shift from its bias, in place.

    `graph_def`: the graph about to be quantized; `float_graph`: the lineage's float model
    (inputs/outputs are its names); `converts(node)`: whether quantize_nodes will quantize
    that op's float weights. Returns the corrections and the number of samples measured.
    A layer whose shift is not finite (NaN or inf in the data) is left as it was.
    """
    layers = find_layers(graph_def, float_graph, converts)
    if not layers:
        return [], 0
    shifts, seen = measure_shifts(float_graph, inputs, outputs, layers, batches)
    if seen == 0:
        return [], 0
    done = []
    for layer, shift in zip(layers, shifts, strict=True):
        if not np.isfinite(shift).all():  # NaN/inf inputs: a NaN bias would break the model
            continue
        scale = _write_bias(layer, layer.bias_value - shift)
        magnitude = np.abs(shift)
        name = "+".join(op.name for op, _ in layer.chain)
        done.append(LayerCorrection(name, layer.bias[0].name, int(shift.size),
                                    float(magnitude.mean()), float(magnitude.max()), scale))
    return done, seen


def correct_for_stage(graph_def: GraphDef, artifact: Any, ctx: Any,
                      converts: Callable[[NodeDef], bool]
                      ) -> tuple[dict[str, float], dict[str, Any]]:
    """quantize_nodes' bias correction of `graph_def` (its working copy of `artifact`), in
    place: (metrics, info). Skipped, with the reason in info, without representative data,
    float model or a single input."""
    reason = None
    if ctx.representative is None:
        reason = "no representative data (data.representative)"
    elif ctx.float_model is None:
        reason = "no float model in this lineage"
    elif len(artifact.inputs) != 1:
        reason = f"the model has {len(artifact.inputs)} inputs; representative data feeds one"
    if reason is not None:
        return {}, {"bias_correction": {"applied": False, "reason": reason}}
    float_model = ctx.float_model()
    done, seen = correct_biases(graph_def, float_model.graph_def, float_model.input_names,
                                list(float_model.outputs), ctx.representative(None, BATCH_SIZE),
                                converts)
    relative = float(np.mean([c.relative_shift for c in done])) if done else 0.0
    return ({"bias_corrected_layers": float(len(done)),
             "bias_shift_over_scale": relative},
            {"bias_correction": {"applied": True, "samples": seen,
                                 "layers": [c.as_dict() for c in done]}})
