"""compact_names: same outputs, shorter names, inputs and outputs untouched."""

from __future__ import annotations

import json
import re

import numpy as np

from orchestrator.measure.tf_runtime import predict
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.stages import StageContext, get_stage


def long_named_graph() -> ModelArtifact:
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="image")
        w = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3),
                        name="model/very_long_block_name_1/dense/kernel/Read/ReadVariableOp")
        h = tf.nn.relu(tf.matmul(x, w, name="model/very_long_block_name_1/dense/MatMul"),
                       name="model/very_long_block_name_1/dense/Relu")
        tf.identity(h, name="probs")
    return ModelArtifact(g.as_graph_def(), (TensorSpec("image", "float32", (None, 4)),),
                         ("probs",))


def test_names_shrink_and_outputs_stay_the_same() -> None:
    artifact = long_named_graph()
    before = artifact.graph_def.SerializeToString()
    stage = get_stage("compact_names")
    result = stage.run(artifact, stage.params(), StageContext(pipeline="p", stage="s"))
    names = [n.name for n in result.artifact.graph_def.node]
    assert "image" in names and "probs" in names
    assert all(re.fullmatch(r"n\d+", n) for n in names if n not in ("image", "probs"))
    assert result.artifact.graph_def.ByteSize() < artifact.graph_def.ByteSize()
    assert result.metrics["bytes_saved"] > 0
    mapping = json.loads(result.files["names.json"])
    assert mapping["model/very_long_block_name_1/dense/MatMul"] in names
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_array_equal(predict(result.artifact, x), predict(artifact, x))
    assert artifact.graph_def.SerializeToString() == before  # the input is not mutated


# --- on a real 8-bit graph: the file the README's int8 pipeline ships ---------------------

from support import quant_fixtures  # noqa: E402

cnn = quant_fixtures.cnn
digits = quant_fixtures.digits
int8 = quant_fixtures.int8


def _copy(artifact: ModelArtifact) -> ModelArtifact:
    """TF's import_graph_def writes default attrs into the GraphDef it is given: run copies."""
    from orchestrator.model.graph_rewrite import copy_graph

    return artifact.replace(graph_def=copy_graph(artifact.graph_def))


def test_an_int8_graph_ships_compact_names_and_keeps_its_interface(
        int8: ModelArtifact, digits: dict[str, np.ndarray]) -> None:
    from orchestrator.model import tf_adapter
    before = int8.graph_def.SerializeToString()
    result = quant_fixtures.apply("compact_names", int8)
    shipped = result.artifact.graph_def
    interface = set(int8.input_names) | set(int8.outputs)
    names = {n.name for n in shipped.node}
    assert interface <= names  # inputs and outputs keep their names
    assert all(re.fullmatch(r"n\d+", n) for n in names - interface)
    # 8-bit names such as ".../eightbit", "/q8/requant" or "_quantized_const" are gone
    assert not [n for n in names if "q8" in n or "quantized" in n or "/" in n]
    assert not [i for n in shipped.node for i in n.input if i.endswith(":0")]
    assert quant_fixtures.ops(result.artifact) == quant_fixtures.ops(int8)  # same ops
    # no attr equal to its op's default is left (TF fills them in at load)
    for node in shipped.node:
        op_def = tf_adapter.op_def(node.op)
        assert not [a.name for a in op_def.attr if a.HasField("default_value")
                    and a.name in node.attr and node.attr[a.name] == a.default_value], node.op
    assert result.metrics["default_attrs_stripped"] > 0
    # most of what the file held above its tensor payloads was names and attrs
    payload = sum(len(n.attr["value"].tensor.tensor_content) for n in int8.graph_def.node
                  if n.op == "Const")
    saved = len(before) - shipped.ByteSize()
    assert saved == result.metrics["bytes_saved"] > 0.5 * (len(before) - payload)
    # the same numbers, exactly, from the shipped bytes
    reloaded = ModelArtifact(_parse(shipped), int8.inputs, int8.outputs)
    x = digits["x_test"]
    np.testing.assert_array_equal(predict(reloaded, x), predict(_copy(int8), x))
    assert int8.graph_def.SerializeToString() == before  # the input is not mutated
    mapping = json.loads(result.files["names.json"])
    assert set(mapping) == {n.name for n in int8.graph_def.node} - interface


def _parse(graph_def):  # noqa: ANN001, ANN202
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef.FromString(graph_def.SerializeToString())


def test_default_attrs_can_be_kept(int8: ModelArtifact) -> None:
    kept = quant_fixtures.apply("compact_names", int8, strip_default_attrs=False)
    stripped = quant_fixtures.apply("compact_names", int8)
    assert kept.metrics["default_attrs_stripped"] == 0
    assert [n.name for n in kept.artifact.graph_def.node] == [
        n.name for n in stripped.artifact.graph_def.node]
    assert kept.artifact.graph_def.ByteSize() > stripped.artifact.graph_def.ByteSize()
    assert sum(len(n.attr) for n in kept.artifact.graph_def.node) == sum(
        len(n.attr) for n in int8.graph_def.node)
