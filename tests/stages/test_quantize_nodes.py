"""quantize_nodes: eight-bit ops, 8-bit weights, ops/exclude_nodes, fallback ranges."""

from __future__ import annotations

import os

import numpy as np
import pytest
from pydantic import ValidationError
from support import quant_fixtures
from support.quant_fixtures import accuracy, agreement, apply, freeze, nodes, ops, predict

from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.graph_rewrite import copy_graph
from orchestrator.quant.ranges import weight_stats
from orchestrator.stages import get_stage

# Fixtures shared by the eight-bit stage tests: bound here so that pytest finds them.
cnn = quant_fixtures.cnn
digits = quant_fixtures.digits


def float_ops(artifact: ModelArtifact) -> set[str]:
    return {n.op for n in artifact.graph_def.node} & {"Conv2D", "MatMul", "BiasAdd", "Relu",
                                                      "MaxPool"}


def test_cnn_runs_in_eight_bits(cnn, digits) -> None:  # noqa: ANN001
    result = apply("quantize_nodes", cnn)
    out = result.artifact
    counts = ops(out)
    assert counts["QuantizedConv2D"] == 2 and counts["QuantizedMatMul"] == 2
    # each bias is added in its conv/matmul's int32 accumulator (orchestrator.quant.integer_bias)
    assert "QuantizedBiasAdd" not in counts and result.info["biases_in_accumulator"] == 4
    assert counts["Bitcast"] == 8 and counts["QuantizedRelu"] == 3
    assert counts["QuantizedMaxPool"] == 1
    assert counts["RequantizationRange"] == result.metrics["requantization_ranges"] > 0
    assert not float_ops(out)
    # Weights are stored as quint8, even without quantize_weights; only the biases stay
    # float32 (66 values, added in the accumulators at full precision).
    stats = weight_stats(out.graph_def)
    assert stats.float_elements == 66 and stats.quantized_fraction > 0.99
    assert out.graph_def.ByteSize() < 0.55 * cnn.graph_def.ByteSize()  # tiny: names weigh
    x, y = digits["x_test"], digits["y_test"]
    before, after = predict(cnn, x), predict(out, x)
    assert agreement(before, after) >= 0.97
    assert accuracy(after, y) >= accuracy(before, y) - 0.02
    assert out.inputs == cnn.inputs and out.outputs == cnn.outputs


def test_after_quantize_weights_the_8bit_weights_are_used_directly(cnn, digits) -> None:  # noqa: ANN001
    weighted = apply("quantize_weights", cnn, minimum_size=1).artifact
    out = apply("quantize_nodes", weighted).artifact
    by_name = nodes(out)
    # No Dequantize -> QuantizeV2 round trips left, nothing dangling.
    for node in out.graph_def.node:
        if node.op == "QuantizeV2":
            assert by_name[node.input[0].split(":")[0]].op != "Dequantize"
    for node in out.graph_def.node:
        if node.op in ("QuantizedConv2D", "QuantizedMatMul"):
            weights = by_name[node.input[1]]
            assert weights.op == "Const" and weights.attr["dtype"].type == 12  # quint8
            # ... the very bytes quantize_weights produced.
            assert weights.attr["value"] == nodes(weighted)[weights.name].attr["value"]
    assert ops(out)["Dequantize"] == 1  # only the float output of the last op
    x = digits["x_test"]
    assert agreement(predict(cnn, x), predict(out, x)) >= 0.97


def test_ops_limits_the_converted_types(cnn, digits) -> None:  # noqa: ANN001
    out = apply("quantize_nodes", cnn, ops=["Conv2D"]).artifact
    counts = ops(out)
    assert counts["QuantizedConv2D"] == 2
    assert counts["MatMul"] == 2 and counts["BiasAdd"] == 4 and counts["Relu"] == 3
    assert not [op for op in counts if op.startswith("Quantized") and op != "QuantizedConv2D"]
    x = digits["x_test"]
    assert agreement(predict(cnn, x), predict(out, x)) >= 0.97


