"""Where the bytes of a `.tflite` go, and the same model in fewer of them.

Why: a full-integer file is mostly weights, but not only. Per-channel quantization keeps a
float32 scale and an int64 zero point for every channel of every weight and bias tensor
(12 bytes a channel), the converter names each tensor after the ops it fused (names like
`a/b/c;a/d/e;...`, often longer than the small tensors they name), and it adds metadata
buffers (`min_runtime_version`, `CONVERSION_METADATA`). On a small model these are a
visible share of what ships; `bytes_by_kind` says how much, and `shrink` removes what the
runtime does not read.

How `bytes_by_kind` counts: positions are read from the flatbuffer itself (LiteRT's
generated schema reader), so each byte is counted once and the kinds sum exactly to the
file's size. A vector counts with its 4-byte length prefix (and a string with its NUL
terminator) in the kind of what it holds; the alignment padding before a vector, and
every table, vtable and offset (including the tables that hold quantization vectors or
names), go to `graph`, with shapes, operators, opcodes, tensor tables and signatures'
tensor indices. Data of a buffer that no tensor and no metadata entry uses is `graph` too.

What `shrink` does, and what it leaves, on ai-edge-litert 2.3.0's evidence:
- drops the names of tensors that are no subgraph's input or output nor in a signature
  (the fields are left out: the interpreter reports them as ""); the signature defs, the
  input and output names, subgraph names and the model's description stay;
- drops the `CONVERSION_METADATA` and `min_runtime_version` metadata and their buffers:
  the interpreter loads such a file and computes bit-identical outputs, with its default
  XNNPACK delegate and with BUILTIN_WITHOUT_DEFAULT_DELEGATES (`min_runtime_version`
  occurs in none of ai-edge-litert's libraries; it informs tools, not the runtime). Other
  metadata (e.g. TFLite Support's `TFLITE_METADATA`) is kept;
- points every empty buffer at buffer 0, the schema's empty sentinel (the converter gives
  each activation an empty buffer of its own; LiteRT's own `read_model` merges them too);
- keeps every zero point: the interpreter's model reader rejects a tensor whose
  zero_point vector is shorter than its scale vector ("QuantizationParam has 1
  zero_point values and 10 scale values. Must have same number.", the same for an empty
  one) or absent ("Quantization parameters has non-null scale but null zero_point."),
  with every op resolver, before any kernel sees it. The all-zero int64 zero points of
  per-channel tensors (8 bytes a channel) are what this runtime requires.

`shrink` re-serialises with `flatbuffer_utils.convert_object_to_bytearray`, which on the
TF 2.21 converter's output gives back the very same bytes (tested), so the bytes saved
are the edits' alone. That builder
cannot write more than 2 GB: a file whose buffers lie after the flatbuffer (the layout
of files over 2 GB, which the LiteRT Quantizer also writes for smaller ones) is rewritten
with them inside when it is smaller than that, and refused otherwise; `bytes_by_kind`
counts such buffers' data too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from orchestrator.errors import ModelSourceError

KINDS = ("weights", "quantization", "names", "metadata", "graph")
# Metadata the interpreter does not read (checked: see the module docstring)
DROPPABLE_METADATA = ("CONVERSION_METADATA", "min_runtime_version")
_IDENTIFIER = b"TFL3"  # bytes 4..8 of every LiteRT flatbuffer

# vtable offsets of the schema's fields (4 + 2 * field id). A flatbuffers schema only adds
# fields, never renumbers them: these hold for every schema version.
_MODEL_DESCRIPTION, _MODEL_BUFFERS, _MODEL_METADATA = 10, 12, 16
_SUBGRAPH_NAME = 12
_TENSOR_NAME = 10
_BUFFER_DATA = 4
_METADATA_NAME = 4
_TENSOR_MAP_NAME = 4
_SIGNATURE_KEY = 8
# QuantizationParameters: min, max, scale (float32), zero_point (int64)
_QUANTIZATION_VECTORS = ((4, 4), (6, 4), (8, 4), (10, 8))


def bytes_by_kind(flatbuffer: bytes) -> dict[str, int]:
    """The bytes of `flatbuffer` by kind (KINDS): they sum to len(flatbuffer)."""
    from ai_edge_litert import schema_py_generated as schema

    data = bytes(flatbuffer)
    _check_identifier(data)
    spans: dict[tuple[int, int], str] = {}  # [start, end) -> kind

    def vector(table: Any, field: int, item_size: int, kind: str, terminator: int = 0
               ) -> None:  # one vector field of a table, with its length prefix
        offset = table.Offset(field)
        if offset:
            start = table.Vector(offset)
            spans[(start - 4, start + table.VectorLen(offset) * item_size + terminator)] = kind

    def string(table: Any, field: int) -> None:
        vector(table, field, 1, "names", terminator=1)

    model = schema.Model.GetRootAs(data, 0)
    string(model._tab, _MODEL_DESCRIPTION)
    buffer_kind: dict[int, str] = {}  # buffer index -> whose data it holds
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        string(subgraph._tab, _SUBGRAPH_NAME)
        for t in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(t)
            buffer_kind.setdefault(tensor.Buffer(), "weights")
            string(tensor._tab, _TENSOR_NAME)
            quantization = tensor.Quantization()
            if quantization is not None:
                for field, size in _QUANTIZATION_VECTORS:
                    vector(quantization._tab, field, size, "quantization")
    for m in range(model.MetadataLength()):
        entry = model.Metadata(m)
        buffer_kind[entry.Buffer()] = "metadata"
        string(entry._tab, _METADATA_NAME)
    for s in range(model.SignatureDefsLength()):
        signature = model.SignatureDefs(s)
        string(signature._tab, _SIGNATURE_KEY)
        for maps, count in ((signature.Inputs, signature.InputsLength()),
                            (signature.Outputs, signature.OutputsLength())):
            for i in range(count):
                string(maps(i)._tab, _TENSOR_MAP_NAME)
    for index, kind in buffer_kind.items():
        if not 0 <= index < model.BuffersLength():
            continue
        buffer = model.Buffers(index)
        if buffer.Offset() > 1:  # data after the flatbuffer (files over 2 GB), no prefix
            spans[(buffer.Offset(), buffer.Offset() + buffer.Size())] = kind
        else:
            vector(buffer._tab, _BUFFER_DATA, 1, kind)
    return _tally(spans, len(data))


def _tally(spans: dict[tuple[int, int], str], size: int) -> dict[str, int]:
    """Bytes of each kind over `spans` (an overlap counted once, for the earlier span);
    what no span covers is `graph`."""
    counts = dict.fromkeys(KINDS, 0)
    reached = 0  # end of the bytes counted so far
    for (start, end), kind in sorted(spans.items()):
        start, end = max(start, reached), min(end, size)
        if end > start:
            counts[kind] += end - start
            reached = end
    counts["graph"] = size - sum(counts.values())
    return counts


# Below this, a file whose buffers lie after its flatbuffer can be rewritten with them
# inside it (a flatbuffer addresses 2 GB).
MAX_INLINE = (1 << 31) - (1 << 24)


def shrink(flatbuffer: bytes, drop_metadata: tuple[str, ...] = DROPPABLE_METADATA
           ) -> tuple[bytes, dict[str, Any]]:
    """`flatbuffer` without the names of its intermediate and constant tensors, the metadata
    named in `drop_metadata`, and distinct empty buffers; its signatures, inputs, outputs
    and numbers unchanged (see the module docstring). Returns the new bytes and what was
    done: {names_dropped, metadata_dropped, empty_buffers_merged, zero_points_shortened
    (always 0: LiteRT requires them), bytes_saved}."""
    from ai_edge_litert.tools import flatbuffer_utils

    data = bytes(flatbuffer)
    _check_identifier(data)
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    outside = [buffer for buffer in model.buffers or [] if buffer.offset > 1]
    if len(data) >= MAX_INLINE or any(
            op.largeCustomOptionsOffset > 1 for subgraph in model.subgraphs or []
            for op in subgraph.operators or []):
        raise ModelSourceError(
            "this .tflite is too large to rewrite in one flatbuffer (2 GB and more, or "
            "custom options after it): shrink re-serialises the flatbuffer")
    for buffer in outside:  # data after the flatbuffer (the LiteRT Quantizer writes so)
        buffer.data = np.frombuffer(data[buffer.offset:buffer.offset + buffer.size],
                                    dtype=np.uint8)
        buffer.offset = buffer.size = 0
    names = _drop_names(model)
    dropped = _drop_metadata(model, set(drop_metadata))
    merged = _merge_empty_buffers(model)
    out = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    return out, {"names_dropped": names, "metadata_dropped": dropped,
                 "empty_buffers_merged": merged, "zero_points_shortened": 0,
                 "bytes_saved": len(data) - len(out)}


def _check_identifier(data: bytes) -> None:
    if len(data) < 8 or data[4:8] != _IDENTIFIER:
        raise ModelSourceError(f"not a LiteRT flatbuffer: {len(data)} bytes without the "
                               f"{_IDENTIFIER.decode()} identifier")


def _drop_names(model: Any) -> int:
    """Leaves out the name of each tensor that is no subgraph input or output and in no
    signature; returns how many names were dropped."""
    kept: dict[int, set[int]] = {}  # subgraph -> its tensors named in signatures
    for signature in model.signatureDefs or []:
        kept.setdefault(signature.subgraphIndex, set()).update(
            int(entry.tensorIndex) for entry in [*(signature.inputs or []),
                                                 *(signature.outputs or [])])
    dropped = 0
    for g, subgraph in enumerate(model.subgraphs or []):
        keep = kept.get(g, set()) | {int(i) for i in [*_ints(subgraph.inputs),
                                                      *_ints(subgraph.outputs)]}
        for t, tensor in enumerate(subgraph.tensors or []):
            if t not in keep and tensor.name:
                tensor.name = None
                dropped += 1
    return dropped


def _ints(values: Any) -> list[int]:
    return [] if values is None else [int(v) for v in values]


def _drop_metadata(model: Any, names: set[str]) -> list[str]:
    """Removes the metadata entries named in `names`, and their buffers when nothing else
    uses them; returns the names removed."""
    dropped, kept = [], []
    for entry in model.metadata or []:
        name = bytes(entry.name or b"").decode("utf-8", "replace")
        (dropped if name in names else kept).append((name, entry))
    model.metadata = [entry for _, entry in kept] or None
    used = {int(tensor.buffer) for subgraph in model.subgraphs or []
            for tensor in subgraph.tensors or []}
    used |= {int(entry.buffer) for _, entry in kept} | set(_ints(model.metadataBuffer))
    unused = {int(entry.buffer) for _, entry in dropped} - used - {0}
    if unused:
        _renumber_buffers(model, [i for i in range(len(model.buffers)) if i not in unused])
    return [name for name, _ in dropped]


def _merge_empty_buffers(model: Any) -> int:
    """Points each tensor whose buffer is empty at buffer 0 (the schema's empty sentinel)
    and removes the empty buffers no longer used; returns how many."""
    buffers = model.buffers or []
    if not buffers or not _empty(buffers[0]):
        return 0
    for subgraph in model.subgraphs or []:
        for tensor in subgraph.tensors or []:
            if _empty(buffers[int(tensor.buffer)]):
                tensor.buffer = 0
    used = {int(tensor.buffer) for subgraph in model.subgraphs or []
            for tensor in subgraph.tensors or []}
    used |= {int(entry.buffer) for entry in model.metadata or []}
    used |= set(_ints(model.metadataBuffer)) | {0}
    kept = [i for i, buffer in enumerate(buffers) if i in used or not _empty(buffer)]
    _renumber_buffers(model, kept)
    return len(buffers) - len(kept)


def _empty(buffer: Any) -> bool:
    return (buffer.data is None or len(buffer.data) == 0) and not buffer.size


def _renumber_buffers(model: Any, kept: list[int]) -> None:
    """Keeps the buffers at indices `kept` (in order) and renumbers what refers to them."""
    new = {old: i for i, old in enumerate(kept)}
    model.buffers = [model.buffers[i] for i in kept]
    for subgraph in model.subgraphs or []:
        for tensor in subgraph.tensors or []:
            tensor.buffer = new[int(tensor.buffer)]
    for entry in model.metadata or []:
        entry.buffer = new[int(entry.buffer)]
    if model.metadataBuffer is not None:
        model.metadataBuffer = np.asarray([new[i] for i in _ints(model.metadataBuffer)],
                                          dtype=np.int32)
