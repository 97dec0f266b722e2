"""What a `.tflite` flatbuffer holds: its builtin ops, parameter count, inputs and outputs.

Read with LiteRT's own tools (its interpreter's flatbuffer verifier first, then its schema
reader), never by hand. A truncated or corrupt file is a ModelSourceError (exit 2) raised
before anything runs it: the verifier rejects it in C++ without crashing.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.errors import ModelSourceError
from orchestrator.model.native_output import native_output_held

# The magic at byte 4 of every TFLite flatbuffer (its file identifier).
FILE_IDENTIFIER = b"TFL3"


class FlexOpsError(ModelSourceError):
    """A valid model whose select TF ops (Flex) this interpreter cannot run."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int | None, ...]


@dataclass(frozen=True)
class LiteRTFacts:
    op_counts: dict[str, int]  # builtin op name (CONV_2D, ...) -> count, every subgraph
    op_versions: dict[str, tuple[int, int]]  # builtin op name -> (lowest, highest) version
    params: int  # elements of the constant tensors (weights, biases)
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


def interpreter(data: bytes, num_threads: int | None = None, allocate: bool = True,
                **kwargs: Any) -> Any:
    """LiteRT's Interpreter on `data` (its flatbuffer verified), tensors allocated unless
    `allocate` is False. A file it rejects is a ModelSourceError naming the reason."""
    from ai_edge_litert.interpreter import Interpreter

    if len(data) < 8 or data[4:8] != FILE_IDENTIFIER:
        raise ModelSourceError(f"not a LiteRT flatbuffer: {len(data)} bytes without the "
                               f"{FILE_IDENTIFIER.decode()} identifier (truncated or another "
                               "format)")
    caught: list[str] = []  # "INFO: Created TensorFlow Lite XNNPACK delegate", once
    try:
        with native_output_held(caught):
            runner = Interpreter(model_content=bytes(data), num_threads=num_threads,
                                 **kwargs)
            if allocate:
                runner.allocate_tensors()
    except (ValueError, RuntimeError) as exc:
        if "Select TensorFlow op" in str(exc):
            raise FlexOpsError(
                "this .tflite uses select TF ops (Flex, from convert_tflite's "
                "select_tf_ops): the ai-edge-litert interpreter has no Flex delegate, so it "
                "cannot run here; an app links LiteRT's Flex delegate to run it") from exc
        raise ModelSourceError(f"LiteRT cannot load this .tflite file (corrupt or "
                               f"truncated?): {_first_line(exc)}") from exc
    return runner


def describe(data: bytes) -> LiteRTFacts:
    """The facts of a valid flatbuffer (verified by the interpreter first)."""
    from ai_edge_litert.tools import flatbuffer_utils

    try:
        runner = interpreter(data)
    except FlexOpsError:  # valid, but its Flex ops cannot be prepared by this interpreter
        runner = interpreter(data, allocate=False)
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    ops: Counter[str] = Counter()
    versions: dict[str, tuple[int, int]] = {}
    params = 0
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) or "CUSTOM"
            ops[name] += 1
            version = int(model.operatorCodes[op.opcodeIndex].version or 1)
            low, high = versions.get(name, (version, version))
            versions[name] = (min(low, version), max(high, version))
        for tensor in subgraph.tensors:
            buffer = model.buffers[tensor.buffer] if tensor.buffer < len(model.buffers) else None
            if buffer is not None and (_has_data(buffer)):
                params += math.prod(int(d) for d in (tensor.shape if tensor.shape is not None
                                                     else ()))
    return LiteRTFacts(op_counts=dict(sorted(ops.items())), op_versions=versions,
                       params=params,
                       inputs=tuple(_info(d) for d in runner.get_input_details()),
                       outputs=tuple(_info(d) for d in runner.get_output_details()))


def _has_data(buffer: Any) -> bool:
    data = getattr(buffer, "data", None)
    return (data is not None and len(data) > 0) or bool(getattr(buffer, "size", 0))


def _info(detail: dict[str, Any]) -> TensorInfo:
    signature = detail.get("shape_signature")
    dims = signature if signature is not None and len(signature) else detail["shape"]
    return TensorInfo(name=detail["name"], dtype=np.dtype(detail["dtype"]).name,
                      shape=tuple(None if int(d) < 0 else int(d) for d in dims))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# TF's v1 profiler's per-element costs (tensorflow/python/profiler/internal/
# flops_registry.py), by the LiteRT builtin that does the op's work: a .tflite's count then
# equals the count of the graph it was converted from (convert_tflite records that one).
_PER_OUTPUT_ELEMENT = {"ADD": 1, "SUB": 1, "MUL": 1, "DIV": 1, "MAXIMUM": 1, "MINIMUM": 1,
                       "POW": 1, "SQUARED_DIFFERENCE": 2, "GREATER": 1, "GREATER_EQUAL": 1,
                       "LESS": 1, "LESS_EQUAL": 1, "EQUAL": 1, "NOT_EQUAL": 1}
