"""Learned rounding (AdaRound) with bias correction on a LiteRT Quantizer int8 file: on the
digits CNN with one weight scale per tensor (coarse steps: rounding matters), its outputs
are clearly closer to float's than nearest rounding's on held-out inputs; only weight and
bias buffers change, each weight by at most one step; a file that is not static int8 is
refused with a ValueError."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from support import quant_fixtures
from support.quant_fixtures import apply

from orchestrator.model.litert_model import interpreter
from orchestrator.quant import litert_quantizer as aeq
from orchestrator.quant.learned_rounding import LAYER_OPS, learn_rounding

cnn, digits = quant_fixtures.cnn, quant_fixtures.digits
LOG = logging.getLogger("test_learned_rounding")


@pytest.fixture(scope="module")
def float_model(cnn, digits) -> bytes:  # noqa: ANN001
    converted = apply("convert_tflite", cnn, mode="fp32").artifact
    return aeq.with_signature(converted.payload, converted.input_names,
                              list(converted.outputs))


def _batches(digits: dict[str, np.ndarray]) -> list[np.ndarray]:
    x = digits["x_calib"][:200]
    return [x[i:i + 50] for i in range(0, len(x), 50)]


@pytest.fixture(scope="module")
def per_tensor(float_model, digits) -> bytes:  # noqa: ANN001
    """Static int8, one weight scale per tensor, nearest rounding (the quantizer's)."""
    made = aeq.quantizer_for(float_model, "static_wi8_ai8", {}, per_channel=False,
                             float_io=True)
    return aeq.quantize(made, aeq.signature_batches(float_model, _batches(digits)), LOG)


@pytest.fixture(scope="module")
def relearned(float_model, per_tensor, digits) -> tuple[bytes, dict[str, Any]]:  # noqa: ANN001
    return learn_rounding(float_model, per_tensor, _batches(digits), iterations=300, log=LOG)


def _outputs(model: bytes, x: np.ndarray) -> np.ndarray:
    runner = interpreter(model, allocate=False)
    given, out = runner.get_input_details()[0], runner.get_output_details()[0]
    runner.resize_tensor_input(given["index"], list(x.shape))
    runner.allocate_tensors()
    runner.set_tensor(given["index"], x.astype(np.float32))
    runner.invoke()
    return runner.get_tensor(out["index"]).astype(np.float64)


def test_learned_rounding_is_closer_to_float_than_nearest(float_model, per_tensor, relearned,
                                                          digits) -> None:  # noqa: ANN001
    x = digits["x_test"]  # held out: the rounding was fitted on x_calib
    reference = _outputs(float_model, x)

    def error(model: bytes) -> float:
        return float(np.mean((_outputs(model, x) - reference) ** 2))

    nearest = error(per_tensor)
    # the rounding alone (measured 0.76 of nearest's error), then with bias correction (0.55)
    rounded, _ = learn_rounding(float_model, per_tensor, _batches(digits), iterations=300,
                                log=LOG, correct_bias=False)
    assert error(rounded) < 0.9 * nearest, (error(rounded), nearest)
    assert error(relearned[0]) < 0.7 * nearest, (error(relearned[0]), nearest)
    report = relearned[1]
    assert [row["op"] for row in report["layers"]] == ["CONV_2D", "CONV_2D",
                                                        "FULLY_CONNECTED", "FULLY_CONNECTED"]
    assert not report["skipped"] and report["seconds"] > 0
    assert all(row["nmse_after"] <= row["nmse_before"] for row in report["layers"])


def _model(flatbuffer: bytes) -> Any:
    from ai_edge_litert.tools import flatbuffer_utils

    return flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))


def test_only_weights_and_biases_change_each_by_one_step_at_most(per_tensor,
                                                                relearned) -> None:  # noqa: ANN001
    from ai_edge_litert.tools import flatbuffer_utils

    before, after = _model(per_tensor), _model(relearned[0])
    old, new = before.subgraphs[0], after.subgraphs[0]
    assert len(old.tensors) == len(new.tensors) and len(old.operators) == len(new.operators)
    for a, b in zip(old.tensors, new.tensors, strict=True):
        assert (a.name, a.type, list(a.shape), a.buffer) == (b.name, b.type, list(b.shape),
                                                             b.buffer)
        if a.quantization is not None and a.quantization.scale is not None:
            assert np.array_equal(a.quantization.scale, b.quantization.scale)
            assert np.array_equal(a.quantization.zeroPoint, b.quantization.zeroPoint)
    weights, biases = set(), set()
    for op in old.operators:
        if flatbuffer_utils.opcode_to_name(before, op.opcodeIndex) in LAYER_OPS:
            weights.add(old.tensors[op.inputs[1]].buffer)
            biases.add(old.tensors[op.inputs[2]].buffer)
    changed = {i for i, (a, b) in enumerate(zip(before.buffers, after.buffers, strict=True))
               if not np.array_equal(a.data if a.data is not None else [],
                                     b.data if b.data is not None else [])}
    assert changed and changed <= weights | biases
    assert changed & weights and changed & biases  # both re-rounding and bias correction
    moved = 0
    for index in weights:
        q_old = np.asarray(before.buffers[index].data, np.uint8).view(np.int8).astype(int)
        q_new = np.asarray(after.buffers[index].data, np.uint8).view(np.int8).astype(int)
        assert np.abs(q_new - q_old).max() <= 1  # floor or ceiling: one step from nearest
        moved += int(np.sum(q_new != q_old))
    assert moved == sum(row["weights_changed"] for row in relearned[1]["layers"]) > 0


def test_a_file_that_is_not_static_int8_is_refused(float_model) -> None:  # noqa: ANN001
    made = aeq.quantizer_for(float_model, "dynamic_wi8_afp32", {}, per_channel=True,
                             float_io=True)
    dynamic = aeq.quantize(made, None, LOG)
    with pytest.raises(ValueError, match="static int8"):
        learn_rounding(float_model, dynamic, [np.zeros((4, 8, 8, 1), np.float32)],
                       iterations=10, log=LOG)


def with_buffers_after(flatbuffer: bytes) -> bytes:
    """The same file with its largest buffer kept after the flatbuffer (`offset`, `size`),
    as ai-edge-quantizer writes large ones."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    index = max(range(len(model.buffers)), key=lambda i: len(model.buffers[i].data)
                if model.buffers[i].data is not None else 0)
    data = bytes(model.buffers[index].data)
    model.buffers[index].data = None
    model.buffers[index].offset, model.buffers[index].size = 1, len(data)  # placeholders
    head = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    start = (len(head) + 15) // 16 * 16
    model.buffers[index].offset = start
    head = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    assert len(head) <= start  # the same size with the offset filled in
    return head + bytes(start - len(head)) + data


def test_a_file_with_buffers_after_its_flatbuffer_is_relearned_whole(
        float_model, per_tensor, relearned, digits) -> None:  # noqa: ANN001
    outside = with_buffers_after(per_tensor)
    x = digits["x_test"][:100].astype(np.float32)
    assert np.array_equal(_outputs(outside, x), _outputs(per_tensor, x))  # LiteRT reads it
    made, report = learn_rounding(float_model, outside, _batches(digits), iterations=300,
                                  log=LOG)
    # every layer relearned as from the inline file, and the file loads (nothing lost)
    assert [r["layer"] for r in report["layers"]] == [r["layer"] for r in relearned[1]["layers"]]
    assert np.allclose(_outputs(made, x), _outputs(relearned[0], x), atol=1e-6)
