"""What a `.tflite` flatbuffer holds: its builtin ops, parameter count, inputs and outputs.

Read with LiteRT's own tools (its interpreter's flatbuffer verifier first, then its schema
reader), never by hand. A truncated or corrupt file is a ModelSourceError (exit 2) raised
before anything runs it: the verifier rejects it in C++ without crashing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.errors import ModelSourceError
from orchestrator.model.native_output import native_output_held
from orchestrator.model.operators import Operator, conv_kind, precision_from_types

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



def read_model(flatbuffer: bytes) -> Any:
    """The flatbuffer as the schema's objects (`flatbuffer_utils`), every buffer's bytes in
    its `data`. A file may keep large buffers after the flatbuffer (`offset` from the file's
    start, `size`: ai-edge-quantizer writes them so); written back with
    `convert_object_to_bytearray` they would be lost, and LiteRT refuses the file
    ("Constant buffer N specified an out of range offset")."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    for buffer in model.buffers or []:
        if (buffer.offset or 0) > 1 and buffer.size:
            buffer.data = np.frombuffer(flatbuffer, np.uint8, int(buffer.size),
                                        int(buffer.offset)).copy()
            buffer.offset, buffer.size = 0, 0
    return model


def tensor_name(tensor: Any) -> str:
    """A flatbuffer tensor's name as text (the schema's objects hold bytes, or None)."""
    raw = tensor.name
    return raw.decode() if isinstance(raw, bytes) else str(raw or "")

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


SIGNATURE_KEY = "serving_default"


def signature_name(ref: str) -> str:
    """The name a graph tensor `ref` goes by in a `.tflite`'s signature: its node name for
    output 0 (`Identity`, `Identity:0`), `node:k` for another output (`split:2`), so that
    every output of a multi-output op keeps a name of its own."""
    ref = ref.lstrip("^")
    return ref[:-2] if ref.endswith(":0") else ref


def signature_map(runner: Any, side: str) -> dict[str, int]:
    """The model's signature (`serving_default`, else the only one), `side` ("inputs" or
    "outputs"): name -> tensor index; empty without one (a file whose names were stripped)."""
    try:
        signatures = runner._get_full_signature_list()  # noqa: SLF001  (name -> index)
    except (AttributeError, RuntimeError, ValueError):
        return {}
    key = SIGNATURE_KEY if SIGNATURE_KEY in signatures else (
        next(iter(signatures)) if len(signatures) == 1 else None)
    if key is None:
        return {}
    return {str(name): int(index) for name, index in (signatures[key].get(side) or {}).items()}


def in_order(details: list[dict[str, Any]], names: Sequence[str],
             signature: Mapping[str, int]) -> list[dict[str, Any]]:
    """The interpreter's input or output `details` in the order of the graph tensors
    `names`: through the model's signature by name, else by each tensor's own name, else
    (names stripped, or not the converter's) in the interpreter's order. The converter
    does not keep a graph's output order, so position is the last resort."""
    if len(details) != len(names):
        return list(details)
    wanted = [signature_name(n) for n in names]
    by_index = {int(d["index"]): d for d in details}
    if all(n in signature for n in wanted) and len({signature[n] for n in wanted}) == len(
            wanted) and all(signature[n] in by_index for n in wanted):
        return [by_index[signature[n]] for n in wanted]
    by_name = {signature_name(str(d["name"])): d for d in details}
    if len(by_name) == len(details) and all(n in by_name for n in wanted):
        return [by_name[n] for n in wanted]
    return list(details)


