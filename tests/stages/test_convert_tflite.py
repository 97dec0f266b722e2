"""convert_tflite: the digits example's float graph as a LiteRT flatbuffer in each mode, run
by LiteRT's own interpreter on the example's test data against the graph it came from; its
structure (ops, tensor types, size against the graph's bytes), the float denylists, int8
edges, and its errors (no representative data, an op LiteRT has no kernel for)."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import quant_fixtures
from support.quant_fixtures import accuracy, agreement, apply, context, predict

from orchestrator.errors import DataError, ModelSourceError
from orchestrator.model.artifact import ModelArtifact
from orchestrator.stages import get_stage

digits = quant_fixtures.digits

# Bytes per weight: float32 4, float16 2, int8 1. The digits CNN's 268k weights are ~all of
# its bytes, so a mode's file is about (its bytes per weight) / 4 of the graph's, plus a
# little for biases (int32 in int8 mode), per-channel scales and the flatbuffer's tables.
SIZE_BOUNDS = {"fp32": (0.95, 1.05), "dynamic_range": (0.22, 0.35),
               "float16": (0.45, 0.60), "int8": (0.22, 0.35)}
WEIGHTED_OPS = ("CONV_2D", "FULLY_CONNECTED")


@pytest.fixture(scope="module")
def graph(digits_example: Path) -> ModelArtifact:
    """The digits example's SavedModel, frozen, stripped and folded (dynamic batch)."""
    from orchestrator.model.sources import load_model

    model = load_model(digits_example / "saved_model")
    for name in ("freeze", "strip", "fold"):
        model = apply(name, model).artifact
    return model


@pytest.fixture(scope="module")
def reference(graph: ModelArtifact, digits: dict[str, np.ndarray]) -> np.ndarray:
    """The float graph's probabilities on the test split."""
    return predict(graph, digits["x_test"])


@pytest.fixture(scope="module")
def convert(graph: ModelArtifact, digits: dict[str, np.ndarray]) -> Any:
    """Call with convert_tflite's params; each conversion made once per module."""
    @functools.cache
    def converted(**params: Any) -> Any:
        return apply("convert_tflite", graph, digits["x_calib"], **params)

    def call(**params: Any) -> Any:
        return converted(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in params.items()})
    return call


# --- LiteRT by hand ------------------------------------------------------------------------

