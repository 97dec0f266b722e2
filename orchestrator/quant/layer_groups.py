"""Layers as the accuracy guard moves them, and their ranking by the error each adds.

A layer is what a user means by one: a Conv2D/MatMul with the BiasAdd and Relu/Relu6 that
follow it (its quantize/dequantize boundary is placed once, around all of them), or a lone
op such as a MaxPool; in a LiteRT file, an op with the ops that only move its input
(a Conv1D's EXPAND_DIMS). Quantizing stages find their layers with these (their
`Knobs.layers`); the guard ranks them with `rank_layers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.model.artifact import node_name
from orchestrator.model.graph_rewrite import data_inputs
from orchestrator.quant.knobs import Layer
from orchestrator.quant.ranges import WEIGHT_OPS

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

# Ops that follow a Conv2D/MatMul into one layer, in this order...
LAYER_TAIL_OPS = ("BiasAdd", "Relu", "Relu6")
# ... also behind these, which only reshape (a Conv1D is ExpandDims, Conv2D, Squeeze).
PASS_THROUGH_OPS = ("Squeeze", "ExpandDims", "Identity")
# LiteRT ops whose weights make them a weight layer.
LITERT_WEIGHT_OPS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED",
                               "TRANSPOSE_CONV", "CONV_3D", "BATCH_MATMUL"})
# LiteRT ops that only move or select values: their output's precision is what the next
# layer reads, so they go with that layer (a Conv1D's EXPAND_DIMS, as a RESHAPE, with its
# CONV_2D: an int16 CONV_2D behind an int8 RESHAPE reads values already rounded to 8 bits).
LITERT_PASS_THROUGH = frozenset({"RESHAPE", "MAX_POOL_2D", "TRANSPOSE", "PAD", "SQUEEZE",
                                 "EXPAND_DIMS", "STRIDED_SLICE", "SLICE"})
# The edges of an int8 LiteRT file with float inputs and outputs: no layer of the model.
LITERT_EDGE_OPS = ("QUANTIZE", "DEQUANTIZE")


def layers_of(graph: GraphDef, convertible: set[str]) -> list[Layer]:
    """The convertible nodes as layers, weight layers first (graph order): a Conv2D/MatMul
    takes the BiasAdd, then the Relu/Relu6, that are its only consumers (looking through a
    Squeeze or ExpandDims); every other convertible node is a layer of its own."""
    consumers: dict[str, list[str]] = {}
    for node in graph.node:
        for inp in node.input:
            consumers.setdefault(node_name(inp), []).append(node.name)
    ops = {n.name: n.op for n in graph.node}
    taken: set[str] = set()
    layers = []
    for node in graph.node:
        if node.name not in convertible or node.op not in WEIGHT_OPS:
            continue
        members, tail, last = [node.name], list(LAYER_TAIL_OPS), node.name
        while len(consumers.get(last, [])) == 1:
            last = consumers[last][0]
            if ops[last] in PASS_THROUGH_OPS:  # a Conv1D's Squeeze: the layer goes on
                continue
            if ops[last] not in tail:
                break
            tail = tail[tail.index(ops[last]) + 1:]
            if last in convertible:  # (a BiasAdd left float for its kernel is passed)
                members.append(last)
        taken.update(members)
        layers.append(Layer(node.name, tuple(members), True))
    layers += [Layer(n.name, (n.name,), False) for n in graph.node
               if n.name in convertible and n.name not in taken]
    return layers


def inputs_by_node(graph: GraphDef) -> dict[str, list[str]]:
    """Each node's data inputs, as node names (control inputs left out)."""
    return {n.name: [node_name(i) for i in data_inputs(n)] for n in graph.node}


def litert_layers(rows: list[dict[str, Any]]) -> list[Layer]:
    """An int8 LiteRT file's ops, as its per-layer rows list them, each a layer of its own
    (the file's QUANTIZE/DEQUANTIZE edges left out)."""
    return [Layer(r["node"], (r["node"],), r.get("op") in LITERT_WEIGHT_OPS)
            for r in rows if r.get("op") not in LITERT_EDGE_OPS]


def grouped_layers(rows: list[dict[str, Any]]) -> list[Layer]:
    """Rows that name each op's inputs, as layers: each op with the pass-through ops that
    feed it alone (walking back), in the rows' order; a pass-through op nothing claims is
    a layer of its own."""
    by_name = {r["node"]: r for r in rows}
    consumers: dict[str, int] = {}
    for row in rows:
        for name in row.get("inputs") or []:
            consumers[name] = consumers.get(name, 0) + 1
    claimed: set[str] = set()
    groups: dict[str, list[str]] = {}
    for row in rows:
        if row.get("op") in LITERT_PASS_THROUGH:
            continue
        chain, inputs = [], list(row.get("inputs") or [])
        while len(inputs) == 1 and inputs[0] in by_name and consumers.get(inputs[0]) == 1 \
                and by_name[inputs[0]].get("op") in LITERT_PASS_THROUGH:
            chain.append(inputs[0])
            inputs = list(by_name[inputs[0]].get("inputs") or [])
        groups[row["node"]] = [row["node"], *chain]
        claimed.update(chain)
    return [Layer(r["node"], tuple(groups.get(r["node"], [r["node"]])),
                  r.get("op") in LITERT_WEIGHT_OPS)
            for r in rows if r["node"] in groups or r["node"] not in claimed]


def upstream_error(node: str, errors: Mapping[str, float],
                   inputs_of: Mapping[str, list[str]]) -> float:
    """The largest error among the nearest measured nodes that feed `node` (0.0 when only
    inputs and constants do): what it was given, before adding its own."""
    seen: set[str] = set()
    stack = list(inputs_of.get(node, []))
    worst = 0.0
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in errors:
            worst = max(worst, errors[name])
        else:
            stack.extend(inputs_of.get(name, []))
    return worst


def rank_layers(layer_errors: list[dict[str, Any]], layers: list[Layer], done: set[str],
                inputs_of: Mapping[str, list[str]] | None = None) -> list[Layer]:
    """Layers not yet moved, worst first. With diagnostics: by the normalized MSE a layer
    adds to what it was given (errors pile up downstream, so a layer after a bad one looks
    bad too), then by its own, the worst node of the layer counting; layers without a
    measured node keep their order after the measured ones. Else in the given order
    (weight layers first)."""
    remaining = [layer for layer in layers if layer.name not in done]
    if not layer_errors:
        return remaining
    errors = {row["node"]: row.get("nmse") or 0.0 for row in layer_errors}

    def score(layer: Layer) -> tuple[bool, float, float]:
        measured = [n for n in layer.nodes if n in errors]
        if not measured:
            return (False, 0.0, 0.0)
        added = max(max(errors[n] - upstream_error(n, errors, inputs_of or {}), 0.0)
                    for n in measured)
        return (True, added, max(errors[n] for n in measured))

    return sorted(remaining, key=score, reverse=True)  # stable: ties keep their order
