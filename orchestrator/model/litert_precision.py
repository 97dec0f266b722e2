"""What a `.tflite` computes in: read from its operators' output types.

Only a file whose every compute op runs on integer tensors can run on the int8 kernels of
Arm CPUs, DSPs and NPUs; a dynamic-range file keeps int8 weights but computes in float, and
one float layer in an int8 file sends that layer (and the tensors around it) back to the
CPU. The verdicts, from the most to the least integer:

- `int8`: every compute op takes and gives int8 (full integer);
- `int8+int16`: integer, with int16 activations where they were needed (a16w8);
- `int8+float`: integer with some ops in float (named by `float_ops`);
- `dynamic`: float compute from int8 weights (dynamic range or weight-only);
- `float`: no quantized weight at all.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

ComputesIn = Literal["int8", "int8+int16", "int8+float", "dynamic", "float"]

# schema TensorType values
FLOAT32, INT16, INT8, UINT8, INT4 = 0, 7, 9, 3, 17
INTEGER_WEIGHTS = frozenset({INT8, UINT8, INT4})
# Ops that only convert at an edge or between precisions: not compute.
EDGE_OPS = frozenset({"QUANTIZE", "DEQUANTIZE"})
DESCRIPTIONS = {"int8": "full integer (int8)",
                "int8+int16": "integer: int8, with int16 activations where needed (a16w8)",
                "int8+float": "int8 with float layers (those run on the CPU, not an NPU)",
                "dynamic": "float compute from int8 weights (dynamic range)",
                "float": "float"}


def _model(flatbuffer: bytes) -> Any:
    from ai_edge_litert.tools import flatbuffer_utils

    return flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))


def _compute_ops(model: Any) -> list[tuple[str, int, Any, Any]]:
    """(op name, first output's type, op, subgraph) of every op that computes."""
    found = []
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            name = _op_name(model, op)
            if name in EDGE_OPS or op.outputs is None or not len(op.outputs):
                continue
            found.append((name, subgraph.tensors[op.outputs[0]].type, op, subgraph))
    return found


def float_ops(flatbuffer: bytes) -> dict[str, int]:
    """Op types of a quantized model that compute in float (their first output is float32),
    with their counts."""
    return dict(Counter(name for name, kind, _, _ in _compute_ops(_model(flatbuffer))
                        if kind == FLOAT32))


def computes_in(flatbuffer: bytes) -> ComputesIn:
    """The file's verdict (see the module's docstring)."""
    model = _model(flatbuffer)
    ops = _compute_ops(model)
    kinds = {kind for _, kind, _, _ in ops}
    integer = kinds & {INT8, UINT8, INT16}
    if FLOAT32 not in kinds:
        return "int8+int16" if INT16 in kinds else "int8"
    if integer:
        return "int8+float"

    def integer_constant(subgraph: Any, index: int) -> bool:
        if index < 0:  # an optional input left out
            return False
        tensor = subgraph.tensors[index]
        return tensor.type in INTEGER_WEIGHTS and model.buffers[tensor.buffer].data is not None

    # dynamic range: int8 weights into float ops; weight-only: int8 weights dequantized
    # before them (float16 weights are dequantized too, and stay "float")
    quantized_weights = any(
        integer_constant(subgraph, int(i)) for subgraph in model.subgraphs
        for op in subgraph.operators if op.inputs is not None for i in op.inputs
        if _op_name(model, op) != "QUANTIZE")
    return "dynamic" if quantized_weights else "float"


def _op_name(model: Any, op: Any) -> str:
    from ai_edge_litert.tools import flatbuffer_utils

    return flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) or "CUSTOM"
