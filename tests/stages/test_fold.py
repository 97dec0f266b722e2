"""The fold stage on real frozen graphs: outputs unchanged, batch norms inside the weights."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.graph_rewrite import GraphIndex, data_inputs, op_counts
from orchestrator.stages import StageContext, get_stage
from orchestrator.stages.fold import Params, run

SHAPE_4D = (2, 8, 8, 3)
SHAPE_2D = (2, 6)
BN_LEFTOVERS = {"Mul", "Add", "AddV2", "Sub", "Rsqrt", "FusedBatchNorm", "FusedBatchNormV2",
                "FusedBatchNormV3", "BatchNormWithGlobalNormalization"}


def fold(artifact: ModelArtifact, **params: object):
    return run(artifact, Params(**params), StageContext(pipeline="test", stage="fold"))


@pytest.fixture
def same_outputs(run_graph):
    """Call with (before, after, input shape): both graphs agree on random inputs."""
    def check(before: ModelArtifact, after: ModelArtifact, shape: tuple) -> None:
        x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
        np.testing.assert_allclose(run_graph(after, x), run_graph(before, x),
                                   rtol=1e-5, atol=1e-5)
    return check


def scale_ops_after_weights(artifact: ModelArtifact) -> list[str]:
    """Batch norms, or Mul/Add of a constant, reading a conv, matmul or BiasAdd: unfolded."""
    index = GraphIndex.build(artifact.graph_def)
    weights = {"Conv2D", "DepthwiseConv2dNative", "MatMul", "BiasAdd"}
    left = []
    for node in artifact.graph_def.node:
        inputs = data_inputs(node)
        reads_weights = any(index.producer(name).op in weights for name in inputs)
        has_const = any(index.const_input(name) is not None for name in inputs)
        if node.op in BN_LEFTOVERS and reads_weights and (has_const or "Norm" in node.op):
            left.append(node.name)
    return left


def keras_layers(name: str) -> tuple[list, tuple]:
    import keras

    layers = keras.layers
    patterns = {
        "conv_no_bias": ([layers.Conv2D(4, 3, use_bias=False)], SHAPE_4D),
        "conv_bias": ([layers.Conv2D(4, 3)], SHAPE_4D),
        "depthwise": ([layers.DepthwiseConv2D(3, depth_multiplier=2)], SHAPE_4D),
        "depthwise_no_bias": ([layers.DepthwiseConv2D(3, depth_multiplier=2, use_bias=False)],
                              SHAPE_4D),
        "separable": ([layers.SeparableConv2D(5, 3)], SHAPE_4D),
        "dense": ([layers.Dense(4)], SHAPE_2D),
        "dense_no_bias": ([layers.Dense(4, use_bias=False)], SHAPE_2D),
        # Dilation makes TF wrap the conv in SpaceToBatchND ... BatchToSpaceND.
        "dilated_depthwise": ([layers.DepthwiseConv2D(3, dilation_rate=2)], SHAPE_4D),
    }
    return patterns[name]


@pytest.mark.parametrize("pattern", ["conv_no_bias", "conv_bias", "depthwise",
                                     "depthwise_no_bias", "separable", "dense", "dense_no_bias",
                                     "dilated_depthwise"])
def test_keras_batch_norm_folds_into_weights(pattern: str, keras_artifact,
                                             same_outputs) -> None:
    import keras

    weight_layers, shape = keras_layers(pattern)
    model = keras.Sequential([keras.Input(shape[1:]), *weight_layers,
                              keras.layers.BatchNormalization()])
    source = keras_artifact(model, shape)

    result = fold(source)

    same_outputs(source, result.artifact, shape)
    ops = op_counts(result.artifact.graph_def)
    assert not BN_LEFTOVERS & set(ops), ops
    assert ops["BiasAdd"] == 1
    assert result.metrics["batch_norms_folded"] == 1
    assert result.metrics["nodes_after"] < result.metrics["nodes_before"]
    assert result.warnings == []


SHAPE_3D = (2, 16, 3)


@pytest.mark.parametrize("conv", [
    {"filters": 4, "kernel_size": 3},
    {"filters": 4, "kernel_size": 3, "use_bias": False},
    {"filters": 4, "kernel_size": 5, "strides": 2, "padding": "same"},
    # Dilation wraps the conv in SpaceToBatchND ... Squeeze -> BatchToSpaceND.
    {"filters": 4, "kernel_size": 3, "dilation_rate": 2, "padding": "same"},
])
def test_conv1d_batch_norm_folds_through_squeeze(conv: dict, keras_artifact,
                                                 same_outputs) -> None:
    import keras

    model = keras.Sequential([keras.Input(SHAPE_3D[1:]), keras.layers.Conv1D(**conv),
                              keras.layers.BatchNormalization()])
    source = keras_artifact(model, SHAPE_3D)
    before = op_counts(source.graph_def)
    assert before["Squeeze"] >= 1 and before["Mul"] >= 1  # Keras 3: x * scale + offset

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_3D)
    ops = op_counts(result.artifact.graph_def)
    assert not BN_LEFTOVERS & set(ops), ops
    assert ops["Conv2D"] == 1 and ops["BiasAdd"] == 1
    assert result.metrics["batch_norms_folded"] == 1 and result.warnings == []


def conv1d_fused_pattern(bias: bool):
    """A Conv1D as TF lowers it, then a fused batch norm on a 4-D view of its output:
    ExpandDims -> Conv2D -> Squeeze -> [BiasAdd] -> ExpandDims -> FusedBatchNormV3 -> Squeeze."""
    import tensorflow as tf

    filters, bias_values = _constants(11, (1, 3, 3, 4), (4,))

    def fn(x):
        y = tf.nn.conv2d(tf.expand_dims(x, 1), filters, [1, 1, 2, 1], "SAME")
        y = tf.squeeze(y, [1])
        if bias:
            y = tf.nn.bias_add(y, bias_values)
        return tf.squeeze(_fused_batch_norm(tf.expand_dims(y, 1), 4), [1])

    return fn


@pytest.mark.parametrize("bias", [True, False])
def test_fused_batch_norm_after_conv1d_expand_dims_folds(bias: bool, tf_artifact,
                                                         same_outputs) -> None:
    source = tf_artifact(conv1d_fused_pattern(bias), SHAPE_3D)
    index = GraphIndex.build(source.graph_def)
    (bn,) = [n for n in source.graph_def.node if n.op == "FusedBatchNormV3"]
    assert index.producer(bn.input[0]).op == "ExpandDims"

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_3D)
    ops = op_counts(result.artifact.graph_def)
    assert not BN_LEFTOVERS & set(ops), ops
    assert ops["BiasAdd"] == 1
    assert result.metrics["batch_norms_folded"] == 1 and result.warnings == []


def test_scale_after_a_new_last_axis_is_left(tf_artifact, same_outputs) -> None:
    import tensorflow as tf

    # ExpandDims(-1) moves the channels off the last axis: a [1, 1, 1, 1, 4] constant then
    # broadcasts the new axis (an outer product), which no weight scaling can express.
    filters, scale = _constants(12, (3, 3, 3, 4), (1, 1, 1, 1, 4))
    source = tf_artifact(lambda x: tf.expand_dims(tf.nn.conv2d(x, filters, 1, "VALID"), -1)
                         * scale, SHAPE_4D)

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_4D)
    assert op_counts(result.artifact.graph_def)["Mul"] == 1
    assert result.metrics["batch_norms_folded"] == 0


def test_residual_add_is_not_taken_for_a_bias(keras_artifact, same_outputs) -> None:
    import keras

    layers = keras.layers
    inputs = keras.Input(SHAPE_4D[1:])
    h = layers.Conv2D(3, 3, padding="same")(inputs)
    h = layers.ReLU()(layers.BatchNormalization()(h))
    h = layers.Conv2D(3, 3, padding="same", use_bias=False)(h)
    h = layers.BatchNormalization()(h)
    outputs = layers.ReLU()(layers.Add()([h, inputs]))
    source = keras_artifact(keras.Model(inputs, outputs), SHAPE_4D)

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_4D)
    graph = result.artifact.graph_def
    assert scale_ops_after_weights(result.artifact) == []
    assert "Mul" not in op_counts(graph)
    (residual,) = [node for node in graph.node if node.op in {"Add", "AddV2"}]
    index = GraphIndex.build(graph)
    assert sorted(index.producer(name).op for name in residual.input) == [
        "BiasAdd", "Placeholder"]
    assert op_counts(graph)["BiasAdd"] == 2
    assert result.metrics["batch_norms_folded"] == 2


def _constants(seed: int, *shapes: tuple) -> list:
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    return [tf.constant(rng.uniform(0.3, 1.5, shape).astype(np.float32)) for shape in shapes]


def _fused_batch_norm(x, channels: int, version: str = "FusedBatchNormV3", seed: int = 2):
    import tensorflow as tf

    scale, offset, mean, variance = _constants(seed, *[(channels,)] * 4)
    op = getattr(tf.raw_ops, version)
    return op(x=x, scale=scale, offset=offset - 0.8, mean=mean - 0.5, variance=variance,
              epsilon=1e-3, is_training=False)[0]


def fused_pattern(name: str):
    """A function of one NHWC input ending in a fused batch norm, as Keras 2 froze them."""
    import tensorflow as tf

    filters, depthwise, bias = _constants(3, (3, 3, 3, 4), (3, 3, 3, 2), (4,))
    conv = lambda x: tf.nn.conv2d(x, filters, 1, "VALID")  # noqa: E731
    patterns = {
        "conv": lambda x: _fused_batch_norm(conv(x), 4),
        "conv_bias": lambda x: _fused_batch_norm(tf.nn.bias_add(conv(x), bias), 4),
        "conv_bias_v1": lambda x: _fused_batch_norm(tf.nn.bias_add(conv(x), bias), 4,
                                                    "FusedBatchNorm"),
        "depthwise": lambda x: _fused_batch_norm(
            tf.nn.depthwise_conv2d(x, depthwise, [1, 1, 1, 1], "VALID"), 6),
    }
    return patterns[name]


@pytest.mark.parametrize("pattern", ["conv", "conv_bias", "conv_bias_v1", "depthwise"])
def test_fused_batch_norm_folds_into_weights(pattern: str, tf_artifact,
                                             same_outputs) -> None:
    source = tf_artifact(fused_pattern(pattern), SHAPE_4D)

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_4D)
    ops = op_counts(result.artifact.graph_def)
    assert not BN_LEFTOVERS & set(ops), ops
    assert result.metrics["batch_norms_folded"] == 1
    assert result.warnings == []


def affine_pattern(name: str):
    """Hand-written `x * scale + offset` variants: operand order, Sub, transpose_b, shapes."""
    import tensorflow as tf

    filters, matrix, scale, offset = _constants(8, (3, 3, 3, 4), (4, 6), (4,), (4,))
    conv = lambda x: tf.nn.conv2d(x, filters, 1, "VALID")  # noqa: E731
    patterns = {
        "matmul_transpose_b_sub": lambda x: tf.matmul(x, matrix, transpose_b=True) * scale
        - offset,
        "const_first_4d_scale": lambda x: offset + tf.reshape(scale, [1, 1, 1, 4]) * conv(x),
        "scalar_scale": lambda x: tf.nn.bias_add(conv(x), offset) * 1.7 + offset,
        "two_affines": lambda x: (conv(x) * scale + offset) * offset - scale,
    }
    return patterns[name], SHAPE_2D if name.startswith("matmul") else SHAPE_4D


@pytest.mark.parametrize("pattern", ["matmul_transpose_b_sub", "const_first_4d_scale",
                                     "scalar_scale", "two_affines"])
def test_constant_scale_and_offset_variants_fold(pattern: str, tf_artifact,
                                                 same_outputs) -> None:
    fn, shape = affine_pattern(pattern)
    source = tf_artifact(fn, shape)

    result = fold(source)

    same_outputs(source, result.artifact, shape)
    ops = op_counts(result.artifact.graph_def)
    assert not BN_LEFTOVERS & set(ops), ops
    assert ops["BiasAdd"] == 1


def test_scale_that_is_not_per_channel_is_left(tf_artifact, same_outputs) -> None:
    import tensorflow as tf

    filters, spatial = _constants(9, (3, 3, 3, 4), (1, 6, 6, 4))
    source = tf_artifact(lambda x: tf.nn.conv2d(x, filters, 1, "VALID") * spatial, SHAPE_4D)

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_4D)
    assert "bad shape" in result.info["tf_transforms_skipped"]["fold_batch_norms"]
    assert op_counts(result.artifact.graph_def)["Mul"] == 1
    assert result.metrics["batch_norms_folded"] == 0
    assert result.warnings == []  # not a batch norm's shape: nothing to report


def test_shared_weights_are_copied_not_overwritten(tf_artifact, same_outputs) -> None:
    import tensorflow as tf

    (filters,) = _constants(4, (3, 3, 3, 4))

    def two_convs(x):
        a = _fused_batch_norm(tf.nn.conv2d(x, filters, 1, "VALID"), 4, seed=5)
        b = _fused_batch_norm(tf.nn.conv2d(x, filters, 1, "VALID"), 4, seed=6)
        return tf.concat([a, b], axis=-1)

    source = tf_artifact(two_convs, SHAPE_4D)

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_4D)
    assert result.metrics["batch_norms_folded"] == 2
    assert not BN_LEFTOVERS & set(op_counts(result.artifact.graph_def))


def test_batch_norm_on_a_shared_tensor_is_left_and_reported(tf_artifact,
                                                            same_outputs) -> None:
    import tensorflow as tf

    filters, bias = _constants(7, (3, 3, 3, 4), (4,))

    def branch(x):
        y = tf.nn.bias_add(tf.nn.conv2d(x, filters, 1, "VALID"), bias)
        return tf.concat([_fused_batch_norm(y, 4), tf.nn.relu(y)], axis=-1)

    source = tf_artifact(branch, SHAPE_4D)

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_4D)
    assert result.metrics["batch_norms_folded"] == 0
    assert len(result.warnings) == 1
    assert "FusedBatchNormV3 after BiasAdd" in result.warnings[0]
    assert result.info["batch_norms_unfolded"] == [
        {"node": "FusedBatchNormV3", "reason": "FusedBatchNormV3 after BiasAdd"}]


def test_batch_norm_after_relu_is_reported_not_folded(keras_artifact, same_outputs) -> None:
    import keras

    layers = keras.layers
    model = keras.Sequential([keras.Input(SHAPE_4D[1:]), layers.Conv2D(4, 3), layers.ReLU(),
                              layers.BatchNormalization()])
    source = keras_artifact(model, SHAPE_4D)

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_4D)
    assert result.metrics["batch_norms_folded"] == 0
    (warning,) = result.warnings
    (left,) = result.info["batch_norms_unfolded"]
    assert warning == f"batch norm not folded into weights: {left['node']} ({left['reason']})"
    assert left["reason"] == "scale after Relu, no conv or matmul before it"


def test_many_unfolded_batch_norms_make_one_short_line(keras_artifact, same_outputs) -> None:
    import keras

    layers = keras.layers
    model = keras.Sequential([keras.Input(SHAPE_4D[1:]), layers.ReLU(),
                              *[layers.BatchNormalization() for _ in range(5)]])
    source = keras_artifact(model, SHAPE_4D)

    result = fold(source)

    same_outputs(source, result.artifact, SHAPE_4D)
    assert result.metrics["batch_norms_unfolded"] == 5
    (warning,) = result.warnings
    names = [left["node"] for left in result.info["batch_norms_unfolded"]]
    assert warning.startswith("5 batch norms not folded into weights: ")
    assert warning.endswith(" and 2 more") and "\n" not in warning
    assert all(name in warning for name in names[:3])
    assert not any(name in warning for name in names[3:])


def test_input_graph_is_not_mutated(keras_artifact) -> None:
    import keras

    model = keras.Sequential([keras.Input(SHAPE_4D[1:]), keras.layers.Conv2D(4, 3),
                              keras.layers.BatchNormalization()])
    source = keras_artifact(model, SHAPE_4D)
    before = source.graph_bytes()

    result = fold(source)

    assert source.graph_bytes() == before
    assert result.artifact.graph_def is not source.graph_def
    assert result.artifact.outputs == source.outputs


def test_registered_with_documented_params() -> None:
    stage = get_stage("fold")
    assert stage.run is run and stage.params is Params
    assert "batch norm" in stage.doc
    assert all(field.description for field in Params.model_fields.values())
