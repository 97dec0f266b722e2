"""The tflite kind: the digits example's graph converted to LiteRT flatbuffers, their facts
read back, corrupt files refused as ModelSourceError (never a crash), encrypted and opened
again, ops_header's selective-build files, and LiteRTRunner against LiteRT by hand."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.digits_graphs import apply

from orchestrator import load_encrypted
from orchestrator.errors import ModelSourceError
from orchestrator.measure.litert_runtime import LiteRTRunner
from orchestrator.measure.tf_runtime import open_runner, predict
from orchestrator.model import kinds
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.encryption import EncryptedFormatError
from orchestrator.model.keys import KeyMaterialError, ModelKey
from orchestrator.model.litert_model import describe, interpreter
from orchestrator.stages import StageContext, get_stage

KEY = bytes(range(32))
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def lite(digits_fp32: ModelArtifact) -> ModelArtifact:
    """The digits graph (batch 1) as a float flatbuffer."""
    return apply("convert_tflite", digits_fp32, mode="fp32")


@pytest.fixture(scope="module")
def lite_int8(digits_fp32: ModelArtifact, digits_data: dict) -> ModelArtifact:
    return apply("convert_tflite", digits_fp32, digits_data["x_calib"], mode="int8",
                 diagnostic_samples=0)


@pytest.fixture(scope="module")
def lite_io8(digits_fp32: ModelArtifact, digits_data: dict) -> ModelArtifact:
    return apply("convert_tflite", digits_fp32, digits_data["x_calib"], mode="int8",
                 io="int8", diagnostic_samples=0)


def digits_graph(folder: Path, batch: int | None) -> ModelArtifact:
    from orchestrator.model.sources import load_model

    model = load_model(folder / "saved_model", "auto",
                       [TensorSpec("image", "float32", (batch, 8, 8, 1))], ["probs"])
    for name in ("freeze", "strip", "fold"):
        model = apply(name, model)
    return model


@pytest.fixture(scope="module")
def lite_batch4(digits_example: Path) -> ModelArtifact:
    """A float flatbuffer whose batch is fixed at 4."""
    return apply("convert_tflite", digits_graph(digits_example, 4), mode="fp32")


@pytest.fixture(scope="module")
def lite_any_batch(digits_example: Path) -> ModelArtifact:
    return apply("convert_tflite", digits_graph(digits_example, None), mode="fp32")


def by_hand(flatbuffer: bytes, x: np.ndarray) -> np.ndarray:
    """LiteRT's interpreter invoked directly, one input batch of the model's own size at a
    time (the last one padded with zeros), int8 edges quantized with the tensors' own
    parameters; the first len(x) rows."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=flatbuffer)
    runner.allocate_tensors()
    [given], [out] = runner.get_input_details(), runner.get_output_details()
    size = int(given["shape"][0])
    rows = []
    for start in range(0, len(x), size):
        batch = x[start:start + size]
        batch = np.concatenate([batch, np.zeros((size - len(batch), *x.shape[1:]), x.dtype)])
        if given["dtype"] == np.int8:
            scale, zero_point = given["quantization"]
            batch = np.clip(np.round(batch / scale + zero_point), -128, 127).astype(np.int8)
        runner.set_tensor(given["index"], batch)
        runner.invoke()
        y = runner.get_tensor(out["index"])
        if out["dtype"] == np.int8:
            scale, zero_point = out["quantization"]
            y = (y.astype(np.float32) - zero_point) * np.float32(scale)
        rows.append(y)
    return np.concatenate(rows)[:len(x)]


# --- the kind and its facts ----------------------------------------------------------------

def test_kind_round_trip_and_facts(lite: ModelArtifact, digits_fp32: ModelArtifact) -> None:
    assert kinds.file_name("tflite") == "model.tflite"
    blob = kinds.to_bytes(lite)
    assert blob == lite.payload and blob[4:8] == b"TFL3"
    loaded = kinds.load(blob, lite.signature_json())
    assert loaded.kind == "tflite" and loaded.payload == blob
    assert (loaded.inputs, loaded.outputs) == (digits_fp32.inputs, digits_fp32.outputs)
    facts = kinds.facts(loaded)
    assert facts["kind"] == "tflite" and facts["size_bytes"] == len(blob)
    assert 0 < facts["gzip_size_bytes"] < len(blob)
    # the same weights as the graph's constants, in LiteRT's op names
    assert facts["params"] == kinds.facts(digits_fp32)["params"]
    assert facts["ops"] == {"CONV_2D": 2, "FULLY_CONNECTED": 2, "RESHAPE": 1, "SOFTMAX": 1}
    assert kinds.runnable(loaded) is loaded
    assert kinds.unwrapped(loaded) is loaded
    with pytest.raises(TypeError, match="flatbuffer"):
        kinds.deployed_graph(loaded)


