"""quantize_weights: >= 90% of weight bytes at 8 bits (depthwise/separable too), ~1/4 size;
all-zero tensors get a usable range."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from support import quant_fixtures
from support.quant_fixtures import agreement, apply, nodes, ops, predict

from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.graph_rewrite import const_value, copy_graph
from orchestrator.model.tf_adapter import transform_graph
from orchestrator.stages import get_stage

# Fixtures shared by the eight-bit stage tests: bound here so that pytest finds them.
cnn = quant_fixtures.cnn
digits = quant_fixtures.digits
separable = quant_fixtures.separable


def dequantized_weights(artifact) -> set[str]:  # noqa: ANN001
    """Names of the weight ops whose filter/matrix input is a Dequantize of quint8."""
    by_name = nodes(artifact)
    result = set()
    for node in artifact.graph_def.node:
        if node.op in ("Conv2D", "MatMul", "DepthwiseConv2dNative"):
            source = by_name[node.input[1].split(":")[0]]
            if source.op == "Dequantize":
                const = by_name[source.input[0]]
                assert const.attr["dtype"].type == 12  # DT_QUINT8
                result.add(node.op + ":" + node.name)
    return result


def test_cnn_a_quarter_of_the_size_same_predictions(cnn, digits) -> None:  # noqa: ANN001
    result = apply("quantize_weights", cnn)
    out = result.artifact
    assert result.metrics["weight_bytes_quantized_fraction"] >= 0.9
    assert not result.warnings
    assert {op.split(":")[0] for op in dequantized_weights(out)} == {"Conv2D", "MatMul"}
    # conv1 (72 values) stays float; every other kernel is 8-bit.
    assert len(dequantized_weights(out)) == 3
    # Each quantized value saves 3 of its 4 bytes; the 3 extra nodes per tensor cost little.
    quantized = result.info["weights"]["quantized_elements"]
    saved = cnn.graph_def.ByteSize() - out.graph_def.ByteSize()
    assert 0.9 * 3 * quantized <= saved <= 3 * quantized
    assert out.graph_def.ByteSize() < 0.4 * cnn.graph_def.ByteSize()  # tiny model: names weigh
    x = digits["x_test"]
    before, after = predict(cnn, x), predict(out, x)
    assert np.abs(after - before).max() < 0.05
    assert agreement(before, after) >= 0.99


def test_depthwise_and_separable_kernels_are_quantized(separable, digits) -> None:  # noqa: ANN001
    result = apply("quantize_weights", separable)
    quantized = dequantized_weights(result.artifact)
    kinds = [name.split(":")[0] for name in quantized]
    assert kinds.count("DepthwiseConv2dNative") == 2  # the DepthwiseConv2D and the separable
    assert kinds.count("Conv2D") == 2  # stem and the separable's pointwise
    assert kinds.count("MatMul") == 1
    assert result.metrics["weight_bytes_quantized_fraction"] >= 0.9
    x = digits["x_test"]
    assert agreement(predict(separable, x), predict(result.artifact, x)) >= 0.98


def test_tiny_tensors_stay_float_and_that_keeps_the_file_smaller(cnn) -> None:  # noqa: ANN001
    default = apply("quantize_weights", cnn).artifact
    everything = apply("quantize_weights", cnn, minimum_size=1).artifact
    biases = [n for n in default.graph_def.node if n.op == "Const"
              and n.attr["dtype"].type == 1 and len(n.attr["value"].tensor.tensor_shape.dim) == 1]
    assert biases, "biases should stay float by default"
    assert ops(everything)["Dequantize"] > ops(default)["Dequantize"]
    assert default.graph_def.ByteSize() < everything.graph_def.ByteSize()


def test_warns_below_ninety_percent(cnn) -> None:  # noqa: ANN001
    result = apply("quantize_weights", cnn, minimum_size=100_000)
    assert result.metrics["weight_bytes_quantized_fraction"] < 0.9
    assert any("minimum_size" in w for w in result.warnings)


def test_input_is_not_mutated(cnn) -> None:  # noqa: ANN001
    before = copy_graph(cnn.graph_def)
    apply("quantize_weights", cnn)
    assert cnn.graph_def == before


def test_params_are_typed() -> None:
    params = get_stage("quantize_weights").params
    assert params().minimum_size == 128
    with pytest.raises(ValidationError):
        params(minimum_size=0)
    with pytest.raises(ValidationError):
        params(min_size=10)


def zero_bias_cnn() -> ModelArtifact:
    """MobileNet's failing pattern, tiny: Conv2D -> BiasAdd(all-zero bias) -> Relu6, then
    Mean -> MatMul -> BiasAdd(all-zero bias). Untrained batch norms fold to such biases."""
    import tensorflow as tf

    from orchestrator.model.graph_rewrite import subgraph

    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 3], name="image")
        w = tf.constant(rng.normal(0, 0.5, (3, 3, 3, 8)).astype("f4"), name="conv/w")
        h = tf.nn.conv2d(x, w, [1, 1, 1, 1], "SAME", name="conv")
        h = tf.nn.bias_add(h, tf.constant(np.zeros(8, "f4"), name="conv/bias"), name="conv/add")
        h = tf.reduce_mean(tf.nn.relu6(h, name="relu6"), axis=[1, 2], name="pool")
        w = tf.constant(rng.normal(0, 1, (8, 10)).astype("f4"), name="dense/w")
        h = tf.matmul(h, w, name="dense")
        tf.nn.bias_add(h, tf.constant(np.zeros(10, "f4"), name="dense/bias"), name="logits")
    return ModelArtifact(subgraph(graph.as_graph_def(), ["image", "logits"]),
                         (TensorSpec("image", "float32", (None, 6, 6, 3)),), ("logits",))


def test_all_zero_weights_get_a_usable_range() -> None:
    # TF's quantize_weights gives an all-zero tensor the range [0, FLT_MIN] (its maximum
    # starts at numeric_limits<float>::min()), and Dequantize turns that into NaN.
    model = zero_bias_cnn()
    x = np.random.default_rng(1).uniform(-1, 1, (64, 6, 6, 3)).astype("f4")
    # (before any predict: import_graph_def adds default attrs to the GraphDef it is given)
    raw = transform_graph(model.graph_def, ["image"], ["logits"],
                          "quantize_weights(minimum_size=8)")
    result = apply("quantize_weights", model, minimum_size=8)
    out = result.artifact
    by_name = {n.name: n for n in copy_graph(out.graph_def).node}
    before, after = predict(model, x), predict(out, x)
    assert np.isfinite(after).all()
    np.testing.assert_allclose(after, before, atol=0.05 * np.abs(before).max())
    assert agreement(before, after) >= 0.95
    assert result.info["degenerate_ranges_widened"] == ["conv/bias", "dense/bias"]
    assert result.metrics["degenerate_ranges_widened"] == 2
    for name in ("conv/bias", "dense/bias"):
        assert by_name[name].op == "Dequantize"
        assert const_value(by_name[f"{name}_quantized_min"]) == 0.0
        assert const_value(by_name[f"{name}_quantized_max"]) == np.float32(0.01)
        assert not np.asarray(const_value(by_name[f"{name}_quantized_const"])).view("u1").any()
    # Every other node is exactly what TF's transform produced.
    changed = {n.name for n in raw.node if n != by_name[n.name]}
    assert changed == {"conv/bias_quantized_max", "dense/bias_quantized_max"}


def accumulator_biases(artifact: ModelArtifact) -> dict[str, np.ndarray]:
    """Fused BiasAdd (its `F/q8`) -> the float bias values integer_bias adds in its
    accumulator (stored times the accumulator's 2^32 - 1 steps)."""
    by_name = nodes(artifact)
    return {name[: -len("/bias")]: np.asarray(const_value(node)) / 4294967295.0
            for name, node in by_name.items()
            if name.endswith("/q8/bias") and f"{name[: -len('/bias')]}/acc" in by_name}


def test_all_zero_biases_run_in_eight_bits() -> None:
    # The MobileNet failure: after quantize_weights, QuantizedBiasAdd turned the [0, FLT_MIN]
    # bias range into garbage (here every logit the same; in MobileNet a NaN range that
    # stopped log_ranges). Biases are now added in the accumulator, in float32 values.
    model = zero_bias_cnn()
    x = np.random.default_rng(1).uniform(-1, 1, (64, 6, 6, 3)).astype("f4")
    weighted = apply("quantize_weights", model, minimum_size=8).artifact
    eight_bit = apply("quantize_nodes", weighted).artifact
    ours, direct = (accumulator_biases(eight_bit),
                    accumulator_biases(apply("quantize_nodes", model).artifact))
    assert sorted(ours) == sorted(direct) == ["conv/add/q8", "logits/q8"]
    for name, values in ours.items():
        assert not values.any() and not direct[name].any()
    assert "QuantizedBiasAdd" not in ops(eight_bit)
    dynamic = predict(eight_bit, x)
    frozen = apply("freeze_ranges", apply("log_ranges", eight_bit, x).artifact, x).artifact
    before = predict(model, x)
    for after in (dynamic, predict(frozen, x)):
        assert np.isfinite(after).all()
        np.testing.assert_allclose(after, before, atol=0.15 * np.abs(before).max())
        assert np.sqrt(np.mean((after - before) ** 2)) < 0.05 * np.sqrt(np.mean(before ** 2))
        assert agreement(before, after) >= 0.9


def test_excluded_ops_keep_float_weights(cnn, digits) -> None:  # noqa: ANN001
    """The guard's full revert: the named layer's kernel stays float32, bit for bit, while
    the others are stored in 8 bits."""
    plain = dequantized_weights(apply("quantize_weights", cnn).artifact)
    layer = sorted(plain)[0].split(":", 1)[1]
    result = apply("quantize_weights", cnn, exclude_nodes=[layer])
    out = result.artifact
    kept = dequantized_weights(out)
    assert kept == {w for w in plain if not w.endswith(":" + layer)}
    weight = nodes(out)[nodes(out)[layer].input[1].split(":")[0]]
    original = nodes(cnn)[weight.name]
    assert weight.op == "Const" and weight.attr["dtype"].type == 1  # DT_FLOAT again
    np.testing.assert_array_equal(const_value(weight), const_value(original))
    assert result.info["float_weights_kept"] == [weight.name]
    x = digits["x_test"]
    assert agreement(predict(cnn, x), predict(out, x)) >= 0.99


def test_excluding_an_unknown_node_is_an_error(cnn) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="not in the graph"):
        apply("quantize_weights", cnn, exclude_nodes=["no_such_layer"])
