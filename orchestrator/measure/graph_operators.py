"""A GraphDef's nodes as operators (orchestrator.model.operators): what the device estimate
prices for a file a TF session runs. Every node is one, Const and Identity included: the
session's executor dispatches each (their kind, `reshape`, costs only that dispatch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.measure.flops import imported
from orchestrator.model.operators import Operator, conv_kind

__all__ = ["graph_operators"]

_GEMM = {"Conv2D": "conv", "QuantizedConv2D": "conv", "QuantizedConv2DWithBias": "conv",
         "QuantizedConv2DWithBiasAndRelu": "conv", "Conv2DBackpropInput": "conv",
         "DepthwiseConv2dNative": "depthwise", "QuantizedDepthwiseConv2D": "depthwise",
         "MatMul": "fully_connected", "QuantizedMatMul": "fully_connected",
         "BatchMatMul": "fully_connected", "BatchMatMulV2": "fully_connected"}
_KINDS = {"AvgPool": "pool", "MaxPool": "pool", "QuantizedAvgPool": "pool",
          "QuantizedMaxPool": "pool", "Mean": "pool", "Sum": "pool", "Max": "pool",
          "Min": "pool", "ArgMax": "pool", "Softmax": "softmax", "LogSoftmax": "softmax",
          "ResizeBilinear": "resize", "ResizeNearestNeighbor": "resize",
          "ConcatV2": "data", "Concat": "data", "QuantizedConcat": "data", "Pad": "data",
          "PadV2": "data", "MirrorPad": "data", "Transpose": "data", "Slice": "data",
          "StridedSlice": "data", "GatherV2": "data", "Split": "data", "SplitV": "data",
          "Pack": "data", "Unpack": "data", "Tile": "data",
          "Reshape": "reshape", "QuantizedReshape": "reshape", "Squeeze": "reshape",
          "ExpandDims": "reshape", "Identity": "reshape", "Const": "reshape",
          "ImmutableConst": "reshape", "NoOp": "reshape", "Placeholder": "reshape",
          "PlaceholderWithDefault": "reshape", "Shape": "reshape"}
# 8-bit ops that are not Quantized*: their work is converting to or from eight bits
_INT8_OPS = {"QuantizeV2", "Dequantize", "Requantize", "RequantizationRange"}


def graph_operators(graph_def: Any, input_shapes: Mapping[str, Sequence[int]]
                    ) -> list[Operator]:
    """Every node of one run with the inputs fixed to `input_shapes` (batch 1)."""
    graph = imported(graph_def, input_shapes)
    found = []
    for op in graph.get_operations():
        outputs = [_size(t) for t in op.outputs]
        out = outputs[0][0] if outputs else 0
        moved = sum(b for _, b in outputs) + sum(_size(t)[1] for t in op.inputs)
        kind = _GEMM.get(op.type) or _KINDS.get(op.type, "elementwise")
        precision = ("int8" if op.type.startswith("Quantized") or op.type in _INT8_OPS
                     else "float32")
        flops, detail = 0, ""
        if kind in ("conv", "depthwise") and len(op.inputs) > 1:
            filt = _dims(op.inputs[1])  # [h, w, in, out] / [h, w, in, multiplier]
            if filt is not None:
                if kind == "conv":
                    kind = conv_kind(filt[0], filt[1])
                per_output = filt[0] * filt[1] * (filt[2] if kind != "depthwise" else 1)
                flops = 2 * out * per_output
                channels_out = filt[3] * (filt[2] if kind == "depthwise" else 1)
                detail = f"{filt[0]}x{filt[1]} {filt[2]}->{channels_out} ch"
        elif kind == "fully_connected" and op.inputs:
            lhs = _dims(op.inputs[0])
            if lhs is not None:
                transposed = ("transpose_a" in op.node_def.attr
                              and bool(op.get_attr("transpose_a")))
                flops = 2 * out * (lhs[-2] if transposed else lhs[-1])
        elif kind == "pool" and "ksize" in op.node_def.attr:
            flops = out * math.prod(op.get_attr("ksize"))
        elif kind == "pool" and op.inputs:
            flops = _size(op.inputs[0])[0]
        elif kind in ("elementwise", "softmax"):
            flops = out
        found.append(Operator(name=op.name, op=op.type, kind=kind, precision=precision,
                              flops=int(flops), elements=int(out), bytes=int(moved),
                              detail=detail))
    return found


def _dims(tensor: Any) -> list[int] | None:
    shape = tensor.shape
    if shape.rank is None or not shape.is_fully_defined():
        return None
    return [int(d) for d in shape.as_list()]


def _size(tensor: Any) -> tuple[int, int]:
    """(elements, bytes) of a tensor of known shape; (0, 0) where it is not known."""
    dims = _dims(tensor)
    if dims is None:
        return 0, 0
    elements = math.prod(dims)
    try:
        width = tensor.dtype.size
    except (AttributeError, TypeError, ValueError):  # resources, strings
        width = 0
    return elements, elements * width
