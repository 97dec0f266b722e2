"""`--input-shape`: an input's unknown dimensions fixed in the model itself (a Placeholder's
`shape`, a `.tflite` input's shape signature, inside the package or the encryption for
`.mmap`/`.enc`), so that everything measuring the model sees the same shape. A shape the
model cannot take is exit 2, naming the input, its shape and the one given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ModelSourceError, UsageError
from orchestrator.model.files import OpenedModel, tflite_text

if TYPE_CHECKING:
    from orchestrator.model.artifact import ModelArtifact, TensorSpec


def shape_text(shape: Sequence[int | None] | None) -> str:
    if shape is None:
        return "[unknown rank]"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _inputs_text(inputs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{s.name} {shape_text(s.shape)}" for s in inputs) or "none"


def resolve_shapes(opened: OpenedModel, given: Mapping[str, tuple[int, ...]]
                   ) -> dict[str, tuple[int, ...]]:
    """Input name -> the shape to run it with, each checked against the model's own: the
    input must exist, the rank match, and every fixed dimension agree."""
    inputs = opened.artifact.inputs
    resolved: dict[str, tuple[int, ...]] = {}
    for name, dims in given.items():
        spec = _find_input(name, inputs, opened.aliases)
        flag = f"--input-shape {name}:{','.join(map(str, dims))}"
        if spec is None:
            raise ModelSourceError(f"{flag}: the model has no input {name!r}; its inputs: "
                                   f"{_inputs_text(inputs)}", file=str(opened.path))
        if spec.name in resolved:
            raise UsageError(f"{flag}: input {spec.name!r} is given twice")
        model = spec.shape
        if model is not None and len(model) != len(dims):
            raise ModelSourceError(
                f"{flag} does not fit input {spec.name!r}: the model's shape is "
                f"{shape_text(model)} (rank {len(model)}), the given {shape_text(dims)} has "
                f"rank {len(dims)}", file=str(opened.path))
        for axis, (have, want) in enumerate(zip(model or (), dims, strict=True)):
            if have is not None and have != want:
                raise ModelSourceError(
                    f"{flag} does not fit input {spec.name!r}: the model's shape is "
                    f"{shape_text(model)}, whose dimension {axis} is fixed to {have}; the "
                    f"given {shape_text(dims)} has {want}", file=str(opened.path))
        resolved[spec.name] = dims
    return resolved


def _find_input(name: str, inputs: Sequence[TensorSpec], aliases: Mapping[str, str]
                ) -> TensorSpec | None:
    from orchestrator.model.artifact import node_name

    for wanted in (name, aliases.get(name)):
        if wanted is None:
            continue
        for spec in inputs:
            if wanted == spec.name or node_name(wanted) == node_name(spec.name):
                return spec
    return None


def with_input_shapes(opened: OpenedModel, shapes: Mapping[str, tuple[int, ...]]
                      ) -> ModelArtifact:
    """The artifact with these inputs' declared shapes fixed; unchanged when every given
    shape is already the model's."""
    artifact = opened.artifact
    changed = {n: s for n, s in shapes.items()
               if next(i.shape for i in artifact.inputs if i.name == n) != s}
    if not changed:
        return artifact
    try:
        inner = _reshaped(opened.inner or artifact, changed)
    except ModelSourceError as exc:  # e.g. a Reshape to a fixed size
        flags = " ".join(f"--input-shape {n}:{','.join(map(str, d))}" for n, d in shapes.items())
        raise ModelSourceError(f"the model does not take {flags}: {exc.message}",
                               file=str(opened.path)) from None
    if artifact.kind != "encrypted":
        return inner
    from orchestrator.model import kinds
    from orchestrator.model.encryption import encrypt

    assert opened.key is not None
    # sealed again with the same key (a fresh nonce): the probe decrypts it as an app would
    return replace(artifact, inputs=inner.inputs, metadata=inner.metadata,
                   payload=encrypt(kinds.to_bytes(inner), inner.kind, opened.key.secret))


