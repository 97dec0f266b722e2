"""A .tflite's operators (orchestrator.model.litert_model.operators), on a small Keras model
(conv 3x3, depthwise 3x3 stride 2, conv 1x1, mean, dense, softmax) converted in float and
in full int8: each op classified by its kernel, at its precision, its FLOPs as TF's
profiler counts the graph's ops (summing to count_flops), its bytes at its dtype's width,
and its shape named as a reader checks it."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from orchestrator.model.litert_model import count_flops, operators
from orchestrator.model.operators import Operator

H = W = 16  # input 16x16x3
KINDS = ["conv", "depthwise", "conv_1x1", "pool", "fully_connected", "softmax"]


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    import keras
    import tensorflow as tf
    from keras import layers

    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(H, W, 3), name="image")
    x = layers.Conv2D(16, 3, padding="same", activation="relu", name="conv3x3")(inputs)
    x = layers.DepthwiseConv2D(3, strides=2, padding="same", activation="relu",
                               name="dw")(x)
    x = layers.Conv2D(32, 1, activation="relu", name="pw")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    x = layers.Dense(10, bias_initializer="ones", name="dense")(x)
    model = keras.Model(inputs, layers.Softmax(name="softmax")(x))
    samples = np.random.default_rng(0).random((2, H, W, 3), dtype=np.float32)

    def representative() -> Any:
        for sample in samples:
            yield [sample[None]]

    converted = {}
    for mode in ("float", "int8"):
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        if mode == "int8":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = representative
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Statistics for quantized inputs")
            converted[mode] = bytes(converter.convert())
    return converted


def by_kind(found: list[Operator]) -> dict[str, Operator]:
    assert len({o.kind for o in found}) == len(found), found  # one op of each kind here
    return {o.kind: o for o in found}


@pytest.mark.parametrize("mode", ["float", "int8"])
def test_each_op_has_its_kind_precision_and_the_profilers_flops(files: dict[str, bytes],
                                                                mode: str) -> None:
    found = operators(files[mode])
    assert [o.kind for o in found] == KINDS, found
    assert [o.op for o in found] == ["CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D", "MEAN",
                                     "FULLY_CONNECTED", "SOFTMAX"]
    precision = "float32" if mode == "float" else "int8"
    assert {o.precision for o in found} == {precision}
    assert sum(o.flops for o in found) == count_flops(files[mode])[0]
    assert count_flops(files[mode])[1] == precision
    ops = by_kind(found)
    # 2 per multiply-add plus the fused bias, one per output element (the graph's BiasAdd)
    assert ops["conv"].flops == 2 * (H * W * 16) * (3 * 3 * 3) + H * W * 16
    assert ops["depthwise"].flops == 2 * (8 * 8 * 16) * (3 * 3) + 8 * 8 * 16
    assert ops["conv_1x1"].flops == 2 * (8 * 8 * 32) * 16 + 8 * 8 * 32
    assert ops["pool"].flops == 8 * 8 * 32  # a mean: one per input element
    assert ops["fully_connected"].flops == 2 * 10 * 32 + 10
    assert ops["softmax"].flops == 5 * 10  # the profiler's 5 per element
    assert [o.elements for o in found] == [H * W * 16, 8 * 8 * 16, 8 * 8 * 32, 32, 10, 10]
    assert ops["conv"].detail == "3x3/1 3->16 ch, 16x16 out"
    assert ops["depthwise"].detail == "3x3/2 16->16 ch, 8x8 out"
    assert ops["conv_1x1"].detail == "1x1/1 16->32 ch, 8x8 out"
    assert ops["fully_connected"].detail == "320 weights"
    assert all(Operator.from_row(o.to_row()) == o for o in found)  # report.json's rows


def test_int8_moves_about_a_quarter_of_the_bytes(files: dict[str, bytes]) -> None:
    floats, ints = by_kind(operators(files["float"])), by_kind(operators(files["int8"]))
    # the 3x3 conv: input, filter and output, 4 bytes each in float; the bias 4 in both
    weights, bias = 16 * 3 * 3 * 3, 16
    moved = H * W * 3 + weights + H * W * 16
    assert floats["conv"].bytes == 4 * moved + 4 * bias
    assert ints["conv"].bytes == moved + 4 * bias  # int8 tensors, an int32 bias
    for kind in ("conv", "depthwise", "conv_1x1"):
        assert 0.24 < ints[kind].bytes / floats[kind].bytes < 0.3, kind
    for kind in KINDS:  # the same ops, shapes and arithmetic
        assert (ints[kind].flops, ints[kind].elements, ints[kind].detail) == (
            floats[kind].flops, floats[kind].elements, floats[kind].detail)
