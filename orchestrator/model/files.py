"""Any model file opened as a ModelArtifact of its kind, for commands outside a recipe
(`orchestrator benchmark`): a SavedModel folder, a Keras file or a TF1 checkpoint (frozen
in memory by the `freeze` stage, as a recipe's first stage does), a frozen `.pb`/`.pbtxt`,
a memmapped package (`.mmap`), a LiteRT flatbuffer (`.tflite`, checked by LiteRT's
verifier), or an encrypted model (`.enc`, decrypted in memory with its key). The content
decides before the suffix. Every unreadable file is a ModelSourceError (exit 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ModelSourceError, OrchestratorError, StageError

if TYPE_CHECKING:
    from orchestrator.model.artifact import ModelArtifact
    from orchestrator.model.keys import ModelKey

# Suffixes the recipe's model sources read (orchestrator.model.sources.detect_format).
_SOURCE_SUFFIXES = (".pb", ".pbtxt", ".keras", ".h5", ".meta", ".index")
_FORMATS_TEXT = ("a SavedModel folder, .keras/.h5, .pb/.pbtxt, a checkpoint .meta, .tflite, "
                 ".mmap or .enc")


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


def open_model(path: Path, key_env: str | None = None, key_file: Path | None = None,
               fmt: str = "auto", format_flag: str | None = None) -> OpenedModel:
    """Open any model file the orchestrator knows, judged by its content, then its suffix
    (`fmt`, a recipe model format other than auto, opens it as that source format).
    Every problem is an OrchestratorError (exit 2) naming the file; a format that cannot
    be told names `format_flag`, the command's option that sets it (if it has one)."""
    from orchestrator import paths
    from orchestrator.model.encryption import MAGIC

    if fmt != "auto":
        return _open_source(path, fmt)

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
                                   f"model suffix; expected {_FORMATS_TEXT}"
                                   + (f"; or give {format_flag}" if format_flag else ""),
                                   file=str(path))
    return _open_source(path, format_flag=format_flag)


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
    from orchestrator.model.litert_model import FILE_IDENTIFIER
    from orchestrator.model.memmap_format import MemmappedFormatError, read_package

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


def _open_source(path: Path, fmt: str | None = None, format_flag: str | None = None
                 ) -> OpenedModel:
    """A recipe model source, frozen in memory unless it is a plain frozen graph already:
    the graph a recipe's pipeline starts from after `freeze`."""
    from orchestrator.model.freezing import freeze, function_calls
    from orchestrator.model.sources import detect_format, load_model

    if fmt is None:
        try:
            fmt = detect_format(path)
        except ModelSourceError as exc:
            if "model.format" not in exc.message:
                raise
            # it names the recipe's key and only the recipe's formats: say the command's
            expected = f"; expected {_FORMATS_TEXT}" + (
                f"; or give {format_flag}" if format_flag else "")
            raise ModelSourceError(exc.message.split("; expected")[0] + expected,
                                   file=exc.file) from None
    artifact = load_model(path, fmt)
    how = {"saved_model": "SavedModel", "keras": "Keras model", "frozen_graph": "frozen graph",
           "checkpoint": "TF1 checkpoint"}[fmt]
    if fmt != "frozen_graph" or function_calls(artifact.graph_def):
        artifact, _ = freeze(artifact)
        how += ", frozen in memory as the freeze stage does"
    aliases = {k: v for k, v in (artifact.metadata.get("input_names") or {}).items() if k != v}
    return OpenedModel(path=path, artifact=artifact, how=how, aliases=aliases)


def _open_payload(path: Path, kind: str, data: bytes) -> OpenedModel:
    """A `.tflite` or memmapped file (or the plaintext of an encrypted one) as an artifact
    of its kind, its inputs and outputs read from the model itself."""
    from orchestrator.model.artifact import ModelArtifact, TensorSpec

    if kind == "tflite":
        from orchestrator.model.litert_model import count_flops, describe

        facts = describe(data)  # LiteRT's verifier first: a corrupt file is exit 2 here
        inputs = tuple(TensorSpec(t.name, t.dtype, t.shape) for t in facts.inputs)
        # the FLOPs the benchmark stage reads (in a run, convert_tflite records the graph's:
        # the same count, see litert_model.count_flops)
        flops, precision = count_flops(data)
        artifact = ModelArtifact(graph_def=None, inputs=inputs,
                                 outputs=tuple(t.name for t in facts.outputs), kind="tflite",
                                 payload=data,
                                 metadata={"tflite": {"flops": flops, "mode": "int8" if
                                                      precision == "int8" else None}},
                                 facts={"params": facts.params, "ops": facts.op_counts})
        return OpenedModel(path=path, artifact=artifact, how="LiteRT flatbuffer",
                           aliases=_tflite_aliases(data))
    if kind == "memmapped":
        from orchestrator.model.memmap_format import read_package

        graph_def = read_package(data).graph_def
        how = "memmapped package"
    else:
        graph_def = _parse_graph(path, data)
        how = "frozen graph"
    from orchestrator.model.sources._common import FrozenSignature, build_artifact

    found = build_artifact(path, kind, FrozenSignature(graph_def), None, None)
    if kind == "graphdef":
        return OpenedModel(path=path, artifact=found, how=how)
    artifact = ModelArtifact(graph_def=None, inputs=found.inputs, outputs=found.outputs,
                             kind=kind, payload=data)
    return OpenedModel(path=path, artifact=artifact, how=how)


def _parse_graph(path: Path, data: bytes) -> Any:
    from google.protobuf.message import DecodeError
    from tensorflow.core.framework import graph_pb2

    from orchestrator.model.sources import frozen_graph

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
    from orchestrator.model.encryption import EncryptedFormatError, decrypt, read_header
    from orchestrator.model.keys import DEFAULT_ENV, load_key

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
                aliases[tflite_text(item.name)] = tflite_text(tensors[item.tensorIndex].name)
    return aliases


def tflite_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
