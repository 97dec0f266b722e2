"""Trained ranges (quant/trained_ranges, quant/tflite_replica): the float .tflite rebuilt as
TensorFlow reproduces LiteRT's float interpreter; fine-tuned through simulated int8 kernels,
its quantized file is closer to float than min-max's (the separable digits CNN: min-max
costs it 36 dB on the logits, trained ranges about 39); an op the replica cannot build is
named."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest
from support import quant_fixtures

from orchestrator.model.artifact import ModelArtifact
from orchestrator.quant import litert_quantizer as aeq
from orchestrator.quant.tflite_replica import Replica
from orchestrator.quant.trained_ranges import fine_tune

separable, digits = quant_fixtures.separable, quant_fixtures.digits
LOG = logging.getLogger("test")
INT8, INT32 = 9, 2  # schema TensorType
EDGES = ("QUANTIZE", "DEQUANTIZE")


@pytest.fixture(scope="module")
def float_model(separable: ModelArtifact) -> bytes:
    payload = quant_fixtures.apply("convert_tflite", separable, mode="fp32").artifact.payload
    assert payload is not None
    return payload


def batches_of(x: np.ndarray, size: int = 32) -> list[np.ndarray]:
    return [x[start:start + size].astype(np.float32) for start in range(0, len(x), size)]


def run(model: bytes, x: np.ndarray, tensor: str | None = None) -> np.ndarray:
    """The model's output on x, or tensor `tensor` (dequantized when int8)."""
    import warnings

    from orchestrator.model.litert_model import interpreter

    with warnings.catch_warnings():  # "preserve_all_tensors ... for debugging": it is
        warnings.simplefilter("ignore")
        it = interpreter(model, allocate=False, experimental_preserve_all_tensors=True)
    given = it.get_input_details()[0]
    it.resize_tensor_input(given["index"], list(x.shape))
    it.allocate_tensors()
    it.set_tensor(given["index"], x.astype(np.float32))
    it.invoke()
    found = it.get_output_details()[0] if tensor is None else next(
        t for t in it.get_tensor_details() if t["name"] == tensor)
    value = it.get_tensor(found["index"]).astype(np.float32)
    scale, zero = found["quantization"]
    return (value - zero) * scale if scale else value


def parsed(model: bytes) -> tuple[list[str], list[tuple[str, int]]]:
    """Tensor names, and each op's kind with its first output's type."""
    from ai_edge_litert.tools import flatbuffer_utils

    obj = flatbuffer_utils.convert_bytearray_to_object(bytearray(model))
    graph = obj.subgraphs[0]
    names = [t.name.decode() if isinstance(t.name, bytes) else t.name for t in graph.tensors]
    ops = [(flatbuffer_utils.opcode_to_name(obj, op.opcodeIndex),
            int(graph.tensors[op.outputs[0]].type)) for op in graph.operators]
    return names, ops


def sqnr_db(reference: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(reference ** 2) / np.mean((reference - got) ** 2)))


def test_the_replica_computes_what_the_float_interpreter_does(float_model: bytes,
                                                              digits: dict) -> None:
    x = digits["x_test"][:64].astype(np.float32)
    replica = Replica(float_model)
    (got,) = replica.forward(x, quantize=False)
    assert np.abs(got.numpy() - run(float_model, x)).max() < 1e-5
    # every conv / depthwise / fully connected filter and bias is a variable
    kinds = Counter(kind for kind, _ in replica.ops)
    weighted = kinds["CONV_2D"] + kinds["DEPTHWISE_CONV_2D"] + kinds["FULLY_CONNECTED"]
    assert weighted >= 4 and len(replica.weights) == 2 * weighted
    # fake-quantized: close to float, not equal (int8 rounding happened)
    replica.initialise_ranges(batches_of(digits["x_calib"][:200]))
    (quantized,) = replica.forward(x, quantize=True)
    assert 20 < sqnr_db(got.numpy(), quantized.numpy()) < 60


def test_trained_ranges_beat_min_max_on_the_logits(float_model: bytes, digits: dict) -> None:
    batches = batches_of(digits["x_calib"][:200])
    trained = fine_tune(float_model, batches, steps=100, log=LOG, seed=0)
    assert trained.report["loss_after"] < 0.8 * trained.report["loss_before"]

    # the fine-tuned float model: same ops and tensor names, other weights
    names, ops = parsed(float_model)
    tuned_names, tuned_ops = parsed(trained.float_model)
    assert tuned_names == names and tuned_ops == ops
    assert trained.float_model != float_model
    assert set(trained.ranges) <= set(names) and len(trained.ranges) >= 5
    assert all(low <= 0.0 < high for low, high in trained.ranges.values())

    def quantized(model: bytes, fixed: dict | None) -> bytes:
        made = aeq.quantizer_for(model, "static_wi8_ai8", {}, per_channel=True, float_io=True)
        return aeq.quantize(made, aeq.signature_batches(model, batches), LOG,
                            fixed_ranges=fixed)

    min_max = quantized(float_model, None)
    tuned = quantized(trained.float_model, trained.ranges)
    # every op but the edges computes in int8, in both files alike
    for model in (min_max, tuned):
        _, kinds = parsed(model)
        inner = [(kind, kind_type) for kind, kind_type in kinds if kind not in EDGES]
        assert Counter(kind for kind, _ in inner) == Counter(k for k, _ in ops)
        assert all(kind_type == INT8 for _, kind_type in inner), inner

    # held-out data, the softmax's input (the logits) against float's
    logits = _softmax_input(float_model)
    x = digits["x_test"].astype(np.float32)
    reference = run(float_model, x, logits)
    by_min_max, by_trained = sqnr_db(reference, run(min_max, x, logits)), \
        sqnr_db(reference, run(tuned, x, logits))
    assert by_trained > by_min_max + 1.5, (by_min_max, by_trained)


def _softmax_input(model: bytes) -> str:
    replica = Replica(model)
    op = next(op for kind, op in replica.ops if kind == "SOFTMAX")
    return replica.name(int(op.inputs[0]))


def test_an_op_the_replica_cannot_build_is_named() -> None:
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def exp(x: tf.Tensor) -> tf.Tensor:
        return tf.exp(x) + 1.0

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [exp.get_concrete_function()], exp)
    model = converter.convert()
    assert "EXP" in {kind for kind, _ in parsed(model)[1]}
    with pytest.raises(ValueError, match="EXP"):
        fine_tune(model, [np.ones((1, 4), np.float32)], steps=1, log=LOG)
