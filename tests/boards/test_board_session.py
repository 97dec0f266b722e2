"""The board's program and the host's session, on this host's own Python as the board:
the protocol, a real LiteRT measurement compared numerically with the host's, the lock,
the sweep of a dead runner's folder, and the faults a session must turn into DeviceLost
(a runner that dies, one that hangs) within its deadline."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.waiting import board_is_measuring

from orchestrator.boards import board_runner, measurement
from orchestrator.boards.errors import DeviceLost
from orchestrator.boards.session import BoardSession
from orchestrator.boards.urls import parse_device_url


class HostPython:
    """This host's Python as the board (the runner needs nothing but numpy and LiteRT)."""

    url = parse_device_url("ssh://localhost")

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env

    def open(self) -> None:
        return None

    def python_command(self, *args: str) -> list[str]:
        prefix = ["env", *(f"{k}={v}" for k, v in (self.env or {}).items())]
        return [*prefix, sys.executable, *args]

    def close(self) -> None:
        return None


@pytest.fixture
def board_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The board's temp dir: its own, so that tests never share a lock or a job folder."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path / "orchestrator-board"


@pytest.fixture
def session(board_tmp: Path, tmp_path: Path) -> BoardSession:
    board = BoardSession(HostPython({"TMPDIR": str(tmp_path)}), "test board")
    board.start()
    yield board
    board.close()


def tflite_model(tmp_path: Path) -> tuple[object, np.ndarray]:
    """A small real LiteRT model (dense + softmax, 10 classes) and inputs for it."""
    import tensorflow as tf

    from orchestrator.model.files import open_model

    rng = np.random.default_rng(0)
    weights = rng.normal(size=(16, 10)).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([1, 16], tf.float32, name="x")])
    def model(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.softmax(tf.matmul(x, weights), name="probs")

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [model.get_concrete_function()], model)
    path = tmp_path / "m.tflite"
    path.write_bytes(converter.convert())
    return open_model(path).artifact, rng.normal(size=(40, 16)).astype(np.float32)


