"""Sort the nodes so that every node comes after its inputs (TF's sort_by_execution_order).

Some runtimes execute a GraphDef in file order; this makes that order valid. The model's
outputs are unchanged.
"""

from __future__ import annotations

from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.graph_rewrite import apply_transforms
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult


class Params(StageParams):
    """No parameters besides ignore_errors."""


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    graph_def = apply_transforms(artifact, "sort_by_execution_order")
    return StageResult(artifact=artifact.replace(graph_def=graph_def),
                       metrics={"nodes": len(graph_def.node)})


STAGE = register(Stage(name="sort_by_execution_order", run=run, params=Params, doc=__doc__))