def test_describe(lite: ModelArtifact, lite_int8: ModelArtifact, lite_io8: ModelArtifact
                  ) -> None:
    facts = describe(lite.payload)
    assert set(facts.op_versions) == set(facts.op_counts)
    assert all(1 <= low <= high for low, high in facts.op_versions.values())
    [image], [probs] = facts.inputs, facts.outputs
    assert (image.name, image.dtype, image.shape) == ("image", "float32", (1, 8, 8, 1))
    assert (probs.dtype, probs.shape) == ("float32", (1, 10))
    eight = describe(lite_int8.payload)
    assert eight.op_counts["QUANTIZE"] == 1 and eight.op_counts["DEQUANTIZE"] == 1
    assert eight.params == facts.params  # the same weights, one byte each
    # int8 kernels are newer versions of the same builtins
    assert eight.op_versions["CONV_2D"][1] >= facts.op_versions["CONV_2D"][1]
    io8 = describe(lite_io8.payload)
    assert (io8.inputs[0].dtype, io8.outputs[0].dtype) == ("int8", "int8")


# --- corrupt files -------------------------------------------------------------------------

def _edited(flatbuffer: bytes, edit: Any) -> bytes:
    """The model with `edit(model)` applied, written back with LiteRT's schema tools: a
    valid flatbuffer that is not a valid model."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    edit(model)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _bad_output(model: Any) -> None:
    model.subgraphs[0].operators[0].outputs[0] = 999


def _bad_buffer(model: Any) -> None:
    model.subgraphs[0].tensors[1].buffer = 10**6


CORRUPTIONS = {
    "empty": lambda data: b"",
    "identifier only": lambda data: data[:8],
    "half": lambda data: data[:len(data) // 2],
    "last byte cut": lambda data: data[:-1],
    "garbage after the identifier": lambda data: data[:8] + np.random.default_rng(0).integers(
        0, 256, len(data) - 8, dtype=np.uint8).tobytes(),
    "random bytes": lambda data: np.random.default_rng(1).integers(
        0, 256, 4096, dtype=np.uint8).tobytes(),
    "tensor index out of range": lambda data: _edited(data, _bad_output),
    "buffer index out of range": lambda data: _edited(data, _bad_buffer),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_file_is_a_model_source_error(corruption: str, lite: ModelArtifact) -> None:
    data = CORRUPTIONS[corruption](lite.payload)
    artifact = kinds.load(data, lite.signature_json())
    calls = {"interpreter": lambda: interpreter(data), "describe": lambda: describe(data),
             "summary": lambda: kinds.get_kind("tflite").summary(artifact),
             "facts": lambda: kinds.facts(artifact),
             "runner": lambda: LiteRTRunner(artifact),
             "open_runner": lambda: open_runner(artifact)}
    for name, call in calls.items():
        with pytest.raises(ModelSourceError, match="LiteRT|flatbuffer") as caught:
            call()
        assert "\n" not in str(caught.value), name  # one line, not LiteRT's log


def test_a_graphdef_is_not_a_tflite_file(lite: ModelArtifact, digits_fp32: ModelArtifact
                                         ) -> None:
    data = digits_fp32.graph_bytes()
    with pytest.raises(ModelSourceError, match="not a LiteRT flatbuffer"):
        describe(data)
    with pytest.raises(ModelSourceError):
        kinds.facts(kinds.load(data, lite.signature_json()))


CHECK_SCRIPT = """
import sys
from orchestrator.model import kinds
from orchestrator.errors import ModelSourceError
from orchestrator.model.litert_model import describe, interpreter

data = open(sys.argv[1], "rb").read()
artifact = kinds.load(data, '{"kind": "tflite", "inputs": [], "outputs": []}')
for call in (lambda: interpreter(data), lambda: describe(data), lambda: kinds.facts(artifact)):
    try:
        call()
        print("loaded")
    except ModelSourceError as exc:
        print("ModelSourceError:", exc)
