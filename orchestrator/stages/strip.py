"""Keep only what the outputs need, and drop training-only nodes.

TF's `strip_unused_nodes` then `remove_nodes(op=Identity, op=CheckNumerics)`:

- everything the outputs do not depend on goes (savers, gradients, summaries, DecodeJpeg
  before a chosen input); a mobile build lacks those ops and would fail to load the graph;
- each input becomes a Placeholder of `input_type`, with `input_shape` when given (-1 for an
  unknown dimension, e.g. a free batch size); the model's input specs follow;
- nodes of the `remove_nodes` op types are bypassed, except those named as the model's
  inputs or outputs, which keep the outputs resolvable (a frozen TF2 graph's outputs are
  Identity nodes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from orchestrator.errors import StageError
from orchestrator.limits import bounded
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.graph_rewrite import apply_transforms
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

# Accepted dtype names (numpy style) and TF's older spellings of some of them.
DTYPES = frozenset({
    "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64", "bool", "string", "complex64", "complex128", "qint8",
    "quint8", "qint16", "quint16", "qint32"})
ALIASES = {"float": "float32", "double": "float64", "half": "float16"}


class Params(StageParams):
    input_type: str | None = Field(
        None, description="dtype of the inputs, e.g. float32 or uint8 (TF names like 'float' "
        "work too); default: each input's current dtype. Only an input that is not yet a "
        "Placeholder can change type.")
    input_shape: list[bounded("dimension")] | None = Field(
        None, description="Shape of every input Placeholder, -1 for an unknown dimension, "
        "e.g. [1, 224, 224, 3]; default: each input's shape in the model's signature (the "
        "recipe's model.inputs, else the graph's).")
    remove_nodes: list[str] = Field(
        ["Identity", "CheckNumerics"],
        description="Op types to bypass (remove_nodes(op=...)); nodes named as the model's "
        "inputs or outputs stay. An empty list skips remove_nodes.")

    @field_validator("input_type")
    @classmethod
    def _known_dtype(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = ALIASES.get(value, value)
        if value not in DTYPES:
            raise ValueError(f"unknown dtype {value!r}; expected one of "
                             f"{', '.join(sorted(DTYPES))}")
        return value

    @field_validator("input_shape")
    @classmethod
    def _valid_dims(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(d < -1 for d in value):
            raise ValueError(f"dimensions must be -1 (unknown) or >= 0, got {value}")
        return value


def _tf_type_name(dtype: str) -> str:
    """'float32' -> 'float', the spelling TF's transforms parse."""
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    return types_pb2.DataType.Name(tf.as_dtype(dtype).as_datatype_enum)[3:].lower()


def _fits(old: tuple[int | None, ...] | None, new: tuple[int | None, ...] | None) -> bool:
    if old is None or new is None:
        return True
    return len(old) == len(new) and all(a is None or b is None or a == b
                                        for a, b in zip(old, new, strict=True))


def _set_placeholders(graph_def: GraphDef, specs: list[TensorSpec]) -> None:
    """Give each input Placeholder its spec's dtype and shape (unknown dims as -1)."""
    import tensorflow as tf

    by_name = {n.name: n for n in graph_def.node}
    for spec in specs:
        node = by_name[spec.name]
        node.attr["dtype"].type = tf.as_dtype(spec.dtype).as_datatype_enum
        shape = node.attr["shape"].shape
        shape.Clear()
        if spec.shape is None:
            shape.unknown_rank = True
        else:
            for dim in spec.shape:
                shape.dim.add().size = -1 if dim is None else dim


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.model.graph_info import input_spec

    by_name = {n.name: n for n in artifact.graph_def.node}
    new_shape = None if params.input_shape is None else tuple(
        None if d == -1 else d for d in params.input_shape)
    specs: list[TensorSpec] = []
    for spec in artifact.inputs:
        dtype = params.input_type or spec.dtype
        shape = new_shape if new_shape is not None else spec.shape
        node = by_name.get(spec.name)
        if node is not None and node.op == "Placeholder":
            current = input_spec(node)
            if dtype != current.dtype:
                raise StageError(f"input {spec.name!r} is a {current.dtype} Placeholder; it "
                                 f"cannot become {dtype} (its consumers expect "
                                 f"{current.dtype})")
            if not _fits(current.shape, shape):
                raise StageError(f"input shape {list(params.input_shape or [])} does not fit "
                                 f"{spec.name!r}, whose shape is {list(current.shape or [])}")
        specs.append(TensorSpec(name=spec.name, dtype=dtype, shape=shape))

    # TF wants a fully known shape for every named input and cannot express -1; the real
    # shape (unknown dims included) is set on the Placeholders afterwards.
    args = [f'name="{s.name}", type_for_name={_tf_type_name(s.dtype)}, shape_for_name="1"'
            for s in specs]
    transforms = f"strip_unused_nodes({', '.join(args)})"
    if params.remove_nodes:
        transforms += " remove_nodes(" + ", ".join(f"op={op}" for op in params.remove_nodes) + ")"
    graph_def = apply_transforms(artifact, transforms)
    _set_placeholders(graph_def, specs)
    return StageResult(
        artifact=artifact.replace(graph_def=graph_def, inputs=tuple(specs)),
        metrics={"nodes_before": len(artifact.graph_def.node), "nodes_after": len(graph_def.node),
                 "nodes_removed": len(artifact.graph_def.node) - len(graph_def.node)})


STAGE = register(Stage(name="strip", run=run, params=Params, doc=__doc__))
