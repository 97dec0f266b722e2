"""The tflite kind: a LiteRT flatbuffer, `model.tflite`, run by `ai_edge_litert`'s Interpreter.

A flatbuffer is mapped as it is, so memmap does not apply; the file's bytes are the
payload. Its facts (ops, params) are read from the flatbuffer with LiteRT's own schema
reader, never by hand.
"""

from __future__ import annotations

from typing import Any

from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.kinds import KeyLookup, payload_codec

NAME = "tflite"
FILE_NAME = "model.tflite"
to_bytes, from_bytes = payload_codec(NAME)


def summary(artifact: ModelArtifact) -> dict[str, Any]:
    """Builtin op counts (LiteRT's names, e.g. CONV_2D) and the constant parameter count."""
    from orchestrator.model.litert_model import describe

    found = describe(to_bytes(artifact))
    return {"params": found.params, "ops": found.op_counts}


def deployed_graph(artifact: ModelArtifact, keys: KeyLookup | None = None) -> Any:
    raise TypeError("a tflite model has no GraphDef: it ships as a flatbuffer")


def runnable(artifact: ModelArtifact, keys: KeyLookup | None = None) -> ModelArtifact:
    """Itself: the runtime's open_runner runs it with LiteRT's interpreter."""
    return artifact
