"""The memmapped kind: a package `MemmappedEnv` maps (see orchestrator.model.memmap_format)."""

from __future__ import annotations

from typing import Any

from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.graph_rewrite import op_counts
from orchestrator.model.kinds import KeyLookup, payload_codec

NAME = "memmapped"
FILE_NAME = "model.mmap"

to_bytes, from_bytes = payload_codec(NAME)


def summary(artifact: ModelArtifact) -> dict[str, Any]:
    """Ops as the package's graph has them (ImmutableConst), params of the weights."""
    from orchestrator.model.graph_info import summarize
    from orchestrator.model.memmap_format import read_package, rebuild

    package = read_package(to_bytes(artifact))
    return {"params": summarize(rebuild(package))["params"],
            "ops": op_counts(package.graph_def)}


def deployed_graph(artifact: ModelArtifact, keys: KeyLookup | None = None) -> Any:
    """The package's own graph: ImmutableConst nodes over its regions."""
    from orchestrator.model.memmap_format import read_package

    return read_package(to_bytes(artifact)).graph_def


def runnable(artifact: ModelArtifact, keys: KeyLookup | None = None) -> ModelArtifact:
    """The graph rebuilt from the package (Consts holding the regions' exact bytes)."""
    from orchestrator.model.memmap_format import read_package, rebuild

    return ModelArtifact(graph_def=rebuild(read_package(to_bytes(artifact))),
                         inputs=artifact.inputs, outputs=artifact.outputs,
                         metadata=artifact.metadata)