def test_exclude_nodes_stay_float_under_their_names(cnn, digits) -> None:  # noqa: ANN001
    convs = [n.name for n in cnn.graph_def.node if n.op == "Conv2D"]
    matmuls = [n.name for n in cnn.graph_def.node if n.op == "MatMul"]
    excluded = [convs[1], matmuls[0]]
    result = apply("quantize_nodes", cnn, exclude_nodes=excluded)
    by_name = nodes(result.artifact)
    for name in excluded:
        assert by_name[name].op in ("Conv2D", "MatMul")
        assert by_name[name].attr["T"].type == 1  # still float
    counts = ops(result.artifact)
    assert counts["QuantizedConv2D"] == 1 and counts["QuantizedMatMul"] == 1
    assert sorted(result.info["excluded_nodes"]) == sorted(excluded)
    x = digits["x_test"]
    assert agreement(predict(cnn, x), predict(result.artifact, x)) >= 0.97


def test_exclude_nodes_must_exist(cnn) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="no_such_node"):
        apply("quantize_nodes", cnn, exclude_nodes=["no_such_node"])


def test_fallback_range_replaces_dynamic_ranges(cnn, digits) -> None:  # noqa: ANN001
    out = apply("quantize_nodes", cnn, fallback_min=-10.0, fallback_max=30.0).artifact
    counts = ops(out)
    assert "RequantizationRange" not in counts
    assert counts["Requantize"] > 0
    assert counts["QuantizedConv2D"] == 2
    predict(out, digits["x_test"][:10])  # runs


def test_add_of_a_bias_goes_into_the_accumulator(digits) -> None:  # noqa: ANN001
    import keras
    from keras import layers

    keras.utils.set_random_seed(3)
    inputs = keras.Input(shape=(8, 8, 1))
    x = layers.Conv2D(8, 3, use_bias=False)(inputs)
    x = layers.Lambda(lambda t: t + np.linspace(-1, 1, 8).astype("float32"))(x)
    x = layers.ReLU()(x)
    x = layers.Flatten()(x)
    outputs = layers.Dense(10, use_bias=False)(x)
    model = freeze(keras.Model(inputs, outputs), (None, 8, 8, 1))
    assert ops(model)["AddV2"] == 1
    result = apply("quantize_nodes", model)
    assert result.info["bias_adds_rewritten"] == 1
    assert result.info["biases_in_accumulator"] == 1
    assert "QuantizedBiasAdd" not in ops(result.artifact)
    assert [n.attr["T"].type for n in result.artifact.graph_def.node
            if n.op == "AddV2"] == [3]  # the one add left is the accumulator's, in int32
    x = digits["x_test"]
    np.testing.assert_allclose(predict(result.artifact, x), predict(model, x), atol=0.25)


def test_short_names_keep_inputs_and_outputs(cnn) -> None:  # noqa: ANN001
    short = apply("quantize_nodes", cnn).artifact
    classic = apply("quantize_nodes", cnn, short_names=False).artifact
    assert not [n.name for n in short.graph_def.node if "eightbit" in n.name]
    assert [n.name for n in classic.graph_def.node if n.name.endswith("/eightbit")]
    for out in (short, classic):
        names = set(nodes(out))
        assert "image" in names and "Identity" in names
    assert short.graph_def.ByteSize() < classic.graph_def.ByteSize()
    assert sorted(ops(short).items()) == sorted(ops(classic).items())


def test_shape_reads_the_quantized_tensor(cnn) -> None:  # noqa: ANN001
    out = apply("quantize_nodes", cnn).artifact
    by_name = nodes(out)
    shapes = [n for n in out.graph_def.node if n.op == "Shape"]
    assert shapes  # Flatten's dynamic batch size
    for node in shapes:
        assert by_name[node.input[0].split(":")[0]].op.startswith("Quantized")


