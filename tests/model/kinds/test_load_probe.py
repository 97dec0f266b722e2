"""load_probe: load time and memory growth of a fresh process, for every kind that ships.

Memory is compared between models measured in the same run (never against fixed numbers
of time): the heap grows with the weights a graph copies in, not with memory-mapped ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_encrypt import context, encrypt, memmapped

from orchestrator.measure import load_probe
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.stages import get_stage

MB = 1024 * 1024


@pytest.fixture(autouse=True)
def own_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe a run starts for itself: not the session's shared one (conftest's
    load_probe_zygote), which the socket tests below stand in for themselves."""
    monkeypatch.delenv(load_probe.SOCKET_ENV, raising=False)


def measure(artifact: ModelArtifact, keys: object = None) -> dict:
    return load_probe.measure_artifact(artifact, keys, [s.to_json() for s in artifact.inputs],
                                       list(artifact.outputs))


def weights_graph(megabytes: int) -> ModelArtifact:
    """y = x @ W with W of `megabytes` MiB of float32, frozen (W is one Const)."""
    import tensorflow as tf

    rows = megabytes * MB // (4 * 256)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, rows], name="input")
        weights = tf.constant(np.random.default_rng(megabytes).standard_normal(
            (rows, 256)).astype(np.float32))
        tf.identity(tf.matmul(x, weights), name="output")
    return ModelArtifact(graph_def=graph.as_graph_def(),
                         inputs=(TensorSpec("input", "float32", (1, rows)),),
                         outputs=("output",))


def test_every_kind_loads_and_gives_the_same_outputs(digits_fp32: ModelArtifact,
                                                     digits_data: dict) -> None:
    convert = get_stage("convert_tflite")
    lite = convert.run(digits_fp32, convert.params(mode="fp32"), context()).artifact
    keys = context().model_key
    answers = {"graphdef": measure(digits_fp32), "memmapped": measure(memmapped(digits_fp32)),
               "encrypted graphdef": measure(encrypt(digits_fp32).artifact, keys),
               "encrypted memmapped": measure(encrypt(memmapped(digits_fp32)).artifact, keys),
               "tflite": measure(lite), "encrypted tflite": measure(encrypt(lite).artifact, keys)}
    for name, answer in answers.items():
        assert answer["load_ms"] > 0, name
        assert answer["rss_growth_mb"] > 0 and answer["anon_growth_mb"] >= 0, (name, answer)
    digests = {name: answer["outputs_sha256"] for name, answer in answers.items()}
    # the same random inputs: the same outputs from the file, mapped, or decrypted
    assert len({digests[k] for k in ("graphdef", "memmapped", "encrypted graphdef",
                                     "encrypted memmapped")}) == 1, digests
    assert digests["tflite"] == digests["encrypted tflite"]


def test_the_heap_grows_with_copied_weights_not_with_mapped_ones() -> None:
    small, large = weights_graph(2), weights_graph(34)
    small_growth = measure(small)["anon_growth_mb"]
    large_plain = measure(large)
    large_mapped = measure(memmapped(large))
    # 32 MiB more weights in Consts: at least as much more heap (the parse copies them)
    assert large_plain["anon_growth_mb"] - small_growth >= 0.9 * 32, (small_growth,
                                                                      large_plain)
    # the same weights memory-mapped: they are file pages, not heap
    assert large_plain["anon_growth_mb"] - large_mapped["anon_growth_mb"] >= 0.8 * 34, (
        large_plain, large_mapped)
    assert large_mapped["outputs_sha256"] == large_plain["outputs_sha256"]


def test_a_failed_load_is_a_clear_error_and_the_next_measurement_works(
        tmp_path: Path, digits_fp32: ModelArtifact) -> None:
    broken = tmp_path / "broken.pb"
    broken.write_bytes(b"\x08\x01 not a graph")
    with pytest.raises(load_probe.ProbeError, match="the load probe failed: .*Error"):
        load_probe.measure_file(broken, "graph", [], ["output"])
    assert measure(digits_fp32)["load_ms"] > 0


def test_a_dead_probe_process_is_replaced(digits_fp32: ModelArtifact) -> None:
    first = measure(digits_fp32)
    process = load_probe._ZYGOTE._process
    assert process is not None
    process.kill()
    process.wait()
    again = measure(digits_fp32)
    assert load_probe._ZYGOTE._process is not process
    assert again["outputs_sha256"] == first["outputs_sha256"]


def test_an_encrypted_model_without_its_key_is_not_measured(digits_fp32: ModelArtifact
                                                            ) -> None:
    with pytest.raises(load_probe.ProbeError, match="no key"):
        measure(encrypt(digits_fp32).artifact, None)


def test_benchmark_reports_the_fresh_process_memory(digits_fp32: ModelArtifact) -> None:
    stage = get_stage("benchmark")
    quick = {"warmup": 1, "runs": 3, "profile_runs": 0}
    with_memory = stage.run(digits_fp32, stage.params(**quick), context())
    without = stage.run(digits_fp32, stage.params(memory=False, **quick), context())
    memory = with_memory.info["memory"]
    assert set(memory) == {"load_ms", "rss_growth_mb", "anon_growth_mb"}
    assert memory["load_ms"] > 0 and memory["rss_growth_mb"] > 0
    assert with_memory.metrics["memory_anon_growth_mb"] == memory["anon_growth_mb"]
    assert "memory" not in without.info and "peak_memory_bytes" not in without.info


def test_workers_of_a_run_measure_through_its_zygote_socket(
        digits_fp32: ModelArtifact, monkeypatch: pytest.MonkeyPatch) -> None:
    """A LocalCluster worker gets the socket of its run's zygote (SOCKET_ENV) and measures
    there, as the run's own process does through the pipe; a client that goes away in the
    middle of a request costs the zygote nothing."""
    import socket

    load_probe.start()
    address = load_probe.shared_address()
    assert address is not None
    by_pipe = measure(digits_fp32)
    monkeypatch.setenv(load_probe.SOCKET_ENV, address)
    asked = []
    monkeypatch.setattr(load_probe._ZYGOTE, "request", lambda spec: asked.append(spec))
    with socket.socket(socket.AF_UNIX) as gone:  # a worker killed while it asked
        gone.connect(address)
        gone.sendall(b'{"path": ')
    by_socket = measure(digits_fp32)
    assert not asked  # not through the pipe, and no zygote of its own
    assert by_socket["outputs_sha256"] == by_pipe["outputs_sha256"]
    assert by_socket["rss_growth_mb"] > 0
    monkeypatch.undo()
    monkeypatch.setenv(load_probe.SOCKET_ENV, address + ".gone")  # none there: its own
    assert measure(digits_fp32)["outputs_sha256"] == by_pipe["outputs_sha256"]