def litert_outputs(flatbuffer: bytes, x: np.ndarray) -> np.ndarray:
    """The model's output on all of `x` in one invoke, with LiteRT's own interpreter (int8
    edges quantized and dequantized with the tensors' own scale and zero point)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer)
    [given] = interpreter.get_input_details()
    interpreter.resize_tensor_input(given["index"], list(x.shape))
    interpreter.allocate_tensors()
    [given], [out] = interpreter.get_input_details(), interpreter.get_output_details()
    value = x
    if given["dtype"] == np.int8:
        scale, zero_point = given["quantization"]
        value = np.clip(np.round(x / scale + zero_point), -128, 127)
    interpreter.set_tensor(given["index"], value.astype(given["dtype"]))
    interpreter.invoke()
    y = interpreter.get_tensor(out["index"])
    if out["dtype"] == np.int8:
        scale, zero_point = out["quantization"]
        return (y.astype(np.float32) - zero_point) * scale
    return y


def op_tensors(flatbuffer: bytes) -> list[tuple[str, list[np.dtype], list[np.dtype]]]:
    """(builtin op name, input tensor dtypes, output tensor dtypes) per operator."""
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_litert.tools import flatbuffer_utils

    details = Interpreter(model_content=flatbuffer).get_tensor_details()
    dtype = {d["index"]: np.dtype(d["dtype"]) for d in details}
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    [subgraph] = model.subgraphs
    return [(flatbuffer_utils.opcode_to_name(model, op.opcodeIndex),
             [dtype[int(i)] for i in op.inputs if i >= 0],
             [dtype[int(i)] for i in op.outputs])
            for op in subgraph.operators]


def weights(flatbuffer: bytes, op_name: str) -> list[tuple[np.dtype, int]]:
    """(dtype, element count) of the weights (second input) of each `op_name` operator."""
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_litert.tools import flatbuffer_utils

    details = {d["index"]: d for d in
               Interpreter(model_content=flatbuffer).get_tensor_details()}
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    [subgraph] = model.subgraphs
    found = [details[int(op.inputs[1])] for op in subgraph.operators
             if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) == op_name]
    return [(np.dtype(d["dtype"]), int(np.prod(d["shape"]))) for d in found]


def edge_dtypes(flatbuffer: bytes) -> tuple[str, str]:
    from orchestrator.model.litert_model import describe

    facts = describe(flatbuffer)
    [given], [out] = facts.inputs, facts.outputs
    return given.dtype, out.dtype


def check_size(result: Any, graph: ModelArtifact, mode: str) -> float:
    ratio = len(result.artifact.payload) / len(graph.graph_bytes())
    low, high = SIZE_BOUNDS[mode]
    assert low <= ratio <= high, (mode, ratio)
    assert result.metrics["size_ratio"] == pytest.approx(ratio)
    return ratio


# --- modes ---------------------------------------------------------------------------------

def test_fp32_is_the_same_float_model(convert: Any, graph: ModelArtifact,
                                      reference: np.ndarray, digits: dict) -> None:
    before = graph.graph_bytes()
    result = convert(mode="fp32")
    out = result.artifact
    assert graph.graph_bytes() == before  # the input is never mutated
    assert out.kind == "tflite" and out.graph_def is None
    assert out.payload[4:8] == b"TFL3"
    assert (out.inputs, out.outputs) == (graph.inputs, graph.outputs)
    assert out.metadata["tflite"] == {"mode": "fp32", "io": "float",
                                      "flops": out.metadata["tflite"]["flops"]}
    assert out.metadata["tflite"]["flops"] > 0  # its source graph's, for device estimates
    ops = result.info["tflite"]["ops"]
    assert ops["CONV_2D"] == 2 and ops["FULLY_CONNECTED"] == 2 and ops["SOFTMAX"] == 1
    assert result.metrics["tflite_ops"] == sum(ops.values())
    assert "QUANTIZE" not in ops and "DEQUANTIZE" not in ops
    assert all(t == np.float32 for _, ins, outs in op_tensors(out.payload) for t in ins + outs
               if t != np.int32)  # int32: Reshape's shape
    assert edge_dtypes(out.payload) == ("float32", "float32")
    check_size(result, graph, "fp32")
    after = litert_outputs(out.payload, digits["x_test"])
    assert np.abs(after - reference).max() < 1e-5
    assert result.warnings == []


def test_dynamic_range_int8_weights_float_activations(convert: Any, graph: ModelArtifact,
                                                      reference: np.ndarray,
                                                      digits: dict) -> None:
    result = convert(mode="dynamic_range")
    payload = result.artifact.payload
    for op, ins, outs in op_tensors(payload):
        if op in WEIGHTED_OPS:
            assert ins[0] == np.float32 and outs == [np.float32], op
    # int8 weights, but for tensors under 1024 elements, which the converter leaves float:
    # here conv1's 16x3x3x1 kernel
    found = weights(payload, "CONV_2D") + weights(payload, "FULLY_CONNECTED")
    assert [dtype for dtype, size in found if size >= 1024] == [np.int8] * 3
    assert [dtype for dtype, size in found if size < 1024] == [np.float32]
    assert edge_dtypes(payload) == ("float32", "float32")
    check_size(result, graph, "dynamic_range")
    after = litert_outputs(payload, digits["x_test"])
    assert np.abs(after - reference).max() < 0.05
    assert agreement(after, reference) >= 0.98
    y = digits["y_test"]
    assert accuracy(after, y) >= accuracy(reference, y) - 0.01


def test_float16_half_the_bytes_nearly_the_same_outputs(convert: Any, graph: ModelArtifact,
                                                        reference: np.ndarray,
                                                        digits: dict) -> None:
    result = convert(mode="float16")
    payload = result.artifact.payload
    tensors = op_tensors(payload)
    # the weights ship as float16 and are dequantized to float32 once, at load
    dequantized = [ins[0] for op, ins, _ in tensors if op == "DEQUANTIZE"]
    assert dequantized and all(t == np.float16 for t in dequantized)
    for op, ins, outs in tensors:
        if op in WEIGHTED_OPS:
            assert ins[1] == np.float32 and outs == [np.float32], op
    assert edge_dtypes(payload) == ("float32", "float32")
    check_size(result, graph, "float16")
    after = litert_outputs(payload, digits["x_test"])
    assert np.abs(after - reference).max() < 5e-3
    assert agreement(after, reference) >= 0.99


def test_int8_full_integer_calibrated(convert: Any, graph: ModelArtifact,
                                      reference: np.ndarray, digits: dict) -> None:
    result = convert(mode="int8")
    payload = result.artifact.payload
    tensors = op_tensors(payload)
    ops = Counter(op for op, _, _ in tensors)
    assert ops["CONV_2D"] == 2 and ops["FULLY_CONNECTED"] == 2
    assert ops["QUANTIZE"] == 1 and ops["DEQUANTIZE"] == 1  # at the float edges only
    for op, ins, outs in tensors:
        if op in WEIGHTED_OPS:  # int8 in, int8 weights, int32 bias, int8 out
            assert ins == [np.int8, np.int8, np.int32] and outs == [np.int8], op
        elif op not in ("QUANTIZE", "DEQUANTIZE"):
            assert np.float32 not in ins + outs, op
    assert edge_dtypes(payload) == ("float32", "float32")
    assert result.info["tflite"]["float_ops"] == {} and result.metrics["float_ops"] == 0
    check_size(result, graph, "int8")
    after = litert_outputs(payload, digits["x_test"])
    assert agreement(after, reference) >= 0.97
    y = digits["y_test"]
    assert accuracy(after, y) >= accuracy(reference, y) - 0.02
    assert np.abs(after - reference).max() < 0.2


def test_int8_layer_errors_name_the_model_tensors(convert: Any) -> None:
    """The quantization debugger's per-layer rows: worst first, each node a tensor of the
    model (what float_nodes takes back), errors near rounding's 0.29 on this healthy CNN."""
    from ai_edge_litert.interpreter import Interpreter

    result = convert(mode="int8")
    rows = result.info["layer_errors"]
    names = {d["name"] for d in
             Interpreter(model_content=result.artifact.payload).get_tensor_details()}
    assert {r["op"] for r in rows} >= {"CONV_2D", "FULLY_CONNECTED"}
    assert all(r["node"] in names for r in rows)
    errors = [r["rmse_over_scale"] for r in rows]
    assert errors == sorted(errors, reverse=True)
    assert all(0 <= e < 1.5 for e in errors)
    assert result.metrics["layer_error_max"] == errors[0]
    assert result.metrics["layers_flagged"] == sum(e > 0.7 for e in errors)
    assert all(r["scale"] > 0 for r in rows)
    assert convert(mode="int8", diagnostic_samples=0).info.get("layer_errors") is None


