"""convert_tflite {mode: dynamic_range, per_channel: false} on a small residual
separable-convolution CNN (Conv2D, SeparableConv2D, DepthwiseConv2D, batch norms, a residual
Add, a Dense head), trained for a few epochs on scikit-learn's 8x8 digits.

LiteRT's hybrid DEPTHWISE_CONV_2D kernel (float input, int8 filter) multiplies output channel
c by the filter's scale[c]; a per-tensor filter has one scale, which its Prepare check lets
through (it compares the count with the filter's size along quantized_dimension 0: 1), so
channels 1.. read past it: garbage, NaN, worse than chance. The stage keeps those filters per
channel, says so in a warning, and leaves every other weight per tensor."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from support.quant_fixtures import agreement, apply, freeze, predict

from orchestrator.model.artifact import ModelArtifact

WIDTH = 48    # channels: a 5x5 depthwise filter of 48 has 1,200 weights (the converter
KERNEL = 5    # quantizes weights of 1,024 and more only, and leaves smaller ones float)
HIDDEN = 32   # the head's hidden units: 48x32 weights, quantized; its last 32x10 stay float
DEPTHWISE_FILTERS = 2  # the SeparableConv2D's and the DepthwiseConv2D's


@pytest.fixture(scope="module")
def trained() -> tuple[ModelArtifact, np.ndarray]:
    """The frozen CNN (dynamic batch) and the held-out digits it is compared on."""
    import keras
    from keras import layers
    from sklearn.datasets import load_digits

    keras.utils.set_random_seed(0)
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[..., None]
    y = digits.target
    inputs = keras.Input(shape=(8, 8, 1), name="image")
    h = layers.Conv2D(WIDTH, KERNEL, padding="same", use_bias=False, name="stem")(inputs)
    h = layers.ReLU()(layers.BatchNormalization(momentum=0.9)(h))
    z = layers.SeparableConv2D(WIDTH, KERNEL, padding="same", use_bias=False, name="sep")(h)
    z = layers.ReLU()(layers.BatchNormalization(momentum=0.9)(z))
    z = layers.DepthwiseConv2D(KERNEL, padding="same", use_bias=False, name="dw")(z)
    z = layers.BatchNormalization(momentum=0.9)(z)
    h = layers.ReLU()(layers.Add()([z, h]))
    h = layers.GlobalAveragePooling2D()(h)
    h = layers.Dense(HIDDEN, activation="relu", name="hidden")(h)
    outputs = layers.Dense(10, activation="softmax", name="probs")(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss="sparse_categorical_crossentropy")
    model.fit(x[:1400], y[:1400], epochs=3, batch_size=32, verbose=0)
    x_test = x[1400:]
    graph = freeze(model, (None, 8, 8, 1))
    accuracy = np.mean(predict(graph, x_test).argmax(axis=1) == y[1400:])
    assert accuracy > 0.7  # it learned (chance: 0.1)
    return graph, x_test


@pytest.fixture(scope="module")
def reference(trained: tuple[ModelArtifact, np.ndarray]) -> np.ndarray:
    graph, x_test = trained
    return predict(graph, x_test)


@pytest.fixture(scope="module")
def convert(trained: tuple[ModelArtifact, np.ndarray]) -> Any:
    """Call with convert_tflite's params (dynamic_range): each conversion made once."""
    @functools.cache
    def converted(**params: Any) -> Any:
        return apply("convert_tflite", trained[0], mode="dynamic_range", **params)
    return converted