def test_input_is_not_mutated(cnn) -> None:  # noqa: ANN001
    before = copy_graph(cnn.graph_def)
    convs = [n.name for n in cnn.graph_def.node if n.op == "Conv2D"]
    apply("quantize_nodes", cnn, exclude_nodes=convs[:1])
    assert cnn.graph_def == before


def test_no_quantizable_op_warns() -> None:
    import tensorflow as tf

    from orchestrator.model.graph_rewrite import subgraph

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        tf.nn.softmax(x, name="y")
    model = ModelArtifact(subgraph(graph.as_graph_def(), ["x", "y"]),
                          (TensorSpec("x", "float32", (None, 4)),), ("y",))
    result = apply("quantize_nodes", model)
    assert result.metrics["quantized_ops"] == result.metrics["quantizable_ops"] == 0
    assert result.warnings[-1].startswith("quantize_nodes converted no op to eight bits: the "
                                          "graph has none of")


def test_params_are_checked() -> None:
    params = get_stage("quantize_nodes").params
    assert params().guard is False and params(guard=True).guard is True
    with pytest.raises(ValidationError, match="Softmax"):
        params(ops=["Softmax"])
    with pytest.raises(ValidationError, match="fallback_max"):
        params(fallback_min=-1.0)
    with pytest.raises(ValidationError):
        params(fallback_min=1.0, fallback_max=-1.0)


# --- what the eight-bit kernels can run (orchestrator.quant.kernel_support) ---------------------

def _const(*shape: int) -> object:
    import tensorflow as tf

    return tf.constant(np.random.default_rng(len(shape)).normal(size=shape).astype(np.float32))


def _one_op_graph(shape: list[int], fn) -> ModelArtifact:  # noqa: ANN001
    import tensorflow as tf

    from orchestrator.model.graph_rewrite import subgraph

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, shape, name="x")
        tf.identity(fn(x), name="y")
    return ModelArtifact(subgraph(graph.as_graph_def(), ["x", "y"]),
                         (TensorSpec("x", "float32", tuple(shape)),), ("y",))


def _raw(name: str):  # noqa: ANN202
    import tensorflow as tf

    return getattr(tf.raw_ops, name)


def _conv(**kwargs: object):  # noqa: ANN202
    import tensorflow as tf

    return lambda x: tf.nn.conv2d(x, _const(3, 3, 3, 4), **kwargs)


