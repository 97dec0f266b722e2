"""A model with FakeQuant nodes converts with its own ranges, in both 8-bit paths.

The model (tests/support/fake_quant_model.py): the digits CNN with FakeQuant nodes where
contrib quantize puts them, its activation ranges narrower than what calibration measures,
so every check below fails if the ranges came from the data instead.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from support import fake_quant_model as fm
from support import quant_fixtures
from support.quant_fixtures import agreement, apply, chain, ops, predict

from orchestrator.quant import fake_quant_ranges as fqr

digits = quant_fixtures.digits


@pytest.fixture(scope="module")
def weights(digits_example: Path) -> list[np.ndarray]:
    return quant_fixtures._trained("cnn", str(digits_example)).get_weights()


@pytest.fixture(scope="module")
def model(weights, digits):  # noqa: ANN001, ANN201
    """(tf.Module, frozen artifact, its FakeQuant ranges by activation)."""
    module = fm.module(weights, fm.ranges_from_data(weights, digits["x_calib"]))
    artifact = fm.frozen(module)
    return module, artifact, fm.fake_quant_ranges(artifact)


def _requantize_ranges(graph_def) -> list[tuple[float, float]]:  # noqa: ANN001
    """The constant (min, max) every Requantize of an 8-bit graph requantizes to."""
    from orchestrator.model.graph_rewrite import GraphIndex

    index = GraphIndex.build(graph_def)
    found = []
    for node in graph_def.node:
        if node.op == "Requantize":
            lo, hi = (index.const_input(node.input[k]) for k in (3, 4))
            assert lo is not None and hi is not None, f"{node.name}'s range is not constant"
            found.append((float(lo), float(hi)))
    return found


def _matches(ranges, wanted: tuple[float, float], tol: float = 1e-6) -> bool:  # noqa: ANN001
    return any(abs(lo - wanted[0]) <= tol * max(1.0, abs(lo)) and
               abs(hi - wanted[1]) <= tol * max(1.0, abs(hi)) for lo, hi in ranges)


def _int8_ranges(flatbuffer: bytes) -> list[tuple[float, float]]:
    """(min, max) of each per-tensor int8 tensor: (-128 - zero) * scale, (127 - zero) *
    scale, i.e. scale = (max - min) / 255."""
    from orchestrator.model.litert_model import interpreter

    found = []
    for t in interpreter(flatbuffer, allocate=False).get_tensor_details():
        params = t["quantization_parameters"]
        if t["dtype"] == np.int8 and len(params["scales"]) == 1:
            scale, zero = float(params["scales"][0]), int(params["zero_points"][0])
            found.append(((-128 - zero) * scale, (127 - zero) * scale))
    return found


def test_graphdef_path_requantizes_to_the_fake_quant_ranges(model, digits) -> None:  # noqa: ANN001
    module, artifact, ranges = model
    x = digits["x_calib"]
    quantized = apply("quantize_nodes", chain(artifact, x, "fold"), x)
    assert quantized.info["trained_ranges"] == len(ranges) == 5
    logged = apply("log_ranges", quantized.artifact, x)
    frozen = apply("freeze_ranges", logged.artifact, x, diagnostics=False)
    graph = frozen.artifact.graph_def
    counts = ops(frozen.artifact)
    assert not [op for op in counts if op.startswith("FakeQuant")]
    assert counts["RequantizationRange"] == 0 and counts["QuantizedConv2D"] == 2
    assert frozen.info["trained_ranges"] == 5
    requantized = _requantize_ranges(graph)
    for name in ("conv1", "conv2", "fc1", "logits"):
        assert _matches(requantized, ranges[name]), (name, ranges[name], requantized)
    # the 8-bit graph computes what the model trained to compute
    images = digits["x_test"]
    assert agreement(predict(frozen.artifact, images), np.asarray(module(images))) >= 0.98


def test_graphdef_path_logs_only_the_ranges_the_model_lacks(weights, digits) -> None:  # noqa: ANN001
    x = digits["x_calib"]
    ranges = fm.ranges_from_data(weights, x)
    del ranges["conv2"]  # a layer left out of quantization-aware training
    artifact = fm.frozen(fm.module(weights, ranges))
    own = fm.fake_quant_ranges(artifact)
    frozen = apply("freeze_ranges", chain(chain(artifact, x, "fold", "quantize_nodes"), x,
                                          "log_ranges"), x, diagnostics=False)
    assert frozen.info["trained_ranges"] == 4
    assert len(frozen.info["ranges"]) == 1  # the one range log_ranges measured
    requantized = _requantize_ranges(frozen.artifact.graph_def)
    assert all(_matches(requantized, own[name]) for name in ("conv1", "fc1", "logits"))
    # conv2's range is measured, not the 99.5th percentile a trained range would have had
    trained_conv2 = fqr.nudged(*fm.ranges_from_data(weights, x)["conv2"])
    assert not _matches(requantized, trained_conv2, 1e-3)


def test_convert_tflite_int8_takes_the_fake_quant_ranges(model, digits) -> None:  # noqa: ANN001
    _module, artifact, ranges = model
    result = apply("convert_tflite", artifact, digits["x_calib"], mode="int8",
                   diagnostic_samples=0)
    found = _int8_ranges(result.artifact.payload)
    for name, wanted in ranges.items():
        assert _matches(found, wanted, 1e-5), (name, wanted, found)
    assert result.info["trained_ranges"] >= 5


def test_fp32_carries_the_ranges_to_quantize_tflite(model, digits) -> None:  # noqa: ANN001
    module, artifact, ranges = model
    x = digits["x_calib"]
    converted = apply("convert_tflite", artifact, x, mode="fp32", diagnostic_samples=0)
    # a clean float file: no FakeQuant left as QUANTIZE/DEQUANTIZE pairs
    assert set(converted.info["tflite"]["ops"]) == {"CONV_2D", "FULLY_CONNECTED",
                                                    "MAX_POOL_2D", "RESHAPE", "SOFTMAX"}
    carried = converted.artifact.metadata[fqr.TRAINED_RANGES]
    assert sorted(tuple(r) for r in carried.values()) == sorted(ranges.values())
    assert converted.info["trained_ranges"] == 5

    quantized = apply("quantize_tflite", converted.artifact, x, diagnostic_samples=0)
    found = _int8_ranges(quantized.artifact.payload)
    for name in ("conv1", "conv2", "fc1", "logits"):
        assert _matches(found, ranges[name], 1e-5), (name, ranges[name], found)
    # without them the quantizer calibrates other ranges: the check above can fail
    bare = dataclasses.replace(converted.artifact, metadata={
        k: v for k, v in converted.artifact.metadata.items() if k != fqr.TRAINED_RANGES})
    calibrated = _int8_ranges(apply("quantize_tflite", bare, x,
                                    diagnostic_samples=0).artifact.payload)
    assert not any(_matches(calibrated, ranges[name], 1e-5) for name in ("conv1", "conv2"))
    from orchestrator.measure.litert_runtime import LiteRTRunner

    images = digits["x_test"]
    with LiteRTRunner(quantized.artifact) as runner:
        scores = runner.predict_all(images)[0]
    assert agreement(scores, np.asarray(module(images))) >= 0.98
