"""freeze: function calls inlined, control flow lowered, library gone, outputs unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.helpers_graphs import (
    assert_same_outputs,
    call_graph,
    noisy_graph,
    ops,
    rand,
    tf1_graph,
    tf1_loaded,
)
from support.helpers_tf import module_saved_model, run

from orchestrator.errors import StageError
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.freezing import CONTROL_FLOW_OPS
from orchestrator.stages import StageContext, get_stage
from orchestrator.stages.freeze import Params
from orchestrator.stages.freeze import run as freeze_run

CALLS = {"PartitionedCall", "StatefulPartitionedCall"}
CTX = StageContext(pipeline="test", stage="freeze")


def freeze(artifact: ModelArtifact, **params: object) -> ModelArtifact:
    return freeze_run(artifact, Params(**params), CTX).artifact


def assert_flat(artifact: ModelArtifact) -> None:
    graph = artifact.graph_def
    assert not (set(ops(artifact)) & (CALLS | CONTROL_FLOW_OPS)), ops(artifact)
    assert len(graph.library.function) == 0
    names = {n.name for n in graph.node}
    assert set(artifact.input_names) <= names
    assert {o.split(":")[0] for o in artifact.outputs} <= names


def test_registered() -> None:
    assert get_stage("freeze").run is freeze_run


def test_inlines_calls_and_lowers_control_flow() -> None:
    before = call_graph()
    assert {"PartitionedCall", "StatelessIf", "StatelessWhile"} <= set(ops(before))
    result = freeze_run(before, Params(), CTX)
    after = result.artifact
    assert_flat(after)
    assert {"Switch", "Merge", "Enter", "Exit", "NextIteration"} <= set(ops(after))
    assert after.outputs == before.outputs  # output names stay
    assert result.metrics["functions_inlined"] == len(before.graph_def.library.function) > 0
    for seed in range(3):  # both branches of the cond
        x = rand(2, 4, seed=seed) * (1 if seed else -10)
        assert_same_outputs(before, after, x)


def test_stateful_call_from_tf1_loader(tmp_path: Path) -> None:
    import tensorflow as tf

    saved = module_saved_model(tmp_path / "sm")
    before = tf1_loaded(saved)
    (output,) = before.outputs
    by_name = {n.name: n for n in before.graph_def.node}
    assert by_name[output].op == "StatefulPartitionedCall"  # the call is the output itself

    after = freeze(before)
    assert_flat(after)
    assert after.outputs == before.outputs
    # the call node became a plain Identity under its own name
    assert {n.name: n.op for n in after.graph_def.node}[output] == "Identity"
    x = rand(5, 3)
    expected = tf.saved_model.load(str(saved)).signatures["serving_default"](
        x=tf.constant(x))["y"].numpy()
    np.testing.assert_allclose(run(after, x)[0], expected, rtol=1e-5, atol=1e-5)
    assert_same_outputs(before, after, x)


def test_prunes_to_outputs_and_cleans_attrs() -> None:
    import tensorflow as tf

    noisy = noisy_graph()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(noisy.graph_def, name="")
    graph_def = graph.as_graph_def(add_shapes=True)
    for node in graph_def.node:
        node.device = "/device:CPU:0"
    before = noisy.replace(graph_def=graph_def)
    assert any("_output_shapes" in n.attr for n in before.graph_def.node)

    after = freeze(before)
    names = {n.name for n in after.graph_def.node}
    assert "unused_sum" not in names and "x" in names
    assert not any("_output_shapes" in n.attr or n.device for n in after.graph_def.node)
    assert_same_outputs(before, after, rand(4, 3))
    kept = freeze(before, clear_devices=False)
    assert all(n.device == "/device:CPU:0" for n in kept.graph_def.node)


def test_does_not_mutate_its_input() -> None:
    before = call_graph()
    snapshot = before.graph_def.SerializeToString(deterministic=True)
    freeze(before)
    assert before.graph_def.SerializeToString(deterministic=True) == snapshot


def test_variables_left_are_an_error() -> None:
    import tensorflow as tf

    def build() -> None:
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        v = tf.compat.v1.get_variable("v", [2, 2], use_resource=False)
        tf.matmul(x, v, name="y")

    artifact = tf1_graph(build, [TensorSpec("x", "float32", (None, 2))], ["y"])
    with pytest.raises(StageError, match="variables"):
        freeze(artifact)


def test_digits_saved_model_load_freeze_strip(digits_example: Path) -> None:
    """The example end to end: within 1e-5 of the SavedModel's own signature."""
    import tensorflow as tf

    from orchestrator.model.sources import load_model
    from orchestrator.stages.strip import Params as StripParams
    from orchestrator.stages.strip import run as strip_run

    saved = digits_example / "saved_model"
    x = np.load(digits_example / "data.npz")["x_test"][:16]
    expected = tf.saved_model.load(str(saved)).signatures["serving_default"](
        image=tf.constant(x))["output_0"].numpy()

    loaded = load_model(saved)
    frozen = freeze(loaded)
    stripped = strip_run(frozen, StripParams(), StageContext("test", "strip")).artifact
    for artifact in (loaded, frozen, stripped):
        np.testing.assert_allclose(run(artifact, x)[0], expected, rtol=1e-5, atol=1e-5)
    assert not (set(ops(stripped)) & CALLS)
    assert set(ops(stripped)) >= {"Conv2D", "MatMul", "Softmax"}
    identities = [n.name for n in stripped.graph_def.node if n.op == "Identity"]
    assert identities == list(stripped.outputs)
