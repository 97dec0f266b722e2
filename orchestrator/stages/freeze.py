"""Flatten the model into one plain GraphDef: no functions, no variables, only what it needs.

The loaders already turned variables into Const nodes. Freezing then:

- inlines every function call (PartitionedCall, StatefulPartitionedCall, direct calls) and
  lowers functional control flow (If, While, Case) to Switch/Merge, with grappler's
  function optimizer alone, so later transforms see the real ops; the library is cleared;
- prunes the graph to what the outputs need (inputs are kept);
- drops noise: `_output_shapes` and `_class` attrs, device placements (unless told not to),
  and control edges that order nothing (from Consts, and from Identity/NoOp nodes that
  only wait on Consts).

Output node names stay: a called function's node becomes an Identity (IdentityN for
several outputs) under the caller's name, so the model's outputs still resolve.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.freezing import freeze
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult


class Params(StageParams):
    clear_devices: bool = Field(
        True, description="Remove device placements, so the graph runs on any device.")


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    frozen, metrics = freeze(artifact, params.clear_devices)
    return StageResult(artifact=frozen, metrics=metrics)


STAGE = register(Stage(name="freeze", run=run, params=Params, doc=__doc__))
