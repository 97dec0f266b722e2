"""quantize_tflite: a float .tflite (convert_tflite fp32 of a separable-convolution digits
CNN) quantized by the LiteRT Quantizer in each scheme, run by LiteRT's interpreter on the
digits test data against the float file; its structure (tensor types per op, what it
computes in, its signature), the quantizer's per-layer errors, per-layer overrides, and
its errors (a quantized input, no data, a bad pattern)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import quant_fixtures
from support.quant_fixtures import agreement, apply

from orchestrator.errors import DataError, ModelSourceError
from orchestrator.model.artifact import ModelArtifact

digits = quant_fixtures.digits
separable = quant_fixtures.separable

INT8, INT16, FLOAT32 = 9, 7, 0


@pytest.fixture(scope="module")
def float_tflite(separable: ModelArtifact) -> ModelArtifact:
    return apply("convert_tflite", separable, mode="fp32").artifact


@pytest.fixture(scope="module")
def quantize(float_tflite: ModelArtifact, digits: dict[str, np.ndarray]) -> Any:
    """Call with quantize_tflite's params; each made once per module."""
    @functools.cache
    def made(**params: Any) -> Any:
        return apply("quantize_tflite", float_tflite, digits["x_calib"],
                     **{k: dict(v) if isinstance(v, tuple) else v for k, v in params.items()})

    def call(**params: Any) -> Any:
        return made(**{k: tuple(v.items()) if isinstance(v, dict) else v
                       for k, v in params.items()})
    return call


def outputs(flatbuffer: bytes, x: np.ndarray) -> np.ndarray:
    """The file's (float) output on every row of `x`, one sample per invoke."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer)
    interpreter.allocate_tensors()
    [given], [out] = interpreter.get_input_details(), interpreter.get_output_details()
    rows = []
    for sample in x:
        interpreter.set_tensor(given["index"], sample[None].astype(np.float32))
        interpreter.invoke()
        rows.append(interpreter.get_tensor(out["index"]).copy())
    return np.concatenate(rows)


def op_types(flatbuffer: bytes) -> list[tuple[str, int, str]]:
    """(op, its first output's tensor type, that tensor's name) for every op."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    subgraph = model.subgraphs[0]
    return [(flatbuffer_utils.opcode_to_name(model, op.opcodeIndex),
             subgraph.tensors[op.outputs[0]].type,
             (subgraph.tensors[op.outputs[0]].name or b"").decode())
            for op in subgraph.operators]


def constant_bytes(flatbuffer: bytes) -> int:
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    return sum(len(b.data) for b in model.buffers if b.data is not None)


@pytest.fixture(scope="module")
def reference(float_tflite: ModelArtifact, digits: dict[str, np.ndarray]) -> np.ndarray:
    return outputs(float_tflite.payload, digits["x_test"][:200])


def test_static_int8_is_full_integer_and_keeps_the_answers(quantize, float_tflite, digits,
                                                           reference) -> None:
    result = quantize(scheme="static_wi8_ai8")
    data = result.artifact.payload
    assert result.info["computes_in"] == "int8"
    compute = [(op, kind) for op, kind, _ in op_types(data)
               if op not in ("QUANTIZE", "DEQUANTIZE")]
    assert {kind for _, kind in compute} == {INT8}, compute
    got = outputs(data, digits["x_test"][:200])
    assert got.shape == reference.shape
    assert agreement(got, reference) >= 0.97
    assert np.abs(got - reference).max() < 0.2
    # int8 weights, int32 biases (the file: mostly tables and names, at this size)
    assert 0.24 < constant_bytes(data) / constant_bytes(float_tflite.payload) < 0.4
    assert result.artifact.metadata["tflite"]["mode"] == "int8"


