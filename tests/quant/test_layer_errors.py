"""Per-layer 8-bit diagnostics: values against an independent computation, and the layer
made bad on purpose is the one named worst."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from support import quant_fixtures  # noqa: E402
from support.helpers_graphs import tf1_graph  # noqa: E402
from support.quant_fixtures import agreement, apply, predict  # noqa: E402

from orchestrator.measure.tf_runtime import GraphRunner  # noqa: E402
from orchestrator.model.artifact import ModelArtifact, TensorSpec  # noqa: E402
from orchestrator.quant import layer_errors as le  # noqa: E402

digits = quant_fixtures.digits

RNG = np.random.default_rng(0)
W1 = RNG.normal(size=(6, 5)).astype(np.float32)
B1 = RNG.normal(size=5).astype(np.float32)
W2 = RNG.normal(size=(5, 3)).astype(np.float32)
X = np.random.default_rng(1).normal(size=(50, 6)).astype(np.float32)


def small_graph(batch: int | None) -> ModelArtifact:
    """x[batch,6] -> MatMul 'mm1' -> BiasAdd 'bias1' -> Relu 'relu1' -> MatMul 'out'."""
    import tensorflow as tf

    def build() -> None:
        x = tf.compat.v1.placeholder(tf.float32, [batch, 6], name="x")
        h = tf.nn.bias_add(tf.matmul(x, tf.constant(W1), name="mm1"), tf.constant(B1),
                           name="bias1")
        tf.matmul(tf.nn.relu(h, name="relu1"), tf.constant(W2), name="out")

    return tf1_graph(build, [TensorSpec("x", "float32", (batch, 6))], ["out"])


def eight_bit(model: ModelArtifact, x: np.ndarray, **quantize: Any) -> ModelArtifact:
    artifact = apply("quantize_nodes", model, **quantize).artifact
    artifact = apply("log_ranges", artifact, x).artifact
    return apply("freeze_ranges", artifact).artifact


def tf_dequantize(q: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """TF's own Dequantize op, MIN_FIRST (what the 8-bit graph's Dequantize nodes do)."""
    import tensorflow as tf

    return tf.quantization.dequantize(tf.constant(q, tf.quint8), lo, hi,
                                      mode="MIN_FIRST").numpy().astype(np.float64)


def independent_rows(model: ModelArtifact, batch: int | None) -> dict[str, dict[str, float]]:
    """The diagnostics of small_graph computed directly: the 8-bit graph's tensors (fetched
    by the names quantize_nodes gives them) through TF's Dequantize, and each float op
    redone in numpy, on the 8-bit inputs (local) and on float all the way (reference)."""
    int8 = eight_bit(model, X)
    # mm1's bias is added in its accumulator: mm1 + bias1 is one layer, named bias1
    outputs = {"bias1": "bias1/q8/requant", "relu1": "relu1/q8", "out": "out/q8/requant"}
    size = batch or le.BATCH_SIZE
    got: dict[str, list[np.ndarray]] = {k: [] for k in outputs}
    ranges: dict[str, tuple[float, float]] = {}
    with GraphRunner.for_artifact(int8) as runner:
        for start in range(0, len(X), size):
            real = X[start:start + size]
            fed = real if batch is None else np.concatenate(
                [real, np.repeat(real[-1:], batch - len(real), axis=0)])
            for name, node in outputs.items():
                q, lo, hi = runner.run(fed, fetches=[f"{node}:{k}" for k in range(3)])
                got[name].append(tf_dequantize(q, lo, hi)[:len(real)])
                assert ranges.setdefault(name, (float(lo), float(hi))) == (lo, hi)  # frozen
    deq = {k: np.concatenate(v) for k, v in got.items()}
    x = X.astype(np.float64)
    local = {"bias1": x @ W1 + B1, "relu1": np.maximum(deq["bias1"], 0),
             "out": deq["relu1"] @ W2}
    h = x @ W1 + B1
    reference = {"bias1": h, "relu1": np.maximum(h, 0), "out": np.maximum(h, 0) @ W2}
    rows = {}
    for name in outputs:
        lo, hi = ranges[name]
        scale = (hi - lo) / 255
        ref = reference[name]
        rows[name] = {
            "rmse_over_scale": float(np.sqrt(np.mean((deq[name] - local[name]) ** 2)) / scale),
            "nmse": float(np.mean((deq[name] - ref) ** 2) / np.mean(ref ** 2)),
            "range_min": lo, "range_max": hi, "scale": scale,
            "clipped_share": float(np.mean((ref < lo) | (ref > hi)))}
    return rows


@pytest.mark.parametrize("batch", [None, 4])
def test_values_match_an_independent_computation(batch: int | None) -> None:
    """Dynamic batch (several runs of 16), and a fixed batch of 4 (50 samples: the last
    run is padded, and the padding must not count)."""
    model = small_graph(batch)
    rows = le.measure(model, eight_bit(model, X), [X[:32], X[32:]])  # as 16, 16, 16, 2
    expected = independent_rows(model, batch)
    assert [r["node"] for r in rows] == ["bias1", "relu1", "out"]  # graph order
    assert [r["op"] for r in rows] == ["BiasAdd", "Relu", "MatMul"]
    for row in rows:
        want = expected[row["node"]]
        for key in ("nmse", "range_min", "range_max", "scale", "clipped_share"):
            assert row[key] == pytest.approx(want[key], rel=1e-4, abs=1e-9), (row["node"], key)
        if row["node"] == "relu1":  # exact in eight bits: it adds no error of its own
            assert row["rmse_over_scale"] == want["rmse_over_scale"] == 0.0
        else:
            assert row["rmse_over_scale"] == pytest.approx(want["rmse_over_scale"], rel=1e-3)
    assert rows[0]["rmse_over_scale"] > 0.2  # rounding at least: the test can fail


def test_both_naming_schemes_give_the_same_rows() -> None:
    model = small_graph(None)
    short = le.measure(model, eight_bit(model, X, short_names=True), [X])
    long = le.measure(model, eight_bit(model, X, short_names=False), [X])
    assert short == long and len(short) == 3


def test_no_quantized_layers() -> None:
    model = small_graph(None)
    assert le.measure(model, model, [X]) == []


def test_rows_tsv_metrics_and_console(cnn, digits) -> None:  # noqa: ANN001
    int8 = eight_bit(apply("quantize_weights", cnn).artifact, digits["x_calib"][:200])
    rows = le.measure(cnn, int8, [digits["x_calib"][:100]])
    # a row per eight-bit op; a conv/matmul and the bias added in its accumulator are one
    quantized = [n.name for n in int8.graph_def.node if n.op.startswith("Quantized")
                 and n.op not in ("QuantizedConv2D", "QuantizedMatMul")]
    fused = [n.name for n in int8.graph_def.node if n.op == "Bitcast"
             and n.attr["type"].type == 13]  # DT_QINT32: the accumulator with its bias
    assert len(rows) == len(quantized) + len(fused) == 9
    assert all(tuple(r) == le.FIELDS for r in rows)
    json.dumps(rows, allow_nan=False)  # JSON-safe: no NaN
    order = le.execution_order(cnn.graph_def)
    assert [r["node"] for r in rows] == [n for n in order if n in {r["node"] for r in rows}]

    lines = le.table_tsv(rows).splitlines()
    assert lines[0].split("\t") == list(le.FIELDS)
    values = [float(line.split("\t")[2]) for line in lines[1:]]
    assert values == sorted(values, reverse=True) and len(values) == 9

    metrics = le.summary_metrics(rows)
    assert metrics["layer_error_max"] == max(r["rmse_over_scale"] for r in rows) == values[0]
    assert metrics["layer_nmse_max"] == max(r["nmse"] for r in rows)
    assert metrics["layers_flagged"] == sum(r["rmse_over_scale"] > 0.7 for r in rows)



def _with_one_bad_weight(model: Any, layer: str) -> Any:
    """A copy of `model` whose `layer` has its largest weight multiplied by 1000: that
    layer's 8-bit weights then have a step 1000 times coarser."""
    import keras

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    kernel, bias = copy.get_layer(layer).get_weights()
    flat = kernel.reshape(-1).copy()
    flat[np.argmax(np.abs(flat))] *= 1000
    copy.get_layer(layer).set_weights([flat.reshape(kernel.shape), bias])
    return copy


