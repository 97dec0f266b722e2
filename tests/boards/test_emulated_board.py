"""The emulated aarch64 board: the cpuinfo each core gets, what it says when it is not
built, and `orchestrator benchmark --on` / `device check` against it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator.boards import emulated_board
from orchestrator.cli.main import main


def test_each_core_claims_only_its_own_features() -> None:
    a72 = emulated_board.cpuinfo(emulated_board.CORES["cortex-a72"], 4)
    a76 = emulated_board.cpuinfo(emulated_board.CORES["cortex-a76"], 4)
    # a Cortex-A72 has no dot product: a cpuinfo that claims it makes LiteRT die of SIGILL
    assert "asimddp" not in a72 and "asimddp" in a76
    assert a72.count("processor\t:") == 4
    assert "CPU part\t: 0xd08" in a72 and "CPU part\t: 0xd0b" in a76


def test_a_board_not_built_says_how_to_build_it(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ORCHESTRATOR_BOARDS", str(tmp_path / "none"))
    assert main(["device", "check", "qemu://aarch64?cpu=cortex-a72"]) == 2
    err = capsys.readouterr().err
    assert "orchestrator device prepare qemu://aarch64" in err and str(tmp_path) in err
    assert main(["device", "check", "qemu://aarch64?cpu=cortex-a9"]) == 2
    assert "cortex-a76" in capsys.readouterr().err  # the cores it has


@pytest.mark.device
def test_device_check_and_benchmark_on_the_emulated_board(
        emulated_board: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["device", "check", "qemu://aarch64?cpu=cortex-a72", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["machine"], facts["cpu"], facts["emulated"]) == ("aarch64", "Cortex-A72",
                                                                   True)
    assert facts["runtimes"]["ai_edge_litert"] and facts["runtimes"]["tensorflow"] is None
    model = _tflite(tmp_path)
    assert main(["benchmark", str(model), "--on", "qemu://aarch64?cpu=cortex-a72",
                 "--runs", "5", "--threads", "1,2", "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert measured["measured"] and measured["board"]["cpu"] == "Cortex-A72"
    assert [row["threads"] for row in measured["threads_matrix"]] == [1, 2]
    assert measured["threads_matrix"][0]["latency_ms"]["count"] == 5
    # a float model on the Arm kernels: the host's numbers to float precision
    [output] = measured["outputs"].values()
    assert output["max_abs_diff"] < 1e-5 and measured["samples"] == 16


def _tflite(folder: Path) -> Path:
    import tensorflow as tf

    weights = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32, name="x")])
    def model(x: tf.Tensor) -> tf.Tensor:
        return tf.tanh(tf.matmul(x, weights))

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [model.get_concrete_function()], model)
    path = folder / "model.tflite"
    path.write_bytes(converter.convert())
    return path
