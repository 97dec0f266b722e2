"""Ops the LiteRT Quantizer has no rule for (EXPAND_DIMS / SQUEEZE of a Conv1D, PRELU),
rewritten into ones it has: the float model computes the same numbers, its ops change as
described, and the quantized file then computes in integer only (before the rewrite,
those ops stayed float between a DEQUANTIZE and a QUANTIZE)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from orchestrator.model.litert_precision import computes_in, float_ops
from orchestrator.quant import litert_quantizer as aeq
from orchestrator.quant.litert_rewrites import rewrite_for_quantizer


@pytest.fixture(scope="module")
def float_model() -> bytes:
    """Conv1D (EXPAND_DIMS, CONV_2D, SQUEEZE), PReLU, global pooling, Dense: a float
    .tflite with random, fixed weights."""
    import keras
    import tensorflow as tf
    from keras import layers

    keras.utils.set_random_seed(3)
    inputs = keras.Input(shape=(64, 2), name="signal")
    x = layers.Conv1D(8, 5, name="conv")(inputs)
    x = layers.PReLU(shared_axes=[1], name="prelu",
                     alpha_initializer=keras.initializers.Constant(0.2))(x)
    x = layers.Conv1D(8, 3, activation="relu", name="conv2")(x)
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = layers.Dense(3, name="logits")(x)
    model = keras.Model(inputs, outputs)
    return bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())


def op_counts(flatbuffer: bytes) -> Counter[str]:
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    return Counter(flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
                   for op in model.subgraphs[0].operators)


def run(flatbuffer: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer)
    interpreter.allocate_tensors()
    [given], [out] = interpreter.get_input_details(), interpreter.get_output_details()
    rows = []
    for sample in x:
        interpreter.set_tensor(given["index"], sample[None])
        interpreter.invoke()
        rows.append(interpreter.get_tensor(out["index"]).copy())
    return np.concatenate(rows)


def signal(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, 64, 2)).astype(np.float32)


def test_the_rewritten_float_model_computes_the_same(float_model: bytes) -> None:
    before = op_counts(float_model)
    assert before["EXPAND_DIMS"] == 2 and before["PRELU"] == 1
    rewritten, done = rewrite_for_quantizer(float_model)
    after = op_counts(rewritten)
    assert done == {"EXPAND_DIMS": 2, "PRELU": 1, **({"SQUEEZE": before["SQUEEZE"]}
                                                     if before["SQUEEZE"] else {})}
    assert not {"EXPAND_DIMS", "SQUEEZE", "PRELU"} & set(after)
    assert after["RESHAPE"] == before["RESHAPE"] + 2 + before["SQUEEZE"]
    assert after["RELU"] >= 1 and after["SUB"] == 1 and after["ADD"] == before["ADD"] + 1
    x = signal(20, 0)
    reference, got = run(float_model, x), run(rewritten, x)
    assert got.shape == reference.shape
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)


def test_a_model_with_nothing_to_rewrite_is_unchanged(float_model: bytes) -> None:
    rewritten, _ = rewrite_for_quantizer(float_model)
    again, done = rewrite_for_quantizer(rewritten)
    assert done == {} and again == rewritten


def quantized(flatbuffer: bytes) -> bytes:
    import logging

    named = aeq.with_signature(flatbuffer, ["signal"], ["logits"])
    made = aeq.quantizer_for(named, "static_wi8_ai8", {}, per_channel=True, float_io=True)
    data = aeq.signature_batches(named, [signal(32, seed) for seed in range(1, 5)])
    return aeq.quantize(made, data, logging.getLogger("test"))


def test_after_the_rewrite_the_quantized_file_is_integer_only(float_model: bytes) -> None:
    plain = quantized(float_model)
    assert computes_in(plain) == "int8+float"  # the quantizer left them in float
    assert {"EXPAND_DIMS", "PRELU"} <= set(float_ops(plain))
    rewritten = quantized(rewrite_for_quantizer(float_model)[0])
    assert computes_in(rewritten) == "int8"
    x = signal(50, 9)
    reference, got = run(float_model, x), run(rewritten, x)
    error = got - reference
    assert 10 * np.log10(np.mean(reference ** 2) / np.mean(error ** 2)) > 20  # dB
