"""Trained ranges: the float model fine-tuned through LiteRT's simulated int8 kernels.

Warden's "trained ranges" (Building Mobile Applications with TensorFlow): after ranges
from representative data, integrate quantization into training with
`FakeQuantWithMinMaxVars`, and the loss mostly goes. Here without labels: the loss is the
distance of the fake-quantized model's outputs to the float model's own on the same
representative inputs (distillation), each output's mean squared error over its float
power, summed (a softmax output is matched on the logits it reads). Weights and ranges
both train (Adam; the weights at a small step relative to their size, the ranges at a
larger one); ranges start at each tensor's min and max over the data. The loss over all
the data is measured a few times along the way, and the best state is kept (the start,
when nothing beat it: a model min-max already quantizes well must not lose to noise).

The result is what the quantizer then takes: the float `.tflite` with the fine-tuned
weights written back into its buffers (same ops, shapes and tensor names), and the
trained range of each tensor that has its own (`litert_quantizer.quantize(...,
fixed_ranges=...)`). The model is rebuilt from the flatbuffer (`tflite_replica`), so any
model source the recipe takes fine-tunes alike.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Adam steps, relative to each variable's size: a weight's largest magnitude, a range's
# width. The weights move by fractions of an int8 step (1/127 of the largest);
# a range may move a few percent.
WEIGHT_STEP = 5e-5
RANGE_STEP = 5e-3
BETAS, EPSILON = (0.9, 0.999), 1e-8
CHECKS = 6  # the loss on all the data measured this many times; the best state is kept


@dataclass(frozen=True)
class TrainedModel:
    """The fine-tuned float model, its trained activation ranges and what happened."""

    float_model: bytes
    ranges: dict[str, tuple[float, float]]
    report: dict[str, Any] = field(default_factory=dict)


def fine_tune(float_model: bytes, batches: list[np.ndarray], *, steps: int, log: Any,
              seed: int = 0, initial_ranges: Mapping[str, tuple[float, float]] | None = None
              ) -> TrainedModel:
    """Fine-tune `float_model`'s weights and activation ranges for `steps` Adam steps, one
    batch of `batches` (the representative data) a step, shuffled by `seed`; ValueError
    naming the ops the replica cannot build. `initial_ranges` (tensor name -> (min, max),
    say a model's own FakeQuant ranges) start those tensors' ranges instead of the data's
    min and max."""
    import tensorflow as tf

    from orchestrator.quant.tflite_replica import Replica

    if not batches:
        raise ValueError("fine-tuning needs representative data")
    started = time.perf_counter()
    replica = Replica(float_model)
    batches = [np.asarray(b, dtype=np.float32) for b in batches]
    replica.initialise_ranges(batches)
    for name, (low, high) in (initial_ranges or {}).items():
        if name in replica.ranges:
            replica.ranges[name][0].assign(min(float(low), 0.0))
            replica.ranges[name][1].assign(max(float(high), 0.0))
    targets = [[t.numpy() for t in replica.logits(b, quantize=False)] for b in batches]
    powers = [max(float(np.mean(np.concatenate([t[k].reshape(-1) for t in targets]) ** 2)),
                  1e-12) for k in range(len(targets[0]))]

    weights = list(replica.weights.values())
    bounds = [v for pair in replica.ranges.values() for v in pair]
    variables = weights + bounds
    steps_of: list[Any] = [WEIGHT_STEP * _channel_size(v.numpy(), replica.channel_axis[b])
                           for b, v in replica.weights.items()]
    for low, high in replica.ranges.values():
        width = max(float(high.numpy() - low.numpy()), 1e-6)
        steps_of += [RANGE_STEP * width] * 2
    adam = _Adam(variables, steps_of)

    def loss_on(x: Any, wanted: list[Any]) -> Any:
        got = replica.logits(x, quantize=True)
        return tf.add_n([tf.reduce_mean(tf.square(g - w)) / p
                         for g, w, p in zip(got, wanted, powers, strict=True)])

    @tf.function(reduce_retracing=True, autograph=False)
    def train_step(x: Any, wanted: list[Any]) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_on(x, wanted)
        adam.apply(tape.gradient(loss, variables))
        return loss

    evaluate = tf.function(loss_on, reduce_retracing=True, autograph=False)

    def mean_loss() -> float:
        return float(np.mean([evaluate(b, t).numpy() for b, t in zip(batches, targets,
                                                                     strict=True)]))

    before = mean_loss()
    best, best_step, kept = before, 0, [v.numpy() for v in variables]
    every = max(steps // CHECKS, 1)
    for step, index in enumerate(_order(len(batches), steps, seed), start=1):
        train_step(batches[index], targets[index])
        if step % every == 0 or step == steps:
            loss = mean_loss()
            log.debug("fine-tune step %d: loss %.4g", step, loss)
            if loss < best:
                best, best_step, kept = loss, step, [v.numpy() for v in variables]
    # the best state seen on the data (the start when nothing beat it): a model that min-max
    # already quantizes well gains nothing, and must not lose to the steps' noise
    for variable, value in zip(variables, kept, strict=True):
        variable.assign(value)
    after = best
    tuned = replica.written_back()
    _check_written(tuned, replica)
    seconds = time.perf_counter() - started
    log.info("trained ranges: %d steps, loss %.4g -> %.4g in %.1fs", steps, before, after,
             seconds)
    report = {"steps": steps, "best_step": best_step, "loss_before": before,
              "loss_after": after,
              "seconds": round(seconds, 3), "batches": len(batches),
              "quantized_ops": replica.quantized_ops(),
              "ranged_tensors": sorted(replica.ranges), "weights": len(weights)}
    return TrainedModel(tuned, replica.trained_ranges(), report)


def _channel_size(weight: np.ndarray, axis: int) -> np.ndarray:
    """Each channel's largest magnitude, broadcastable against `weight` (one outlier in a
    channel then sets only its own channel's step, as it sets its int8 scale)."""
    others = tuple(a for a in range(weight.ndim) if a != axis)
    # a bias: one size for the tensor
    top = np.abs(weight).max(axis=others, keepdims=True) if others else np.abs(weight).max()
    return np.maximum(top, 1e-8).astype(np.float32)


def _order(count: int, steps: int, seed: int) -> list[int]:
    """Batch indices for `steps` steps: every batch once per epoch, each epoch shuffled."""
    rng = np.random.RandomState(seed)
    order: list[int] = []
    while len(order) < steps:
        order.extend(int(i) for i in rng.permutation(count))
    return order[:steps]


def _check_written(tuned: bytes, replica: Any) -> None:
    """The written flatbuffer holds every trained weight exactly (read back)."""
    from orchestrator.quant.tflite_replica import Replica

    again = Replica(tuned)
    for buffer, variable in replica.weights.items():
        if not np.array_equal(again.weights[buffer].numpy(), variable.numpy()):
            raise RuntimeError(f"buffer {buffer}: the weights written back differ")


class _Adam:
    """Adam with a step size per variable (TF's Keras optimizers want Keras variables)."""

    def __init__(self, variables: list[Any], steps: list[float]) -> None:
        import tensorflow as tf

        self.variables, self.steps = variables, steps
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables]
        self.t = tf.Variable(0.0, trainable=False)

    def apply(self, gradients: list[Any]) -> None:
        import tensorflow as tf

        self.t.assign_add(1.0)
        b1, b2 = BETAS
        correction = tf.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
        for var, grad, m, v, step in zip(self.variables, gradients, self.m, self.v,
                                         self.steps, strict=True):
            if grad is None:
                continue
            m.assign(b1 * m + (1 - b1) * grad)
            v.assign(b2 * v + (1 - b2) * tf.square(grad))
            var.assign_sub(step * correction * m / (tf.sqrt(v) + EPSILON))