"""


@pytest.mark.parametrize("corruption", ["half", "garbage after the identifier",
                                        "tensor index out of range"])
def test_corrupt_file_in_a_fresh_process_never_crashes(corruption: str, lite: ModelArtifact,
                                                        tmp_path: Path) -> None:
    """LiteRT's verifier runs in C++: a crash there would kill the process with a signal,
    not raise. A fresh process reads the file as an app would."""
    path = tmp_path / "model.tflite"
    path.write_bytes(CORRUPTIONS[corruption](lite.payload))
    done = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode >= 0, f"killed by signal {-done.returncode}: {done.stderr[-2000:]}"
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("ModelSourceError: ") for line in lines)


# --- encrypted -----------------------------------------------------------------------------

def key_context(stage: str) -> StageContext:
    model_key = ModelKey(KEY, source="test")

    def lookup(wanted: str | None) -> ModelKey:
        if wanted not in (None, model_key.key_id):
            raise KeyMaterialError(f"no key {wanted}")
        return model_key

    return StageContext(pipeline="test", stage=stage, model_key=lookup)


def encrypted(artifact: ModelArtifact) -> ModelArtifact:
    stage = get_stage("encrypt")
    return stage.run(artifact, stage.params(), key_context("encrypt")).artifact


@pytest.mark.parametrize("which", ["lite", "lite_int8"])
def test_encrypted_tflite_opens_as_a_runnable_flatbuffer(which: str, tmp_path: Path,
                                                         digits_data: dict,
                                                         request: pytest.FixtureRequest
                                                         ) -> None:
    from ai_edge_litert.interpreter import Interpreter

    plain = request.getfixturevalue(which)
    out = encrypted(plain)
    assert out.kind == "encrypted"
    assert out.metadata["encryption"]["payload_kind"] == "tflite"
    blob = kinds.to_bytes(out)
    assert plain.payload[:64] not in blob and b"TFL3" not in blob[:64]
    assert {k: v for k, v in kinds.facts(out).items() if k in ("params", "ops")} == {
        k: v for k, v in kinds.facts(plain).items() if k in ("params", "ops")}
    path = tmp_path / "model.enc"
    path.write_bytes(blob)
    opened = load_encrypted(path, KEY)
    assert isinstance(opened, bytes) and opened == plain.payload
    # what an app does with it: LiteRT's Interpreter on the bytes as they are
    x = digits_data["x_test"][:30]
    runner = Interpreter(model_content=opened)
    runner.allocate_tensors()
    [given], [probs] = runner.get_input_details(), runner.get_output_details()
    outputs = []
    for row in x:
        runner.set_tensor(given["index"], row[None])
        runner.invoke()
        outputs.append(runner.get_tensor(probs["index"]))
    assert np.array_equal(np.concatenate(outputs), by_hand(plain.payload, x))
    # and the orchestrator's runner decrypts it in memory with the key
    keys = key_context("evaluate").model_key
    with open_runner(out, keys) as decrypted, open_runner(plain) as direct:
        assert isinstance(decrypted, LiteRTRunner)
        assert np.array_equal(decrypted.predict(x), direct.predict(x))
    with pytest.raises(EncryptedFormatError, match="wrong key"):
        load_encrypted(path, bytes(range(1, 33)))


# --- ops_header ----------------------------------------------------------------------------

def ops_header(artifact: ModelArtifact) -> Any:
    stage = get_stage("ops_header")
    return stage.run(artifact, stage.params(), key_context("ops_header"))


@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("which", ["lite", "lite_int8"])
def test_ops_header_registers_each_builtin_once(which: str, encrypt: bool,
                                                request: pytest.FixtureRequest) -> None:
    plain = request.getfixturevalue(which)
    given = encrypted(plain) if encrypt else plain
    result = ops_header(given)
    assert result.artifact is given  # a measuring stage
    assert "ops_to_register.h" not in result.files  # TF's header is for graphs
    facts = describe(plain.payload)
    source = result.files["register_litert_ops.cc"].decode()
    added = re.findall(r"resolver->AddBuiltin\(::tflite::BuiltinOperator_(\w+), "
                       r"::tflite::ops::builtin::Register_(\w+)\(\), (\d+), (\d+)\);", source)
    assert len(added) == source.count("AddBuiltin")
    assert [op for op, _, _, _ in added] == sorted(facts.op_counts)  # one per builtin op
    for op, register, low, high in added:
        assert register == op and (int(low), int(high)) == facts.op_versions[op]
    assert "void RegisterSelectedOps(::tflite::MutableOpResolver* resolver) {" in source
    listing = json.loads(result.files["litert_ops.json"])["builtin_ops"]
    assert {op: entry["count"] for op, entry in listing.items()} == facts.op_counts
    table = result.files["litert_ops.txt"].decode().splitlines()
    assert len(table) == 1 + len(facts.op_counts)
    assert result.info["ops_header"] == {"runtime": "litert",
                                         "op_types": sorted(facts.op_counts)}
    assert result.metrics["op_types"] == len(facts.op_counts)


def test_ops_header_ignores_tensorflow_extra_ops_on_tflite(lite: ModelArtifact) -> None:
    stage = get_stage("ops_header")
    result = stage.run(lite, stage.params(extra_ops=["NoOp:NoOp"]),
                       StageContext(pipeline="t", stage="h"))
    [warning] = result.warnings
    assert "NoOp:NoOp" in warning and "ignored" in warning
    assert result.files == ops_header(lite).files


def test_ops_header_on_an_encrypted_tflite_needs_its_key(lite: ModelArtifact) -> None:
    stage = get_stage("ops_header")
    with pytest.raises(KeyMaterialError, match="encrypted"):
        stage.run(encrypted(lite), stage.params(), StageContext(pipeline="t", stage="h"))


# --- LiteRTRunner --------------------------------------------------------------------------

def test_runner_pads_a_fixed_batch(lite_batch4: ModelArtifact, digits_example: Path,
                                   digits_data: dict) -> None:
    x = digits_data["x_test"][:10]
    with open_runner(lite_batch4) as runner:
        assert isinstance(runner, LiteRTRunner)
        assert runner.fixed_batch_size() == 4
        assert runner.input_specs() == [([4, 8, 8, 1], np.dtype(np.float32))]
        batches = list(runner.batches(x, batch_size=64))  # the model's 4 wins over 64
        assert [len(b) for b in batches] == [4, 4, 4]
        assert np.array_equal(batches[2], x[[8, 9, 9, 9]])  # padded with the last row
        [probs] = runner.predict_all(x, batch_size=64)
    assert probs.shape == (10, 10)
    np.testing.assert_allclose(probs, by_hand(lite_batch4.payload, x), rtol=0, atol=1e-6)
    graph = predict(digits_graph(digits_example, 4), x)
    assert np.abs(probs - graph).max() < 1e-5


def test_runner_any_batch_matches_by_hand(lite_any_batch: ModelArtifact, lite: ModelArtifact,
                                          digits_data: dict) -> None:
    x = digits_data["x_test"][:37]
    with open_runner(lite_any_batch) as runner:
        assert runner.fixed_batch_size() is None
        assert [len(b) for b in runner.batches(x, batch_size=16)] == [16, 16, 5]
        [probs] = runner.predict_all(x, batch_size=16)
        again = runner.predict(x[:3], batch_size=2)  # resized back down
        with pytest.raises(TypeError):
            runner.run(x[:1], fetches=["Identity"])
    assert probs.shape == (37, 10)
    expected = by_hand(lite.payload, x)  # the batch-1 model, one row at a time
    np.testing.assert_allclose(probs, expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(again, expected[:3], rtol=0, atol=1e-6)
    with open_runner(lite_any_batch, intra_op_threads=1) as single:
        assert single.num_threads == 1
        np.testing.assert_allclose(single.predict(x), expected, rtol=0, atol=1e-6)


def test_runner_feeds_int8_edges_floats(lite_io8: ModelArtifact, digits_fp32: ModelArtifact,
                                        digits_data: dict) -> None:
    x = digits_data["x_test"]
    with open_runner(lite_io8) as runner:
        assert runner.input_specs() == [([1, 8, 8, 1], np.dtype(np.float32))]
        [probs] = runner.predict_all(x)
    assert probs.dtype == np.float32
    assert np.array_equal(probs, by_hand(lite_io8.payload, x))
    graph = predict(digits_fp32, x)
    assert np.mean(probs.argmax(1) == graph.argmax(1)) >= 0.97
