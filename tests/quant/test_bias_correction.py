"""Bias correction in quantize_nodes: 8-bit weights shift each layer's output mean; the
corrected bias cancels that shift on held-out inputs, and only bias constants change."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from orchestrator.measure.tf_runtime import predict
from orchestrator.model import tf_adapter  # noqa: F401  (TF env defaults before TF is imported
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.graph_rewrite import GraphIndex, const_value
from orchestrator.quant import bias_correction as bc
from orchestrator.quant.numerics import dequantize, float_to_quint8
from orchestrator.stages import StageContext, get_stage

SHAPE = (6, 6, 4)
BIASES = {"conv_b", "dw_b", "sep_b", "fc_b"}


def _inputs(n: int, seed: int) -> np.ndarray:
    # positive inputs with a non-zero mean: weight rounding errors then shift output means
    return np.random.default_rng(seed).uniform(0.0, 2.0, (n, *SHAPE)).astype(np.float32)


@pytest.fixture(scope="module")
def model() -> ModelArtifact:
    """Conv2D + BiasAdd, Relu, DepthwiseConv2dNative + BiasAdd, Relu, depthwise then 1x1
    Conv2D + BiasAdd (a separable conv), Relu, MatMul + Add (a per-channel const). Each
    weight has one large outlier, so its 8-bit step is coarse and the rounding errors do
    not average out."""
    import tensorflow as tf

    rng = np.random.default_rng(3)

    def weights(*shape: int) -> np.ndarray:
        w = rng.normal(0.0, 0.1, shape).astype(np.float32)
        w.flat[0] = 2.5
        return w

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, *SHAPE], name="x")
        h = tf.nn.conv2d(x, tf.constant(weights(3, 3, 4, 16), name="conv_w"), 1, "SAME",
                         name="conv")
        h = tf.nn.relu(tf.nn.bias_add(h, tf.constant(rng.normal(0, 0.1, 16).astype(
            np.float32), name="conv_b"), name="conv_bias"), name="conv_relu")
        h = tf.nn.depthwise_conv2d(h, tf.constant(weights(3, 3, 16, 1), name="dw_w"),
                                   [1, 1, 1, 1], "SAME", name="dw")
        h = tf.nn.relu(tf.nn.bias_add(h, tf.constant(rng.normal(0, 0.1, 16).astype(
            np.float32), name="dw_b"), name="dw_bias"), name="dw_relu")
        # a separable conv: depthwise straight into pointwise, one bias after both
        h = tf.nn.depthwise_conv2d(h, tf.constant(weights(3, 3, 16, 1), name="sep_dw_w"),
                                   [1, 1, 1, 1], "SAME", name="sep_dw")
        h = tf.nn.conv2d(h, tf.constant(weights(1, 1, 16, 8), name="sep_pw_w"), 1, "SAME",
                         name="sep_pw")
        h = tf.nn.relu(tf.nn.bias_add(h, tf.constant(rng.normal(0, 0.1, 8).astype(
            np.float32), name="sep_b"), name="sep_bias"), name="sep_relu")
        h = tf.reshape(h, [-1, 6 * 6 * 8], name="flat")
        h = tf.matmul(h, tf.constant(weights(6 * 6 * 8, 8), name="fc_w"), name="fc")
        tf.add(h, tf.constant(rng.normal(0, 0.1, 8).astype(np.float32), name="fc_b"),
               name="out")

    return ModelArtifact(graph_def=graph.as_graph_def(),
                         inputs=(TensorSpec("x", "float32", (None, *SHAPE)),), outputs=("out",))


def _run(name: str, artifact: ModelArtifact, float_model: ModelArtifact | None,
         x: np.ndarray | None, **params: Any) -> Any:
    def representative(samples: int | None, batch_size: int) -> Iterator[np.ndarray]:
        rows = x if samples is None else x[:samples]
        for start in range(0, len(rows), batch_size):
            yield rows[start:start + batch_size]

    stage = get_stage(name)
    ctx = StageContext(pipeline="test", stage=name,
                       representative=None if x is None else representative,
                       float_model=None if float_model is None else (lambda: float_model))
    return stage.run(artifact, stage.params(**params), ctx)


def _mean_error(model: ModelArtifact, quantized: ModelArtifact, x: np.ndarray) -> np.ndarray:
    """Per output channel, |mean(8-bit output - float output)| over held-out inputs."""
    return np.abs((predict(quantized, x) - predict(model, x)).mean(axis=0))


def _consts(artifact: ModelArtifact) -> dict[str, bytes]:
    return {n.name: n.attr["value"].SerializeToString() for n in artifact.graph_def.node
            if n.op == "Const"}


def _without_values(artifact: ModelArtifact) -> list[tuple[str, str, list[str], list[str]]]:
    """Every node without its value, by name (GTT does not keep the node order)."""
    return sorted((n.name, n.op, list(n.input), sorted(k for k in n.attr if k != "value"))
                  for n in artifact.graph_def.node)


def test_weights_only_shift_is_cancelled_and_only_biases_change(model: ModelArtifact) -> None:
    """quantize_weights, then quantize_nodes converting no op: weights-only 8-bit, where the
    correction is exact for the first layer and cancels most of the shift at the output."""
    calib, held_out = _inputs(400, seed=1), _inputs(400, seed=2)
    weighted = _run("quantize_weights", model, None, None).artifact
    plain = _run("quantize_nodes", weighted, model, calib, ops=[], bias_correction=False)
    fixed = _run("quantize_nodes", weighted, model, calib, ops=[])

    before, after = _mean_error(model, plain.artifact, held_out), \
        _mean_error(model, fixed.artifact, held_out)
    print(f"weights-only mean error per channel: before {before.mean():.5f} (max "
          f"{before.max():.5f}), after {after.mean():.5f} (max {after.max():.5f})")
    assert before.mean() > 0.01  # the 8-bit weights shift the output measurably ...
    assert after.mean() < 0.2 * before.mean()  # ... and the correction cancels most of it
    assert after.max() < 0.3 * before.max()

    assert fixed.metrics["bias_corrected_layers"] == 4
    assert fixed.metrics["bias_shift_over_scale"] > 0
    layers = fixed.info["bias_correction"]["layers"]
    assert {entry["layer"] for entry in layers} == {"conv", "dw", "sep_dw+sep_pw", "fc"}
    assert {entry["bias"] for entry in layers} == BIASES
    # structure: the same nodes, ops, inputs and attrs; only the bias values differ
    assert _without_values(fixed.artifact) == _without_values(plain.artifact)
    old, new = _consts(plain.artifact), _consts(fixed.artifact)
    assert {name for name in old if old[name] != new[name]} == BIASES


def test_full_eight_bit_mean_error_shrinks(model: ModelArtifact) -> None:
    """The whole 8-bit chain: activations quantized too, ranges frozen."""
    calib, held_out = _inputs(400, seed=1), _inputs(400, seed=2)
    results = {}
    for corrected in (False, True):
        artifact = _run("quantize_weights", model, None, None).artifact
        artifact = _run("quantize_nodes", artifact, model, calib,
                        bias_correction=corrected).artifact
        artifact = _run("log_ranges", artifact, None, calib).artifact
        artifact = _run("freeze_ranges", artifact, None, None).artifact
        results[corrected] = _mean_error(model, artifact, held_out)
    before, after = results[False], results[True]
    print(f"8-bit mean error per channel: before {before.mean():.5f}, after {after.mean():.5f}")
    assert after.mean() < 0.5 * before.mean()


def test_eight_bit_biases_stay_eight_bit(model: ModelArtifact) -> None:
    """With quantize_weights(minimum_size=1) the biases are quint8 + Dequantize; corrected,
    they are stored in 8 bits again, in their new range."""
    calib, held_out = _inputs(400, seed=1), _inputs(400, seed=2)
    weighted = _run("quantize_weights", model, None, None, minimum_size=1).artifact
    plain = _run("quantize_nodes", weighted, model, calib, ops=[], bias_correction=False)
    fixed = _run("quantize_nodes", weighted, model, calib, ops=[])
    assert fixed.metrics["bias_corrected_layers"] == 4
    assert _without_values(fixed.artifact) == _without_values(plain.artifact)
    old, new = _consts(plain.artifact), _consts(fixed.artifact)
    changed = {name for name in old if old[name] != new[name]}
    assert {name.rsplit("_quantized_", 1)[0] for name in changed} == BIASES
    assert all(name.rsplit("_quantized_", 1)[1] in ("const", "min", "max") for name in changed)
    assert all(n.attr["dtype"].type == 12 for n in fixed.artifact.graph_def.node
               if n.name.endswith("_quantized_const"))  # quint8
    before, after = _mean_error(model, plain.artifact, held_out), \
        _mean_error(model, fixed.artifact, held_out)
    assert after.mean() < 0.2 * before.mean()


def test_simulated_weights_are_what_quantize_nodes_stores(model: ModelArtifact) -> None:
    """Without quantize_weights, the W8 the correction assumes is exactly the quint8 weight
    quantize_nodes folds into the graph (QuantizeV2 MIN_FIRST)."""
    out = _run("quantize_nodes", model, model, _inputs(50, seed=1)).artifact
    index, source = GraphIndex.build(out.graph_def), GraphIndex.build(model.graph_def)
    for name in ("conv_w", "fc_w"):  # the depthwise conv stays float, its weights too
        stored, lo, hi = (const_value(index.nodes[f"{name}_quantized_{part}"])
                          for part in ("const", "min", "max"))
        w = const_value(source.nodes[name])
        assert (float(lo), float(hi)) == pytest.approx(bc.quantize_range(w), rel=1e-7)
        assert np.array_equal(float_to_quint8(w, *bc.quantize_range(w)),
                              stored.astype(np.uint8))
    assert "dw_w_quantized_const" not in index.nodes


def test_skipped_without_representative_data_or_float_model(model: ModelArtifact) -> None:
    calib = _inputs(50, seed=1)
    plain = _run("quantize_nodes", model, model, calib, bias_correction=False)
    for float_model, x, reason in ((model, None, "no representative data"),
                                   (None, calib, "no float model")):
        result = _run("quantize_nodes", model, float_model, x)
        info = result.info["bias_correction"]
        assert info["applied"] is False and info["reason"].startswith(reason)
        # skipping is no warning (quantize_nodes' own no-kernel warning is plain's too)
        assert "bias_corrected_layers" not in result.metrics
        assert result.warnings == plain.warnings
        assert result.artifact.graph_def == plain.artifact.graph_def
    off = _run("quantize_nodes", model, model, calib, bias_correction=False)
    assert "bias_correction" not in off.info


def test_non_finite_data_leaves_biases_alone(model: ModelArtifact) -> None:
    calib = _inputs(50, seed=1)
    calib[3, 0, 0, 0] = np.nan
    plain = _run("quantize_nodes", model, model, calib, bias_correction=False)
    result = _run("quantize_nodes", model, model, calib)
    assert result.metrics["bias_corrected_layers"] == 0
    assert result.artifact.graph_def == plain.artifact.graph_def


def test_float_weights_that_stay_float_are_not_corrected(model: ModelArtifact) -> None:
    """Without quantize_weights, an op quantize_nodes leaves in float keeps float weights:
    no shift, no correction (here: every op excluded, or none converted)."""
    calib = _inputs(50, seed=1)
    linear = ["conv", "dw", "sep_dw", "sep_pw", "fc"]
    for params in ({"ops": []}, {"exclude_nodes": linear}):
        plain = _run("quantize_nodes", model, model, calib, bias_correction=False, **params)
        result = _run("quantize_nodes", model, model, calib, **params)
        assert result.metrics["bias_corrected_layers"] == 0
        assert result.artifact.graph_def == plain.artifact.graph_def


def test_dequantize_reads_the_kernels_zero_point() -> None:
    lo, hi = -0.3, 1.1
    values = np.arange(256, dtype=np.uint8)
    w8 = dequantize(values, lo, hi)
    step = (hi - lo) / 255
    assert np.allclose(np.diff(w8), step, rtol=0, atol=1e-6)  # float32 values near 1
    assert 0.0 in w8  # zero is exact: the zero point is rounded to an integer
    assert np.array_equal(float_to_quint8(w8, lo, hi), values)