# (shape, graph) that GTT converts into ops TF 2.21 runs correctly.
RUNNABLE = {
    "conv_equal_strides": ([1, 9, 9, 3], _conv(strides=[1, 2, 2, 1], padding="SAME")),
    "matmul_transposed": ([3, 2], lambda x: _raw("MatMul")(a=x, b=_const(4, 3),
                                                           transpose_a=True, transpose_b=True)),
    "maxpool_unequal": ([1, 9, 9, 3], lambda x: _raw("MaxPool")(
        input=x, ksize=[1, 1, 2, 1], strides=[1, 1, 2, 1], padding="VALID")),
    "avgpool_unequal_same": ([1, 9, 9, 3], lambda x: _raw("AvgPool")(
        value=x, ksize=[1, 3, 2, 1], strides=[1, 1, 2, 1], padding="SAME")),
    "add_channel_vector": ([2, 4, 4, 3], lambda x: _raw("Add")(x=x, y=_const(3))),
    "add_trailing_dims": ([2, 4, 4, 3], lambda x: _raw("Add")(x=x, y=_const(4, 4, 3))),
    "mul_scalar": ([2, 4, 4, 3], lambda x: _raw("Mul")(x=x, y=_const())),
    "resize_align_corners": ([1, 4, 4, 3], lambda x: _raw("ResizeBilinear")(
        images=x, size=[8, 8], align_corners=True)),
    "reshape_int32": ([2, 4, 4, 3], lambda x: _raw("Reshape")(tensor=x, shape=[2, -1])),
}
# (shape, graph, the op, the rule in the warning, what GTT's plain conversion does).
LIMITED = {
    "conv_unequal_strides": ([1, 9, 9, 3], _conv(strides=[1, 1, 2, 1], padding="SAME"),
                             "Conv2D", "QuantizedConv2D needs equal strides, has [1, 1, 2, 1]",
                             "fails"),
    "conv_dilated": ([1, 9, 9, 3], _conv(strides=1, padding="VALID", dilations=2),
                     "Conv2D", "QuantizedConv2D cannot dilate", "wrong"),
    "conv_explicit_padding": ([1, 9, 9, 3], _conv(strides=1, padding=[[0, 0], [1, 1], [2, 2],
                                                                      [0, 0]]),
                              "Conv2D", "needs SAME or VALID padding, has EXPLICIT", "fails"),
    "conv_nchw": ([1, 3, 9, 9], _conv(strides=1, padding="SAME", data_format="NCHW"),
                  "Conv2D", "QuantizedConv2D needs NHWC, has NCHW", "fails"),
    # MaxPool's Eigen kernel pools across channels; its oneDNN kernel (when enabled) fails.
    "maxpool_depth": ([1, 4, 4, 4], lambda x: _raw("MaxPool")(
        input=x, ksize=[1, 1, 1, 2], strides=[1, 1, 1, 2], padding="VALID"),
        "MaxPool", "QuantizedMaxPool pools only spatially",
        "ok" if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0" else "fails"),
    "maxpool_explicit": ([1, 9, 9, 3], lambda x: _raw("MaxPool")(
        input=x, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="EXPLICIT",
        explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0]),
        "MaxPool", "needs SAME or VALID padding", "fails"),
    "bias_add_nchw": ([1, 3, 4, 4], lambda x: _raw("BiasAdd")(value=x, bias=_const(3),
                                                              data_format="NCHW"),
                      "BiasAdd", "QuantizedBiasAdd needs NHWC", "fails"),
    # a bias not added in a converted conv/matmul's accumulator: TF's QuantizedBiasAdd
    # (float32 total space) shifts it by up to 4 steps, depending on the ranges' last bits
    "bias_add_alone": ([2, 5, 3], lambda x: _raw("BiasAdd")(value=x, bias=_const(3)),
                       "BiasAdd", "QuantizedBiasAdd is off by up to 4 steps", "ok"),
    "add_last_axis_repeated": ([2, 4, 4, 3], lambda x: _raw("Add")(x=x, y=_const(2, 4, 4, 1)),
                               "Add", "QuantizedAdd cannot broadcast these shapes, has "
                               "[2, 4, 4, 3] and [2, 4, 4, 1]", "wrong"),
    "add_middle_axis": ([2, 4, 4, 3], lambda x: _raw("Add")(x=x, y=_const(1, 4, 1, 3)),
                        "Add", "QuantizedAdd cannot broadcast", "fails"),
    "mul_both_ways": ([2, 1], lambda x: _raw("Mul")(x=x, y=_const(1, 3)),
                      "Mul", "QuantizedMul cannot broadcast", "wrong"),
    "resize_half_pixel": ([1, 4, 4, 3], lambda x: _raw("ResizeBilinear")(
        images=x, size=[8, 8], half_pixel_centers=True),
        "ResizeBilinear", "drops half_pixel_centers", "wrong"),
    "reshape_int64": ([2, 4, 4, 3], lambda x: _raw("Reshape")(
        tensor=x, shape=np.array([2, -1], np.int64)),
        "Reshape", "QuantizedReshape needs an int32 shape, has int64", "fails"),
    "conv_transpose": ([1, 4, 4, 3], lambda x: _raw("Conv2DBackpropInput")(
        input_sizes=[1, 8, 8, 5], filter=_const(3, 3, 5, 3), out_backprop=x,
        strides=[1, 2, 2, 1], padding="SAME"),
        "Conv2DBackpropInput", "TensorFlow has no QuantizedConv2DTranspose", "float"),
}


def _relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _input(shape: list[int]) -> np.ndarray:
    return np.random.default_rng(5).uniform(-1, 1, size=shape).astype(np.float32)