def test_int8_io_makes_int8_edges(convert: Any, reference: np.ndarray, digits: dict) -> None:
    from ai_edge_litert.interpreter import Interpreter

    result = convert(mode="int8", io="int8")
    payload = result.artifact.payload
    assert edge_dtypes(payload) == ("int8", "int8")
    recorded = result.artifact.metadata["tflite"]
    assert (recorded["mode"], recorded["io"]) == ("int8", "int8")
    ops = Counter(op for op, _, _ in op_tensors(payload))
    assert not ops["QUANTIZE"] and not ops["DEQUANTIZE"]  # the app quantizes, not the model
    interpreter = Interpreter(model_content=payload)
    [given], [out] = interpreter.get_input_details(), interpreter.get_output_details()
    assert given["quantization"][0] > 0 and out["quantization"][0] > 0
    after = litert_outputs(payload, digits["x_test"])
    assert agreement(after, reference) >= 0.97
    # the same integer model inside as io: float's, which only adds the edge conversions
    assert agreement(after, litert_outputs(convert(mode="int8").artifact.payload,
                                           digits["x_test"])) >= 0.99


def test_float_ops_keeps_fully_connected_float(convert: Any, reference: np.ndarray,
                                               digits: dict) -> None:
    int8 = convert(mode="int8", diagnostic_samples=0)
    result = convert(mode="int8", float_ops=["FULLY_CONNECTED"], diagnostic_samples=0)
    tensors = op_tensors(result.artifact.payload)
    connected = [(ins, outs) for op, ins, outs in tensors if op == "FULLY_CONNECTED"]
    assert len(connected) == 2
    assert all(ins[:2] == [np.float32, np.float32] and outs == [np.float32]
               for ins, outs in connected)
    assert all(ins[1] == np.int8 and outs == [np.int8]
               for op, ins, outs in tensors if op == "CONV_2D")  # the rest stays int8
    assert result.info["tflite"]["float_ops"] == {"FULLY_CONNECTED": 2}
    assert result.info["tflite"]["float_op_types"] == ["FULLY_CONNECTED"]
    assert result.metrics["float_ops"] == 2
    assert result.warnings == []  # a diagnostic: what the recipe asked for, said in the report
    [warning] = result.info["diagnostics"]
    assert "FULLY_CONNECTED x2" in warning and "float" in warning
    # 3 more bytes for each fully connected weight, now float32 again
    float_weights = sum(size for _, size in weights(int8.artifact.payload, "FULLY_CONNECTED"))
    grown = len(result.artifact.payload) - len(int8.artifact.payload)
    assert grown == pytest.approx(3 * float_weights, rel=0.05)
    after = litert_outputs(result.artifact.payload, digits["x_test"])
    assert agreement(after, reference) >= 0.97


