"""Convert a frozen graph to a LiteRT `.tflite` flatbuffer (the successor path).

Modes, as TFLite's converter names them:
- `fp32`: the same float model as a flatbuffer;
- `dynamic_range`: weights stored as int8, activations float (quantized on the fly inside
  the kernels that support it); no data needed;
- `float16`: weights stored as float16, computed in float32;
- `int8`: full integer: weights int8 per channel, activations int8 with ranges calibrated on
  the recipe's representative data. `io: int8` makes the model's inputs and outputs int8
  too (an app then quantizes its own inputs); `io: float` (default) keeps float edges.

Ops LiteRT has no builtin kernel for fail the conversion with their names, unless
`select_tf_ops` lets them run as TF ops (the app then links the Flex delegate, several MB).
`float_nodes` / `float_ops` keep named nodes or op types in float in int8 mode (the
quantization debugger's denylists): the closed-loop guard sets them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, PositiveInt

from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from orchestrator.model import ModelArtifact


class Params(StageParams):
    mode: Literal["fp32", "dynamic_range", "float16", "int8"] = Field(
        "int8", description="fp32: float flatbuffer; dynamic_range: int8 weights, float "
        "activations; float16: float16 weights; int8: full integer, calibrated on the "
        "recipe's representative data, per-channel weights.")
    io: Literal["float", "int8"] = Field(
        "float", description="int8 mode only: the model's input and output type. int8 "
        "makes the app quantize its inputs and dequantize its outputs itself.")
    calibration_samples: PositiveInt = Field(
        200, description="int8 mode: representative samples used to calibrate ranges.")
    select_tf_ops: bool = Field(
        False, description="Let ops with no LiteRT builtin run as TF ops (Flex delegate: "
        "the app must link it, several MB). Off: such ops fail the conversion, named.")
    float_nodes: list[str] = Field(
        [], description="int8 mode: names of nodes (tensor names in the converted model) "
        "kept in float (the quantization debugger's denylisted_nodes).")
    float_ops: list[str] = Field(
        [], description="int8 mode: builtin op types kept in float, e.g. [MEAN] "
        "(the quantization debugger's denylisted_ops).")


def run(given: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.litert_convert import convert

    return convert(given, params, ctx)


STAGE = register(Stage(name="convert_tflite", run=run, params=Params, doc=__doc__ or "",
                       optional_data=("representative",), produces="tflite"))
