"""Ranges a model already trained: its FakeQuant nodes (TF1 contrib quantize, TFMOT's QAT).

A `FakeQuantWithMinMaxVars` / `...Args` after an activation holds the range the model was
trained to be quantized with; one on weights holds theirs. Both 8-bit paths honour them:

- GraphDef: GTT's quantize_nodes hoists each activation FakeQuant into the Requantize before
  it, its min/max constants the requantization range (no RequantizationRange to log). Those
  constants are TF's raw variables, and GTT merges equal constants across nodes:
  `pin_hoisted_ranges` gives each such Requantize/QuantizeV2 its own constants, nudged as
  the FakeQuant op nudges them (zero on a step), so later nudging stays per node.
- LiteRT: the converter's int8 mode reads FakeQuant ranges itself, but its float mode keeps
  every FakeQuant as a QUANTIZE/DEQUANTIZE pair. `strip` takes them out of the graph first
  (activation ones bypassed, weight ones folded into their fake-quantized constants), and
  `tflite_ranges` names their ranges by the float `.tflite`'s tensors, for the quantizer.

TensorFlow is imported only inside functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.model.graph_rewrite import (
    GraphIndex,
    const_value,
    constant_nodes,
    copy_graph,
    make_const,
    prune_orphans,
    unique_name,
)
from orchestrator.model.litert_model import tensor_name

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

FAKE_QUANT_OPS = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs",
                  "FakeQuantWithMinMaxVarsPerChannel")
# The metadata key of a float artifact's trained ranges: {tensor name: [min, max]} (a
# float .tflite's tensor names after convert_tflite; quantize_tflite pins them).
TRAINED_RANGES = "trained_ranges"
# A GraphDef artifact's: {Requantize/QuantizeV2 node: [min, max]} (quantize_nodes).
GRAPH_TRAINED_RANGES = "fake_quant_ranges"


@dataclass(frozen=True)
class FakeQuant:
    """One activation FakeQuant node: what it quantizes and the range it was trained with."""

    node: str
    input: str                      # the tensor it quantizes (a node input, e.g. conv1/Relu)
    range: tuple[float, float] | None  # nudged (min, max); None: not an 8-bit per-tensor range


def nudged(lo: float, hi: float, narrow_range: bool = False) -> tuple[float, float]:
    """(min, max) as TF's FakeQuant ops nudge them: zero exactly on one of the steps."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not hi - lo > 0.0:
        return lo, hi
    q_min, q_max = (1, 255) if narrow_range else (0, 255)
    step = (hi - lo) / (q_max - q_min)
    zero_point = min(max(round(q_min - lo / step), q_min), q_max)
    return (float(np.float32((q_min - zero_point) * step)),
            float(np.float32((q_max - zero_point) * step)))


def _attr(node, key: str, default):  # noqa: ANN001, ANN202
    # `in` first: indexing a proto map inserts an empty value
    if key not in node.attr:
        return default
    value = node.attr[key]
    return value.WhichOneof("value") and getattr(value, value.WhichOneof("value"))


def activations(graph_def: GraphDef) -> list[FakeQuant]:
    """The FakeQuant nodes on computed tensors (not on constants: weights), with ranges."""
    index = GraphIndex.build(graph_def)
    constant = constant_nodes(graph_def)
    found = []
    for node in graph_def.node:
        if node.op not in FAKE_QUANT_OPS or node.input[0].split(":")[0] in constant:
            continue
        if node.op == "FakeQuantWithMinMaxArgs":
            bounds = (_attr(node, "min", -6.0), _attr(node, "max", 6.0))
        elif node.op == "FakeQuantWithMinMaxVars":
            lo, hi = (index.resolve_const(i) for i in node.input[1:3])
            bounds = None if lo is None or hi is None else (
                float(const_value(lo)), float(const_value(hi)))
        else:  # per-channel activations: no per-tensor range to give
            bounds = None
        eight_bit = _attr(node, "num_bits", 8) == 8 and not _attr(node, "narrow_range", False)
        found.append(FakeQuant(node.name, node.input[0],
                               nudged(*bounds) if bounds and eight_bit else None))
    return found


def strip(graph_def: GraphDef) -> tuple[GraphDef, list[FakeQuant]]:
    """The graph without FakeQuant nodes, and the activation ones it took out.

    An activation FakeQuant's consumers read its input instead; a weights' FakeQuant (all
    inputs constant) becomes a Const of its output, the fake-quantized weights the model
    was trained with."""
    import tensorflow as tf

    acts = activations(graph_def)
    constant = constant_nodes(graph_def)
    weights = [n.name for n in graph_def.node
               if n.op in FAKE_QUANT_OPS and n.name in constant]
    values: list[np.ndarray] = []
    if weights:  # run the constant subgraphs once: TF's own fake quantization, exactly
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            values = session.run([f"{name}:0" for name in weights])
    bypass = {fq.node: fq.input for fq in acts}
    out = copy_graph(graph_def)
    del out.node[:]
    orphans: list[str] = []  # what computed a folded FakeQuant's inputs (its min/max)
    for node in graph_def.node:
        if node.name in bypass:
            continue
        if node.name in weights:
            out.node.append(make_const(node.name, values[weights.index(node.name)]))
            orphans += [i.lstrip("^").split(":")[0] for i in node.input]
            continue
        new = out.node.add()
        new.CopyFrom(node)
        for i, name in enumerate(new.input):
            control, bare = name.startswith("^"), name.lstrip("^")
            ref = bare[:-2] if bare.endswith(":0") else bare
            if ref not in bypass:
                continue
            while ref in bypass:  # a FakeQuant's output -> the tensor it quantized
                ref = bypass[ref]
            new.input[i] = "^" + ref.split(":")[0] if control else ref
    prune_orphans(out, orphans)
    return out, acts


