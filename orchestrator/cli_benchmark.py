"""`orchestrator benchmark MODEL`: the recipe's `benchmark` stage on any model file, outside a
recipe, printed as TF's `benchmark_model` prints it.

The model is opened as `inspect` and the recipe's model sources open it: a SavedModel
folder, a Keras file or a TF1 checkpoint (frozen in memory by the `freeze` stage, as a
recipe's first stage does), a frozen `.pb`/`.pbtxt`, a memmapped package (`.mmap`), a
LiteRT flatbuffer (`.tflite`, checked by LiteRT's verifier), or an encrypted model (`.enc`,
decrypted in memory with the key from an environment variable or a key file). Then the
`benchmark` stage itself measures it: nothing here times anything.

`--input-shape NAME:d1,d2,...` fixes unknown dimensions of an input, as benchmark_model's
`--input_layer_shape` does: the model's declared input shape is set to it (a Placeholder's
`shape`, a `.tflite` input's shape signature, inside the package or the encryption for
`.mmap`/`.enc`), so the timed runs, the FLOP count and the fresh-process memory probe all
see the same shape. A shape the model cannot take is exit 2, before anything runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ModelSourceError, OrchestratorError, StageError

if TYPE_CHECKING:
    from orchestrator.keys import ModelKey
    from orchestrator.model import ModelArtifact, TensorSpec
    from orchestrator.stages.base import StageResult

# Suffixes the recipe's model sources read (orchestrator.sources.detect_format).
_SOURCE_SUFFIXES = (".pb", ".pbtxt", ".keras", ".h5", ".meta", ".index")
_FORMATS_TEXT = ("a SavedModel folder, .keras/.h5, .pb/.pbtxt, a checkpoint .meta, .tflite, "
                 ".mmap or .enc")
_TOP_ROWS = 10  # benchmark_model prints the top 10 nodes by default


class UsageError(OrchestratorError):
    """A bad option value (exit 2)."""


# --------------------------------------------------------------------------- options


def parse_threads(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; every setting at least 1."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise UsageError(f"--threads {text!r}: expected thread counts such as 1,2,4")
    settings = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise UsageError(f"--threads {text!r}: {item!r} is not a whole number") from None
        if value < 1:
            raise UsageError(f"--threads {text!r}: a thread count must be at least 1, "
                             f"got {value}")
        settings.append(value)
    return settings


def parse_input_shapes(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`NAME:d1,d2,...` per value, or several in one value (`a:1,3,b:1,5`, as
    benchmark_model's --input_layer_shape lists them); NAME may be a tensor name (`x:0`)."""
    shapes: dict[str, list[int]] = {}
    for value in values:
        current: list[int] | None = None
        for token in (t.strip() for t in value.split(",")):
            if ":" in token:
                name, _, first = token.rpartition(":")
                if not name:
                    raise UsageError(f"--input-shape {value!r}: an input name must come "
                                     "before ':' (NAME:d1,d2,...)")
                if name in shapes:
                    raise UsageError(f"--input-shape: input {name!r} is given twice")
                current = shapes[name] = []
                if first:
                    current.append(_dim(first, value))
            elif current is None:
                raise UsageError(f"--input-shape {value!r}: expected NAME:d1,d2,... "
                                 "(e.g. image:1,224,224,3)")
            else:
                current.append(_dim(token, value))
    return {name: tuple(dims) for name, dims in shapes.items()}


def _dim(text: str, value: str) -> int:
    try:
        dim = int(text)
    except ValueError:
        raise UsageError(f"--input-shape {value!r}: dimension {text!r} is not a whole "
                         "number") from None
    if dim < 1:
        raise UsageError(f"--input-shape {value!r}: every dimension must be at least 1 "
                         f"(got {dim}); give the size to run with")
    return dim


