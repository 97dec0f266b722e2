"""Artifact kinds: what a model is on disk, one module per kind, looked up by name.

A kind module defines:
- `NAME` and `FILE_NAME` (its file in the store and in `-o DIR/<variant>/`);
- `to_bytes(artifact) -> bytes`: the file that ships (its size is `size_bytes`);
- `from_bytes(data, signature) -> ModelArtifact`;
- `summary(artifact) -> {"params", "ops"}`: summarize_graph facts of the model inside;
- `runnable(artifact, keys) -> ModelArtifact`: a graphdef artifact that computes the same
  outputs, for the measuring stages (`keys` finds a model key by key id, for encrypted).
- `deployed_graph(artifact, keys) -> GraphDef`: the graph an app loads from the file, as it
  is (ImmutableConst nodes for memmapped), for the stages that describe what ships.

Adding a kind (tflite) is one module and one line in KIND_MODULES; stages say which kinds
they accept in their `Stage` record, and the recipe's wiring check enforces it.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import json
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from orchestrator.model.artifact import ModelArtifact

if TYPE_CHECKING:
    from orchestrator.model.keys import ModelKey

KIND_MODULES: dict[str, str] = {
    "graphdef": "orchestrator.model.kinds.graphdef",
    "memmapped": "orchestrator.model.kinds.memmapped",
    "encrypted": "orchestrator.model.kinds.encrypted",
    "tflite": "orchestrator.model.kinds.tflite",
}
DEFAULT_KIND = "graphdef"
# key id -> the model key (raises when it is not known); see StageContext.model_key
KeyLookup = Callable[[str], "ModelKey"]


def get_kind(name: str) -> ModuleType:
    """The module of artifact kind `name` (KeyError for an unknown kind)."""
    return importlib.import_module(KIND_MODULES[name])


def file_name(kind: str) -> str:
    return str(get_kind(kind).FILE_NAME)


def to_bytes(artifact: ModelArtifact) -> bytes:
    """The bytes of the file that ships for this artifact."""
    return bytes(get_kind(artifact.kind).to_bytes(artifact))


def load(data: bytes, signature_json: str) -> ModelArtifact:
    """An artifact from its file bytes and its signature.json (whose `kind` says how)."""
    signature = json.loads(signature_json)
    return get_kind(signature.get("kind", DEFAULT_KIND)).from_bytes(data, signature)


def runnable(artifact: ModelArtifact, keys: KeyLookup | None = None) -> ModelArtifact:
    """A graphdef artifact computing the same outputs (the measuring stages run this)."""
    return get_kind(artifact.kind).runnable(artifact, keys)


def unwrapped(artifact: ModelArtifact, keys: KeyLookup | None = None) -> ModelArtifact:
    """The model an app gets once it opened the file: an encrypted artifact decrypted in
    memory (its kind is then the one inside), any other as it is."""
    inner = getattr(get_kind(artifact.kind), "inner", None)
    return artifact if inner is None else inner(artifact, keys)


def payload_bytes(artifact: ModelArtifact) -> bytes:
    """`to_bytes` of the kinds whose file is an opaque payload (memmapped, encrypted,
    tflite)."""
    assert artifact.payload is not None
    return artifact.payload


def payload_artifact(kind: str, data: bytes, signature: Mapping[str, Any]) -> ModelArtifact:
    """`from_bytes` of the payload kinds: the file's bytes as they are, no graph parsed."""
    return ModelArtifact(graph_def=None, kind=kind, payload=data, **signature_fields(signature))


def payload_codec(kind: str) -> tuple[Callable[[ModelArtifact], bytes],
                                      Callable[[bytes, Mapping[str, Any]], ModelArtifact]]:
    """`to_bytes` and `from_bytes` of payload kind `kind`: `to_bytes, from_bytes =
    payload_codec(NAME)` in its module."""
    return payload_bytes, functools.partial(payload_artifact, kind)


def deployed_graph(artifact: ModelArtifact, keys: KeyLookup | None = None) -> Any:
    """The GraphDef an app loads from the shipped file (ops_header, graph_view)."""
    return get_kind(artifact.kind).deployed_graph(artifact, keys)


def facts(artifact: ModelArtifact) -> dict[str, Any]:
    """What report.json shows of a model: its kind, the size and gzip size of the file that
    ships, and the const parameter count and op counts of the graph inside."""
    blob = to_bytes(artifact)
    summary = get_kind(artifact.kind).summary(artifact)
    return {"kind": artifact.kind,
            "size_bytes": len(blob),
            "gzip_size_bytes": len(gzip.compress(blob, compresslevel=9, mtime=0)),
            "params": int(summary["params"]),
            "ops": dict(sorted(summary["ops"].items()))}


def signature(inputs: Any, outputs: Any, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments shared by every kind's `from_bytes`."""
    from orchestrator.model.artifact import TensorSpec

    return {"inputs": tuple(TensorSpec.from_json(s) for s in inputs),
            "outputs": tuple(outputs), "metadata": dict(metadata)}


def signature_fields(sig: Mapping[str, Any]) -> dict[str, Any]:
    return signature(sig["inputs"], sig["outputs"], sig.get("metadata", {}))