def tflite_ranges(flatbuffer: bytes, stripped: list[FakeQuant]
                  ) -> tuple[dict[str, list[float]], list[str]]:
    """{float .tflite tensor name: [min, max]} for the stripped FakeQuants' tensors, and the
    FakeQuant nodes whose tensor it does not name.

    The converter names a fused tensor by its ops' names joined with ';' (CONV_2D with its
    BiasAdd and Relu: "conv1/Relu;conv1/BiasAdd;conv1/Conv2D;..."): the tensor whose name
    holds the FakeQuant's input node is the one it quantized."""
    names = tensor_names(flatbuffer)
    found: dict[str, list[float]] = {}
    missing = []
    for fq in stripped:
        if fq.range is None:
            continue
        wanted = fq.input.split(":")[0]
        match = next((n for n in names if n == wanted or wanted in n.split(";")), None)
        if match is None:
            missing.append(fq.node)
        else:
            found[match] = list(fq.range)
    return found, missing


def pin_hoisted_ranges(quantized: GraphDef, original: GraphDef
                       ) -> tuple[GraphDef, dict[str, list[float]]]:
    """Each Requantize/QuantizeV2 of `quantized` that GTT made of one of `original`'s
    activation FakeQuant nodes (named `<fake quant>_eightbit/...` or `..._hoisted_eightbit/
    ...`) gets its own constants holding that FakeQuant's nudged range, in place of the
    raw (and possibly shared) ones; a new graph and {node: [min, max]}."""
    ranges = {fq.node: fq.range for fq in activations(original) if fq.range is not None}
    if not ranges:
        return quantized, {}
    out = copy_graph(quantized)
    consts = {n.name for n in out.node if n.op == "Const"}
    taken = {n.name for n in out.node}
    pinned: dict[str, list[float]] = {}
    for node in list(out.node):
        ports = _RANGE_PORTS.get(node.op)
        owner = fake_quant_of(node.name)
        if ports is None or owner not in ranges or len(node.input) <= ports[1] or \
                any(node.input[p].split(":")[0] not in consts for p in ports):
            continue
        for port, value, end in zip(ports, ranges[owner], ("min", "max"), strict=True):
            name = unique_name(f"{node.name}/trained_{end}", taken)
            taken.add(name)
            out.node.append(make_const(name, np.float32(value)))
            node.input[port] = name
        pinned[node.name] = list(ranges[owner])
    return out, pinned


_RANGE_PORTS = {"Requantize": (3, 4), "QuantizeV2": (1, 2)}


def fake_quant_of(node: str) -> str:
    """The FakeQuant node GTT named a node after (`<fake quant>_hoisted_eightbit/
    requantize` -> `<fake quant>`); other names unchanged."""
    owner = node.rsplit("/", 1)[0]
    for suffix in ("_hoisted_eightbit", "_eightbit"):
        owner = owner.removesuffix(suffix)
    return owner


def tensor_names(flatbuffer: bytes) -> list[str]:
    """The names of the main subgraph's activation tensors (its inputs and its ops'
    outputs; not constants, which the converter names by the same fused ops)."""
    from ai_edge_litert.tools import flatbuffer_utils

    graph = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer)).subgraphs[0]
    computed = [*graph.inputs, *(i for op in graph.operators for i in op.outputs)]
    return [tensor_name(graph.tensors[i]) for i in computed if i >= 0]


def int8_tensors_with_ranges(flatbuffer: bytes, ranges: list[tuple[float, float]]
                             ) -> dict[str, list[float]]:
    """{name: [min, max]} of the int8 file's activation tensors (per tensor, no constant
    data) whose range is one of `ranges`, to a hundredth of a step: the ranges it took
    from the model rather than from calibration."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    int8 = flatbuffer_utils.TensorType.INT8
    found: dict[str, list[float]] = {}
    for tensor in model.subgraphs[0].tensors:
        quant = tensor.quantization
        buffer = model.buffers[tensor.buffer] if tensor.buffer < len(model.buffers) else None
        if tensor.type != int8 or quant is None or quant.scale is None \
                or len(quant.scale) != 1 or (buffer is not None and buffer.data is not None
                                             and len(buffer.data)):
            continue
        scale, zero = float(quant.scale[0]), int(quant.zeroPoint[0])
        lo, hi = (-128 - zero) * scale, (127 - zero) * scale
        if any(abs(lo - a) < scale / 100 and abs(hi - b) < scale / 100 for a, b in ranges):
            found[tensor_name(tensor)] = [lo, hi]
    return found
