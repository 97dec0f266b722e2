"""Add a linear layer's bias in its own 32-bit accumulator, not with QuantizedBiasAdd.

GTT's quantize_nodes turns `Conv2D/MatMul -> BiasAdd` into
`QuantizedConv2D -> Requantize (to 8 bits) -> QuantizedBiasAdd (quint8 + quint8 bias) ->
Requantize`. TF's QuantizedBiasAdd (the x86 Eigen path) moves both operands into a qint32
"total space" of +-M * 2^17 (M: the largest magnitude of the two ranges) in float32
arithmetic: its zero offset, near 2^31, is only representable to about 128 units, which is
one 8-bit step of the input, per operand. So the op adds a constant offset of up to about 4
steps to every value of a layer, set by the input range to the last bit (measured: 13 % of
random ranges are off by more than half a step; tests/quant/test_integer_bias.py). Ranges are
logged anew for every candidate graph, so which layers are off changes from one candidate
to the next: that made the accuracy guard's trials look random.

Here the bias goes straight into the convolution's int32 accumulator, in the accumulator's
own scale L = (max - min) / (2^32 - 1), as gemmlowp and TFLite do it:

    acc (qint32) -> Bitcast int32 -> AddV2(round-free bias / L) -> Bitcast qint32
                 -> RequantizationRange -> Requantize (the BiasAdd's own, kept)

which is exact to 1/128 of an 8-bit step, keeps the bias in float32 (no 8-bit bias
rounding, so bias correction survives whole), and drops one 8-bit requantization and the
QuantizedBiasAdd. Every op is a standard TF kernel. L depends on the layer's input range,
which may be computed at run time, so bias / L is computed in the graph: a handful of ops
on a vector of one value per channel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.model.artifact import node_name
from orchestrator.model.graph_rewrite import GraphIndex, constant_nodes, make_const, output_index

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

LINEAR_FLOAT = ("Conv2D", "MatMul")
LINEAR_EIGHT_BIT = ("QuantizedConv2D", "QuantizedMatMul")
# qint32 steps of the accumulator range: (max - min) / L
_ACCUMULATOR_STEPS = 4294967295.0
_DT_FLOAT, _DT_INT32, _DT_QINT32 = 1, 3, 13
EIGHT_BIT_SUFFIX = "/eightbit"  # GTT's name for the eight-bit op of float op F: F/eightbit


def biases_to_fuse(graph_def: GraphDef, converts: Mapping[str, bool]) -> dict[str, str]:
    """BiasAdd name -> its bias tensor, for every BiasAdd of a constant bias right after a
    Conv2D/MatMul that quantize_nodes converts (`converts[name]`), both about to be
    converted."""
    index = GraphIndex.build(graph_def)
    found = {}
    for node in graph_def.node:
        if node.op != "BiasAdd" or len(node.input) < 2 or not converts.get(node.name):
            continue
        linear = index.producer(node.input[0])
        if linear is None or linear.op not in LINEAR_FLOAT or output_index(node.input[0]) \
                or not converts.get(linear.name):
            continue
        found[node.name] = node.input[1]
    return found


def constant_values(graph_def: GraphDef, tensors: Mapping[str, str]) -> dict[str, np.ndarray]:
    """key -> value of each constant tensor (a Const, or a Dequantize of stored 8-bit
    weights), computed by TF itself; entries that turn out not to be constant are left out."""
    import tensorflow as tf

    constant = constant_nodes(graph_def)
    wanted = {key: name for key, name in tensors.items() if node_name(name) in constant}
    if not wanted:
        return {}
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    keys = list(wanted)
    with tf.compat.v1.Session(graph=graph) as session:
        values = session.run([_tensor(wanted[k]) for k in keys])
    return {k: np.asarray(v, np.float32) for k, v in zip(keys, values, strict=True)}


def _op(nodes: list, name: str, op_type: str, inputs: list[str], **types: int) -> str:
    """Append a NodeDef with type attrs to `nodes`; returns its name."""
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name=name, op=op_type, input=inputs)
    for key, value in types.items():
        node.attr[key].type = value
    nodes.append(node)
    return name


def _tensor(name: str) -> str:
    return name if ":" in name else f"{name}:0"


def fuse(graph_def: GraphDef, biases: Mapping[str, np.ndarray]) -> list[str]:
    """Rewrite GTT's `Quantized{Conv2D,MatMul} -> Requantize -> QuantizedBiasAdd` of each
    BiasAdd F in `biases` (F -> its float bias values) into the accumulator add, in place.
    Returns the BiasAdds fused. Nodes left unused (the old Requantize, its range, the 8-bit
    bias) are for the caller's prune."""
    index = GraphIndex.build(graph_def)
    fused = []
    for bias_add in [n for n in graph_def.node if n.op == "QuantizedBiasAdd"]:
        float_name = bias_add.name[: -len(EIGHT_BIT_SUFFIX)]
        if not bias_add.name.endswith(EIGHT_BIT_SUFFIX) or float_name not in biases:
            continue
        requantize = index.producer(bias_add.input[0])
        linear = None if requantize is None or requantize.op != "Requantize" \
            else index.producer(requantize.input[0])
        if linear is None or linear.op not in LINEAR_EIGHT_BIT \
                or list(requantize.input[1:3]) != [f"{linear.name}:1", f"{linear.name}:2"]:
            continue
        name = bias_add.name
        lo, hi = f"{linear.name}:1", f"{linear.name}:2"
        # bias / L = bias * (2^32 - 1) / (max - min): the constant factor goes in the bias
        scaled = (np.asarray(biases[float_name], np.float64) * _ACCUMULATOR_STEPS)
        nodes = [make_const(f"{name}/bias", scaled.astype(np.float32))]
        span = _op(nodes, f"{name}/span", "Sub", [hi, lo], T=_DT_FLOAT)
        steps = _op(nodes, f"{name}/steps", "RealDiv", [f"{name}/bias", span], T=_DT_FLOAT)
        # Cast truncates: at most one accumulator step, 1/128 of an 8-bit step
        steps_int = _op(nodes, f"{name}/steps_int", "Cast", [steps], SrcT=_DT_FLOAT,
                        DstT=_DT_INT32)
        accumulator = _op(nodes, f"{name}/acc", "Bitcast", [f"{linear.name}:0"],
                          T=_DT_QINT32, type=_DT_INT32)
        total = _op(nodes, f"{name}/sum", "AddV2", [accumulator, steps_int], T=_DT_INT32)
        bias_add.Clear()
        bias_add.name, bias_add.op = name, "Bitcast"
        bias_add.input.append(total)
        bias_add.attr["T"].type = _DT_INT32
        bias_add.attr["type"].type = _DT_QINT32
        graph_def.node.extend(nodes)
        # the BiasAdd's min/max outputs are now the accumulator's own
        renames = {f"{name}:1": lo, f"{name}:2": hi}
        for consumer in index.consumers.get(name, []):
            for i, inp in enumerate(consumer.input):
                consumer.input[i] = renames.get(inp, inp)
        fused.append(float_name)
    return fused
