"""sort_by_execution_order: every node after its inputs, outputs unchanged."""

from __future__ import annotations

from support.helpers_graphs import assert_same_outputs, noisy_graph, rand

from orchestrator.model.artifact import ModelArtifact, node_name
from orchestrator.stages import StageContext, get_stage
from orchestrator.stages.sort_by_execution_order import Params, run


def out_of_order(artifact: ModelArtifact) -> list[str]:
    """Nodes listed before one of their inputs."""
    seen: set[str] = set()
    late = []
    for node in artifact.graph_def.node:
        if any(node_name(i) not in seen for i in node.input):
            late.append(node.name)
        seen.add(node.name)
    return late


def test_sorts_a_reversed_graph() -> None:
    from tensorflow.core.framework import graph_pb2

    noisy = noisy_graph()
    reversed_graph = graph_pb2.GraphDef()
    reversed_graph.CopyFrom(noisy.graph_def)
    del reversed_graph.node[:]
    reversed_graph.node.extend(reversed(noisy.graph_def.node))
    before = noisy.replace(graph_def=reversed_graph)
    assert out_of_order(before)

    result = run(before, Params(), StageContext(pipeline="test", stage="sort"))
    after = result.artifact
    assert out_of_order(after) == []
    assert sorted(n.name for n in after.graph_def.node) == sorted(
        n.name for n in before.graph_def.node)
    assert result.metrics["nodes"] == len(before.graph_def.node)
    assert out_of_order(before)  # input untouched
    assert_same_outputs(before, after, rand(3, 3))


def test_registered() -> None:
    assert get_stage("sort_by_execution_order").run is run
