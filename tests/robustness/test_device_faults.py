"""Boards are shared and flaky: each fault against a real OpenSSH server on loopback whose
board is the emulated aarch64 Python (benchmarks/testbed/ssh_board.py).

- a board that cannot be reached, an unknown host key, a runtime missing there: exit 2
  before any stage runs, naming the target, the URL and the fix; nothing written;
- a connection lost mid-measurement, then the board rebooting: exit 3 naming the stage,
  target and board, within a bounded time; nothing half-written; the re-run reuses every
  stage that finished, measures and validates litert_int8 on the board (the digits recipe
  end to end over SSH), and the dead runner's folder on the board is removed;
- a board that hangs mid-measurement: exit 3 at the stage's timeout;
- Ctrl-C mid-measurement on the emulated board: exit 130, the board's process killed with
  the run, not waited for until its runs end (issue 39).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.robust_helpers import (
    DIGITS,
    RUN_TIMEOUT_S,
    cache_entries,
    check_clean_error,
    cli_in_process,
    partial_cache_entries,
    start_cli,
    wait_all,
    wait_for,
    write_yaml,
)
from support.waiting import board_is_measuring

pytestmark = [pytest.mark.device, pytest.mark.slow]

CORE = "cortex-a76"


@pytest.fixture
def board(tmp_path: Path, emulated_board: Path) -> Iterator[object]:
    from testbed.ssh_board import start_ssh_board

    started = start_ssh_board(tmp_path / "sshd")
    yield started
    started.stop()


def board_python(folder: Path, emulated: Path, with_runtimes: bool = True) -> Path:
    """The board's Python, as the SSH server's sessions start it: the emulated aarch64
    Python, with a temp dir and a home of this test's own (the board's lock, its job
    folders and what `device prepare` installs stay here); without the runtimes (no
    PYTHONPATH to the board's wheels) for a board that was never prepared."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tmp").mkdir(exist_ok=True)
    (folder / "home").mkdir(exist_ok=True)
    script = folder / "python3"
    runtimes = f'PYTHONPATH="{emulated}/site" ' if with_runtimes else ""
    script.write_text(
        "#!/bin/sh\n"
        f'export TMPDIR="{folder}/tmp" HOME="{folder}/home" '
        f'ORCHESTRATOR_BOARD_PYTHON="{script}"\n'
        f"{runtimes}exec qemu-aarch64-static -cpu {CORE} -L {emulated}/cpus/{CORE} "
        f'{emulated}/root/usr/bin/python3.11 "$@"\n')
    script.chmod(0o755)
    return script


def recipe(folder: Path, connect: str, runs: int = 50, timeout_s: float = 120) -> Path:
    """The digits model's LiteRT int8 file, measured on the board (`runs` timed runs)."""
    return write_yaml(folder / "device.yaml", {
        "version": 1, "name": "device-faults",
        "model": {"path": str(DIGITS / "saved_model")},
        "data": {"representative": {"source": str(DIGITS / "data.npz"), "array": "x_calib",
                                    "samples": 50},
                 "evaluation": {"source": str(DIGITS / "data.npz"), "inputs": "x_test",
                                "labels": "y_test"}},
        "targets": [{"name": "arm", "device": "phone-modern", "connect": connect}],
        "pipelines": {"fp32": {"stages": ["freeze", "strip", "fold"]},
                      "litert_int8": {"from": "fp32", "stages": [
                          {"convert_tflite": {"mode": "int8"}}, "evaluate",
                          {"measure_on_device": {"target": "arm", "runs": runs,
                                                 "timeout_s": timeout_s}}]}}})


def without_warnings(err: str) -> str:
    """stderr without the stages' warning lines (fp32's: no TensorFlow on the board)."""
    return "\n".join(line for line in err.splitlines()
                     if not line.startswith("    warning: "))


def env_for(run_env: dict[str, str], config: Path) -> dict[str, str]:
    return {**run_env, "ORCHESTRATOR_SSH_CONFIG": str(config)}


def nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "out").exists()
    assert partial_cache_entries(tmp_path / ".orchestrator") == []


def in_process(monkeypatch: pytest.MonkeyPatch, config: Path, capsys: pytest.CaptureFixture,
               *args: object) -> tuple[int, str, str]:
    """`orchestrator ARGS` in this process, its SSH config `config` (exit-2 cases: they end
    before any stage, so a subprocess's imports would be most of their cost)."""
    monkeypatch.setenv("ORCHESTRATOR_SSH_CONFIG", str(config))
    return cli_in_process([str(a) for a in args], capsys)


