"""Biases added in the conv/matmul's int32 accumulator (orchestrator.integer_bias), and
why: TF's QuantizedBiasAdd shifts a whole layer by a range-dependent offset."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "stages"))  # the 8-bit stage fixtures
from helpers_graphs import tf1_graph  # noqa: E402
from quant_fixtures import apply, ops  # noqa: E402

from orchestrator.layer_errors import dequantize  # noqa: E402
from orchestrator.model import TensorSpec  # noqa: E402
from orchestrator.runtime import predict  # noqa: E402

# The input range of a BiasAdd in the photo mini-Xception of issue 17, and its bias range.
INPUT_RANGE, BIAS_RANGE = (-4.755581, 4.9719486), (-0.689076, 0.6196499)


def test_tfs_quantized_bias_add_is_off_by_steps() -> None:
    """Every input code with every bias: the op's mean error is over a step (a constant
    offset, the same for all values). If a future TF fixes its kernel, this fails and the
    workaround can be reconsidered."""
    import tensorflow as tf

    codes = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 16, axis=1)
    bias = np.random.default_rng(0).integers(0, 256, 16).astype(np.uint8)
    out = tf.raw_ops.QuantizedBiasAdd(
        input=tf.constant(codes, tf.quint8), bias=tf.constant(bias, tf.quint8),
        min_input=INPUT_RANGE[0], max_input=INPUT_RANGE[1], min_bias=BIAS_RANGE[0],
        max_bias=BIAS_RANGE[1], out_type=tf.qint32)
    got = tf.raw_ops.Dequantize(input=out.output, min_range=out.min_out,
                                max_range=out.max_out, mode="MIN_FIRST").numpy()
    want = dequantize(codes, *INPUT_RANGE) + dequantize(bias, *BIAS_RANGE)
    step = (INPUT_RANGE[1] - INPUT_RANGE[0]) / 255
    offset = float(np.mean(got - want)) / step
    spread = float(np.std(got - want)) / step
    assert abs(offset) > 1.0 and spread < 0.1, (offset, spread)


def conv_bias_relu(seed: int):  # noqa: ANN201
    """x[?,6,6,3] -> Conv2D 'conv' -> BiasAdd 'bias' -> Relu 'relu' -> Flatten -> MatMul
    'dense' -> BiasAdd 'logits'."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def build() -> None:
        x = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 3], name="x")
        h = tf.nn.conv2d(x, rng.normal(size=(3, 3, 3, 8)).astype("f4"), 1, "SAME",
                         name="conv")
        h = tf.nn.relu(tf.nn.bias_add(h, rng.normal(size=8).astype("f4"), name="bias"),
                       name="relu")
        h = tf.reshape(h, [-1, 6 * 6 * 8])
        tf.nn.bias_add(tf.matmul(h, rng.normal(size=(288, 5)).astype("f4") / 10, name="dense"),
                       rng.normal(size=5).astype("f4"), name="logits")

    return tf1_graph(build, [TensorSpec("x", "float32", (None, 6, 6, 3))], ["logits"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_biases_go_into_the_accumulator(seed: int) -> None:
    model = conv_bias_relu(seed)
    x = np.random.default_rng(10 + seed).normal(size=(64, 6, 6, 3)).astype("f4")
    eight_bit = apply("quantize_nodes", model)
    assert eight_bit.info["biases_in_accumulator"] == 2
    frozen = apply("freeze_ranges", apply("log_ranges", eight_bit.artifact, x,
                                          min_percentile=0, max_percentile=0).artifact,
                   min_percentile=0, max_percentile=0).artifact
    counts = ops(frozen)
    assert "QuantizedBiasAdd" not in counts and counts["Bitcast"] == 4  # to int32 and back
    int_adds = [n for n in frozen.graph_def.node if n.op == "AddV2"]
    assert len(int_adds) == 2 and all(n.attr["T"].type == 3 for n in int_adds)  # DT_INT32
    before, after = predict(model, x), predict(frozen, x)
    by_name = {n.name: n for n in frozen.graph_def.node}
    lo, hi = (float(by_name[f"logits/q8/range/frozen_{e}"].attr["value"].tensor.float_val[0])
              for e in ("min", "max"))
    step = (hi - lo) / 255
    error = (after - before) / step
    # rounding at two requantizations and the 8-bit weights, but no constant offset
    assert abs(float(np.mean(error))) < 0.15, float(np.mean(error))
    assert float(np.sqrt(np.mean(error ** 2))) < 1.5


def test_a_small_bias_survives_whole() -> None:
    """The bias is float32 in the accumulator: a shift of a fifth of an output step (what
    bias correction adds) moves the output mean by that, not by zero or a whole 8-bit bias
    step."""
    import dataclasses

    from orchestrator.graph_rewrite import const_value, copy_graph, set_const_value

    model = conv_bias_relu(3)
    x = np.random.default_rng(4).normal(size=(64, 6, 6, 3)).astype("f4")
    base = apply("quantize_nodes", model).artifact
    logged = apply("log_ranges", base, x).artifact
    frozen = apply("freeze_ranges", logged).artifact
    by_name = {n.name: n for n in frozen.graph_def.node}
    lo, hi = (float(const_value(by_name[f"logits/q8/range/frozen_{e}"]))
              for e in ("min", "max"))
    shift = 0.2 * (hi - lo) / 255
    graph = copy_graph(frozen.graph_def)
    bias = next(n for n in graph.node if n.name == "logits/q8/bias")
    set_const_value(bias, const_value(bias) + np.float32(shift * 4294967295.0))
    moved = dataclasses.replace(frozen, graph_def=graph)
    delta = float(np.mean(predict(moved, x) - predict(frozen, x)))
    assert delta == pytest.approx(shift, rel=0.35)