def _reshaped(artifact: ModelArtifact, shapes: Mapping[str, tuple[int, ...]]
              ) -> ModelArtifact:
    inputs = tuple(replace(s, shape=shapes.get(s.name, s.shape)) for s in artifact.inputs)
    if artifact.kind == "graphdef":
        return replace(artifact, inputs=inputs,
                       graph_def=_graph_with_shapes(artifact.graph_def, shapes))
    assert artifact.payload is not None
    if artifact.kind == "tflite":
        from orchestrator.model.litert_model import count_flops

        payload = _tflite_with_shapes(artifact.payload, shapes)
        # its FLOPs at the new shape (what the benchmark stage reports)
        tflite = {**(artifact.metadata.get("tflite") or {}), "flops": count_flops(payload)[0]}
        return replace(artifact, inputs=inputs, payload=payload,
                       metadata={**artifact.metadata, "tflite": tflite})
    else:  # memmapped
        payload = _package_with_shapes(artifact.payload, shapes)
    return replace(artifact, inputs=inputs, payload=payload)


def _graph_with_shapes(graph_def: Any, shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """A copy whose input Placeholders declare these shapes (strip's `shape=` does the
    same)."""
    import tensorflow as tf

    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.name in shapes:
            if "shape" not in node.attr:
                raise ModelSourceError(f"input {node.name!r} is a {node.op} node, whose "
                                       "shape cannot be set; --input-shape needs a "
                                       "Placeholder")
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(list(shapes[node.name]))
                                              .as_proto())
            node.attr.pop("_output_shapes", None)  # stale once the shape is fixed
    try:  # shape inference on import: a shape the graph cannot take fails here
        with tf.Graph().as_default():
            tf.compat.v1.import_graph_def(out, name="")
    except (ValueError, tf.errors.OpError) as exc:
        from orchestrator.model.sources._common import short

        raise ModelSourceError(short(exc)) from exc
    return out


def _package_with_shapes(data: bytes, shapes: Mapping[str, tuple[int, ...]]) -> bytes:
    """The memmapped package with its graph region's Placeholders reshaped, laid out again
    as the memmap stage writes it (regions in order, 64-byte aligned, directory, offset)."""
    import struct

    from orchestrator.model.memmap_format import ALIGNMENT, GRAPH_REGION, read_package
    from orchestrator.model.tf_adapter import memmapped_directory_proto

    package = read_package(data)
    graph = _graph_with_shapes(package.graph_def, shapes).SerializeToString(deterministic=True)
    directory = memmapped_directory_proto()
    chunks: list[bytes] = []
    offset = 0
    for region in package.regions:
        content = graph if region.name == GRAPH_REGION else package.region(region.name)
        padding = -offset % ALIGNMENT
        chunks.append(b"\0" * padding)
        offset += padding
        element = directory.element.add()
        element.name, element.offset, element.length = region.name, offset, len(content)
        chunks.append(content)
        offset += len(content)
    chunks += [directory.SerializeToString(deterministic=True), struct.pack("<Q", offset)]
    return b"".join(chunks)


def _tflite_with_shapes(data: bytes, shapes: Mapping[str, tuple[int, ...]]) -> bytes:
    """The flatbuffer with these inputs' shape and shape signature set (what LiteRT's
    resize_tensor_input does at run time), written back by LiteRT's own flatbuffer tools."""
    import numpy as np
    from ai_edge_litert.tools import flatbuffer_utils

    from orchestrator.model.artifact import node_name
    from orchestrator.model.litert_model import describe, read_model

    model = read_model(data)
    subgraph = model.subgraphs[0]
    wanted = {node_name(n): dims for n, dims in shapes.items()}
    for index in subgraph.inputs:
        tensor = subgraph.tensors[index]
        dims = wanted.get(node_name(tflite_text(tensor.name)))
        if dims is not None:
            tensor.shape = np.array(dims, dtype=np.int32)
            tensor.shapeSignature = np.array(dims, dtype=np.int32)
    out = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    try:  # verified and allocated again: a shape the graph cannot take fails here
        describe(out)
    except ModelSourceError as exc:
        from orchestrator.model.sources._common import short

        raise ModelSourceError(short(exc.__cause__) if exc.__cause__ else exc.message
                               ) from exc
    return out
