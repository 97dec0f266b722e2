"""benchmarks/testbed/ssh_board.py itself: a real sshd on loopback that a strict,
non-interactive client reaches with no HOME of its own; its faults (sessions killed, the
server stopped and started again, an unknown host key) are the real ones."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from testbed.ssh_board import SshBoard, start_ssh_board

pytestmark = pytest.mark.device


@pytest.fixture
def board(tmp_path: Path) -> Iterator[SshBoard]:
    started = start_ssh_board(tmp_path / "sshd")
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def client_env(tmp_path: Path) -> dict[str, str]:
    """The client's environment: HOME somewhere that does not exist, no agent."""
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env["HOME"] = str(tmp_path / "no-such-home")
    return env


def ssh(board: SshBoard, env: dict[str, str], *remote: str,
        config: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(board.ssh_command(*remote, config=config), env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=30, check=False)


def background(board: SshBoard, env: dict[str, str], remote: str) -> subprocess.Popen[str]:
    return subprocess.Popen(board.ssh_command(remote), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def running_command(board: SshBoard, argv: list[str]) -> int:
    """The pid of the process under the listener running `argv` (not the shell that
    starts it), once it runs."""
    wanted = b"\0".join(arg.encode() for arg in argv) + b"\0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in board.descendants():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == wanted:
                    return pid
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError(f"{argv} is not running under the listener")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_the_board_answers_loses_connections_reboots_and_checks_its_host_key(
        board: SshBoard, client_env: dict[str, str], tmp_path: Path) -> None:
    port = board.port
    assert board.user == "root" or os.getuid() != 0
    assert board.url() == f"ssh://{board.user}@127.0.0.1:{port}"
    assert board.url(python="/opt/a b/python3") == \
        f"ssh://{board.user}@127.0.0.1:{port}?python=/opt/a%20b/python3"
    assert not (tmp_path / "no-such-home").exists()

    # a command runs there, non-interactively, with strict host key checking
    done = ssh(board, client_env, "python3 -c 'print(6*7)'")
    if done.returncode == 127:  # no python3 on the session's PATH
        done = ssh(board, client_env, "sh -c 'echo 42'")
    assert (done.returncode, done.stdout.strip()) == (0, "42"), done.stderr
    assert not (tmp_path / "no-such-home").exists()  # the client wrote nothing to a HOME

    # a connection lost mid-command: the client ends within 10 s; the command is gone too
    client = background(board, client_env, "sleep 30")
    sleeper = running_command(board, ["sleep", "30"])
    try:
        assert board.kill_sessions() == 1
        code = client.wait(timeout=10)
    finally:
        client.kill()
        client.wait()
    assert code != 0, client.stderr.read()
    assert not alive(sleeper)
    assert board.session_pids() == [] and board.descendants() == []
    # the listener stays: new connections work
    assert ssh(board, client_env, "true").returncode == 0

    # the same with what the session ran outliving it (a network drop), then a power-off:
    # stop() ends it too
    client = background(board, client_env, "sleep 31")
    sleeper = running_command(board, ["sleep", "31"])
    try:
        assert board.kill_sessions(keep_commands=True) == 1
        code = client.wait(timeout=10)
    finally:
        client.kill()
        client.wait()
    assert code != 0
    assert alive(sleeper) and sleeper in board.processes()
    board.stop()
    assert not alive(sleeper)

    # stopped: connection refused
    done = ssh(board, client_env, "true")
    assert done.returncode == 255 and "Connection refused" in done.stderr, done.stderr

    # rebooted: the same port, the same host key
    board.restart()
    assert board.port == port
    done = ssh(board, client_env, "echo", "back")
    assert (done.returncode, done.stdout.strip()) == (0, "back"), done.stderr

    # a client that does not know the host key refuses it
    done = ssh(board, client_env, "true", config=board.config_without_known_host())
    assert done.returncode == 255
    assert "Host key verification failed" in done.stderr, done.stderr


def test_stop_ends_every_session_and_is_idempotent(board: SshBoard,
                                                   client_env: dict[str, str]) -> None:
    clients = [background(board, client_env, f"sleep {40 + i}") for i in range(3)]
    try:
        deadline = time.monotonic() + 10
        while len(board.session_pids()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(board.session_pids()) == 3
        running_command(board, ["sleep", "42"])
        everything = board.processes()
        board.stop()
        board.stop()
        codes = [client.wait(timeout=10) for client in clients]
    finally:
        for client in clients:
            client.kill()
            client.wait()
    assert all(code != 0 for code in codes)
    assert not any(alive(pid) for pid in everything)
    assert board.processes() == [] and board.session_pids() == []