def with_signature(flatbuffer: bytes, inputs: Sequence[str], outputs: Sequence[str],
                   output_shapes: Sequence[Sequence[int | None] | None] | None = None,
                   replace: bool = False) -> bytes:
    """`flatbuffer` with its main subgraph's inputs and outputs in the order of the graph
    tensors `inputs` and `outputs`, and a `serving_default` signature naming them as the
    graph does (`signature_name`), so that a runtime and an app find each by name, not
    position. A model with a signature keeps it unless `replace`.

    Each graph tensor is found by the converted tensor's own name; where names do not
    tell, by its shape (`output_shapes`, the graph's, None for an unknown dimension) when
    exactly one converted output has it, else by position. A found output whose shape
    disagrees with the graph's is a ValueError (the converter changed the model)."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    if (model.signatureDefs and not replace) or not model.subgraphs:
        return flatbuffer
    subgraph = model.subgraphs[0]

    def name(index: int) -> str:
        return tensor_name(subgraph.tensors[index])

    def shape(index: int) -> list[int | None]:
        tensor = subgraph.tensors[index]
        dims = tensor.shapeSignature if tensor.shapeSignature is not None and len(
            tensor.shapeSignature) else tensor.shape
        return [None if int(d) < 0 else int(d) for d in (dims if dims is not None else [])]

    def ordered(indices: Any, names: Sequence[str],
                shapes: Sequence[Sequence[int | None] | None] | None) -> list[int] | None:
        indices = [int(i) for i in (indices if indices is not None else [])]
        if len(indices) != len(names):
            return None
        by_name = {signature_name(name(i)): i for i in indices}
        found: list[int | None] = [by_name.get(signature_name(n)) for n in names]
        if shapes is not None and len(shapes) == len(names):
            for k, wanted in enumerate(shapes):
                if found[k] is not None or wanted is None:
                    continue
                fits = [i for i in indices if i not in found and _fits(shape(i), wanted)]
                if len(fits) == 1:
                    found[k] = fits[0]
        if any(f is None for f in found):  # names and shapes do not tell: by position
            found = [f if f is not None else i for f, i in zip(found, indices, strict=True)]
            if len(set(found)) != len(found):
                found = list(indices)
        if shapes is not None and len(shapes) == len(names):
            for n, i, wanted in zip(names, found, shapes, strict=True):
                if wanted is not None and not _fits(shape(int(i)), wanted):
                    raise ValueError(
                        f"the converted model's output {name(int(i))!r} has shape "
                        f"{shape(int(i))}, the graph's {n!r} {list(wanted)}: no output of "
                        "the .tflite matches it by name or shape")
        return [int(f) for f in found]  # type: ignore[arg-type]

    ins = ordered(subgraph.inputs, list(inputs), None)
    outs = ordered(subgraph.outputs, list(outputs), output_shapes)
    if ins is None or outs is None:  # not the graph's count: name what the file has
        ins = [int(i) for i in subgraph.inputs]
        outs = [int(i) for i in subgraph.outputs]
        inputs, outputs = [name(i) for i in ins], [name(i) for i in outs]
    subgraph.inputs, subgraph.outputs = list(ins), list(outs)
    model.signatureDefs = [schema.SignatureDefT(
        inputs=[schema.TensorMapT(name=signature_name(n), tensorIndex=i)
                for n, i in zip(inputs, ins, strict=True)],
        outputs=[schema.TensorMapT(name=signature_name(n), tensorIndex=i)
                 for n, i in zip(outputs, outs, strict=True)],
        signatureKey=SIGNATURE_KEY, subgraphIndex=0)]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _fits(shape: Sequence[int | None], wanted: Sequence[int | None]) -> bool:
    """Whether a tensor's shape can be the graph's `wanted` (unknown dimensions fit any)."""
    return len(shape) == len(wanted) and all(
        a is None or b is None or a == b for a, b in zip(shape, wanted, strict=True))


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


Shapes = dict[int, tuple[int, ...]]  # tensor index -> its shape in one inference


def _elements(shapes: Shapes, index: int) -> int:
    return math.prod(max(int(d), 1) for d in shapes.get(index, ()))


def _op_flops(name: str, op: Any, shapes: Shapes) -> int:
    """One operator's FLOPs, as the profiler counts the TF ops it replaces (2 per
    multiply-add; a fused bias is the graph's BiasAdd, one per output element)."""
    inputs = [int(i) for i in op.inputs]
    out = _elements(shapes, int(op.outputs[0])) if len(op.outputs) else 0
    bias = out if len(inputs) > 2 and inputs[2] >= 0 else 0
    if name in ("CONV_2D", "DEPTHWISE_CONV_2D") and len(inputs) > 1 \
            and len(shapes.get(inputs[1], ())) == 4:
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


# LiteRT's TensorType values -> (numpy dtype name, bytes per element)
_TENSOR_TYPES = {0: ("float32", 4), 1: ("float16", 2), 2: ("int32", 4), 3: ("uint8", 1),
                 4: ("int64", 8), 6: ("bool", 1), 7: ("int16", 2), 9: ("int8", 1),
                 10: ("float64", 8)}
# builtin op -> the kind of kernel it runs on (orchestrator.model.operators.KINDS); CONV_2D
# is split into 1x1 and KxK by its filter
_KIND_OF = {
    # a transposed or 3-D convolution: no FLOPs counted for it (the profiler's graph has
    # none either), so priced as an op of no modelled kind, by its elements
    "DEPTHWISE_CONV_2D": "depthwise", "TRANSPOSE_CONV": "other", "CONV_3D": "other",
    "FULLY_CONNECTED": "fully_connected", "BATCH_MATMUL": "fully_connected",
    "AVERAGE_POOL_2D": "pool", "MAX_POOL_2D": "pool", "L2_POOL_2D": "pool", "MEAN": "pool",
    "SUM": "pool", "REDUCE_MAX": "pool", "REDUCE_MIN": "pool", "ARG_MAX": "pool",
    "ARG_MIN": "pool", "SOFTMAX": "softmax", "LOG_SOFTMAX": "softmax",
    "RESIZE_BILINEAR": "resize", "RESIZE_NEAREST_NEIGHBOR": "resize",
    "CONCATENATION": "data", "PAD": "data", "PADV2": "data", "MIRROR_PAD": "data",
    "TRANSPOSE": "data", "SLICE": "data", "STRIDED_SLICE": "data", "GATHER": "data",
    "SPLIT": "data", "SPLIT_V": "data", "PACK": "data", "UNPACK": "data", "TILE": "data",
    "SPACE_TO_DEPTH": "data", "DEPTH_TO_SPACE": "data", "BROADCAST_TO": "data",
    "RESHAPE": "reshape", "SQUEEZE": "reshape", "EXPAND_DIMS": "reshape",
}
_ELEMENTWISE = {"ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "SQUARED_DIFFERENCE",
                "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LEAKY_RELU", "PRELU",
                "LOGISTIC", "TANH", "HARD_SWISH", "GELU", "ELU", "EXP", "LOG", "SQRT",
                "RSQRT", "SQUARE", "NEG", "ABS", "QUANTIZE", "DEQUANTIZE", "CAST", "FLOOR",
                "CEIL", "ROUND", "SIN", "COS", "GREATER", "GREATER_EQUAL", "LESS",
                "LESS_EQUAL", "EQUAL", "NOT_EQUAL", "SELECT", "SELECT_V2", "ADD_N",
                "FLOOR_DIV", "FLOOR_MOD", "LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT"}


