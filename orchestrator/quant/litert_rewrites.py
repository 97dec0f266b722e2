"""Ops the LiteRT Quantizer has no rule for, rewritten into ones it has, in the float model.

`ai-edge-quantizer` 0.10 leaves an op it does not know in float, with a DEQUANTIZE before
and a QUANTIZE after it: one such op makes a full-integer file compute partly in float,
and a DSP or an NPU then hands it back to the CPU. Two kinds are common in the models
people ship, and both have exact equivalents the quantizer knows:

- EXPAND_DIMS and SQUEEZE (a Conv1D is EXPAND_DIMS, CONV_2D, SQUEEZE) only reshape: a
  RESHAPE to the same static shape;
- PRELU (mtcnn's networks, many face and speech models): max(x, 0) + alpha * min(x, 0),
  that is r = RELU(x), ADD(r, MUL(SUB(x, r), alpha)): in float the same numbers.

The rewrite works on the flatbuffer's object model; new tensors get names derived from
the op's output, so that layer errors and the guard can still name them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FLOAT32, INT32 = 0, 2  # schema TensorType


def rewrite_for_quantizer(float_model: bytes) -> tuple[bytes, dict[str, int]]:
    """The model with EXPAND_DIMS / SQUEEZE as RESHAPE and PRELU decomposed, and how many
    of each were rewritten (the model unchanged, and {}, when there were none)."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    from orchestrator.model.litert_model import read_model

    model = read_model(float_model)
    ops = schema.BuiltinOperator
    rewritten: dict[str, int] = {}
    for subgraph in model.subgraphs:
        operators = []
        for op in subgraph.operators:
            code = model.operatorCodes[op.opcodeIndex].builtinCode
            if code in (ops.EXPAND_DIMS, ops.SQUEEZE) and _static(subgraph, op.outputs[0]):
                operators.append(_as_reshape(model, subgraph, op))
                name = "EXPAND_DIMS" if code == ops.EXPAND_DIMS else "SQUEEZE"
            elif code == ops.PRELU:
                operators.extend(_decomposed_prelu(model, subgraph, op))
                name = "PRELU"
            else:
                operators.append(op)
                continue
            rewritten[name] = rewritten.get(name, 0) + 1
        subgraph.operators = operators
    if not rewritten:
        return float_model, {}
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model)), rewritten


def _static(subgraph: Any, index: int) -> bool:
    """A shape a RESHAPE can hold: known but for, at most, one dimension (the batch)."""
    tensor = subgraph.tensors[index]
    dims = list(tensor.shapeSignature if tensor.shapeSignature is not None
                else tensor.shape if tensor.shape is not None else [])
    return bool(dims) and sum(d < 0 for d in dims) <= 1


def _opcode(model: Any, builtin: int) -> int:
    from ai_edge_litert import schema_py_generated as schema

    for index, code in enumerate(model.operatorCodes):
        if code.builtinCode == builtin:
            return index
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = builtin
    code.version = 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _tensor(model: Any, subgraph: Any, like: Any, name: str, kind: int = FLOAT32,
            data: np.ndarray | None = None) -> int:
    """A new tensor (with its own buffer) shaped like `like`, or holding `data`."""
    from ai_edge_litert import schema_py_generated as schema

    buffer = schema.BufferT()
    tensor = schema.TensorT()
    if data is not None:
        buffer.data = np.frombuffer(data.tobytes(), dtype=np.uint8)
        tensor.shape = np.asarray(data.shape, dtype=np.int32)
    else:
        tensor.shape = None if like.shape is None else np.array(like.shape)
        tensor.shapeSignature = (None if like.shapeSignature is None
                                 else np.array(like.shapeSignature))
    model.buffers.append(buffer)
    tensor.buffer, tensor.type, tensor.name = len(model.buffers) - 1, kind, name.encode()
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def _name(subgraph: Any, index: int) -> str:
    from orchestrator.model.litert_model import tensor_name

    return tensor_name(subgraph.tensors[index])


def _op(model: Any, builtin: int, inputs: list[int], outputs: list[int],
        options: tuple[int, Any] | None = None) -> Any:
    from ai_edge_litert import schema_py_generated as schema

    op = schema.OperatorT()
    op.opcodeIndex = _opcode(model, builtin)
    op.inputs, op.outputs = np.array(inputs, dtype=np.int32), np.array(outputs, dtype=np.int32)
    if options is not None:
        op.builtinOptionsType, op.builtinOptions = options
    return op


def _as_reshape(model: Any, subgraph: Any, op: Any) -> Any:
    from ai_edge_litert import schema_py_generated as schema

    out = subgraph.tensors[op.outputs[0]]
    dims = out.shapeSignature if out.shapeSignature is not None else out.shape
    shape = np.asarray([int(d) for d in dims], dtype=np.int32)
    shape_index = _tensor(model, subgraph, out, f"{_name(subgraph, op.outputs[0])}/shape",
                          INT32, shape)
    options = schema.ReshapeOptionsT()
    options.newShape = shape
    return _op(model, schema.BuiltinOperator.RESHAPE, [int(op.inputs[0]), shape_index],
               [int(op.outputs[0])], (schema.BuiltinOptions.ReshapeOptions, options))


def _decomposed_prelu(model: Any, subgraph: Any, op: Any) -> list[Any]:
    """RELU, SUB, MUL, ADD: relu(x) + alpha * (x - relu(x))."""
    from ai_edge_litert import schema_py_generated as schema

    ops, kinds = schema.BuiltinOperator, schema.BuiltinOptions
    x, alpha, out = int(op.inputs[0]), int(op.inputs[1]), int(op.outputs[0])
    like, base = subgraph.tensors[x], _name(subgraph, out)
    positive = _tensor(model, subgraph, like, f"{base}/positive")
    negative = _tensor(model, subgraph, like, f"{base}/negative")
    scaled = _tensor(model, subgraph, like, f"{base}/scaled_negative")
    return [_op(model, ops.RELU, [x], [positive]),
            _op(model, ops.SUB, [x, positive], [negative], (kinds.SubOptions,
                                                             schema.SubOptionsT())),
            _op(model, ops.MUL, [negative, alpha], [scaled], (kinds.MulOptions,
                                                              schema.MulOptionsT())),
            _op(model, ops.ADD, [positive, scaled], [out], (kinds.AddOptions,
                                                            schema.AddOptionsT()))]
