"""Where a .tflite's bytes go (orchestrator.model.tflite_bytes.bytes_by_kind), counted
independently from LiteRT's model object, and `shrink`: a smaller file with the same
signatures, input and output names and bit-identical outputs, on a small Conv2D /
DepthwiseConv2D / Dense CNN converted in full-integer, dynamic-range and float modes."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import ModelSourceError
from orchestrator.model.tflite_bytes import DROPPABLE_METADATA, KINDS, bytes_by_kind, shrink

MODES = ("int8", "dynamic", "float")


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits in [0, 1]: (calibration images, other images)."""
    from sklearn.datasets import load_digits

    images = (load_digits().images.astype(np.float32) / 16.0)[..., None]
    return images[:32], images[32:132]


@pytest.fixture(scope="module")
def models(digits: tuple[np.ndarray, np.ndarray]) -> dict[str, bytes]:
    """The CNN (random, seeded weights) as a .tflite per mode: int8 is full integer with
    int8 input and output; dynamic has int8 weights and float compute."""
    import keras
    import tensorflow as tf
    from keras import layers

    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(8, 8, 1), name="image")
    x = layers.Conv2D(8, 3, activation="relu", name="conv")(inputs)
    x = layers.DepthwiseConv2D(3, activation="relu", name="depthwise")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(32, activation="relu", name="dense")(x)
    outputs = layers.Dense(10, name="logits")(x)
    model = keras.Model(inputs, outputs)
    calibration = digits[0]

    def representative() -> Any:
        for sample in calibration:
            yield [sample[None]]

    converted = {}
    for mode in MODES:
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        if mode != "float":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if mode == "int8":
            converter.representative_dataset = representative
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
        with warnings.catch_warnings():  # int8 edges: "Statistics for quantized inputs
            # were expected, but not specified" (the converter's own, about the edges)
            warnings.filterwarnings("ignore", message="Statistics for quantized inputs")
            converted[mode] = bytes(converter.convert())
    return converted


def model_object(flatbuffer: bytes) -> Any:
    from ai_edge_litert.tools import flatbuffer_utils

    return flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))


def interpreter(flatbuffer: bytes, delegates: bool) -> Any:
    """LiteRT's interpreter: with its default XNNPACK delegate, or builtin kernels only."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    options = {} if delegates else {
        "experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    runner = Interpreter(model_content=flatbuffer, **options)
    runner.allocate_tensors()
    return runner


def outputs(flatbuffer: bytes, images: np.ndarray, delegates: bool) -> np.ndarray:
    """The serving signature's output for each image, the input quantized if int8."""
    runner = interpreter(flatbuffer, delegates).get_signature_runner("serving_default")
    given = runner.get_input_details()["image"]
    if given["dtype"] == np.int8:
        scale, zero_point = given["quantization"]
        images = np.clip(np.round(images / scale) + zero_point, -128, 127).astype(np.int8)
    [result] = runner(image=images).values()
    return result


def string_bytes(value: bytes | None) -> int:
    """A flatbuffer string: 4-byte length, the bytes, a NUL."""
    return 0 if value is None else 4 + len(value) + 1


def vector_bytes(values: Any, item_size: int) -> int:
    return 0 if values is None else 4 + len(values) * item_size


def per_channel(model: Any) -> list[Any]:
    return [tensor for subgraph in model.subgraphs for tensor in subgraph.tensors
            if tensor.quantization is not None and tensor.quantization.scale is not None
            and len(tensor.quantization.scale) > 1]


@pytest.mark.parametrize("mode", MODES)
def test_the_kinds_sum_to_the_file_size(models: dict[str, bytes], mode: str) -> None:
    counts = bytes_by_kind(models[mode])
    assert tuple(counts) == KINDS
    assert sum(counts.values()) == len(models[mode])
    assert all(counts[kind] > 0 for kind in ("weights", "names", "metadata", "graph"))
    assert (counts["quantization"] > 0) == (mode != "float")
    assert counts["weights"] > len(models[mode]) / 2  # a CNN's file is mostly weights


