"""Cross-layer equalization (Nagel et al. 2019, data-free): balance the weight ranges of
consecutive layers, so that per-tensor 8-bit weights serve every channel.

For a layer L1 whose output channel i feeds only the next layer L2, through at most a
constant bias and ops that commute with a positive per-channel scale (Relu, LeakyRelu,
MaxPool, AvgPool; never Relu6, whose clip does not scale), dividing channel i of L1's
weights and bias by s_i and multiplying L2's input channel i by s_i leaves the outputs
unchanged. With s_i = sqrt(r1_i / r2_i), r1_i = max |W1| over output channel i and
r2_i = max |W2| over input channel i, both ranges become sqrt(r1_i r2_i). Depthwise ->
pointwise pairs (a SeparableConv2D) gain most: a depthwise filter's channels often differ
by orders of magnitude once batch norm is folded in.

Layers: Conv2D, DepthwiseConv2dNative (NHWC) and MatMul with constant float weights. Run
it on the folded float graph, before quantize_weights. Chains (dw -> pw -> relu -> dw ...)
are balanced pair by pair, `iterations` times over, as the paper iterates. Reported:
pairs equalized, and the paper's precision of each pair (mean over its channels of
(r1_i / max r1) * (r2_i / max r2), 1.0 when every channel uses its tensor's whole 8-bit
range), before and after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from orchestrator.limits import bounded
from orchestrator.model.artifact import node_name
from orchestrator.model.graph_rewrite import (
    GraphIndex,
    const_value,
    copy_graph,
    is_nhwc,
    output_index,
)
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from tensorflow.core.framework.node_def_pb2 import NodeDef

    from orchestrator.model.artifact import ModelArtifact

_DT_FLOAT = 1
CONVS = ("Conv2D", "DepthwiseConv2dNative")
# Per-channel positive scaling commutes with these: f(s * x) = s * f(x) for s > 0.
POSITIVE_HOMOGENEOUS = ("Relu", "LeakyRelu", "MaxPool", "AvgPool", "Identity")


class Params(StageParams):
    iterations: bounded("iterations") = Field(
        4, description="Passes over all pairs: a layer shared by two pairs "
        "(the pointwise conv between two depthwise ones) is balanced again on each pass.")


@dataclass
class Pair:
    """L1 -> [bias] -> [positive-homogeneous ops] -> L2, and where their channels are."""

    first: str            # L1's weight Const
    first_axis: int       # its output-channel axis (depthwise: after merging in x mult)
    bias: str | None      # L1's bias Const
    second: str           # L2's weight Const
    second_axis: int      # its input-channel axis
    layers: tuple[str, str]


def _weights(index: GraphIndex, layer: NodeDef) -> NodeDef | None:
    """The layer's float weight Const, when only this layer reads it."""
    const = index.producer(layer.input[1]) if len(layer.input) >= 2 else None
    if const is None or const.op != "Const" or output_index(layer.input[1]) != 0 \
            or const.attr["dtype"].type != _DT_FLOAT \
            or not index.only_consumer_is(const.name, layer):
        return None
    return const


def _out_axis(layer: NodeDef) -> int:
    if layer.op == "MatMul":
        return 0 if "transpose_b" in layer.attr and layer.attr["transpose_b"].b else 1
    return 3 if layer.op == "Conv2D" else 2  # depthwise: [kh, kw, in * mult] once merged


def _in_axis(layer: NodeDef) -> int:
    if layer.op == "MatMul":
        return 1 if "transpose_b" in layer.attr and layer.attr["transpose_b"].b else 0
    return 2


def _single_reader(index: GraphIndex, node: NodeDef, outputs: set[str]) -> NodeDef | None:
    """The one node reading `node` (through its output 0), if exactly one does."""
    readers = index.consumers.get(node.name, [])
    if node.name in outputs or len(readers) != 1:
        return None
    reader = readers[0]
    inputs = [i for i in reader.input if node_name(i) == node.name]
    if len(inputs) != 1 or inputs[0].startswith("^") or output_index(inputs[0]) != 0:
        return None
    return reader


def _bias_const(index: GraphIndex, node: NodeDef, data: str, channels: int
                ) -> NodeDef | None:
    """The per-channel float Const that `node` (BiasAdd / Add / AddV2) adds to `data`."""
    if node.op not in ("BiasAdd", "Add", "AddV2") or len(node.input) != 2 or not is_nhwc(node):
        return None
    if node.op == "BiasAdd" and node_name(node.input[0]) != data:
        return None
    other = [i for i in node.input if node_name(i) != data]
    const = index.producer(other[0]) if len(other) == 1 else None
    if const is None or const.op != "Const" or const.attr["dtype"].type != _DT_FLOAT \
            or not index.only_consumer_is(const.name, node):
        return None
    shape = [d.size for d in const.attr["value"].tensor.tensor_shape.dim]
    if not shape or shape[-1] != channels or any(d != 1 for d in shape[:-1]):
        return None
    return const