def test_float_nodes_take_the_worst_layer_back_to_float(convert: Any, reference: np.ndarray,
                                                        digits: dict) -> None:
    from ai_edge_litert.interpreter import Interpreter

    worst = convert(mode="int8").info["layer_errors"][0]
    result = convert(mode="int8", float_nodes=[worst["node"]], diagnostic_samples=0)
    dtype = {d["name"]: np.dtype(d["dtype"]) for d in
             Interpreter(model_content=result.artifact.payload).get_tensor_details()}
    assert dtype[worst["node"]] == np.float32
    assert result.info["tflite"]["float_nodes"] == [worst["node"]]
    assert result.info["tflite"]["float_ops"] == {worst["op"]: 1}
    assert f"{worst['op']} x1" in result.info["diagnostics"][-1]
    after = litert_outputs(result.artifact.payload, digits["x_test"])
    assert agreement(after, reference) >= 0.97


def test_float_ops_keep_the_float_edges_io_float_asks_for(convert: Any) -> None:
    result = convert(mode="int8", float_ops=["FULLY_CONNECTED"], diagnostic_samples=0)
    assert result.artifact.metadata["tflite"]["io"] == "float"
    assert edge_dtypes(result.artifact.payload) == ("float32", "float32")


# --- errors --------------------------------------------------------------------------------

def test_int8_without_representative_data_is_a_data_error(graph: ModelArtifact) -> None:
    stage = get_stage("convert_tflite")
    with pytest.raises(DataError, match="representative") as caught:
        stage.run(graph, stage.params(mode="int8"), context(None, "convert_tflite"))
    assert "dynamic_range" in str(caught.value)  # the mode that needs no data
    for mode in ("fp32", "dynamic_range", "float16"):  # these need none
        assert stage.run(graph, stage.params(mode=mode),
                         context(None, "convert_tflite")).artifact.kind == "tflite"


