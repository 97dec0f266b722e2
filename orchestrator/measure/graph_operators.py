"""A GraphDef's nodes as operators (orchestrator.model.operators): what the device estimate
prices for a file a TF session runs. Every node is one, Const and Identity included: the
session's executor dispatches each (their kind, `reshape`, costs only that dispatch).

FLOPs are counted as TF's v1 profiler counts each node (its flops_registry.py; Quantized*
ops as their float twins, orchestrator.measure.flops), so that a float graph's operators
add up to its `count_flops`.
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
          "PlaceholderWithDefault": "reshape", "Shape": "reshape", "Bitcast": "reshape",
          "Snapshot": "reshape", "StopGradient": "reshape"}
# 8-bit ops that are not Quantized*: their work is converting to or from eight bits
_INT8_OPS = {"QuantizeV2", "Dequantize", "Requantize", "RequantizationRange"}
# the profiler's FLOPs per output element (binary ops) and per input element (unary ones):
# tensorflow/python/profiler/internal/flops_registry.py, nn_ops.py (BiasAdd); the ops it
# does not register (Relu, Cast, ...) count 0 there, and here
_PER_OUTPUT = {"Add": 1, "AddV2": 1, "Sub": 1, "Mul": 1, "RealDiv": 1, "Maximum": 1,
               "Minimum": 1, "Pow": 1, "SquaredDifference": 2, "GreaterEqual": 1,
               "Greater": 1, "LessEqual": 1, "Less": 1, "Equal": 1, "NotEqual": 1,
               "BiasAdd": 1, "QuantizedBiasAdd": 1, "QuantizedAdd": 1, "QuantizedMul": 1}
_PER_INPUT = {"Softmax": 5, "Reciprocal": 1, "Square": 1, "Rsqrt": 2, "Log": 1, "Neg": 1}
# reductions: input elements x 1 + output elements x (finalize - 1)
_REDUCTIONS = {"Mean": 1, "Sum": 0, "ArgMax": 0, "ArgMin": 0}


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
                flops, detail = _conv(op, kind, filt, out)
                if op.type != "Conv2DBackpropInput" and kind == "conv":
                    kind = conv_kind(filt[0], filt[1])
        elif kind == "fully_connected" and op.inputs:
            lhs = _dims(op.inputs[0])
            if lhs is not None:
                transposed = ("transpose_a" in op.node_def.attr
                              and bool(op.get_attr("transpose_a")))
                flops = 2 * out * (lhs[-2] if transposed else lhs[-1])
        elif kind == "pool" and "ksize" in op.node_def.attr:
            flops = out * math.prod(op.get_attr("ksize"))
        elif op.type in _REDUCTIONS and op.inputs:
            flops = _size(op.inputs[0])[0] + out * (_REDUCTIONS[op.type] - 1)
        elif op.type in _PER_OUTPUT:
            flops = out * _PER_OUTPUT[op.type]
        elif op.type == "AddN" and op.inputs:
            flops = out * (len(op.inputs) - 1)
        elif op.type in _PER_INPUT and op.inputs:
            flops = _size(op.inputs[0])[0] * _PER_INPUT[op.type]
        found.append(Operator(name=op.name, op=op.type, kind=kind, precision=precision,
                              flops=int(flops), elements=int(out), bytes=int(moved),
                              detail=detail))
    return found


def _conv(op: Any, kind: str, filt: list[int], out: int) -> tuple[int, str]:
    """(FLOPs, shape) of a convolution, as the profiler counts it (nn_ops.py and
    flops_registry.py): 2 per multiply-add."""
    strides = list(op.get_attr("strides")) if "strides" in op.node_def.attr else [1, 1, 1, 1]
    dims = _dims(op.outputs[0]) if op.outputs else None
    spatial = f", {dims[1]}x{dims[2]} out" if dims is not None and len(dims) == 4 else ""
    stride = strides[1] if len(strides) == 4 else 1
    if op.type == "Conv2DBackpropInput":  # filter [h, w, its output's ch, its input's ch]
        flops = 2 * out * filt[0] * filt[1] * filt[3] // max(strides[1] * strides[2], 1)
        return flops, f"{filt[0]}x{filt[1]}/{stride} {filt[3]}->{filt[2]} ch transposed{spatial}"
    if kind == "depthwise":
        return (2 * out * filt[0] * filt[1],
                f"{filt[0]}x{filt[1]}/{stride} {filt[2]}->{filt[2] * filt[3]} ch{spatial}")
    return (2 * out * filt[0] * filt[1] * filt[2],
            f"{filt[0]}x{filt[1]}/{stride} {filt[2]}->{filt[3]} ch{spatial}")


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
