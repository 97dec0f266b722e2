"""Run any Graph Transform Tool transforms, e.g. `fold_constants(ignore_errors=true)`.

The string is passed to TF's TransformGraph as written (the same syntax as the classic
`transform_graph --transforms=...`), with the model's inputs and outputs as context.
A TF failure, or a transform that loses an input or output node, fails the stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from orchestrator.errors import StageError
from orchestrator.model.artifact import ModelArtifact, node_name
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef


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


def missing_io(graph_def: GraphDef, artifact: ModelArtifact) -> list[str]:
    """The artifact's input and output nodes that `graph_def` lacks."""
    names = {n.name for n in graph_def.node}
    wanted = [*artifact.input_names, *artifact.outputs]
    return [w for w in wanted if node_name(w) not in names]


def apply_transforms(artifact: ModelArtifact, transforms: str) -> GraphDef:
    """TF's TransformGraph on the artifact's graph (a copy), with its inputs and outputs.

    Raises StageError naming the transforms on TF failures and on lost input/output nodes
    (the runner adds the pipeline and stage).
    """
    from orchestrator.model import tf_adapter
    outputs = sorted({node_name(o) for o in artifact.outputs})
    try:
        graph_def = tf_adapter.transform_graph(artifact.graph_def, artifact.input_names,
                                               outputs, transforms)
    except (ValueError, RuntimeError) as exc:  # TF's status errors surface as these
        raise StageError(f"transforms {transforms!r} failed: {exc}") from exc
    lost = missing_io(graph_def, artifact)
    if lost:
        raise StageError(f"transforms {transforms!r} removed or renamed the model's "
                         f"input/output nodes: {', '.join(lost)}")
    return graph_def


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    graph_def = apply_transforms(artifact, params.transforms)
    return StageResult(artifact=artifact.replace(graph_def=graph_def),
                       metrics={"nodes_before": len(artifact.graph_def.node),
                                "nodes_after": len(graph_def.node)})


STAGE = register(Stage(name="transform", run=run, params=Params, doc=__doc__))