def _counts(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark stage's params from the options (each checked, named by its option)."""
    params: dict[str, Any] = {}
    for option, key, low in (("--runs", "runs", 1), ("--warmup", "warmup", 0),
                             ("--profile-runs", "profile_runs", 0)):
        value = getattr(args, key)
        if value is None:
            continue
        if value < low:
            raise UsageError(f"{option} must be at least {low}, got {value}")
        params[key] = value
    if args.threads is not None:
        params["threads"] = parse_threads(args.threads)
    return params


# --------------------------------------------------------------------------- opening


@dataclass(frozen=True)
class OpenedModel:
    """A model file opened as the stages take it.

    `artifact` is what the benchmark stage measures; for an encrypted file `inner` is the
    model inside (decrypted in memory) and `key` its key. `aliases` maps other names of
    the inputs (signature names) to their input names. `how` says what was opened."""

    path: Path
    artifact: ModelArtifact
    how: str
    aliases: Mapping[str, str] = field(default_factory=dict)
    inner: ModelArtifact | None = None
    key: ModelKey | None = None


def open_model(path: Path, key_env: str | None = None, key_file: Path | None = None
               ) -> OpenedModel:
    """Open any model file the orchestrator knows, judged by its content, then its suffix.
    Every problem is an OrchestratorError (exit 2) naming the file."""
    from orchestrator import paths
    from orchestrator.encryption import MAGIC

    problem = paths.path_problem(path, "file_or_dir")
    if problem and problem != "not found":  # a FIFO or a device would hang the reader
        raise ModelSourceError(f"cannot read the model: {problem}", file=str(path))
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelSourceError(f"cannot read the model: {exc.strerror or exc}",
                                   file=str(path)) from None
        if not data:
            raise ModelSourceError("the model file is empty", file=str(path))
        suffix = path.suffix.lower()
        if data[:len(MAGIC)] == MAGIC or suffix == ".enc":
            return _located(path, lambda: _open_encrypted(path, data, key_env, key_file))
        kind = _payload_kind(data, suffix)
        if kind is not None:
            return _located(path, lambda: _open_payload(path, kind, data))
        if suffix not in _SOURCE_SUFFIXES and path.name not in ("saved_model.pb",
                                                               "saved_model.pbtxt"):
            raise ModelSourceError(f"cannot tell the model format: by its content it is no "
                                   f"LiteRT flatbuffer, memmapped package or encrypted "
                                   f"model, and {path.suffix or 'no suffix'} is not a "
                                   f"model suffix; expected {_FORMATS_TEXT}", file=str(path))
    return _open_source(path)


def _located(path: Path, opener: Any) -> OpenedModel:
    """Run `opener`; an error that does not name a file gets this one."""
    try:
        return opener()  # type: ignore[no-any-return]
    except OrchestratorError as exc:
        if exc.file is None and not isinstance(exc, StageError):
            exc.file = str(path)
        raise


def _payload_kind(data: bytes, suffix: str) -> str | None:
    """"tflite" or "memmapped" when the bytes (or the suffix) say so, else None."""
    from orchestrator.litert_model import FILE_IDENTIFIER
    from orchestrator.memmap_format import MemmappedFormatError, read_package

    if suffix == ".tflite" or data[4:8] == FILE_IDENTIFIER:
        return "tflite"
    if suffix == ".mmap":
        return "memmapped"
    if suffix in _SOURCE_SUFFIXES:
        return None
    try:
        read_package(data)
    except MemmappedFormatError:
        return None
    return "memmapped"


def _open_source(path: Path) -> OpenedModel:
    """A recipe model source (as `inspect` opens it), frozen in memory unless it is a plain
    frozen graph already: the graph a recipe's pipeline starts from after `freeze`."""
    from orchestrator.sources import detect_format, load_model
    from orchestrator.stages import get_stage
    from orchestrator.stages.base import StageContext
    from orchestrator.stages.freeze import function_calls

    fmt = detect_format(path)
    artifact = load_model(path, fmt)
    how = {"saved_model": "SavedModel", "keras": "Keras model", "frozen_graph": "frozen graph",
           "checkpoint": "TF1 checkpoint"}[fmt]
    if fmt != "frozen_graph" or function_calls(artifact.graph_def):
        freeze = get_stage("freeze")
        result = freeze.run(artifact, freeze.params(),
                            StageContext(pipeline="cli", stage="freeze"))
        artifact = result.artifact
        how += ", frozen in memory by the freeze stage"
    aliases = {k: v for k, v in (artifact.metadata.get("input_names") or {}).items() if k != v}
    return OpenedModel(path=path, artifact=artifact, how=how, aliases=aliases)


def _open_payload(path: Path, kind: str, data: bytes) -> OpenedModel:
    """A `.tflite` or memmapped file (or the plaintext of an encrypted one) as an artifact
    of its kind, its inputs and outputs read from the model itself."""
    from orchestrator.model import ModelArtifact, TensorSpec

    if kind == "tflite":
        from orchestrator.litert_model import describe

        facts = describe(data)  # LiteRT's verifier first: a corrupt file is exit 2 here
        inputs = tuple(TensorSpec(t.name, t.dtype, t.shape) for t in facts.inputs)
        artifact = ModelArtifact(graph_def=None, inputs=inputs,
                                 outputs=tuple(t.name for t in facts.outputs), kind="tflite",
                                 payload=data)
        return OpenedModel(path=path, artifact=artifact, how="LiteRT flatbuffer",
                           aliases=_tflite_aliases(data))
    if kind == "memmapped":
        from orchestrator.memmap_format import read_package

        graph_def = read_package(data).graph_def
        how = "memmapped package"
    else:
        graph_def = _parse_graph(path, data)
        how = "frozen graph"
    from orchestrator.sources._common import FrozenSignature, build_artifact

    found = build_artifact(path, kind, FrozenSignature(graph_def), None, None)
    if kind == "graphdef":
        return OpenedModel(path=path, artifact=found, how=how)
    artifact = ModelArtifact(graph_def=None, inputs=found.inputs, outputs=found.outputs,
                             kind=kind, payload=data)
    return OpenedModel(path=path, artifact=artifact, how=how)


def _parse_graph(path: Path, data: bytes) -> Any:
    from google.protobuf.message import DecodeError
    from tensorflow.core.framework import graph_pb2

    from orchestrator.sources import frozen_graph

    graph_def = graph_pb2.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except DecodeError as exc:
        raise ModelSourceError(f"the decrypted model is not a GraphDef: {exc}",
                               file=str(path)) from None
    frozen_graph.validate(path, graph_def)
    return graph_def


def _open_encrypted(path: Path, data: bytes, key_env: str | None, key_file: Path | None
                    ) -> OpenedModel:
    """Decrypt in memory (header checked first, then the key's id, then the GCM tag), read
    the model inside for its inputs and outputs; the artifact stays the encrypted file."""
    from orchestrator.encryption import EncryptedFormatError, decrypt, read_header
    from orchestrator.keys import DEFAULT_ENV, load_key

    header = read_header(data)
    key = load_key(key_env or DEFAULT_ENV, key_file)
    try:
        payload_kind, plaintext = decrypt(data, key.secret)
    except EncryptedFormatError as exc:
        raise EncryptedFormatError(f"{exc.message} (the key from {key.source})",
                                   file=str(path)) from None
    inner = _open_payload(path, payload_kind, plaintext)
    artifact = replace(inner.artifact, graph_def=None, kind="encrypted", payload=data)
    return OpenedModel(path=path, artifact=artifact, aliases=inner.aliases,
                       how=f"encrypted {inner.how}; key id {header.key_id}, from {key.source}",
                       inner=inner.artifact, key=key)


def _tflite_aliases(data: bytes) -> dict[str, str]:
    """Signature input names (`image`) -> tensor names (`serving_default_image:0`)."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    tensors = model.subgraphs[0].tensors if model.subgraphs else []
    aliases = {}
    for signature in model.signatureDefs or []:
        for item in signature.inputs or []:
            if item.name is not None and item.tensorIndex < len(tensors):
                aliases[_text(item.name)] = _text(tensors[item.tensorIndex].name)
    return aliases


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --------------------------------------------------------------------------- input shapes


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
    from orchestrator.model import node_name

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
    from orchestrator import kinds
    from orchestrator.encryption import encrypt

    assert opened.key is not None
    # sealed again with the same key (a fresh nonce): the probe decrypts it as an app would
    return replace(artifact, inputs=inner.inputs,
                   payload=encrypt(kinds.to_bytes(inner), inner.kind, opened.key.secret))


def _reshaped(artifact: ModelArtifact, shapes: Mapping[str, tuple[int, ...]]
              ) -> ModelArtifact:
    inputs = tuple(replace(s, shape=shapes.get(s.name, s.shape)) for s in artifact.inputs)
    if artifact.kind == "graphdef":
        return replace(artifact, inputs=inputs,
                       graph_def=_graph_with_shapes(artifact.graph_def, shapes))
    assert artifact.payload is not None
    if artifact.kind == "tflite":
        payload = _tflite_with_shapes(artifact.payload, shapes)
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
        from orchestrator.sources._common import short

        raise ModelSourceError(short(exc)) from exc
    return out


def _package_with_shapes(data: bytes, shapes: Mapping[str, tuple[int, ...]]) -> bytes:
    """The memmapped package with its graph region's Placeholders reshaped, laid out again
    as the memmap stage writes it (regions in order, 64-byte aligned, directory, offset)."""
    import struct

    from orchestrator.memmap_format import ALIGNMENT, GRAPH_REGION, read_package
    from orchestrator.tf_adapter import memmapped_directory_proto

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

    from orchestrator.litert_model import describe
    from orchestrator.model import node_name

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    subgraph = model.subgraphs[0]
    wanted = {node_name(n): dims for n, dims in shapes.items()}
    for index in subgraph.inputs:
        tensor = subgraph.tensors[index]
        dims = wanted.get(node_name(_text(tensor.name)))
        if dims is not None:
            tensor.shape = np.array(dims, dtype=np.int32)
            tensor.shapeSignature = np.array(dims, dtype=np.int32)
    out = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    try:  # verified and allocated again: a shape the graph cannot take fails here
        describe(out)
    except ModelSourceError as exc:
        from orchestrator.sources._common import short

        raise ModelSourceError(short(exc.__cause__) if exc.__cause__ else exc.message
                               ) from exc
    return out


# --------------------------------------------------------------------------- running


def run_benchmark(artifact: ModelArtifact, params: Any, key: ModelKey | None,
                  path: Path) -> StageResult:
    """The benchmark stage on `artifact`. A model that TensorFlow cannot run is exit 2 (the
    file is at fault); any other failure of the stage is exit 3, as in a recipe."""
    from orchestrator.errors import DataError
    from orchestrator.stages import get_stage
    from orchestrator.stages.base import StageContext

    def lookup(wanted: str | None) -> ModelKey:
        if key is None:
            from orchestrator.keys import KeyMaterialError

            raise KeyMaterialError("the model is encrypted and no key was given")
        return key

    ctx = StageContext(pipeline="cli", stage="benchmark", model_key=lookup)
    try:
        return get_stage("benchmark").run(artifact, params, ctx)
    except (DataError, ModelSourceError) as exc:
        if exc.file is None:
            exc.file = str(path)
        raise
    except OrchestratorError as exc:
        raise StageError(str(exc), stage="benchmark") from exc
    except Exception as exc:
        import tensorflow as tf

        from orchestrator.sources._common import short

        if isinstance(exc, tf.errors.OpError):  # the graph itself does not run
            raise ModelSourceError(f"TensorFlow cannot run this model: {_op_error(exc)}",
                                   file=str(path)) from exc
        raise StageError(f"{type(exc).__name__}: {short(exc)}", stage="benchmark") from exc


def _op_error(exc: Any) -> str:
    """`InvalidArgumentError at node 'w': <the reason>` from TF's many-line message."""
    reasons = [line.strip() for line in str(exc.message).splitlines() if line.strip()
               and not line.startswith(("Graph execution error", "Detected at node", "Node:"))]
    reason = reasons[0] if reasons else "no reason given"
    node = getattr(exc.node_def, "name", "") if exc.node_def is not None else ""
    where = f" at node {node!r}" if node else ""
    return f"{type(exc).__name__}{where}: {reason[:300]}"


# --------------------------------------------------------------------------- printing


def _latency_line(threads: int, stats: Mapping[str, Any]) -> str:
    values = " ".join(f"{key if key != 'mean' else 'avg'}={stats[key]:.3f}" for key in
                      ("first", "curr", "min", "max", "mean", "std", "p50", "p90", "p99"))
    return f"  threads={threads}: count={stats['count']} {values}"


def _tsv_rows(data: bytes) -> tuple[list[str], list[dict[str, str]]]:
    lines = data.decode().splitlines()
    columns = lines[0].split("\t")
    return columns, [dict(zip(columns, line.split("\t"), strict=True)) for line in lines[1:]]


def _human(count: float) -> str:
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= scale:
            return f"{count / scale:.2f} {prefix}"
    return f"{count:g}"


def _binary(size: int) -> str:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} B"