def test_an_unreachable_board_is_exit_2_before_any_stage(
        workspace: Path, prefect_server: None, board: object,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    port = board.port
    board.stop()  # nothing listens there now
    connect = f"ssh://root@127.0.0.1:{port}"
    code, _, err = in_process(monkeypatch, board.config, capsys, "run",
                              recipe(workspace, connect), "-o", workspace / "out")
    message = check_clean_error(code, err, "target arm", connect,
                                "orchestrator device check", "device.yaml:")
    assert "Connection refused" in message
    # before any stage: not even the source model was stored
    assert cache_entries(workspace / ".orchestrator") == set()
    nothing_written(workspace)


def test_an_unknown_host_key_is_refused_until_accepted(
        workspace: Path, prefect_server: None, board: object, emulated_board: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    python = board_python(workspace / "board", emulated_board)
    connect = board.url(python=str(python))
    strict = board.config_without_known_host()
    code, _, err = in_process(monkeypatch, strict, capsys, "run",
                              recipe(workspace, connect), "-o", workspace / "out")
    check_clean_error(code, err, "target arm", "host key", "--accept-host-key")
    nothing_written(workspace)
    # the user accepts it, explicitly, once: then the board answers
    code, _, err = in_process(monkeypatch, strict, capsys, "device", "check", connect)
    assert code == 2 and "--accept-host-key" in err
    code, out, err = in_process(monkeypatch, strict, capsys, "device", "check", connect,
                                "--accept-host-key")
    assert code == 0, err
    assert "machine: aarch64" in out and "Cortex-A76" in out
    code, _, err = in_process(monkeypatch, strict, capsys, "device", "check", connect)
    assert code == 0, err


def test_a_board_without_its_runtimes_is_exit_2_until_prepared(
        workspace: Path, prefect_server: None, board: object, emulated_board: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    python = board_python(workspace / "board", emulated_board, with_runtimes=False)
    connect = board.url(python=str(python))
    code, _, err = in_process(monkeypatch, board.config, capsys, "run",
                              recipe(workspace, connect), "-o", workspace / "out")
    check_clean_error(code, err, "target arm", connect, "ai_edge_litert", "numpy",
                      f"orchestrator device prepare {shlex.quote(connect)}")
    assert cache_entries(workspace / ".orchestrator") == set()
    nothing_written(workspace)
    # prepare: this host fetches the board's wheels and sends them over the connection
    code, _, err = in_process(monkeypatch, board.config, capsys, "device", "prepare",
                              connect)
    assert code == 0, err[-3000:]
    site = workspace / "board" / "home" / ".cache" / "orchestrator-board"
    assert [p.name for p in site.iterdir()] == ["site-cp311-aarch64"]
    code, out, _ = in_process(monkeypatch, board.config, capsys, "device", "check", connect)
    assert code == 0 and "LiteRT .tflite files: can measure" in out, out


def measured_board(tmp_path: Path, board: object, emulated: Path,
                   run_env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The board's URL (its Python with the runtimes) and a run's environment for it."""
    python = board_python(tmp_path / "board", emulated)
    return board.url(python=str(python)), env_for(run_env, board.config)


def _runner_pids(board: object) -> list[int]:
    """The board's measuring programs (under qemu), among the SSH server's processes."""
    found = []
    for pid in board.descendants():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"orchestrator-board-runner" in cmdline:
            found.append(pid)
    return found


def test_a_lost_connection_then_a_reboot_and_the_rerun_reuses_what_finished(
        tmp_path: Path, run_env: dict[str, str], board: object,
        emulated_board: Path) -> None:
    connect, env = measured_board(tmp_path, board, emulated_board, run_env)
    args = ["run", recipe(tmp_path, connect, runs=1500), "-o", tmp_path / "out"]
    run = start_cli(args, env, tmp_path, tmp_path / "logs-1")
    board_tmp = tmp_path / "board" / "tmp"
    lock_folder = board_tmp / "orchestrator-board"
    assert wait_for(lambda: board_is_measuring(lock_folder), RUN_TIMEOUT_S, 0.05), run.stderr()
    killed = board.kill_sessions()  # the connection drops mid-measurement
    assert killed >= 1
    [code] = wait_all([run], timeout=RUN_TIMEOUT_S)
    message = check_clean_error(code, without_warnings(run.stderr()), "measure_on_device",
                                "target arm", connect, exit_code=3, progress_ok=True)
    assert "the connection was lost" in message or "ended" in message, message
    nothing_written(tmp_path)
    # the board reboots: every process on it ends, what a runner left stays on its disk
    board.stop()
    for pid in _runner_pids(board):
        os.kill(pid, signal.SIGKILL)
    board.restart()
    left = sorted((board_tmp / "orchestrator-board").glob("job-*"))
    rerun = start_cli(args, env, tmp_path, tmp_path / "logs-2")
    [code] = wait_all([rerun], timeout=RUN_TIMEOUT_S * 2)
    assert code == 0, rerun.stderr()[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    stages = {s["name"]: s["cached"] for s in report["variants"]["litert_int8"]["stages"]}
    assert stages == {"convert_tflite": True, "evaluate": True, "measure_on_device": False}
    # measured and validated on the board behind SSH: the digits recipe end to end
    lite = report["variants"]["litert_int8"]
    measured = lite["targets"]["arm"]["measured"]
    assert measured["measured"] and measured["where"] == connect
    assert (measured["board"]["machine"], measured["board"]["cpu"]) == ("aarch64",
                                                                        "Cortex-A76")
    assert measured["emulated"] is False  # over ssh: a board as far as the run can tell
    assert abs(measured["accuracy"] - lite["accuracy"]) <= 0.005
    assert measured["top1_agreement"] >= 0.99 and measured["latency_ms"]["count"] == 1500
    # a real board's latency is what the target's budgets and selection read
    assert lite["targets"]["arm"]["latency_basis"] == "measured on arm's board"
    assert lite["targets"]["arm"]["latency_ms"] == measured["latency_ms"]["p50"]
    fp32 = report["variants"]["fp32"]["targets"]["arm"]["measured"]
    assert fp32["measured"] is False and "tensorflow" in fp32["reason"]
    assert board.session_pids() == []  # the run closed its connection
    # the folders a dead runner left are gone, and the re-run's own too
    assert not any(path.exists() for path in left)
    assert list((board_tmp / "orchestrator-board").glob("job-*")) == []


def test_a_board_that_hangs_mid_measurement_is_exit_3_at_the_timeout(
        tmp_path: Path, run_env: dict[str, str], board: object,
        emulated_board: Path) -> None:
    connect, env = measured_board(tmp_path, board, emulated_board, run_env)
    args = ["run", recipe(tmp_path, connect, runs=4000, timeout_s=8), "-o",
            tmp_path / "out"]
    run = start_cli(args, env, tmp_path, tmp_path / "logs")
    lock_folder = tmp_path / "board" / "tmp" / "orchestrator-board"
    assert wait_for(lambda: board_is_measuring(lock_folder), RUN_TIMEOUT_S, 0.05), \
        run.stderr()
    frozen = _runner_pids(board)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)  # the board stops answering, the connection stays up
    try:
        [code] = wait_all([run], timeout=RUN_TIMEOUT_S)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    message = check_clean_error(code, without_warnings(run.stderr()), "measure_on_device",
                                "target arm", connect, exit_code=3, progress_ok=True)
    assert "no answer in time" in message
    nothing_written(tmp_path)


def _board_runners(marker: Path) -> list[int]:
    """Live measuring programs whose environment names `marker` (this test's TMPDIR):
    wherever they are in the process tree (a board's runner has its own session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"orchestrator-board-runner" not in (entry / "cmdline").read_bytes():
                continue
            if str(marker).encode() not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def test_ctrl_c_mid_measurement_ends_the_board_with_the_run(
        tmp_path: Path, run_env: dict[str, str], emulated_board: Path) -> None:
    """A real SIGINT to the run's process group (as a terminal sends it) while the
    emulated board measures 100000 runs per setting (minutes under qemu): exit 130, one
    `interrupted`, the board's process gone with the run and no report. Before issue 39
    the run said goodbye to a runner still measuring and waited 10 s before killing it."""
    board_tmp = tmp_path / "board-tmp"  # the board's lock and job folders: this test's own
    board_tmp.mkdir()
    env = {**run_env, "TMPDIR": str(board_tmp)}
    connect = f"qemu://aarch64?cpu={CORE}"
    args = ["run", recipe(tmp_path, connect, runs=100_000, timeout_s=3600), "-o",
            tmp_path / "out"]
    run = start_cli(args, env, tmp_path, tmp_path / "logs")
    lock_folder = board_tmp / "orchestrator-board"
    assert wait_for(lambda: board_is_measuring(lock_folder), RUN_TIMEOUT_S, 0.05), run.stderr()
    assert _board_runners(board_tmp), "the board's runner is not among the processes"
    started = time.monotonic()
    os.killpg(run.process.pid, signal.SIGINT)
    [code] = wait_all([run], timeout=RUN_TIMEOUT_S)
    print(f"SIGINT to exit: {time.monotonic() - started:.2f} s")
    err = run.stderr()
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and err.splitlines().count("interrupted") == 1, err[-2000:]
    assert _board_runners(board_tmp) == []  # killed with the run, not left measuring
    assert not (tmp_path / "out" / "report.json").exists()
