"""Run any Graph Transform Tool transforms, e.g. `fold_constants(ignore_errors=true)`.

The string is passed to TF's TransformGraph as written (the same syntax as the classic
`transform_graph --transforms=...`), with the model's inputs and outputs as context.
A TF failure, or a transform that loses an input or output node, fails the stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.graph_rewrite import apply_transforms
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    pass


class Params(StageParams):
    transforms: str = Field(
        ..., description="Graph Transform Tool transforms, space-separated, e.g. "
        "'fold_constants(ignore_errors=true) remove_nodes(op=CheckNumerics)'.")

    @field_validator("transforms")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        value = " ".join(value.split())
        if not value:
            raise ValueError("name at least one transform, e.g. 'fold_constants'")
        if value.count("(") != value.count(")"):
            raise ValueError(f"unbalanced parentheses in {value!r}")
        return value


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    graph_def = apply_transforms(artifact, params.transforms)
    return StageResult(artifact=artifact.replace(graph_def=graph_def),
                       metrics={"nodes_before": len(artifact.graph_def.node),
                                "nodes_after": len(graph_def.node)})


STAGE = register(Stage(name="transform", run=run, params=Params, doc=__doc__))
