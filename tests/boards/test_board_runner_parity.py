"""board_runner.py goes to the board alone (it imports nothing of orchestrator), so it
keeps its own copy of how a `.tflite`'s outputs are named and put in the graph's order
(model/litert_model.py): run both on the same real files, so that the copies cannot
drift apart."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from orchestrator.boards import board_runner
from orchestrator.model import litert_model

HERE = Path(__file__).resolve().parent


def _convert_tests():  # the multi-output files tests/stages/test_convert_tflite.py makes
    spec = importlib.util.spec_from_file_location(
        "convert_tflite_files", HERE.parent / "stages" / "test_convert_tflite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def files() -> tuple[list[str], dict[str, bytes]]:
    from orchestrator.model.litert_model import with_signature

    made = _convert_tests()
    graph = made._split_heads()
    converted = made.apply("convert_tflite", graph, mode="fp32").artifact
    stripped = made.apply("convert_tflite", graph, mode="fp32", strip_names=True).artifact
    scrambled = made._scrambled(converted.payload)
    signed = with_signature(scrambled, ["frames"], list(graph.outputs),
                            [[None, 4, 5], [None, 4, 11], [None, 4, 4]], replace=True)
    return list(graph.outputs), {
        "converted": converted.payload, "stripped": stripped.payload,
        "scrambled": scrambled, "signed": signed, "rotated": made._rotated(signed)}


@pytest.mark.parametrize("ref", ["heads", "heads:0", "heads:2", "^heads:1", "Identity:0"])
def test_signature_names_alike(ref: str) -> None:
    assert board_runner.signature_name(ref) == litert_model.signature_name(ref)


def test_the_board_orders_a_files_outputs_as_the_host_does(
        files: tuple[list[str], dict[str, bytes]]) -> None:
    from ai_edge_litert.interpreter import Interpreter

    names, payloads = files
    orders = {}
    for label, payload in payloads.items():
        interpreter = Interpreter(model_content=payload)
        for side in ("inputs", "outputs"):
            assert board_runner.signature(interpreter, side) == litert_model.signature_map(
                interpreter, side), (label, side)
        details = interpreter.get_output_details()
        host = litert_model.in_order(details, names,
                                     litert_model.signature_map(interpreter, "outputs"))
        board = board_runner.ordered(details, names,
                                     board_runner.signature(interpreter, "outputs"))
        assert [d["index"] for d in board] == [d["index"] for d in host], label
        orders[label] = [int(d["shape"][-1]) for d in host]
        # a name list that does not fit: both keep the interpreter's order
        assert board_runner.ordered(details, names[:2], {}) == litert_model.in_order(
            details, names[:2], {}) == details
    # the cases differ (else the comparison would prove little): the signature reorders
    assert orders["signed"] == orders["rotated"] == [5, 11, 4]
    assert orders["scrambled"] == [11, 4, 5]


def test_the_board_frames_its_messages_as_the_helper_protocol_reads_them() -> None:
    """Its own copy of the frame header (it imports nothing of orchestrator)."""
    from orchestrator import helper_process

    assert board_runner.FRAME.format == helper_process.FRAME.format
    assert board_runner.FRAME.pack(1234) == helper_process.FRAME.pack(1234)
