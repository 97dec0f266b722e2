"""ModelArtifact: a model of some kind (a GraphDef, a memmapped package, an encrypted blob)
plus its input/output signature and metadata.

Artifacts are immutable values: stages build new ones with `replace`, never mutate.
TensorFlow is imported lazily so that `orchestrator validate` stays fast. What each kind
means (its file, its facts, how to run it) lives in `orchestrator.model.kinds`, one module per
kind; this module knows none of them, so it imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef


@dataclass(frozen=True)
class TensorSpec:
    """A model input: node name, dtype name and shape (None or -1 for unknown dims)."""

    name: str
    dtype: str = "float32"
    shape: tuple[int | None, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype,
                "shape": None if self.shape is None else list(self.shape)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorSpec:
        shape = data.get("shape")
        return cls(name=data["name"], dtype=data.get("dtype", "float32"),
                   shape=None if shape is None else tuple(None if d in (None, -1) else int(d)
                                                          for d in shape))


def tensor_name(name: str) -> str:
    """'node' -> 'node:0'; 'node:1' stays."""
    return name if ":" in name else f"{name}:0"


def node_name(name: str) -> str:
    """'node:1' / '^node' -> 'node'."""
    return name.lstrip("^").split(":")[0]


@dataclass(frozen=True)
class ModelArtifact:
    """A model: what flows between stages.

    `kind` is "graphdef" (then `graph_def` holds the graph) or another artifact kind of
    `orchestrator.model.kinds`, whose file bytes are in `payload` (graph_def is then None).
    `outputs` are node names (optionally with ':k'). `metadata` is JSON-serialisable and
    travels with the model, e.g. `min_max_log` from log_ranges for freeze_ranges.
    `facts` (not serialized, not compared) are summary facts a kind cannot recompute from
    its bytes alone, such as the op counts inside an encrypted blob.
    """

    graph_def: GraphDef | None
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "graphdef"
    payload: bytes | None = field(default=None, repr=False)
    facts: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    def replace(self, **changes: Any) -> ModelArtifact:
        """A new artifact with some fields changed (metadata is merged, not replaced)."""
        if "metadata" in changes:
            changes["metadata"] = {**self.metadata, **changes["metadata"]}
        return dataclasses.replace(self, **changes)

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def graph_bytes(self) -> bytes:
        """The serialized GraphDef (graphdef kind only; see orchestrator.model.kinds for others)."""
        if self.graph_def is None:
            raise TypeError(f"a {self.kind} artifact has no GraphDef; use orchestrator.model.kinds")
        return self.graph_def.SerializeToString(deterministic=True)

    def signature_json(self) -> str:
        return json.dumps({"kind": self.kind,
                           "inputs": [s.to_json() for s in self.inputs],
                           "outputs": list(self.outputs),
                           "metadata": dict(self.metadata)}, indent=2, sort_keys=True)

    @classmethod
    def from_bytes(cls, graph_bytes: bytes, signature_json: str) -> ModelArtifact:
        from tensorflow.core.framework import graph_pb2

        graph_def = graph_pb2.GraphDef()
        graph_def.ParseFromString(graph_bytes)
        sig = json.loads(signature_json)
        return cls(graph_def=graph_def,
                   inputs=tuple(TensorSpec.from_json(s) for s in sig["inputs"]),
                   outputs=tuple(sig["outputs"]),
                   metadata=sig.get("metadata", {}))

