"""graph_view: DOT views of the digits graphs parsed back with pydot, SVG rendering (or a
warning saying how to install Graphviz), and a TensorBoard log dir TensorBoard loads."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pydot
import pytest
from support import quant_fixtures
from support.quant_fixtures import apply

from orchestrator.model.artifact import ModelArtifact, node_name
from orchestrator.stages import StageContext, get_stage
from orchestrator.stages.graph_view import EVENTS_FILE

cnn = quant_fixtures.cnn
digits = quant_fixtures.digits

NO_DOT = "Graphviz's `dot` is not on PATH (apt-get install graphviz / brew install graphviz)"


int8 = quant_fixtures.int8  # the digits CNN through the whole 8-bit path
graph = quant_fixtures.fp32_and_int8


def parse(dot: bytes) -> pydot.Dot:
    graphs = pydot.graph_from_dot_data(dot.decode())
    assert graphs is not None and len(graphs) == 1, "not one valid DOT graph"
    return graphs[0]


def unquote(text: str) -> str:
    return text[1:-1].replace('\\"', '"').replace("\\\\", "\\") if text.startswith('"') \
        else text


def dot_nodes(graph: Any) -> dict[str, Any]:
    """Every node statement in `graph` and its subgraphs, by unquoted name."""
    found = {unquote(n.get_name()): n for n in graph.get_nodes()
             if n.get_name() not in ("node", "edge", "graph")}
    for sub in graph.get_subgraphs():
        found.update(dot_nodes(sub))
    return found


def dot_edges(graph: Any) -> list[Any]:
    return list(graph.get_edges()) + [e for s in graph.get_subgraphs() for e in dot_edges(s)]


def label_lines(node: Any) -> list[str]:
    return unquote(node.get("label")).split("\\n")


def test_types_view_has_every_op_type_its_count_and_the_flows(graph: ModelArtifact) -> None:
    before = graph.graph_bytes()
    result = apply("graph_view", graph, render=False, tensorboard=False)
    assert result.artifact is graph and result.artifact.graph_bytes() == before  # unchanged
    assert get_stage("graph_view").kind == "measure"
    assert set(result.files) == {"graph.dot"} and result.warnings == []
    view = parse(result.files["graph.dot"])
    ops = {n.name: n.op for n in graph.graph_def.node}
    counts = Counter(ops.values())
    nodes = dot_nodes(view)
    assert set(nodes) == set(counts)
    for op, node in nodes.items():
        assert label_lines(node) == [op, f"× {counts[op]}"]
    # one arrow per (producer type, consumer type, control?), labelled with its inputs
    expected: Counter[tuple[str, str, bool]] = Counter(
        (ops[node_name(i)], node.op, i.startswith("^"))
        for node in graph.graph_def.node for i in node.input)
    drawn = {(unquote(e.get_source()), unquote(e.get_destination()),
              e.get("style") == "dashed"): int(unquote(e.get("label")))
             for e in dot_edges(view)}
    assert drawn == dict(expected)
    assert result.metrics == {"graph_nodes": len(ops), "graph_op_types": len(counts)}


def test_files_depend_only_on_the_model_and_params(cnn: ModelArtifact) -> None:
    """What the cache key covers: a view cached for one pipeline may serve another."""
    stage = get_stage("graph_view")
    params = stage.params(all_nodes=True)
    first, second = (stage.run(cnn, params, StageContext(pipeline=name, stage="graph_view"))
                     for name in ("fp32", "other"))
    assert first.files == second.files and first.warnings == second.warnings


@pytest.mark.parametrize("cluster_by", ["name_scope", "op_type"])
def test_all_nodes_view_has_every_node_and_input(int8: ModelArtifact, cluster_by: str) -> None:
    result = apply("graph_view", int8, all_nodes=True, cluster_by=cluster_by, render=False,
                   tensorboard=False)
    view = parse(result.files["graph_nodes.dot"])
    ops = {n.name: n.op for n in int8.graph_def.node}
    nodes = dot_nodes(view)
    assert set(nodes) == set(ops)
    for name, node in nodes.items():
        assert label_lines(node) == [name.rsplit("/", 1)[-1], ops[name]]
    def output_label(name: str) -> str:  # ":k" for output k > 0
        index = 0 if name.startswith("^") or ":" not in name else int(name.rsplit(":", 1)[1])
        return f":{index}" if index else ""

    expected = sorted((node_name(i), n.name, i.startswith("^"), output_label(i))
                      for n in int8.graph_def.node for i in n.input)
    drawn = sorted((unquote(e.get_source()), unquote(e.get_destination()),
                    e.get("style") == "dashed", unquote(e.get("label") or '""'))
                   for e in dot_edges(view))
    assert drawn == expected

    def clusters(graph: Any, path: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """node -> labels of the clusters it sits in, outermost first."""
        found = {unquote(n.get_name()): path for n in graph.get_nodes()
                 if n.get_name() not in ("node", "edge", "graph")}
        for sub in graph.get_subgraphs():
            assert sub.get_name().startswith("cluster_")
            found.update(clusters(sub, (*path, unquote(sub.get("label")))))
        return found

    placed = clusters(view, ())
    for name, path in placed.items():
        if cluster_by == "op_type":
            count = sum(op == ops[name] for op in ops.values())
            assert path == (f"{ops[name]} ({count})",)
        else:
            assert path == tuple(name.split("/")[:-1])


@pytest.mark.skipif(shutil.which("dot") is None, reason=NO_DOT)
def test_svg_rendered_with_every_op_type(int8: ModelArtifact) -> None:
    result = apply("graph_view", int8, all_nodes=True, tensorboard=False)
    assert result.warnings == []
    assert set(result.files) == {"graph.dot", "graph.svg", "graph_nodes.dot", "graph_nodes.svg"}
    svg = result.files["graph.svg"].decode()
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    for op, count in Counter(n.op for n in int8.graph_def.node).items():
        assert f">{op}</text>" in svg and f">× {count}</text>" in svg
    nodes_svg = result.files["graph_nodes.svg"].decode()
    assert all(f"<title>{n.name}</title>" in nodes_svg for n in int8.graph_def.node)


def test_without_dot_the_dot_files_come_with_a_warning_how_to_install(
        cnn: ModelArtifact, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no `dot` on PATH
    result = apply("graph_view", cnn, all_nodes=True, tensorboard=False)
    assert set(result.files) == {"graph.dot", "graph_nodes.dot"}
    assert len(result.warnings) == 1
    warning = result.warnings[0]
    assert warning.startswith("graph.svg and graph_nodes.svg not rendered: Graphviz's `dot` "
                              "is not on PATH")
    assert "apt-get install graphviz" in warning and "brew install graphviz" in warning
    assert "dot -Tsvg graph.dot -o graph.svg" in warning
    # render: false asks for no SVG, so there is nothing to warn about
    assert apply("graph_view", cnn, render=False, tensorboard=False).warnings == []


def test_tensorboard_log_dir_holds_the_graph(int8: ModelArtifact, tmp_path: Path) -> None:
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = apply("graph_view", int8, render=False)
    assert EVENTS_FILE.startswith("tensorboard/") and EVENTS_FILE in result.files
    assert apply("graph_view", int8, render=False).files[EVENTS_FILE] == \
        result.files[EVENTS_FILE]  # the same graph gives the same bytes
    path = tmp_path / EVENTS_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(result.files[EVENTS_FILE])
    events = list(tf.compat.v1.train.summary_iterator(str(path)))
    assert [e.file_version for e in events] == ["brain.Event:2", ""]
    # TensorBoard's own loader (what its Graphs tab reads) finds the graph, unchanged
    accumulator = EventAccumulator(str(path.parent))
    accumulator.Reload()
    assert accumulator.Tags()["graph"] is True
    assert accumulator.Graph().SerializeToString(deterministic=True) == int8.graph_bytes()