def test_describe_says_what_the_board_is(session: BoardSession) -> None:
    facts = session.describe()
    assert facts["machine"] == os.uname().machine
    assert facts["python"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["cores"] == os.cpu_count()
    assert facts["runtimes"]["numpy"] == np.__version__
    assert facts["runtimes"]["ai_edge_litert"]
    assert session.ready["ready"] and session.ready["protocol"] == board_runner.PROTOCOL


def test_measure_runs_the_file_and_its_outputs_match_the_hosts(
        session: BoardSession, tmp_path: Path) -> None:
    from orchestrator.measure.tf_runtime import open_runner

    artifact, inputs = tflite_model(tmp_path)
    reply = measurement.measure(session, artifact, None, inputs, [1, 2], warmup=2, runs=7,
                                samples=len(inputs), timeout=120)
    assert sorted(reply["threads"]) == ["1", "2"]
    for stats in reply["threads"].values():
        assert stats["count"] == 7 and 0 < stats["min"] <= stats["p50"] <= stats["max"]
    assert reply["load"]["load_ms"] > 0 and reply["load"]["rss_growth_mb"] >= 0
    assert reply["noise"]["lock_wait_s"] >= 0
    with open_runner(artifact) as runner:
        host = runner.predict_all(inputs)
    # the same file on the same CPU: the same numbers
    assert len(reply["outputs"]) == 1 and reply["outputs"][0].shape == host[0].shape
    np.testing.assert_allclose(reply["outputs"][0], host[0], atol=1e-6)
    labels = host[0].argmax(axis=1)
    labels[:4] = (labels[:4] + 1) % 10  # four wrong labels: accuracy 36/40 on both sides
    compared = measurement.compare(reply["outputs"], host, ["probs"], labels)
    assert compared["accuracy"] == compared["host_accuracy"] == pytest.approx(0.9)
    assert compared["top1_agreement"] == 1.0
    assert compared["outputs"]["probs"]["max_abs_diff"] <= 1e-6


def test_the_key_of_an_encrypted_file_never_reaches_the_boards_disk(
        session: BoardSession, tmp_path: Path, board_tmp: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.model.encryption import encrypt
    from orchestrator.model.files import open_model
    from orchestrator.model.kinds import to_bytes

    artifact, inputs = tflite_model(tmp_path)
    secret = os.urandom(32)
    (tmp_path / "m.enc").write_bytes(encrypt(to_bytes(artifact), "tflite", secret))
    monkeypatch.setenv("TEST_MODEL_KEY", secret.hex())
    opened = open_model(tmp_path / "m.enc", key_env="TEST_MODEL_KEY")
    assert opened.artifact.kind == "encrypted" and opened.key is not None
    reply = measurement.measure(session, opened.artifact, lambda _kid: opened.key, inputs,
                                [1], warmup=1, runs=3, samples=8, timeout=120)
    # decrypted in memory there: the same outputs as the plain file's
    plain = measurement.measure(session, artifact, None, inputs, [1], warmup=1, runs=3,
                                samples=8, timeout=120)
    np.testing.assert_array_equal(reply["outputs"][0], plain["outputs"][0])
    key = opened.key
    on_disk = b"".join(p.read_bytes() for p in board_tmp.rglob("*") if p.is_file())
    assert key.secret not in on_disk


def test_a_second_measurement_waits_for_the_boards_lock(session: BoardSession,
                                                        tmp_path: Path, board_tmp: Path
                                                        ) -> None:
    artifact, inputs = tflite_model(tmp_path)
    board_tmp.mkdir(parents=True, exist_ok=True)
    with open(board_tmp / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another measurement holds the board
        threading.Timer(1.5, lambda: fcntl.flock(held, fcntl.LOCK_UN)).start()
        reply = measurement.measure(session, artifact, None, inputs, [1], warmup=1, runs=3,
                                    samples=4, timeout=60)
    # it started only once the lock was free (a lower bound: never flaky)
    assert reply["noise"]["lock_wait_s"] >= 1.0


def test_a_dead_runners_folder_is_removed_by_the_next_one(board_tmp: Path,
                                                          tmp_path: Path) -> None:
    stale = board_tmp / "job-999999"
    stale.mkdir(parents=True)
    (stale / "alive").touch()
    (stale / "model.bin").write_bytes(b"left by a runner that died")
    with BoardSession(HostPython({"TMPDIR": str(tmp_path)}), "test board") as board:
        assert board.ready["stale_jobs_removed"] == 1
        assert not stale.exists()
        live = Path(board.ready["job"])
        assert live.is_dir()  # its own folder, held while it lives
    assert not live.exists()  # and removed when it ends


def _runner_pid(board: BoardSession) -> int:
    return int(Path(board.ready["job"]).name.removeprefix("job-"))


def test_a_runner_that_dies_mid_measurement_is_device_lost(session: BoardSession,
                                                           tmp_path: Path) -> None:
    artifact, inputs = tflite_model(tmp_path)
    pid = _runner_pid(session)

    def kill_once_measuring() -> None:  # not after a fixed delay: a fast host finishes first
        while not session.busy:
            time.sleep(0.001)
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill_once_measuring, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(DeviceLost) as caught:
        measurement.measure(session, artifact, None, inputs, [1], warmup=5, runs=100_000,
                            samples=4, timeout=120)
    assert time.monotonic() - started < 60
    assert "test board" in str(caught.value) and "measuring" in str(caught.value)


def test_a_runner_that_hangs_is_device_lost_at_the_deadline(session: BoardSession,
                                                            tmp_path: Path) -> None:
    artifact, inputs = tflite_model(tmp_path)
    pid = _runner_pid(session)
    os.kill(pid, signal.SIGSTOP)  # the board freezes
    try:
        started = time.monotonic()
        with pytest.raises(DeviceLost) as caught:
            measurement.measure(session, artifact, None, inputs, [1], warmup=1, runs=3,
                                samples=4, timeout=3)
        assert time.monotonic() - started < 30  # bounded: the deadline, then the kill
        assert "no answer in time" in str(caught.value)
    finally:
        subprocess.run(["kill", "-CONT", str(pid)], check=False)
    assert not session.alive  # the session killed it
    assert not session.busy  # the request is over: close() does not take it for one


def _wait_until(condition: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)
    assert condition(), "the board never started measuring"  # type: ignore[operator]


def test_ctrl_c_mid_measurement_kills_the_board_at_once(
        session: BoardSession, tmp_path: Path, board_tmp: Path, default_sigint: None
        ) -> None:
    """Issue 39: the interrupt leaves request() with the board's process already ended,
    not left measuring (its reply would come only when the runs are done) for close() to
    wait on."""
    artifact, inputs = tflite_model(tmp_path)
    pid = _runner_pid(session)

    def interrupt() -> None:
        _wait_until(lambda: board_is_measuring(board_tmp))
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        measurement.measure(session, artifact, None, inputs, [1], warmup=5,
                            runs=10_000_000, samples=4, timeout=600)
    # ended and reaped before the interrupt went on: nothing waits for the runs
    assert not session.alive and session.process.returncode == -signal.SIGKILL
    assert not Path(f"/proc/{pid}").exists()


def test_closing_a_session_mid_request_kills_the_board_rather_than_waiting(
        session: BoardSession, tmp_path: Path, board_tmp: Path) -> None:
    """close() from another thread (the run's end, after an interrupt elsewhere) while a
    measurement is under way: the board is killed, not sent a goodbye it would read only
    after its runs; the measuring thread gets DeviceLost."""
    artifact, inputs = tflite_model(tmp_path)
    process = session.process
    raised: list[BaseException] = []

    def measure() -> None:
        try:
            measurement.measure(session, artifact, None, inputs, [1], warmup=5,
                                runs=10_000_000, samples=4, timeout=600)
        except BaseException as exc:  # noqa: BLE001
            raised.append(exc)

    worker = threading.Thread(target=measure, daemon=True)
    worker.start()
    _wait_until(lambda: board_is_measuring(board_tmp))
    session.close()
    assert process.returncode == -signal.SIGKILL  # killed, not a runner that said goodbye
    worker.join(60)
    assert not worker.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], DeviceLost), raised