@pytest.mark.parametrize("case", sorted(RUNNABLE))
def test_what_the_kernels_run_is_converted(case: str) -> None:
    shape, fn = RUNNABLE[case]
    model = _one_op_graph(shape, fn)
    result = apply("quantize_nodes", model)
    x = _input(shape)
    assert result.metrics["quantized_ops"] >= 1 and result.metrics["kernel_limited_ops"] == 0
    assert not [w for w in result.warnings if "stays float" in w or "stay float," in w]
    assert _relative_error(predict(result.artifact, x), predict(model, x)) < 0.05


def _plain_conversion(model: ModelArtifact, x: np.ndarray, expected: np.ndarray | None) -> str:
    """What GTT's quantize_nodes alone makes of a one-op graph in TF 2.21: "float" (left
    alone), "fails" (to build or to run), "wrong" (other values or shape) or "ok"."""
    from orchestrator.model import tf_adapter
    try:
        graph = tf_adapter.transform_graph(model.graph_def, ["x"], ["y"], "quantize_nodes")
        if not [n for n in graph.node if n.op.startswith("Quantized")]:
            return "float"
        got = predict(model.replace(graph_def=graph), x)
    except Exception:  # noqa: BLE001  (TF raises several error types)
        return "fails"
    if expected is None or got.shape != expected.shape:
        return "wrong"
    return "wrong" if _relative_error(got, expected) > 0.3 else "ok"


@pytest.mark.parametrize("case", sorted(LIMITED))
def test_what_the_kernels_cannot_run_stays_float(case: str) -> None:
    shape, fn, op, rule, plain = LIMITED[case]
    model = _one_op_graph(shape, fn)
    x = _input(shape)
    # Float Conv2D runs only NHWC on a CPU: that case is checked by structure alone.
    expected = None if case == "conv_nchw" else predict(model, x)
    # The rule is needed: GTT's own conversion fails to build or run, or computes wrongly.
    assert _plain_conversion(model, x, expected) == plain

    result = apply("quantize_nodes", model)

    (node,) = [n for n in model.graph_def.node if n.op == op]
    kept = nodes(result.artifact)[node.name]
    assert kept.op == op and kept.attr["T"].type == 1
    if expected is not None:
        np.testing.assert_allclose(predict(result.artifact, x), expected, rtol=1e-6, atol=1e-6)
    (warning,) = [w for w in result.warnings if "stays float" in w]
    assert warning.startswith(f"{node.name} stays float: ") and rule in warning
    (record,) = [r for r in result.info["float_nodes"] if r["node"] == node.name]
    assert record["op"] == op and rule.split(", has")[0] in record["reason"]
    assert result.metrics["kernel_limited_ops"] == 1


@pytest.mark.parametrize(("a", "b", "ok"), [
    ([2, 4, 4, 3], [2, 4, 4, 3], True),
    ([None, 4, 4, 3], [3], True),
    ([None, 4, 4, 3], [1, 1, 1, 3], True),
    ([None, 4, 4, 3], [], True),
    ([None, 4, 4, 3], [4, 4, 3], True),
    ([None, 4, 4, 3], [None, 4, 4, 1], False),   # repeats along the last axis
    ([None, 4, 4, 3], [None, 1, 1, 3], False),   # squeeze-and-excite: a middle axis
    ([2, 1], [1, 3], False),                     # both sides repeat
    ([None, 8], [None, 8], True),
    (None, [3], False),                          # unknown rank
])
def test_broadcast_rule(a, b, ok: bool) -> None:  # noqa: ANN001
    from orchestrator.quant.kernel_support import broadcast_supported

    assert broadcast_supported(a, b) is ok
    assert broadcast_supported(b, a) is ok


# --- models: Conv1D, unequal strides, no kernel -----------------------------------------

def _sqnr_db(reference: np.ndarray, value: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference ** 2) / np.sum((value - reference) ** 2)))


