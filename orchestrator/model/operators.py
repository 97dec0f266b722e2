"""One run of a model as a list of operators, each with its kind, precision and work: what
the device estimates cost op by op (orchestrator.measure.cost_model).

A depthwise 3x3 and a dense 1x1 convolution of the same FLOPs run at very different
fractions of a core's peak, and a hard-swish costs far more than its FLOPs: so an operator
is classified by the kind of kernel that runs it, not counted as FLOPs alone. Both model
forms give this list: a `.tflite` (orchestrator.model.litert_model.operators) and a
GraphDef (orchestrator.measure.graph_operators).

Pure: no TensorFlow import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Operator", "KINDS", "PRECISIONS", "conv_kind", "precision_from_types"]

# The kinds of kernel an operator runs on, each with the work it is costed by.
KINDS: dict[str, str] = {
    "conv_1x1": "a 1x1 convolution (a GEMM over pixels)",
    "conv": "a KxK convolution (im2col + GEMM)",
    "depthwise": "a depthwise convolution (per-channel: little reuse per byte)",
    "fully_connected": "a fully connected layer or matmul (weights read once per run)",
    "pool": "a pooling or reduction",
    "elementwise": "an elementwise op (add, mul, activation, (de)quantize)",
    "softmax": "a softmax (exp and a reduction per row)",
    "resize": "a resize (interpolation)",
    "data": "a data movement op (concat, pad, transpose, slice)",
    "reshape": "a reshape (no data moved)",
    "other": "an op of no modelled kind",
}
# The arithmetic an operator runs in: int16 is LiteRT's 16x8 mode (int16 activations on
# reference kernels); dynamic is float activations against int8 weights (hybrid kernels).
PRECISIONS = ("float32", "int8", "int16", "dynamic")


@dataclass(frozen=True)
class Operator:
    """One operator of one inference (batch 1)."""

    name: str  # its output tensor (.tflite) or node (GraphDef)
    op: str  # the runtime's op: CONV_2D, Conv2D, ...
    kind: str  # a key of KINDS
    precision: str  # one of PRECISIONS
    flops: int  # 2 per multiply-add, as TF's profiler counts
    elements: int  # output elements (the work of elementwise kinds)
    bytes: int  # bytes read (inputs and weights) and written (outputs)
    detail: str = ""  # its shape, as a reader checks it: "3x3/2 32->64 ch, 112x112 out"

    def to_row(self) -> list[Any]:
        """A compact row (report.json keeps one per operator)."""
        return [self.name, self.op, self.kind, self.precision, self.flops, self.elements,
                self.bytes, self.detail]

    @classmethod
    def from_row(cls, row: Any) -> Operator:
        """An operator from its compact row (`to_row`) or its JSON mapping."""
        if isinstance(row, dict):
            return cls(**row)
        return cls(*row)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def conv_kind(kernel_h: int, kernel_w: int) -> str:
    """A dense convolution's kind by its kernel: a 1x1 is a GEMM over pixels, a KxK needs
    its patches gathered first."""
    return "conv_1x1" if kernel_h == 1 and kernel_w == 1 else "conv"


def precision_from_types(activation: str, weights: str | None = None) -> str:
    """The precision of an op from its input's and weights' dtypes (numpy names)."""
    if activation in ("int8", "uint8"):
        return "int8"
    if activation == "int16":
        return "int16"
    if weights in ("int8", "uint8"):
        return "dynamic"
    return "float32"