def test_the_layer_made_bad_is_named_worst(digits_example, digits) -> None:  # noqa: ANN001
    trained = quant_fixtures._trained("cnn", str(digits_example))
    x = digits["x_calib"][:200]
    results = {}
    for name, model in (("good", trained), ("bad", _with_one_bad_weight(trained, "fc1"))):
        fp32 = quant_fixtures.freeze(model, (None, 8, 8, 1))
        int8 = eight_bit(apply("quantize_weights", fp32).artifact, x)
        rows = le.measure(fp32, int8, [x])
        results[name] = {r["node"]: r for r in rows}, agreement(
            predict(fp32, digits["x_test"]), predict(int8, digits["x_test"]))
    (good, good_agree), (bad, bad_agree) = results["good"], results["bad"]
    assert bad_agree < good_agree - 0.2  # the damage is real
    # fc1's MatMul and its bias are one layer (the bias is added in its accumulator)
    fc1 = next(n for n, r in bad.items() if "fc1" in n and r["op"] == "BiasAdd")
    worst = le.worst_first(list(bad.values()))
    assert worst[0]["node"] == fc1
    assert worst[0]["rmse_over_scale"] > 2 * worst[1]["rmse_over_scale"]
    assert worst[0]["rmse_over_scale"] > 2 * good[fc1]["rmse_over_scale"]
    assert fc1 in {r["node"] for r in le.flagged(list(bad.values()))}
    # The layers before it are untouched by the change: same errors as in the good model.
    for node in [n for n in good if "conv" in n]:
        assert bad[node]["rmse_over_scale"] == pytest.approx(good[node]["rmse_over_scale"])