_PER_INPUT_ELEMENT = {"SOFTMAX": 5, "RSQRT": 2, "SQUARE": 1, "LOG": 1, "NEG": 1}
# reductions: input elements x 1, plus output elements x (finalize - 1)
_REDUCTIONS = {"MEAN": 1, "SUM": 0, "ARG_MAX": 0, "ARG_MIN": 0}
# TensorType values of the 8-bit integer types (LiteRT's schema)
_INT8_TYPES = {3, 9}  # UINT8, INT8


Shapes = dict[int, tuple[int, ...]]  # tensor index -> its shape in one inference


def _elements(shapes: Shapes, index: int) -> int:
    return math.prod(max(int(d), 1) for d in shapes.get(index, ()))


def _op_flops(name: str, op: Any, shapes: Shapes) -> int:
    """One operator's FLOPs, as the profiler counts the TF ops it replaces (2 per
    multiply-add; a fused bias is the graph's BiasAdd, one per output element)."""
    inputs = [int(i) for i in op.inputs]
    out = _elements(shapes, int(op.outputs[0])) if len(op.outputs) else 0
    bias = out if len(inputs) > 2 and inputs[2] >= 0 else 0
    if name in ("CONV_2D", "DEPTHWISE_CONV_2D") and len(inputs) > 1:
        filt = [max(int(d), 1) for d in shapes[inputs[1]]]  # [out,h,w,in] / [1,h,w,out]
        per_output = filt[1] * filt[2] * (filt[3] if name == "CONV_2D" else 1)
        return 2 * out * per_output + bias
    if name == "FULLY_CONNECTED" and len(inputs) > 1:
        return 2 * out * max(int(shapes[inputs[1]][-1]), 1) + bias  # weights [units, in]
    if name == "BATCH_MATMUL" and inputs:
        lhs = [max(int(d), 1) for d in shapes[inputs[0]]]
        depth = lhs[-2] if getattr(op.builtinOptions, "adjX", False) else lhs[-1]
        return 2 * out * depth
    if name in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        options = op.builtinOptions
        return out * int(options.filterHeight) * int(options.filterWidth)
    if name in _PER_OUTPUT_ELEMENT:
        return out * _PER_OUTPUT_ELEMENT[name]
    if name in _PER_INPUT_ELEMENT and inputs:
        return _elements(shapes, inputs[0]) * _PER_INPUT_ELEMENT[name]
    if name in _REDUCTIONS and inputs:
        return _elements(shapes, inputs[0]) + out * (_REDUCTIONS[name] - 1)
    return 0


def _one_sample_shapes(data: bytes, tensors: list[Any]) -> Shapes:
    """Every tensor's shape in one inference of batch 1 (unknown dimensions as 1), as
    LiteRT's interpreter propagates them; the flatbuffer's own shapes when it cannot."""
    shapes = {i: tuple(int(d) for d in (t.shape if t.shape is not None else ()))
              for i, t in enumerate(tensors)}
    try:
        from ai_edge_litert.interpreter import OpResolverType

        # without XNNPACK: a delegate's own tensors keep their first shapes
        runner = interpreter(data, allocate=False, experimental_op_resolver_type=(
            OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
        for detail in runner.get_input_details():
            signature = detail.get("shape_signature")
            dims = [int(d) if int(d) > 0 else 1 for d in (
                signature if signature is not None and len(signature) else detail["shape"])]
            if dims:
                dims[0] = 1  # per sample, as the graph's count fixes the batch to 1
            runner.resize_tensor_input(detail["index"], dims, strict=False)
        with native_output_held([]):  # LiteRT's "Created ... XNNPACK delegate" line
            runner.allocate_tensors()
        shapes.update({int(d["index"]): tuple(int(x) for x in d["shape"])
                       for d in runner.get_tensor_details()})
    except (ModelSourceError, ValueError, RuntimeError):
        pass  # a model that takes no batch of 1: its declared shapes
    return shapes


def count_flops(data: bytes) -> tuple[int, str]:
    """FLOPs of one inference of a .tflite (its main subgraph, batch 1, unknown dimensions
    as 1), counted from its operators as TF's v1 profiler counts the graph's, and the
    precision its arithmetic runs in ("int8" when a conv or matmul takes 8-bit inputs,
    else "float32"), as the device estimates take it. Ops the profiler does not count
    (reshapes, activations, (de)quantize) count 0."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    if not model.subgraphs:
        return 0, "float32"
    subgraph = model.subgraphs[0]
    tensors = list(subgraph.tensors or [])
    shapes = _one_sample_shapes(data, tensors)
    total, precision = 0, "float32"
    for op in subgraph.operators or []:
        name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) or "CUSTOM"
        total += _op_flops(name, op, shapes)
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL") \
                and len(op.inputs) and tensors[op.inputs[0]].type in _INT8_TYPES:
            precision = "int8"
    return total, precision
