"""The graphdef kind: a frozen TensorFlow GraphDef, serialized as `model.pb`."""

from __future__ import annotations

from typing import Any

from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.kinds import KeyLookup, signature_fields

NAME = "graphdef"
FILE_NAME = "model.pb"


def to_bytes(artifact: ModelArtifact) -> bytes:
    return artifact.graph_bytes()


def from_bytes(data: bytes, signature: dict[str, Any]) -> ModelArtifact:
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString(data)
    return ModelArtifact(graph_def=graph_def, **signature_fields(signature))


def summary(artifact: ModelArtifact) -> dict[str, Any]:
    from orchestrator.model.graph_info import summarize

    found = summarize(artifact.graph_def)
    return {"params": found["params"], "ops": found["op_counts"]}


def deployed_graph(artifact: ModelArtifact, keys: KeyLookup | None = None) -> Any:
    return artifact.graph_def


def runnable(artifact: ModelArtifact, keys: KeyLookup | None = None) -> ModelArtifact:
    return artifact
