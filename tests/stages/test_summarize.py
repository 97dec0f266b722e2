"""summarize and graph_info: what summarize_graph reports, as data and as text."""

from __future__ import annotations

import numpy as np
from support.helpers_graphs import call_graph, noisy_graph, tf1_graph

from orchestrator.model import graph_info
from orchestrator.model.artifact import TensorSpec
from orchestrator.stages import StageContext, get_stage
from orchestrator.stages.summarize import Params, run


def test_stage_reports_and_passes_the_model_through() -> None:
    artifact = noisy_graph()
    result = run(artifact, Params(), StageContext(pipeline="test", stage="summarize"))
    assert result.artifact is artifact
    summary = result.info["summary"]
    assert summary["inputs"] == [{"name": "x", "dtype": "float32", "shape": [None, 3]}]
    assert summary["outputs"] == [{"name": "out", "op": "Identity"}]
    # every element of every numeric Const: w, the two scalars, unused_sum's axes
    consts = [n for n in artifact.graph_def.node if n.op == "Const"]
    expected = sum(int(np.prod([d.size for d in n.attr["value"].tensor.tensor_shape.dim]))
                   for n in consts)
    assert summary["params"] == summary["const_params"] == expected
    assert result.metrics == {"params": float(expected),
                              "nodes": float(len(artifact.graph_def.node))}
    assert summary["op_counts"]["Identity"] == 2 and list(summary["op_counts"]) == sorted(
        summary["op_counts"])
    assert get_stage("summarize").kind == "measure"


def test_detection_ignores_junk_and_unreached_nodes() -> None:
    import tensorflow as tf

    def build() -> None:
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        v = tf.compat.v1.get_variable("v", [2, 2])
        tf.nn.softmax(tf.matmul(x, v), name="y")
        tf.compat.v1.train.Saver()
        tf.compat.v1.global_variables_initializer()
        tf.constant(1.0) * 2.0  # a constant branch nothing reads  # noqa: B018

    graph_def = tf1_graph(build, [], []).graph_def
    assert graph_info.detect_inputs(graph_def) == [TensorSpec("x", "float32", (None, 2))]
    assert graph_info.detect_outputs(graph_def) == ["y"]
    summary = graph_info.summarize(graph_def)
    assert summary["variables"] == [{"name": "v", "dtype": "float32", "shape": [2, 2]}]
    assert summary["variable_params"] == 4
    assert summary["outputs"] == [{"name": "y", "op": "Softmax"}]
    assert "Found 1 variables: (name=v, type=float32, shape=[2,2])" in (
        graph_info.format_summary(summary))


def test_counts_quantized_and_immutable_consts_not_strings() -> None:
    import tensorflow as tf

    def build() -> None:
        tf.constant(np.zeros((3, 4), np.uint8), name="q_like")
        tf.constant(["a", "b"], name="strings")
        tf.raw_ops.ImmutableConst(dtype=tf.float32, shape=[10, 10],
                                  memory_region_name="memmapped_package://w", name="mapped")

    summary = graph_info.summarize(tf1_graph(build, [], []).graph_def)
    assert summary["const_params"] == 12 + 100


def test_functions_counted_and_text_layout() -> None:
    artifact = call_graph()
    summary = graph_info.summarize(artifact.graph_def, artifact.input_names,
                                   list(artifact.outputs))
    assert summary["functions"] > 0
    assert "Relu" in summary["op_counts"]  # lives only inside a library function
    text = graph_info.format_summary(summary)
    assert text.splitlines()[0] == "Found 1 possible inputs: (name=x, type=float32, shape=[?,4])"
    assert "No variables spotted." in text
    assert "const parameters" in text and "Op types used: " in text


def test_the_text_says_what_params_counts() -> None:
    artifact = call_graph()
    summary = graph_info.summarize(artifact.graph_def, artifact.input_names,
                                   list(artifact.outputs))
    text = graph_info.format_summary(summary)
    assert f"params: {summary['params']:,}, the elements of the graph's numeric constant" in text
    assert "report.json's `params` counts the same in the shipped file" in text