def test_the_quantizers_per_layer_errors_are_the_layer_errors(quantize) -> None:
    rows = quantize(scheme="static_wi8_ai8").info["layer_errors"]
    ops = [r["op"] for r in rows]
    assert {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"} <= set(ops)
    names = {r["node"] for r in rows}
    for row in rows:
        assert 0 <= row["added_nmse"] <= row["nmse"] + 1e-12
        assert row["sqnr_db"] is None or row["sqnr_db"] > 10  # digits: all close to float
        assert all(name in names or name.startswith("image") for name in row["inputs"]), row
    worst = [r["added_nmse"] for r in rows]
    assert worst == sorted(worst, reverse=True)
    table = quantize(scheme="static_wi8_ai8").files["layer_errors.tsv"].decode().splitlines()
    assert table[0].split("\t")[:5] == ["node", "op", "rmse_over_scale", "nmse", "added_nmse"]
    assert len(table) == len(rows) + 1


def test_a_layer_moved_to_int16_activations_has_less_error(quantize, digits,
                                                           reference) -> None:
    plain = quantize(scheme="static_wi8_ai8")
    worst = plain.info["layer_errors"][0]
    pattern = "^" + worst["node"].split(";")[0].replace("/", "/")
    wide = quantize(scheme="static_wi8_ai8", layers={pattern: "static_wi8_ai16"},
                    shrink=False)  # names kept: the test finds the layer's tensor by it
    types = {name: kind for _, kind, name in op_types(wide.artifact.payload)}
    assert types[worst["node"]] == INT16
    assert wide.info["computes_in"] == "int8+int16"
    after = {r["node"]: r for r in wide.info["layer_errors"]}[worst["node"]]
    assert after["added_nmse"] < worst["added_nmse"]
    got = outputs(wide.artifact.payload, digits["x_test"][:200])
    assert agreement(got, reference) >= 0.97


def test_a_layer_kept_in_float_is_named(quantize) -> None:
    result = quantize(scheme="static_wi8_ai8", layers={"probs": "float"})
    assert result.info["computes_in"] == "int8+float"
    assert result.info["tflite"]["float_ops"] == {"FULLY_CONNECTED": 1}
    assert any("computes in float" in d for d in result.info["diagnostics"])


def test_dynamic_needs_no_data_and_computes_in_float(float_tflite, digits, reference) -> None:
    result = apply("quantize_tflite", float_tflite, None, scheme="dynamic_wi8_afp32",
                   diagnostic_samples=0)
    assert result.info["computes_in"] == "dynamic"
    got = outputs(result.artifact.payload, digits["x_test"][:200])
    assert agreement(got, reference) >= 0.98
    assert np.abs(got - reference).max() < 0.15  # activations rounded on the fly


def test_int8_edges(quantize) -> None:
    from ai_edge_litert.interpreter import Interpreter

    data = quantize(scheme="static_wi8_ai8", io="int8").artifact.payload
    interpreter = Interpreter(model_content=data)
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    assert interpreter.get_output_details()[0]["dtype"] == np.int8


def test_the_shipped_file_has_a_signature_named_as_the_graph(quantize) -> None:
    from ai_edge_litert.interpreter import Interpreter

    data = quantize(scheme="static_wi8_ai8").artifact.payload
    signatures = Interpreter(model_content=data).get_signature_list()
    assert list(signatures) == ["serving_default"]
    assert signatures["serving_default"]["inputs"] == ["image"]


def test_a_quantized_input_is_refused(quantize, digits) -> None:
    int8 = quantize(scheme="static_wi8_ai8").artifact
    with pytest.raises(ModelSourceError, match=r"convert_tflite: \{mode: fp32\}"):
        apply("quantize_tflite", int8, digits["x_calib"])


def test_static_without_data_is_a_data_error(float_tflite) -> None:
    with pytest.raises(DataError, match="representative"):
        apply("quantize_tflite", float_tflite, None)


def test_a_bad_pattern_or_scheme_is_refused() -> None:
    from pydantic import ValidationError

    from orchestrator.stages import get_stage

    params = get_stage("quantize_tflite").params
    with pytest.raises(ValidationError, match="not a regular expression"):
        params(layers={"conv(": "float"})
    with pytest.raises(ValidationError, match="static_wi8_ai16"):
        params(scheme="static_wi8_a16")


def test_a_misspelt_scheme_in_a_recipe_gets_a_did_you_mean(tmp_path: Path) -> None:
    from orchestrator.errors import RecipeError
    from orchestrator.recipe.loading import load_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("version: 1\nname: x\nmodel: {path: m.pb}\npipelines:\n  p:\n"
                      "    stages: [{convert_tflite: {mode: fp32}},\n"
                      "             {quantize_tflite: {scheme: static_wi8_a16}}]\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe, check_files=False)
    text = str(caught.value)
    assert 'did you mean "static_wi8_ai16"?' in text and ":7:" in text, text


def test_per_tensor_dynamic_keeps_depthwise_filters_per_channel(float_tflite, digits,
                                                               reference) -> None:
    """LiteRT's float-input depthwise kernel reads one scale per channel: a per-tensor
    filter there reads past its one scale (convert_tflite's per-tensor defect). The
    other weights go per tensor as asked."""
    from ai_edge_litert.tools import flatbuffer_utils

    result = apply("quantize_tflite", float_tflite, None, scheme="dynamic_wi8_afp32",
                   per_channel=False, diagnostic_samples=0)
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(result.artifact.payload))
    subgraph = model.subgraphs[0]
    scales = {}
    for op in subgraph.operators:
        name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
        weight = subgraph.tensors[op.inputs[1]] if len(op.inputs) > 1 else None
        if weight is not None and weight.type == INT8:
            scales.setdefault(name, []).append(len(weight.quantization.scale))
    assert all(n > 1 for n in scales["DEPTHWISE_CONV_2D"]), scales
    assert all(n == 1 for op, counts in scales.items() if op != "DEPTHWISE_CONV_2D"
               for n in counts), scales
    got = outputs(result.artifact.payload, digits["x_test"][:200])
    assert np.isfinite(got).all()
    assert agreement(got, reference) >= 0.97


def test_the_shipped_file_is_shrunk_and_computes_the_same(quantize, digits) -> None:
    """Intermediate tensor names and conversion metadata dropped (bytes_by_kind says where
    the bytes went); the signature, its input and output names, and every number kept."""
    from ai_edge_litert.interpreter import Interpreter

    full = quantize(scheme="static_wi8_ai8", shrink=False)
    small = quantize(scheme="static_wi8_ai8")
    before, after = full.info["bytes_by_kind"], small.info["bytes_by_kind"]
    assert sum(after.values()) == len(small.artifact.payload)
    assert sum(before.values()) == len(full.artifact.payload)
    assert after["names"] < before["names"] and after["weights"] == before["weights"]
    assert after["quantization"] == before["quantization"]
    assert small.info["shrink"]["bytes_saved"] == len(full.artifact.payload) - len(
        small.artifact.payload) > 0
    x = digits["x_test"][:100]
    np.testing.assert_array_equal(outputs(small.artifact.payload, x),
                                  outputs(full.artifact.payload, x))
    signatures = Interpreter(model_content=small.artifact.payload).get_signature_list()
    assert signatures == Interpreter(model_content=full.artifact.payload).get_signature_list()
    names = [d["name"] for d in Interpreter(model_content=small.artifact.payload
                                            ).get_tensor_details()]
    assert sum(1 for n in names if n) <= 4  # input, output and their signature names
    assert small.info["layer_errors"] == full.info["layer_errors"]  # measured before


def int8_weights(flatbuffer: bytes) -> dict[str, np.ndarray]:
    """Every int8 constant of the file (its weights), by tensor name."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    subgraph = model.subgraphs[0]
    return {(t.name or b"").decode(): np.frombuffer(bytes(model.buffers[t.buffer].data),
                                                    np.int8)
            for t in subgraph.tensors
            if t.type == INT8 and model.buffers[t.buffer].data is not None}


def logit_error(flatbuffer: bytes, reference: np.ndarray, x: np.ndarray) -> float:
    """Mean squared error of the log-probabilities against float's."""
    got = outputs(flatbuffer, x)
    return float(np.mean((np.log(got + 1e-6) - np.log(reference + 1e-6)) ** 2))


@pytest.mark.parametrize("method", [
    {"ranges": "mse"}, {"rounding": "learned"}, {"fine_tune": True, "fine_tune_steps": 30}],
    ids=["ranges", "rounding", "fine_tune"])
def test_each_int8_method_keeps_full_integer_and_changes_the_numbers(
        quantize, digits, reference, method) -> None:
    """The stage's wiring of each int8 method: every op still int8 (int8 speed), the
    method named in info, and the file's numbers moved from min-max's while staying close to
    float (tests/quant/ prove each one helps where min-max loses)."""
    plain = quantize(scheme="static_wi8_ai8", shrink=False)
    made = quantize(scheme="static_wi8_ai8", shrink=False, **method)
    assert made.info["computes_in"] == "int8"
    assert [op for op, _, _ in op_types(made.artifact.payload)] == [
        op for op, _, _ in op_types(plain.artifact.payload)]
    used = made.info["tflite"]["int8_methods"]
    assert ("ranges: mse" in used) == (method.get("ranges") == "mse")
    assert ("rounding: learned" in used) == (method.get("rounding") == "learned")
    assert ("fine_tune (trained ranges)" in used) == bool(method.get("fine_tune"))
    x = digits["x_test"][:200]
    got, before = made.artifact.payload, plain.artifact.payload
    assert got != before
    assert agreement(outputs(got, x), reference) >= 0.97
    # ranges by error may cost a little on a model min-max already serves (its helping is
    # tests/quant/test_range_search.py's); learned rounding and trained ranges must not
    slack = 1.5 if method.get("ranges") else 1.0
    assert logit_error(got, reference, x) <= slack * logit_error(before, reference, x)
    if method.get("rounding") == "learned":  # each weight one step at most from nearest
        mine, nearest = int8_weights(got), int8_weights(before)
        assert mine.keys() == nearest.keys()
        changed = [n for n in mine if not np.array_equal(mine[n], nearest[n])]
        assert changed and all(np.abs(mine[n].astype(int) - nearest[n]).max() <= 1
                               for n in changed)
        assert made.info["method_seconds"]["learned_rounding"] > 0
    if method.get("fine_tune"):
        assert made.info["fine_tune"]["steps"] == 30
        assert made.info["method_seconds"]["fine_tune"] > 0


def test_an_int8_method_on_a_scheme_that_calibrates_nothing_is_refused() -> None:
    from pydantic import ValidationError

    from orchestrator.stages import get_stage

    params = get_stage("quantize_tflite").params
    with pytest.raises(ValidationError, match="rounding: learned.*dynamic_wi8_afp32"):
        params(scheme="dynamic_wi8_afp32", rounding="learned")
    assert params(scheme="dynamic_wi8_afp32", layers={"conv": "static_wi8_ai8"},
                  fine_tune=True).fine_tune