def outputs(flatbuffer: bytes, x: np.ndarray) -> np.ndarray:
    """The model's output on all of `x`, by LiteRT's own interpreter."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer)
    [given] = interpreter.get_input_details()
    interpreter.resize_tensor_input(given["index"], list(x.shape))
    interpreter.allocate_tensors()
    interpreter.set_tensor(given["index"], x.astype(np.float32))
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def weight_scales(flatbuffer: bytes) -> list[tuple[str, str, int, int]]:
    """(op, its input's type, scales of its int8 weights, their quantized dimension) per op
    with int8 weights (second input)."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    [subgraph] = model.subgraphs
    found = []
    for op in subgraph.operators:
        if len(op.inputs) < 2 or op.inputs[1] < 0:
            continue
        given, kernel = (subgraph.tensors[int(i)] for i in op.inputs[:2])
        if kernel.type == flatbuffer_utils.TensorType.INT8:
            found.append((flatbuffer_utils.opcode_to_name(model, op.opcodeIndex),
                          flatbuffer_utils.type_to_name(given.type),
                          len(kernel.quantization.scale),
                          int(kernel.quantization.quantizedDimension)))
    return found


def depthwise_filters(flatbuffer: bytes) -> list[tuple[bytes, list[float]]]:
    """(int8 values, scales) of each DEPTHWISE_CONV_2D filter."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    [subgraph] = model.subgraphs
    kernels = [subgraph.tensors[int(op.inputs[1])] for op in subgraph.operators
               if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) == "DEPTHWISE_CONV_2D"]
    return [(np.asarray(model.buffers[k.buffer].data, dtype=np.uint8).tobytes(),
             list(k.quantization.scale)) for k in kernels]


def fidelity(flatbuffer: bytes, trained: Any, reference: np.ndarray) -> tuple[float, float]:
    """(top-1 agreement with the float graph, max abs difference of the probabilities)."""
    after = outputs(flatbuffer, trained[1])
    return agreement(after, reference), float(np.abs(after - reference).max())


@pytest.mark.parametrize("strip_names", [False, True])
def test_per_tensor_dynamic_range_keeps_hybrid_depthwise_per_channel(
        trained: Any, reference: np.ndarray, convert: Any, strip_names: bool) -> None:
    default = convert(strip_names=strip_names)  # per channel
    result = convert(per_channel=False, strip_names=strip_names)
    payload = result.artifact.payload
    # as close to the float model as the per-channel default (before the fix: NaN, ~0.1)
    agree, worst = fidelity(payload, trained, reference)
    default_agree, default_worst = fidelity(default.artifact.payload, trained, reference)
    assert default_agree >= 0.97 and default_worst < 0.15, (default_agree, default_worst)
    assert agree >= 0.97 and worst < 0.15, (agree, worst)
    # per tensor where LiteRT reads it right; the hybrid depthwise filters per channel
    scales = weight_scales(payload)
    assert sorted({op for op, *_ in scales}) == ["CONV_2D", "DEPTHWISE_CONV_2D",
                                                 "FULLY_CONNECTED"]
    assert all(given == "FLOAT32" for _, given, _, _ in scales)  # hybrid: float inputs
    depthwise = [(n, axis) for op, _, n, axis in scales if op == "DEPTHWISE_CONV_2D"]
    assert depthwise == [(WIDTH, 3)] * DEPTHWISE_FILTERS
    assert all(n == 1 for op, _, n, _ in scales if op != "DEPTHWISE_CONV_2D")
    assert all(n > 1 for op, _, n, _ in weight_scales(default.artifact.payload))
    # those filters are the per-channel conversion's own, values and scales
    assert depthwise_filters(payload) == depthwise_filters(default.artifact.payload)
    # said, not silent; and smaller than the default still: 12 bytes a channel saved on
    # the other weights
    assert result.info["tflite"]["kept_per_channel"] == {"DEPTHWISE_CONV_2D": DEPTHWISE_FILTERS}
    [warning] = result.warnings
    assert "per_channel: false" in warning and f"{DEPTHWISE_FILTERS} DEPTHWISE_CONV_2D" in warning
    assert "kept per channel" in warning and "repeated" not in warning
    saved = len(default.artifact.payload) - len(payload)
    # the stem's and the pointwise conv's scales, WIDTH each, the hidden layer's, HIDDEN;
    # give or take the flatbuffer's alignment
    assert saved == pytest.approx(12 * ((WIDTH - 1) * 2 + HIDDEN - 1), abs=16)
    assert "kept_per_channel" not in default.info["tflite"] and default.warnings == []


def test_unmatched_per_channel_conversion_repeats_the_one_scale(
        trained: Any, reference: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the per-channel conversion does not match operator for operator, a filter keeps
    its per-tensor int8 values and its one scale, written once per channel: the same
    arithmetic as per tensor, read right by the kernel."""
    from orchestrator.stages import convert_tflite

    graph, _ = trained
    monkeypatch.setattr(convert_tflite, "_per_channel_twin", lambda *args: None)
    result = apply("convert_tflite", graph, mode="dynamic_range", per_channel=False)
    agree, worst = fidelity(result.artifact.payload, trained, reference)
    assert agree >= 0.97 and worst < 0.15, (agree, worst)
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(result.artifact.payload))
    [subgraph] = model.subgraphs
    repeated = [subgraph.tensors[int(op.inputs[1])].quantization for op in subgraph.operators
                if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
                == "DEPTHWISE_CONV_2D"]
    assert len(repeated) == DEPTHWISE_FILTERS
    assert all(len(set(q.scale)) == 1 and len(q.scale) == WIDTH for q in repeated)
    [warning] = result.warnings
    assert f"{DEPTHWISE_FILTERS} of them with their one scale repeated" in warning