@pytest.mark.parametrize("mode", MODES)
def test_each_kind_matches_the_model_object(models: dict[str, bytes], mode: str) -> None:
    """The same bytes counted from LiteRT's object API (values, not file positions)."""
    model = model_object(models[mode])
    tensors = [tensor for subgraph in model.subgraphs for tensor in subgraph.tensors]
    quantization = sum(vector_bytes(getattr(tensor.quantization, field), size)
                       for tensor in tensors if tensor.quantization is not None
                       for field, size in (("min", 4), ("max", 4), ("scale", 4),
                                           ("zeroPoint", 8)))
    names = (string_bytes(model.description)
             + sum(string_bytes(subgraph.name) for subgraph in model.subgraphs)
             + sum(string_bytes(tensor.name) for tensor in tensors)
             + sum(string_bytes(entry.name) for entry in model.metadata)
             + sum(string_bytes(signature.signatureKey)
                   + sum(string_bytes(entry.name)
                         for entry in [*signature.inputs, *signature.outputs])
                   for signature in model.signatureDefs))
    weights = sum(vector_bytes(model.buffers[i].data, 1)
                  for i in {tensor.buffer for tensor in tensors})
    metadata = sum(vector_bytes(model.buffers[entry.buffer].data, 1)
                   for entry in model.metadata)
    counts = bytes_by_kind(models[mode])
    assert counts["quantization"] == quantization
    assert counts["names"] == names
    assert counts["weights"] == weights
    assert counts["metadata"] == metadata
    if mode == "int8":  # a float32 scale and an int64 zero point per channel, at least
        channels = sum(len(tensor.quantization.scale) for tensor in per_channel(model))
        assert channels >= 8 + 8 + 32 + 10  # conv, depthwise, dense, logits: 2 tensors each
        assert 12 * channels < counts["quantization"] < 12 * channels + 1000


@pytest.mark.parametrize("mode", ("int8", "dynamic"))
def test_shrink_computes_the_same_numbers(models: dict[str, bytes],
                                          digits: tuple[np.ndarray, np.ndarray],
                                          mode: str) -> None:
    original = models[mode]
    smaller, done = shrink(original)
    assert len(smaller) < len(original) and done["bytes_saved"] == len(original) - len(smaller)
    images = digits[1]
    for delegates in (True, False):
        reference = outputs(original, images, delegates)
        got = outputs(smaller, images, delegates)
        assert got.dtype == reference.dtype and got.shape == (len(images), 10)
        assert len(np.unique(reference)) > 20  # outputs that tell the files apart
        np.testing.assert_array_equal(got, reference)


def test_shrink_keeps_signatures_and_input_output_names(models: dict[str, bytes]) -> None:
    original = models["int8"]
    smaller, _ = shrink(original)
    before, after = interpreter(original, True), interpreter(smaller, True)
    assert after.get_signature_list() == before.get_signature_list() == {
        "serving_default": {"inputs": ["image"], "outputs": ["output_0"]}}
    for details in ("get_input_details", "get_output_details"):
        assert ([(d["name"], d["index"], d["dtype"], d["quantization"])
                 for d in getattr(after, details)()]
                == [(d["name"], d["index"], d["dtype"], d["quantization"])
                    for d in getattr(before, details)()])
    assert after.get_input_details()[0]["name"]  # a name kept, not an empty one
    runner, reference = (interp.get_signature_runner("serving_default")
                         for interp in (after, before))
    assert runner.get_input_details().keys() == reference.get_input_details().keys()
    assert runner.get_output_details().keys() == reference.get_output_details().keys()