def find_pairs(index: GraphIndex, outputs: set[str]) -> list[Pair]:
    """Every L1 -> L2 pair whose connecting channels nothing else reads."""
    pairs = []
    for layer in index.graph_def.node:
        if layer.op not in (*CONVS, "MatMul") or not is_nhwc(layer):
            continue
        w1 = _weights(index, layer)
        if w1 is None:
            continue
        shape = tuple(d.size for d in w1.attr["value"].tensor.tensor_shape.dim)
        channels = shape[2] * shape[3] if layer.op == "DepthwiseConv2dNative" else \
            shape[_out_axis(layer)]
        prev, node, bias = layer, _single_reader(index, layer, outputs), None
        if node is not None and (bias := _bias_const(index, node, layer.name, channels)):
            prev, node = node, _single_reader(index, node, outputs)
        while node is not None and node.op in POSITIVE_HOMOGENEOUS and is_nhwc(node):
            prev, node = node, _single_reader(index, node, outputs)
        # the channels must arrive as L2's data (input 0), not as its weights
        if node is None or not is_nhwc(node) or node_name(node.input[0]) != prev.name:
            continue
        second = node
        ok = (second.op in CONVS and layer.op in CONVS) or (
            second.op == "MatMul" == layer.op and not (
                "transpose_a" in second.attr and second.attr["transpose_a"].b))
        w2 = _weights(index, second) if ok else None
        if w2 is None or w2.name == w1.name:
            continue
        shape2 = [d.size for d in w2.attr["value"].tensor.tensor_shape.dim]
        if shape2[_in_axis(second)] != channels:  # e.g. a grouped convolution
            continue
        pairs.append(Pair(w1.name, _out_axis(layer), None if bias is None else bias.name,
                          w2.name, _in_axis(second), (layer.name, second.name)))
    return pairs


def _ranges(values: np.ndarray, axis: int) -> np.ndarray:
    """max |w| per index along `axis`."""
    return np.abs(np.moveaxis(values, axis, -1)).reshape(-1, values.shape[axis]).max(axis=0)


def _first_view(values: np.ndarray, pair: Pair) -> np.ndarray:
    """L1's weights with output channels on one axis (depthwise: [kh, kw, in * mult])."""
    return values.reshape(*values.shape[:2], -1) if values.ndim == 4 and pair.first_axis == 2 \
        else values


def pair_precision(r1: np.ndarray, r2: np.ndarray) -> float:
    """Nagel et al.'s objective for one pair, per channel: mean_i (r1_i / max r1) *
    (r2_i / max r2). 1.0 when every channel uses its tensors' whole 8-bit range."""
    top1, top2 = float(r1.max()), float(r2.max())
    return float(np.mean(r1 / top1 * r2 / top2)) if top1 > 0 and top2 > 0 else 1.0


def _precision(values: dict[str, np.ndarray], pair: Pair) -> float:
    return pair_precision(_ranges(_first_view(values[pair.first], pair), pair.first_axis),
                          _ranges(values[pair.second], pair.second_axis))


def equalize_pair(values: dict[str, np.ndarray], pair: Pair) -> np.ndarray:
    """Scale one pair in `values` (Const name -> array) in place; returns the scales."""
    w1 = _first_view(values[pair.first], pair)
    w2 = values[pair.second]
    r1, r2 = _ranges(w1, pair.first_axis), _ranges(w2, pair.second_axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.sqrt(r1.astype(np.float64) / r2)
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)  # dead channels stay
    shape1 = [1] * w1.ndim
    shape1[pair.first_axis] = -1
    shape2 = [1] * w2.ndim
    shape2[pair.second_axis] = -1
    values[pair.first] = (w1 / scale.reshape(shape1)).astype(np.float32).reshape(
        values[pair.first].shape)
    values[pair.second] = (w2 * scale.reshape(shape2)).astype(np.float32)
    if pair.bias is not None:
        bias = values[pair.bias]
        values[pair.bias] = (bias / scale.reshape(bias.shape)).astype(np.float32)
    return scale


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    import tensorflow as tf

    graph = copy_graph(artifact.graph_def)
    index = GraphIndex.build(graph)
    pairs = find_pairs(index, {node_name(o) for o in artifact.outputs})
    if not pairs:
        return StageResult(artifact=artifact.replace(graph_def=graph),
                           metrics={"equalized_pairs": 0.0},
                           info={"equalized": []},
                           warnings=["equalize found no pair of layers to balance (Conv2D, "
                                     "DepthwiseConv2dNative or MatMul with constant weights, "
                                     "one feeding the next through a bias, Relu or pooling)"])
    names = {n for p in pairs for n in (p.first, p.second, p.bias) if n is not None}
    values = {n: const_value(index.nodes[n]).astype(np.float32) for n in names}
    before = [_precision(values, p) for p in pairs]
    for _ in range(params.iterations):
        for pair in pairs:
            equalize_pair(values, pair)
    after = [_precision(values, p) for p in pairs]
    for name, value in values.items():
        index.nodes[name].attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return StageResult(
        artifact=artifact.replace(graph_def=graph),
        metrics={"equalized_pairs": float(len(pairs)),
                 "pair_precision_before": float(np.mean(before)),
                 "pair_precision_after": float(np.mean(after))},
        info={"equalized": [{"first": p.layers[0], "second": p.layers[1],
                             "precision_before": b, "precision_after": a}
                            for p, b, a in zip(pairs, before, after, strict=True)]})


STAGE = register(Stage(name="equalize", run=run, params=Params, doc=__doc__ or ""))
