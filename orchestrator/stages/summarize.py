"""Report what summarize_graph prints: inputs, outputs, parameters and op types.

A measuring stage: the model passes through unchanged. The summary goes to the report's
`summary` info; `params` (constant parameters) and `nodes` are logged as metrics.
"""

from __future__ import annotations

from orchestrator.model.artifact import ModelArtifact
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult


class Params(StageParams):
    """No parameters besides ignore_errors."""


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.model.graph_info import summarize

    summary = summarize(artifact.graph_def, artifact.input_names, list(artifact.outputs))
    return StageResult(artifact=artifact, info={"summary": summary},
                       metrics={"params": float(summary["params"]),
                                "nodes": float(summary["nodes"])})


STAGE = register(Stage(name="summarize", run=run, params=Params, doc=__doc__,
                       kind="measure"))
