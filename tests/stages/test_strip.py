"""strip: unused nodes gone, Identity/CheckNumerics bypassed, outputs kept, inputs reshaped."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from support.helpers_graphs import assert_same_outputs, noisy_graph, ops, rand, tf1_graph
from support.helpers_tf import run

from orchestrator.errors import StageError
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.stages import StageContext, get_stage
from orchestrator.stages.strip import Params
from orchestrator.stages.strip import run as strip_run

CTX = StageContext(pipeline="test", stage="strip")


def strip(artifact: ModelArtifact, **params: object) -> ModelArtifact:
    return strip_run(artifact, Params(**params), CTX).artifact


def placeholder_shape(artifact: ModelArtifact, name: str) -> list[int] | None:
    node = next(n for n in artifact.graph_def.node if n.name == name)
    shape = node.attr["shape"].shape
    return None if shape.unknown_rank else [d.size for d in shape.dim]


def test_registered() -> None:
    assert get_stage("strip").run is strip_run


def test_removes_unused_identity_and_check_numerics() -> None:
    before = noisy_graph()
    assert {"Identity", "CheckNumerics"} <= set(ops(before))
    result = strip_run(before, Params(), CTX)
    after = result.artifact
    names = {n.name for n in after.graph_def.node}
    assert "unused_sum" not in names
    assert "CheckNumerics" not in ops(after)
    # the output is an Identity node itself: it stays, and is the only Identity left
    assert [n.name for n in after.graph_def.node if n.op == "Identity"] == ["out"]
    assert after.outputs == ("out",)
    assert result.metrics["nodes_removed"] == len(before.graph_def.node) - len(names) > 0
    assert_same_outputs(before, after, rand(5, 3))


def test_input_shape_sets_placeholder_and_spec() -> None:
    before = noisy_graph()
    after = strip(before, input_shape=[1, 3])
    assert after.inputs == (TensorSpec("x", "float32", (1, 3)),)
    assert placeholder_shape(after, "x") == [1, 3]
    assert_same_outputs(before, after, rand(1, 3))

    free = strip(before, input_shape=[-1, 3], remove_nodes=[])
    assert free.inputs == (TensorSpec("x", "float32", (None, 3)),)
    assert placeholder_shape(free, "x") == [-1, 3]
    assert "CheckNumerics" in ops(free)  # remove_nodes=[] skips removal
    assert_same_outputs(before, free, rand(7, 3))


def test_inner_node_as_input_becomes_a_placeholder() -> None:
    """The classic use: cut preprocessing off by naming an inner node as the input."""
    import tensorflow as tf

    def build() -> None:
        raw = tf.compat.v1.placeholder(tf.float32, [None, 4], name="raw")
        pre = tf.multiply(raw, 2.0, name="pre")
        tf.nn.relu(pre - 1.0, name="y")

    spec = TensorSpec("pre", "float32", (None, 4))
    before = tf1_graph(build, [spec], ["y"])
    after = strip(before)
    nodes = {n.name: n.op for n in after.graph_def.node}
    assert nodes["pre"] == "Placeholder" and "raw" not in nodes
    assert placeholder_shape(after, "pre") == [-1, 4]
    assert_same_outputs(before, after, rand(3, 4))  # the runtime feeds 'pre' in both


def test_input_type_for_a_replaced_input() -> None:
    import tensorflow as tf

    def build() -> None:
        raw = tf.compat.v1.placeholder(tf.int32, [None, 2], name="raw")
        pre = tf.cast(raw, tf.float32, name="pre")
        tf.identity(pre * 2.0, name="y")

    before = tf1_graph(build, [TensorSpec("pre", "float32", (None, 2))], ["y"])
    after = strip(before, input_type="float")  # TF's spelling is accepted
    node = next(n for n in after.graph_def.node if n.name == "pre")
    assert node.op == "Placeholder" and node.attr["dtype"].type == tf.float32.as_datatype_enum
    assert after.inputs[0].dtype == "float32"
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_allclose(run(after, x)[0], x * 2.0)


def test_does_not_mutate_its_input() -> None:
    before = noisy_graph()
    snapshot = before.graph_def.SerializeToString(deterministic=True)
    strip(before, input_shape=[1, 3])
    assert before.graph_def.SerializeToString(deterministic=True) == snapshot
    assert before.inputs[0].shape == (None, 3)


def test_mismatches_are_clear_errors() -> None:
    with pytest.raises(StageError, match="cannot become int32"):
        strip(noisy_graph(), input_type="int32")
    with pytest.raises(StageError, match="does not fit"):
        strip(noisy_graph(), input_shape=[1, 4])


def test_params_are_validated() -> None:
    with pytest.raises(ValidationError, match="unknown dtype"):
        Params(input_type="floaty")
    with pytest.raises(ValidationError, match="a dimension is a size, or -1"):
        Params(input_shape=[1, -2])
    with pytest.raises(ValidationError):
        Params(remove_ops=["Identity"])  # unknown param