def erf_graph(tf_artifact: Any) -> ModelArtifact:
    """x -> erf(x) * 2: Erf has no LiteRT builtin, but a Flex (select TF ops) kernel."""
    import tensorflow as tf

    artifact = tf_artifact(lambda x: tf.math.erf(x) * 2.0, (1, 4))
    assert "Erf" in {n.op for n in artifact.graph_def.node}
    return artifact


def test_an_op_litert_lacks_is_named_with_select_tf_ops(tf_artifact: Any) -> None:
    artifact = erf_graph(tf_artifact)
    with pytest.raises(ModelSourceError) as caught:
        apply("convert_tflite", artifact, mode="fp32")
    message = str(caught.value)
    assert "Erf" in message and "select_tf_ops" in message
    assert "Mul" not in message  # only the op that lacks a kernel
    # the same graph without it converts
    import tensorflow as tf

    fine = tf_artifact(lambda x: tf.math.tanh(x) * 2.0, (1, 4))
    x = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)
    out = apply("convert_tflite", fine, mode="fp32").artifact
    assert np.allclose(litert_outputs(out.payload, x), np.tanh(x) * 2.0, atol=1e-6)


def test_select_tf_ops_lets_the_op_run_as_a_tf_op(tf_artifact: Any) -> None:
    artifact = erf_graph(tf_artifact)
    result = apply("convert_tflite", artifact, mode="fp32", select_tf_ops=True)
    assert result.artifact.kind == "tflite"
    assert b"FlexErf" in result.artifact.payload


def test_an_op_without_flex_kernel_is_not_sent_to_select_tf_ops(tf_artifact: Any) -> None:
    import tensorflow as tf

    artifact = tf_artifact(lambda x: tf.math.digamma(x) * 2.0, (1, 4))
    with pytest.raises(ModelSourceError) as caught:
        apply("convert_tflite", artifact, mode="fp32", select_tf_ops=True)
    assert "Digamma" in str(caught.value)
    assert "set select_tf_ops: true" not in str(caught.value)


@pytest.mark.parametrize(("mode", "verdict"), [("fp32", "float"), ("float16", "float"),
                                               ("dynamic_range", "dynamic"), ("int8", "int8")])
def test_each_mode_says_what_its_file_computes_in(convert, mode: str, verdict: str) -> None:
    """What decides whether a DSP or an NPU can run the file: read from its operators."""
    from orchestrator.model.litert_precision import computes_in

    result = convert(mode=mode)
    assert result.info["computes_in"] == verdict == computes_in(result.artifact.payload)
    computing = [(op, outs) for op, _, outs in op_tensors(result.artifact.payload)
                 if op not in ("QUANTIZE", "DEQUANTIZE")]
    float_out = [op for op, outs in computing if outs[0] == np.float32]
    assert (not float_out) == (verdict == "int8"), float_out


# --- several outputs: found by name through the signature, never by position -------------

def _split_heads() -> ModelArtifact:
    """frames (N, 4, 3) -> dense 20 -> split into heads of 11, 4 and 5 (`heads`,
    `heads:1`, `heads:2`: one op's outputs), the model's outputs out of graph order."""
    import tensorflow as tf

    from orchestrator.model.artifact import TensorSpec

    rng = np.random.default_rng(5)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4, 3], name="frames")
        h = tf.matmul(tf.reshape(x, [-1, 3]),
                      tf.constant(rng.normal(size=(3, 20)).astype(np.float32)))
        tf.split(tf.reshape(h, [-1, 4, 20]), [11, 4, 5], axis=-1, name="heads")
    return ModelArtifact(graph_def=graph.as_graph_def(),
                         inputs=(TensorSpec("frames", "float32", (None, 4, 3)),),
                         outputs=("heads:2", "heads", "heads:1"), metadata={})