def operators(data: bytes) -> list[Operator]:
    """The operators of one inference of a .tflite (main subgraph, batch 1, unknown
    dimensions as 1), each with its kind, precision, FLOPs (as TF's v1 profiler counts the
    graph's ops), output elements and the bytes it reads and writes."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    if not model.subgraphs:
        return []
    subgraph = model.subgraphs[0]
    tensors = list(subgraph.tensors or [])
    shapes = _one_sample_shapes(data, tensors)

    def dtype(index: int) -> tuple[str, int]:
        return _TENSOR_TYPES.get(int(tensors[index].type), ("float32", 4))

    found = []
    for op in subgraph.operators or []:
        name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) or "CUSTOM"
        inputs = [int(i) for i in op.inputs if int(i) >= 0]
        outputs = [int(i) for i in op.outputs if int(i) >= 0]
        moved = sum(_elements(shapes, i) * dtype(i)[1] for i in inputs + outputs)
        out = _elements(shapes, outputs[0]) if outputs else 0
        kind = _KIND_OF.get(name, "elementwise" if name in _ELEMENTWISE else "other")
        detail = ""
        filt = ([max(int(d), 1) for d in shapes.get(inputs[1], ())] if len(inputs) > 1
                else [])
        if name == "CONV_2D" and len(filt) == 4:  # [out, h, w, in]
            kind = conv_kind(filt[1], filt[2])
            detail = _conv_detail(op, filt[1], filt[2], filt[3], filt[0], shapes, outputs)
        elif name == "DEPTHWISE_CONV_2D" and len(filt) == 4:  # [1, h, w, out]
            detail = _conv_detail(op, filt[1], filt[2], filt[3], filt[3], shapes, outputs)
        elif kind == "fully_connected" and len(inputs) > 1:
            detail = f"{_elements(shapes, inputs[1])} weights"
        elif outputs:
            detail = "x".join(str(d) for d in shapes.get(outputs[0], ()))
        weights = dtype(inputs[1])[0] if len(inputs) > 1 and kind in (
            "conv", "conv_1x1", "depthwise", "fully_connected") else None
        activation = dtype(inputs[0])[0] if inputs else "float32"
        if name in ("QUANTIZE", "DEQUANTIZE"):  # priced by the side that is not float
            activation = next((dtype(i)[0] for i in inputs + outputs
                               if dtype(i)[0] not in ("float32", "float16")), activation)
        found.append(Operator(
            name=tensor_name(tensors[outputs[0]]) if outputs else name, op=name, kind=kind,
            precision=precision_from_types(activation, weights),
            flops=_op_flops(name, op, shapes), elements=out, bytes=moved, detail=detail))
    return found


def _conv_detail(op: Any, kh: int, kw: int, c_in: int, c_out: int, shapes: Shapes,
                 outputs: list[int]) -> str:
    stride = int(getattr(op.builtinOptions, "strideH", 1) or 1)
    out = shapes.get(outputs[0], ()) if outputs else ()
    spatial = f", {out[1]}x{out[2]} out" if len(out) == 4 else ""
    return f"{kh}x{kw}/{stride} {c_in}->{c_out} ch{spatial}"


def count_flops(data: bytes) -> tuple[int, str]:
    """FLOPs of one inference of a .tflite (its main subgraph, batch 1, unknown dimensions
    as 1), counted from its operators as TF's v1 profiler counts the graph's, and the
    precision its arithmetic runs in ("int8" when a conv or matmul takes 8-bit inputs,
    else "float32"), as the device estimates take it. Ops the profiler does not count
    (reshapes, activations, (de)quantize) count 0."""
    found = operators(data)
    heavy = {"conv", "conv_1x1", "depthwise", "fully_connected"}
    precision = "int8" if any(o.kind in heavy and o.precision == "int8"
                              for o in found) else "float32"
    return sum(o.flops for o in found), precision