def format_report(opened: OpenedModel, artifact: ModelArtifact, params: Any,
                  result: StageResult) -> str:
    """benchmark_model's report: what was run, the measured figures (timings per threads
    setting, fresh-process memory, the host, the per-node profile), then the estimates."""
    from orchestrator import profiling

    info = result.info
    host = info["host"]
    lines = [f"Model: {opened.path} ({opened.how})",
             *(f"Input: {s.name} {s.dtype} {shape_text(s.shape)} (random values)"
               for s in artifact.inputs),
             f"Outputs: {', '.join(artifact.outputs)}",
             "",
             "Measured on this host: "
             f"{host['cpu']}, {host['cores']} cores, {host['machine']}, {host['system']}, "
             f"Python {host['python']}, TensorFlow {host['tensorflow']}",
             f"Latency in ms, batch {info['batch_size']}, {params.warmup} warm-up + "
             f"{params.runs} timed runs per setting, inter-op threads 1 "
             "(first: the cold run; curr: the last):"]
    lines += [_latency_line(row["threads"], row["latency_ms"]) for row in info["threads_matrix"]]
    memory = info.get("memory")
    if memory:
        lines.append(f"Memory of a fresh process that loads the file and runs it once: load "
                     f"{memory['load_ms']:.1f} ms, resident +{memory['rss_growth_mb']:.2f} "
                     f"MiB, heap (RssAnon) +{memory['anon_growth_mb']:.2f} MiB")
    profile = info.get("profile")
    lines.append("")
    if profile is None:
        lines.append("Per-node profile: none (--profile-runs 0)")
    elif profile.get("source") is None:
        lines.append(f"Per-node profile: none: {profile.get('note')}")
    else:
        lines.append(f"Per-node profile, measured over {profile['runs']} traced runs at "
                     f"threads={info['threads']} (not part of the timings above):")
        columns, top = _tsv_rows(result.files[profiling.TOP_FILE])
        lines.append(profiling.text_table("Top by Computation Time", top, columns,
                                          limit=_TOP_ROWS))
        if len(top) > _TOP_ROWS:
            rest = sum(float(r["%"]) for r in top[_TOP_ROWS:])
            lines.append(f"... {len(top) - _TOP_ROWS} more nodes, {rest:.3f}% of the time")
        columns, by_type = _tsv_rows(result.files[profiling.BY_TYPE_FILE])
        lines += ["", profiling.text_table("Summary by node type", by_type, columns)]
    lines += ["", "Estimated (computed from the graph, not measured):"]
    flops = info.get("flops")
    lines.append(f"  FLOPs: {flops:,} ({_human(flops)}) per sample, {info['precision']}"
                 if flops is not None else "  FLOPs: not counted (see the warning)")
    peak = info.get("peak_memory_bytes")
    if peak is not None:
        lines.append(f"  Peak memory: {peak:,} bytes ({_binary(peak)}): weights + "
                     "inputs + the peak of live tensors, an upper estimate")
    elif artifact.kind == "tflite" or (opened.inner is not None
                                       and opened.inner.kind == "tflite"):
        lines.append("  Peak memory: not estimated for a .tflite (no traced run)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command


def cmd_benchmark(args: argparse.Namespace) -> int:
    from orchestrator.stages import get_stage

    stage = get_stage("benchmark")
    # every OrchestratorError goes to cli.main: `error: ...` on stderr, its exit code
    values = _counts(args)
    given = parse_input_shapes(args.input_shape)
    try:
        params = stage.params(**values)
    except ValueError as exc:  # pydantic's ValidationError; _counts checks first
        raise UsageError(f"bad benchmark option: {exc}") from None
    path = Path(args.model)
    if stage.prepare is not None and path.exists():
        stage.prepare(params)  # the memory probe's TensorFlow import overlaps ours
    opened = open_model(path, args.key_env, args.key_file)
    artifact = with_input_shapes(opened, resolve_shapes(opened, given))
    result = run_benchmark(artifact, params, opened.key, path)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    unknown = [s for s in artifact.inputs if s.shape is None or None in s.shape[1:]]
    for spec in unknown:
        print(f"warning: input {spec.name} has unknown dimensions {shape_text(spec.shape)}, "
              f"fed as 1; give --input-shape {spec.name}:d1,d2,... to set them",
              file=sys.stderr)
    if args.json:
        print(json.dumps(result.info, indent=2, default=str))
    else:
        print(format_report(opened, artifact, params, result))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """`orchestrator benchmark`: the benchmark stage on any model file."""
    # no import of the stage here: every command builds this parser (see test_help_defaults)
    bench = sub.add_parser(
        "benchmark", help="benchmark any model file as benchmark_model does (the recipe's "
        "benchmark stage): latency per threads setting, per-node profile, FLOPs, memory",
        description="Runs the recipe's benchmark stage on a model file outside a recipe: a "
        "SavedModel folder, .keras/.h5, .pb/.pbtxt, a checkpoint .meta, .tflite, .mmap or "
        ".enc. Inputs are random data of the model's input shapes.")
    bench.add_argument("model", help="the model file or SavedModel folder")
    bench.add_argument("--input-shape", action="append", default=[],
                       metavar="NAME:D1,D2,...",
                       help="run input NAME with this shape, fixing its unknown dimensions "
                       "(repeatable, or several as a:1,3,b:1,5)")
    bench.add_argument("--runs", type=int, default=None, metavar="N",
                       help="timed runs per threads setting (default 50)")
    bench.add_argument("--warmup", type=int, default=None, metavar="N",
                       help="untimed runs first (default 5)")
    bench.add_argument("--threads", default=None, metavar="N[,N...]",
                       help="intra-op thread settings, each timed, e.g. 1,2,4 (default: "
                       "this machine's core count); inter-op threads are always 1")
    bench.add_argument("--profile-runs", type=int, default=None, metavar="N",
                       help="traced runs for the per-node profile, 0 for none (default 20)")
    bench.add_argument("--key-env", default=None, metavar="VAR",
                       help="environment variable holding the key of an encrypted model "
                       "(default ORCHESTRATOR_MODEL_KEY)")
    bench.add_argument("--key-file", type=Path, default=None,
                       help="file holding the key of an encrypted model (instead of the "
                       "environment variable)")
    bench.add_argument("--json", action="store_true",
                       help="print the benchmark stage's info as JSON (as report.json "
                       "holds it) instead of the tables")
    bench.set_defaults(fn=cmd_benchmark)