def _scrambled(flatbuffer: bytes) -> bytes:
    """As a converter that neither keeps the outputs' order nor their names makes it: the
    outputs rotated, renamed, no signature."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    subgraph = model.subgraphs[0]
    subgraph.outputs = [int(i) for i in subgraph.outputs[1:]] + [int(subgraph.outputs[0])]
    for k, index in enumerate(subgraph.outputs):
        subgraph.tensors[index].name = f"StatefulPartitionedCall:{k}".encode()
    model.signatureDefs = []
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def test_outputs_of_one_op_come_out_in_the_graphs_order_under_a_signature() -> None:
    from orchestrator.measure.litert_runtime import LiteRTRunner
    from orchestrator.measure.tf_runtime import predict_all

    graph = _split_heads()
    x = np.random.default_rng(0).normal(size=(6, 4, 3)).astype(np.float32)
    converted = apply("convert_tflite", graph, mode="fp32").artifact
    from ai_edge_litert.interpreter import Interpreter

    model = Interpreter(model_content=converted.payload)
    assert [int(d["shape"][-1]) for d in model.get_output_details()] == [5, 11, 4]
    assert sorted(model.get_signature_list()["serving_default"]["outputs"]) == [
        "heads", "heads:1", "heads:2"]
    with LiteRTRunner(converted) as runner:
        for mine, source in zip(runner.predict_all(x), predict_all(graph, x), strict=True):
            np.testing.assert_allclose(mine, source, rtol=1e-5, atol=1e-5)
    # names stripped: the order the file has is the graph's, so position still holds
    stripped = apply("convert_tflite", graph, mode="fp32", strip_names=True).artifact
    with LiteRTRunner(stripped) as runner:
        assert [o.shape[-1] for o in runner.predict_all(x)] == [5, 11, 4]


def test_outputs_a_converter_reordered_and_renamed_are_found_by_shape() -> None:
    from orchestrator.measure.litert_runtime import LiteRTRunner
    from orchestrator.model.litert_model import with_signature

    graph = _split_heads()
    converted = apply("convert_tflite", graph, mode="fp32").artifact
    scrambled = _scrambled(converted.payload)
    x = np.ones((2, 4, 3), dtype=np.float32)
    with LiteRTRunner(converted.replace(payload=scrambled)) as runner:  # nothing tells
        assert [o.shape[-1] for o in runner.predict_all(x)] == [11, 4, 5]
    shapes = [[None, 4, 5], [None, 4, 11], [None, 4, 4]]
    signed = with_signature(scrambled, ["frames"], list(graph.outputs), shapes, replace=True)
    with LiteRTRunner(converted.replace(payload=signed)) as runner:
        assert [o.shape[-1] for o in runner.predict_all(x)] == [5, 11, 4]
    # the signature alone finds them, whatever the file's order
    with LiteRTRunner(converted.replace(payload=_rotated(signed))) as runner:
        assert [o.shape[-1] for o in runner.predict_all(x)] == [5, 11, 4]
    with pytest.raises(ValueError, match="no output of the .tflite matches it"):
        with_signature(scrambled, ["frames"], list(graph.outputs),
                       [[None, 4, 5], [None, 4, 11], [None, 4, 7]], replace=True)


def _rotated(flatbuffer: bytes) -> bytes:
    """The subgraph's outputs rotated by one, the signature kept."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    subgraph = model.subgraphs[0]
    subgraph.outputs = [int(i) for i in subgraph.outputs[1:]] + [int(subgraph.outputs[0])]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def test_a_conversion_wraps_the_graph_once(graph: ModelArtifact, digits: dict,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # the signature reads the output shapes off the function the converter converts, not
    # off a second wrapping of the graph (a real conversion, the real wrapping, counted)
    from orchestrator.stages import convert_tflite

    wrapped = convert_tflite._concrete_function
    calls: list[ModelArtifact] = []

    def counted(given: ModelArtifact) -> Any:
        calls.append(given)
        return wrapped(given)

    monkeypatch.setattr(convert_tflite, "_concrete_function", counted)
    result = apply("convert_tflite", graph, digits["x_calib"], mode="fp32")
    assert len(calls) == 1
    assert result.info["tflite"]["mode"] == "fp32"
