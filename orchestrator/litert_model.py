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
from orchestrator.native_output import native_output_held

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