def _signals(count: int = 128) -> np.ndarray:
    rng = np.random.default_rng(4)
    t = np.linspace(0, 1, 32, dtype=np.float32)
    freq = rng.uniform(1, 6, (count, 1, 3)).astype(np.float32)
    return (np.sin(2 * np.pi * freq * t[None, :, None]) +
            0.1 * rng.normal(size=(count, 32, 3))).astype(np.float32)


def _conv1d_model() -> ModelArtifact:
    """Conv1D blocks (strided, with bias and without) with batch norm, two sigmoid heads."""
    import keras
    from conftest import freeze_keras, randomize_batch_norms
    from keras import layers

    keras.utils.set_random_seed(2)
    inputs = keras.Input((32, 3))
    h = layers.Conv1D(8, 5, strides=2, padding="same", name="conv_a")(inputs)
    h = layers.ReLU()(layers.BatchNormalization()(h))
    h = layers.Conv1D(8, 3, padding="same", use_bias=False, name="conv_b")(h)
    h = layers.ReLU()(layers.BatchNormalization()(h))
    h = layers.GlobalAveragePooling1D()(h)
    heads = [layers.Dense(n, activation="sigmoid", name=f"head{n}")(h) for n in (3, 2)]
    model = keras.Model(inputs, heads)
    randomize_batch_norms(model)
    return freeze_keras(model, (None, 32, 3))


def test_conv1d_model_quantizes_and_runs() -> None:
    model = apply("fold", _conv1d_model()).artifact
    x = _signals()
    convs = [n.name for n in model.graph_def.node if n.op == "Conv2D"]
    strided = [n.name for n in model.graph_def.node
               if n.op == "Conv2D" and list(n.attr["strides"].list.i) == [1, 1, 2, 1]]
    assert len(convs) == 2 and len(strided) == 1

    result = apply("quantize_nodes", apply("quantize_weights", model).artifact)

    # The strided Conv1D has one row: its strides become [1, 2, 2, 1], and it runs in 8 bits.
    assert result.info["strides_equalized"] == strided
    counts = ops(result.artifact)
    assert counts["QuantizedConv2D"] == 2 and "Conv2D" not in counts
    # a Conv1D's bias comes after its Squeeze, not in the conv's accumulator: it stays float
    # rather than go through TF's QuantizedBiasAdd
    limited = [r for r in result.info["float_nodes"] if r["op"] == "BiasAdd"]
    assert result.metrics["kernel_limited_ops"] == len(limited) == 2
    assert all("QuantizedBiasAdd is off" in r["reason"] for r in limited)
    assert "QuantizedBiasAdd" not in counts
    # ops no eight-bit kernel covers: a diagnostic (report and page), not a warning
    [bias_warning] = result.warnings
    [warning] = result.info["diagnostics"]
    assert "QuantizedBiasAdd is off by up to 4 steps" in bias_warning
    assert warning.startswith("stay float, no eight-bit kernel: ")
    assert "Mean x1" in warning and "Sigmoid x2" in warning
    int8 = apply("log_ranges", result.artifact, x, samples=64).artifact
    int8 = apply("freeze_ranges", int8).artifact
    from support.helpers_tf import run

    for reference, value in zip(run(model, x), run(int8, x), strict=True):
        assert _sqnr_db(reference, value) > 25.0
        assert np.mean((reference > 0.5) == (value > 0.5)) > 0.95