def test_shrink_drops_intermediate_names_and_conversion_metadata(
        models: dict[str, bytes]) -> None:
    original = models["int8"]
    smaller, done = shrink(original)
    before, after = model_object(original), model_object(smaller)
    [graph_before], [graph_after] = before.subgraphs, after.subgraphs
    io = {int(i) for i in [*graph_before.inputs, *graph_before.outputs]}
    intermediate = [t for t in range(len(graph_before.tensors)) if t not in io]
    assert ";" in b"".join(graph_before.tensors[t].name for t in intermediate).decode()
    assert done["names_dropped"] == len(intermediate)
    assert all(graph_after.tensors[t].name is None for t in intermediate)
    assert all(graph_after.tensors[t].name == graph_before.tensors[t].name for t in io)
    assert graph_after.name == graph_before.name

    assert {entry.name.decode() for entry in before.metadata} >= set(DROPPABLE_METADATA)
    assert sorted(done["metadata_dropped"]) == sorted(DROPPABLE_METADATA)
    assert not after.metadata
    # every tensor keeps its data, its quantization and its zero points, fewer buffers
    assert done["zero_points_shortened"] == 0
    for old, new in zip(graph_before.tensors, graph_after.tensors, strict=True):
        old_data, new_data = (model.buffers[t.buffer].data
                              for model, t in ((before, old), (after, new)))
        assert (old_data is None) == (new_data is None)
        if old_data is not None:
            assert bytes(old_data) == bytes(new_data)
        for field in ("scale", "zeroPoint", "quantizedDimension"):
            assert np.array_equal(getattr(old.quantization, field),
                                  getattr(new.quantization, field))
    assert len(after.buffers) == len(before.buffers) - 2 - done["empty_buffers_merged"]

    counts, shrunk = bytes_by_kind(original), bytes_by_kind(smaller)
    assert shrunk["metadata"] == 0 and shrunk["names"] < counts["names"] / 3
    assert shrunk["weights"] == counts["weights"]
    assert shrunk["quantization"] == counts["quantization"]
    assert shrink(smaller)[1]["bytes_saved"] == 0  # nothing left to drop


def test_reserialising_alone_gives_the_same_bytes(models: dict[str, bytes]) -> None:
    """Why shrink's savings are its edits': the converter's file round-trips exactly."""
    from ai_edge_litert.tools import flatbuffer_utils

    for flatbuffer in models.values():
        again = flatbuffer_utils.convert_object_to_bytearray(model_object(flatbuffer))
        assert bytes(again) == flatbuffer


@pytest.mark.parametrize("zero_point", ([0], []), ids=("one", "empty"))
def test_litert_rejects_shortened_zero_points(models: dict[str, bytes],
                                              zero_point: list[int]) -> None:
    """Why shrink keeps the all-zero zero points of per-channel tensors: LiteRT's model
    reader wants as many zero points as scales. If a future LiteRT accepts fewer, this
    fails and shrink can shorten them (8 bytes a channel)."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = model_object(models["int8"])
    tensors = per_channel(model)
    assert tensors and all(not np.any(t.quantization.zeroPoint) for t in tensors)
    for tensor in tensors:
        tensor.quantization.zeroPoint = np.asarray(zero_point, dtype=np.int64)
    edited = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    for delegates in (True, False):
        with pytest.raises(ValueError, match="zero_point values and .* scale values"):
            interpreter(edited, delegates)


def test_buffers_after_the_flatbuffer(models: dict[str, bytes],
                                      digits: tuple[np.ndarray, np.ndarray]) -> None:
    """The layout of files over 2 GB, on a small one: the largest buffer's data after the
    flatbuffer, found by offset (the LiteRT Quantizer writes ONet's so). bytes_by_kind
    counts it (without a length prefix); shrink takes it back inside."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    original = models["int8"]
    model = model_object(original)
    largest = max(range(len(model.buffers)), key=lambda i: vector_bytes(
        model.buffers[i].data, 1))
    payload = bytes(model.buffers[largest].data)
    model.buffers[largest].data = None
    model.buffers[largest].offset, model.buffers[largest].size = 1 << 40, len(payload)
    head = flatbuffer_utils.convert_object_to_bytearray(model)
    head += bytes(-len(head) % 16)
    flatbuffer_utils.update_packed_buffer(
        schema.Model.GetRootAs(head, 0).Buffers(largest), offset=len(head))
    outside = bytes(head) + payload
    np.testing.assert_array_equal(outputs(outside, digits[1], False),
                                  outputs(original, digits[1], False))

    counts = bytes_by_kind(outside)
    assert sum(counts.values()) == len(outside)
    assert counts["weights"] == bytes_by_kind(original)["weights"] - 4
    inside, done = shrink(outside)  # the data taken back into the flatbuffer
    assert model_object(inside).buffers[largest].offset == 0
    np.testing.assert_array_equal(outputs(inside, digits[1], False),
                                  outputs(original, digits[1], False))
    assert bytes_by_kind(inside)["weights"] == bytes_by_kind(original)["weights"]
    assert done["names_dropped"] > 0


def test_not_a_tflite_is_refused() -> None:
    for data in (b"", b"\x00" * 64, b"PK\x03\x04" + bytes(60)):
        for function in (bytes_by_kind, shrink):
            with pytest.raises(ModelSourceError, match="not a LiteRT flatbuffer"):
                function(data)
