"""GraphRunner: batching, including graphs that fix their batch size."""

from __future__ import annotations

import numpy as np

from orchestrator.measure.tf_runtime import GraphRunner


def graph(batch: int | None):
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, 3], name="x")
        tf.identity(x * 2.0 + 1.0, name="y")
    return g.as_graph_def()


def test_fixed_batch_pads_the_last_batch_and_trims_outputs() -> None:
    x = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    with GraphRunner(graph(4), ["x"], ["y"]) as runner:
        assert runner.fixed_batch_size() == 4
        assert [len(b) for b in runner.batches(x, 64)] == [4, 4]
        np.testing.assert_allclose(runner.predict(x), x * 2 + 1)


def test_free_batch_uses_the_requested_size() -> None:
    x = np.ones((5, 3), np.float32)
    with GraphRunner(graph(None), ["x"], ["y"]) as runner:
        assert runner.fixed_batch_size() is None
        assert [len(b) for b in runner.batches(x, 2)] == [2, 2, 1]
        np.testing.assert_allclose(runner.predict(x, 2), x * 3)


def test_predict_all_returns_every_output_in_order() -> None:
    import tensorflow as tf

    from orchestrator.measure.tf_runtime import predict, predict_all
    from orchestrator.model.artifact import ModelArtifact, TensorSpec

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")  # fixed batch: padded
        tf.identity(x * 2.0, name="double")
        tf.reduce_sum(x, axis=1, keepdims=True, name="total")
    artifact = ModelArtifact(graph_def=g.as_graph_def(), inputs=(TensorSpec("x"),),
                             outputs=("total", "double"))
    x = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    total, double = predict_all(artifact, x)
    assert total.shape == (5, 1) and double.shape == (5, 3)
    np.testing.assert_allclose(total, x.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(double, x * 2)
    np.testing.assert_allclose(predict(artifact, x), total)  # the first output, as before
