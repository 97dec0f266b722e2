"""The guard's layers (what is moved as one) and their ranking, on hand-made graphs and
per-layer rows (orchestrator.quant.layer_groups)."""

from __future__ import annotations

from typing import Any

from tensorflow.core.framework import graph_pb2, node_def_pb2

from orchestrator.quant.knobs import Layer
from orchestrator.quant.layer_groups import grouped_layers, layers_of, rank_layers


def graph(*nodes: tuple[str, str, list[str]]) -> graph_pb2.GraphDef:
    out = graph_pb2.GraphDef()
    for name, op, inputs in nodes:
        out.node.append(node_def_pb2.NodeDef(name=name, op=op, input=inputs))
    return out


GRAPH = graph(
    ("x", "Placeholder", []),
    ("conv", "Conv2D", ["x", "w1"]), ("bias", "BiasAdd", ["conv", "b1"]),
    ("relu", "Relu", ["bias"]), ("pool", "MaxPool", ["relu"]),
    # a conv read twice: no tail (its BiasAdd is a layer of its own)
    ("conv2", "Conv2D", ["pool", "w2"]), ("bias2", "BiasAdd", ["conv2", "b2"]),
    ("side", "Relu", ["conv2"]),
    # a Conv1D: the bias comes after its Squeeze; here it stays float (not convertible)
    ("conv3", "Conv2D", ["pool", "w3"]), ("squeeze", "Squeeze", ["conv3"]),
    ("bias3", "BiasAdd", ["squeeze", "b3"]), ("relu3", "Relu6", ["bias3"]),
    ("dense", "MatMul", ["relu3", "w4"]), ("out", "BiasAdd", ["dense", "b4"]),
)
CONVERTIBLE = {"conv", "bias", "relu", "pool", "conv2", "bias2", "side", "conv3", "relu3",
               "dense", "out"}


def test_a_layer_is_a_weight_op_with_its_bias_and_activation() -> None:
    layers = {layer.name: layer for layer in layers_of(GRAPH, CONVERTIBLE)}
    assert layers["conv"] == Layer("conv", ("conv", "bias", "relu"), True)
    assert layers["conv2"] == Layer("conv2", ("conv2",), True)  # two readers: no tail
    # through the Squeeze and past the BiasAdd left float, to the Relu6
    assert layers["conv3"] == Layer("conv3", ("conv3", "relu3"), True)
    assert layers["dense"] == Layer("dense", ("dense", "out"), True)
    lone = [name for name, layer in layers.items() if not layer.has_weights]
    assert lone == ["pool", "bias2", "side"]  # in graph order, after the weight layers
    assert list(layers)[:4] == ["conv", "conv2", "conv3", "dense"]
    members = [n for layer in layers.values() for n in layer.nodes]
    assert sorted(members) == sorted(CONVERTIBLE)  # every convertible node, once


def test_ranking_by_the_error_a_layer_adds() -> None:
    layers = layers_of(GRAPH, CONVERTIBLE)
    inputs_of = {n.name: [i for i in n.input] for n in GRAPH.node}
    # conv's layer drifts 0.01; conv2 inherits it and adds 0.001; dense adds 0.05
    rows = [{"node": "bias", "nmse": 0.01}, {"node": "relu", "nmse": 0.01},
            {"node": "conv2", "nmse": 0.011}, {"node": "out", "nmse": 0.06},
            {"node": "pool", "nmse": 0.01}]
    ranked = [layer.name for layer in rank_layers(rows, layers, set(), inputs_of)]
    assert ranked[:3] == ["dense", "conv", "conv2"]
    # unmeasured layers keep their order, after the measured ones
    measured = {"dense", "conv", "conv2", "pool"}
    assert [n for n in ranked if n not in measured] == ["conv3", "bias2", "side"]
    # done layers are left out; without diagnostics the given order stands
    assert [layer.name for layer in rank_layers(rows, layers, {"dense"}, inputs_of)][0] == \
        "conv"
    assert rank_layers([], layers, set()) == layers


def row(node: str, op: str, *inputs: str) -> dict[str, Any]:
    return {"node": node, "op": op, "inputs": list(inputs)}


def test_pass_through_ops_go_with_the_layer_they_feed() -> None:
    rows = [row("front", "CONV_2D", "audio"), row("squeeze", "RESHAPE", "front"),
            row("expand", "RESHAPE", "squeeze"), row("conv0", "CONV_2D", "expand"),
            row("shared", "RESHAPE", "conv0"), row("head_a", "FULLY_CONNECTED", "shared"),
            row("head_b", "FULLY_CONNECTED", "shared")]
    layers = {layer.name: layer for layer in grouped_layers(rows)}
    assert layers["conv0"].nodes == ("conv0", "expand", "squeeze")
    assert layers["front"].nodes == ("front",) and layers["front"].has_weights
    assert "squeeze" not in layers and "expand" not in layers
    assert layers["shared"].nodes == ("shared",)  # two layers read it: its own layer
    assert list(layers) == ["front", "conv0", "shared", "head_a", "head_b"]