def _strided_model(layers_count: int) -> ModelArtifact:
    """Conv2Ds with strides (1, 2) on 8-row images: QuantizedConv2D cannot run them."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(3)
    inputs = keras.Input((8, 32, 1))
    h = inputs
    for i in range(layers_count):
        h = layers.Conv2D(4, 3, strides=(1, 2), padding="same", activation="relu",
                          name=f"wide{i}")(h)
    outputs = layers.Dense(5)(layers.Flatten()(h))
    return freeze(keras.Model(inputs, outputs), (None, 8, 32, 1))


@pytest.mark.parametrize("count", [1, 4])
def test_unequal_strides_stay_float_and_are_named(count: int) -> None:
    model = _strided_model(count)
    convs = [n.name for n in model.graph_def.node if n.op == "Conv2D"]
    x = np.random.default_rng(6).uniform(0, 1, (16, 8, 32, 1)).astype(np.float32)

    result = apply("quantize_nodes", model)

    by_name = nodes(result.artifact)
    assert all(by_name[name].op == "Conv2D" for name in convs)
    assert ops(result.artifact)["QuantizedMatMul"] == 1
    limits = [w for w in result.warnings if "stay" in w and "QuantizedConv2D" in w]
    if count == 1:
        assert limits == [f"{convs[0]} stays float: QuantizedConv2D needs equal strides, "
                          "has [1, 1, 2, 1]"]
    else:
        assert limits == [f"4 nodes stay float, QuantizedConv2D needs equal strides "
                          f"([1, 1, 2, 1]): {', '.join(convs[:3])} and 1 more"]
    assert [r["node"] for r in result.info["float_nodes"]
            if "equal strides" in r["reason"]] == convs
    # ... and the whole eight-bit path runs (log_ranges failed here before).
    int8 = apply("log_ranges", result.artifact, x, samples=16).artifact
    int8 = apply("freeze_ranges", int8).artifact
    assert _sqnr_db(predict(model, x), predict(int8, x)) > 20.0


def test_ops_without_kernel_are_named_in_one_warning() -> None:
    import keras
    from keras import layers

    keras.utils.set_random_seed(4)
    inputs = keras.Input((8, 8, 1))
    h = layers.Conv2D(4, 3, padding="same", activation="relu", name="stem")(inputs)
    h = layers.DepthwiseConv2D(3, padding="same", activation="tanh", name="dw1")(h)
    h = layers.DepthwiseConv2D(3, padding="same", name="dw2")(h)
    h = layers.DepthwiseConv2D(3, padding="same", name="dw3")(h)
    outputs = layers.Dense(3, activation="sigmoid")(layers.GlobalAveragePooling2D()(h))
    model = freeze(keras.Model(inputs, outputs), (None, 8, 8, 1))

    result = apply("quantize_nodes", model)

    (warning,) = result.info["diagnostics"]  # not a warning: nothing in the recipe helps
    assert not [w for w in result.warnings if "no eight-bit kernel" in w]
    # the depthwise convs' biases stay float too, named in a warning of their own
    (bias_warning,) = result.warnings
    assert "QuantizedBiasAdd is off by up to 4 steps" in bias_warning and "dw" in bias_warning
    depthwise = [n.name for n in model.graph_def.node if n.op == "DepthwiseConv2dNative"]
    assert warning.startswith("stay float, no eight-bit kernel: DepthwiseConv2dNative x3 "
                              f"({depthwise[0]}, {depthwise[1]} and 1 more)")
    assert "Tanh x1" in warning and "Mean x1" in warning and "Sigmoid x1" in warning
    records = [r for r in result.info["float_nodes"] if r["op"] == "DepthwiseConv2dNative"]
    assert records == [{"node": name, "op": "DepthwiseConv2dNative",
                        "reason": "no eight-bit kernel"} for name in depthwise]
    assert result.metrics["no_kernel_ops"] == 6 and result.metrics["quantized_ops"] > 0
    assert "converted no op" not in warning


def test_all_excluded_is_counted_not_called_none(cnn) -> None:  # noqa: ANN001
    from orchestrator.quant.ranges import QUANTIZABLE_OPS

    quantizable = [n.name for n in cnn.graph_def.node if n.op in QUANTIZABLE_OPS]

    result = apply("quantize_nodes", cnn, exclude_nodes=quantizable)

    assert result.metrics["quantized_ops"] == 0
    assert result.metrics["quantizable_ops"] == len(quantizable) > 0
    assert result.warnings[-1] == ("quantize_nodes converted no op to eight bits: all "
                                   f"{len(quantizable)} quantizable ops stay float")
    assert sorted(r["node"] for r in result.info["float_nodes"]
                  if r["reason"] == "exclude_nodes") == sorted(quantizable)
