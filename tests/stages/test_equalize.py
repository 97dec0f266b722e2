"""equalize: cross-layer equalization keeps float outputs, balances the paired weight
ranges, stops at Relu6 and at tensors read twice, and makes 8-bit weights more faithful."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.helpers_graphs import assert_same_outputs, tf1_graph
from support.helpers_tf import run

from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.graph_rewrite import const_value
from orchestrator.stages import StageContext, get_stage

SHAPE = (8, 8, 3)
# (first layer, second layer): what the chain below must pair up, and nothing else
PAIRS = {("stem", "dw"), ("dw", "pw"), ("pw", "conv3"), ("dense1", "out")}  # out: dense2


def _imbalanced(rng: np.random.Generator, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """He-scaled weights whose channels along `axis` span two orders of magnitude (as a
    folded batch norm can leave them)."""
    fan_in = int(np.prod(shape[:-1])) if len(shape) == 2 else int(np.prod(shape[:3]))
    w = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape).astype(np.float32)
    scales = np.logspace(-1, 1, shape[axis]).astype(np.float32)
    rng.shuffle(scales)
    view = [1] * len(shape)
    view[axis] = -1
    return w * scales.reshape(view)


@pytest.fixture(scope="module")
def chain() -> ModelArtifact:
    """stem Conv2D + bias + Relu -> depthwise (x2) -> pointwise 1x1 + bias + Relu + MaxPool
    -> conv3 + bias + Relu6 -> conv4 + bias -> mean -> dense1 + bias + Relu -> dense2."""
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def bias(n: int, name: str) -> Any:
        return tf.constant(rng.normal(0, 0.5, n).astype(np.float32), name=name)

    def build() -> None:
        x = tf.compat.v1.placeholder(tf.float32, [None, *SHAPE], name="x")
        h = tf.nn.conv2d(x, tf.constant(_imbalanced(rng, (3, 3, 3, 8), 3), name="stem_w"),
                         1, "SAME", name="stem")
        h = tf.nn.relu(tf.nn.bias_add(h, bias(8, "stem_b")), name="stem_relu")
        h = tf.nn.depthwise_conv2d(h, tf.constant(_imbalanced(rng, (3, 3, 8, 2), 2),
                                                  name="dw_w"), [1, 1, 1, 1], "SAME",
                                   name="dw")
        h = tf.nn.conv2d(h, tf.constant(_imbalanced(rng, (1, 1, 16, 12), 3), name="pw_w"),
                         1, "SAME", name="pw")
        h = tf.add(h, bias(12, "pw_b"), name="pw_bias")  # an Add, as fold may leave it
        h = tf.nn.max_pool2d(tf.nn.relu(h, name="pw_relu"), 2, 2, "VALID", name="pool")
        h = tf.nn.conv2d(h, tf.constant(_imbalanced(rng, (3, 3, 12, 10), 3), name="conv3_w"),
                         1, "SAME", name="conv3")
        h = tf.nn.relu6(tf.nn.bias_add(h, bias(10, "conv3_b")), name="conv3_relu6")
        h = tf.nn.conv2d(h, tf.constant(_imbalanced(rng, (1, 1, 10, 6), 3), name="conv4_w"),
                         1, "SAME", name="conv4")
        h = tf.nn.bias_add(h, bias(6, "conv4_b"), name="conv4_bias")
        h = tf.reduce_mean(h, axis=[1, 2], name="gap")
        h = tf.matmul(h, tf.constant(_imbalanced(rng, (6, 16), 1), name="dense1_w"),
                      name="dense1")
        h = tf.nn.relu(tf.nn.bias_add(h, bias(16, "dense1_b")), name="dense1_relu")
        tf.matmul(h, tf.constant(rng.normal(0, 0.3, (16, 5)).astype(np.float32),
                                 name="dense2_w"), name="out")

    return tf1_graph(build, [TensorSpec("x", "float32", (None, *SHAPE))], ["out"])


def _equalize(artifact: ModelArtifact, **params: Any) -> Any:
    stage = get_stage("equalize")
    return stage.run(artifact, stage.params(**params), StageContext("test", "equalize"))


def _inputs(n: int = 64, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (n, *SHAPE)).astype(np.float32)


def _consts(artifact: ModelArtifact) -> dict[str, np.ndarray]:
    return {n.name: const_value(n) for n in artifact.graph_def.node if n.op == "Const"}


def _ranges(w: np.ndarray, axis: int) -> np.ndarray:
    return np.abs(np.moveaxis(w, axis, -1)).reshape(-1, w.shape[axis]).max(axis=0)


def test_float_outputs_unchanged(chain: ModelArtifact) -> None:
    out = _equalize(chain).artifact
    x = _inputs()
    reference = run(chain, x)[0]
    assert_same_outputs(chain, out, x, tol=1e-4 * float(np.abs(reference).max()))


def test_pairs_and_only_their_constants_change(chain: ModelArtifact) -> None:
    result = _equalize(chain)
    pairs = {(p["first"], p["second"]) for p in result.info["equalized"]}
    assert pairs == PAIRS
    assert result.metrics["equalized_pairs"] == len(PAIRS)
    before, after = _consts(chain), _consts(result.artifact)
    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    # never through Relu6: conv4's weights and bias and conv3's bias are untouched
    assert changed == {"stem_w", "stem_b", "dw_w", "pw_w", "pw_b", "conv3_w", "dense1_w",
                       "dense1_b", "dense2_w"}
    # structure: the same nodes, ops and inputs
    assert [(n.name, n.op, list(n.input)) for n in result.artifact.graph_def.node] == \
        [(n.name, n.op, list(n.input)) for n in chain.graph_def.node]


def test_weight_ranges_balanced(chain: ModelArtifact) -> None:
    result = _equalize(chain, iterations=1)
    w = _consts(result.artifact)
    # an isolated pair is balanced exactly: dense1's output channel i and dense2's input
    # channel i end with the same range, sqrt(r1 * r2)
    r1, r2 = _ranges(w["dense1_w"], 1), _ranges(w["dense2_w"], 0)
    np.testing.assert_allclose(r1, r2, rtol=1e-5)
    old = _consts(chain)
    np.testing.assert_allclose(r1, np.sqrt(_ranges(old["dense1_w"], 1)
                                           * _ranges(old["dense2_w"], 0)), rtol=1e-5)
    # the depthwise filter's channel ranges (three decades apart) come much closer
    spread = {name: _ranges(c["dw_w"].reshape(3, 3, -1), 2)
              for name, c in (("before", old), ("after", w))}
    ratio = {k: float(v.max() / v.min()) for k, v in spread.items()}
    print(f"depthwise max/min channel range: {ratio}")
    assert ratio["after"] < 0.1 * ratio["before"]
    for iterations in (1, 8):  # the paper's objective improves, over all pairs
        metrics = _equalize(chain, iterations=iterations).metrics
        assert metrics["pair_precision_after"] > 1.2 * metrics["pair_precision_before"]


def test_shared_tensors_are_not_equalized() -> None:
    """A Relu read by the next conv and by a skip connection must keep its scale."""
    import tensorflow as tf

    rng = np.random.default_rng(2)

    def build() -> None:
        x = tf.compat.v1.placeholder(tf.float32, [None, *SHAPE], name="x")
        a = tf.nn.relu(tf.nn.conv2d(x, tf.constant(_imbalanced(rng, (3, 3, 3, 4), 3)), 1,
                                    "SAME", name="a"), name="a_relu")
        b = tf.nn.conv2d(a, tf.constant(_imbalanced(rng, (3, 3, 4, 4), 3)), 1, "SAME",
                         name="b")
        tf.add(a, b, name="out")

    artifact = tf1_graph(build, [TensorSpec("x", "float32", (None, *SHAPE))], ["out"])
    result = _equalize(artifact)
    assert result.metrics["equalized_pairs"] == 0
    assert "no pair of layers" in result.warnings[0]
    assert result.artifact.graph_def == artifact.graph_def


def test_eight_bit_weights_are_more_faithful(chain: ModelArtifact) -> None:
    """What equalization is for: per-tensor 8-bit weights (quantize_weights) lose less."""
    stage = get_stage("quantize_weights")
    x = _inputs(256, seed=3)
    reference = run(chain, x)[0]
    errors = {}
    for name, model in (("plain", chain), ("equalized", _equalize(chain).artifact)):
        weighted = stage.run(model, stage.params(minimum_size=1),
                             StageContext("test", "quantize_weights")).artifact
        errors[name] = float(np.sqrt(np.mean((run(weighted, x)[0] - reference) ** 2)
                                     / np.mean(reference ** 2)))
    print(f"8-bit weights, RMSE vs float over float's RMS: {errors}")
    assert errors["equalized"] < 0.5 * errors["plain"]
