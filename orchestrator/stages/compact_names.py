"""Short node names (`n0`, `n1`...) except inputs and outputs; added by default to 8-bit pipelines.

Exported graphs keep long traced names (`model/block_1/separable_conv2d/ReadVariableOp`),
and eight-bit graphs add more nodes with longer names: on small models the names and the
input references that repeat them are a third of what the file holds above its weights.
Mobile runtimes look nodes up only by their inputs and outputs, which keep their names. The
old -> new mapping is written as `names.json`, so that profiles of the shipped graph can
still be read against the original model. With `strip_default_attrs` (the default), attrs
that equal their op's default are dropped too, as TF's SavedModel export does: TF fills
them back in when it loads the graph.

Added by default: a pipeline with `quantize_nodes` in its lineage gets `compact_names`
after its last graphdef transform (after `freeze_ranges`, whose per-layer diagnostics and
the accuracy guard match nodes by their float names; before `memmap` and `encrypt`), and
report.json lists it with the pipeline's stages. A pipeline opts out with `keep_names:
true`; listing `compact_names` yourself puts it where you want it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pydantic import Field

from orchestrator.model.artifact import ModelArtifact, node_name
from orchestrator.model.graph_rewrite import copy_graph, rename_nodes
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef


class Params(StageParams):
    prefix: str = Field("n", pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
                        description="Prefix of the new names, followed by a counter.")
    strip_default_attrs: bool = Field(
        True, description="Drop attrs equal to their op's default, as TF's SavedModel "
        "export does (TF adds them back at load): fewer bytes, and runtimes older than an "
        "attr still load the graph.")


def strip_default_attrs(graph: GraphDef) -> int:
    """Remove, in place, every attr whose value is its OpDef's default; returns how many."""
    from orchestrator.model import tf_adapter
    removed = 0
    for node in graph.node:
        op_def = tf_adapter.op_def(node.op)
        if op_def is None:
            continue  # an op this TF does not know: leave it as it is
        for attr in op_def.attr:
            if attr.HasField("default_value") and attr.name in node.attr \
                    and node.attr[attr.name] == attr.default_value:
                del node.attr[attr.name]
                removed += 1
    return removed


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    graph = copy_graph(artifact.graph_def)
    keep = set(artifact.input_names) | {node_name(o) for o in artifact.outputs}
    taken = {n.name for n in graph.node}
    mapping: dict[str, str] = {}
    counter = 0
    for node in graph.node:
        if node.name in keep:
            continue
        while f"{params.prefix}{counter}" in taken:
            counter += 1
        mapping[node.name] = f"{params.prefix}{counter}"
        counter += 1
    rename_nodes(graph, mapping)
    stripped = strip_default_attrs(graph) if params.strip_default_attrs else 0
    before = artifact.graph_def.ByteSize()
    after = graph.ByteSize()
    return StageResult(
        artifact=artifact.replace(graph_def=graph),
        metrics={"renamed_nodes": float(len(mapping)), "default_attrs_stripped": float(stripped),
                 "bytes_saved": float(before - after)},
        files={"names.json": json.dumps(mapping, indent=1, sort_keys=True).encode()})


STAGE = register(Stage(name="compact_names", run=run, params=Params, doc=__doc__ or "",
                       compacts_names=True))