cnn = quant_fixtures.cnn


def test_a_layer_after_an_op_left_in_float(separable, digits) -> None:  # noqa: ANN001
    """The Relu after a depthwise convolution and its bias (which stay float): its local
    reference takes the 8-bit graph's own float input."""
    x = digits["x_calib"][:64]
    int8 = eight_bit(apply("quantize_weights", separable).artifact, x)
    rows = {r["node"]: r for r in le.measure(separable, int8, [x])}
    fnodes = {n.name: n for n in separable.graph_def.node}
    int8_ops = {n.name: n.op for n in int8.graph_def.node}
    [bias_add] = [n for n in fnodes.values() if n.op == "BiasAdd" and
                  fnodes[n.input[0]].op == "DepthwiseConv2dNative"]
    assert int8_ops[bias_add.name] == "BiasAdd"  # left float: not after a converted conv
    [relu] = [n for n in fnodes.values() if n.op == "Relu" and n.input[0] == bias_add.name]
    assert int8_ops[f"{relu.name}/q8"] == "QuantizedRelu"
    errors, scale = [], None
    with GraphRunner.for_artifact(int8) as runner:
        for start in range(0, len(x), le.BATCH_SIZE):
            given, q, lo, hi = runner.run(x[start:start + le.BATCH_SIZE], fetches=[
                f"{bias_add.name}:0"] + [f"{relu.name}/q8:{k}" for k in range(3)])
            errors.append(tf_dequantize(q, lo, hi) - np.maximum(given.astype(np.float64), 0))
            scale = (hi - lo) / 255
    expected = np.sqrt(np.mean(np.concatenate(errors) ** 2)) / scale
    assert expected > 0.1  # the float input is quantized: rounding at least
    assert rows[relu.name]["rmse_over_scale"] == pytest.approx(expected, rel=1e-3)


separable = quant_fixtures.separable
