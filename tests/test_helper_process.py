"""orchestrator/helper_process.py with real child processes: a request and its answer, a
deadline that passes, a child that dies mid-request, a Ctrl-C mid-request; whatever cuts a
request short leaves the child killed and reaped (no zombie). Deadlines here are bounds on a
child that never answers, never assertions about how long something took."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import helper_process
from orchestrator.helper_process import Helper, HelperEnded, HelperTimeout

# reads its input and writes it back (lines, frames: any bytes), until its input ends
ECHO = ("import os\n"
        "while chunk := os.read(0, 65536):\n"
        "    os.write(1, chunk)\n")
# reads one line, then does what the test asks, never answering
SILENT = ("import os, signal, subprocess, sys, time\n"
          "sys.stdin.buffer.readline()\n"
          "{then}\n"
          "time.sleep(600)\n")


def _child(code: str, **kwargs: object) -> subprocess.Popen[bytes]:
    return helper_process.start([sys.executable, "-c", code], **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The test's children, killed and reaped at the end whatever the test did."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        helper_process.kill(process)


def _gone(pid: int) -> bool:
    """No process `pid`, not even a zombie (a zombie is a child nobody reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("X",)


def _assert_reaped(process: subprocess.Popen[bytes]) -> None:
    assert process.returncode is not None  # waited for by the module
    with pytest.raises(ChildProcessError):  # and so not waitable again: no zombie of ours
        os.waitpid(process.pid, os.WNOHANG)
    assert _gone(process.pid)


def test_a_request_and_its_answer_lines_and_frames(children: list) -> None:
    process = _child(ECHO)
    children.append(process)
    helper = Helper(process)
    with helper.exchange(60) as deadline:
        helper.write(b'{"op": "ping"}\n', deadline)
        assert helper.read_line(deadline) == b'{"op": "ping"}'
        blob = bytes(range(256)) * 64  # within what a pipe holds: it echoes as it reads
        helper.write_frame(blob, deadline)
        assert helper.read_frame(deadline) == blob
    assert process.poll() is None  # an answered request keeps its helper
    helper_process.stop(process, 60)  # its input ends, so does it
    assert process.returncode == 0
    _assert_reaped(process)


def test_everything_to_the_end_and_a_channel_over_a_socket() -> None:
    left, right = socket.socketpair()
    with left, right:
        ours, theirs = helper_process.Channel(left, left), helper_process.Channel(right, right)
        ours.write(b"one\ntwo")
        assert theirs.read_line(helper_process.deadline_in(60)) == b"one"
        left.shutdown(socket.SHUT_WR)
        assert theirs.read_to_end(helper_process.deadline_in(60)) == b"two"
        with pytest.raises(HelperEnded):
            theirs.read_line(helper_process.deadline_in(60))


def test_no_answer_by_the_deadline_kills_and_reaps_the_child_and_its_group(
        children: list, tmp_path: Path) -> None:
    """The child and what it started (a grandchild in its process group) are killed."""
    pid_file = tmp_path / "grandchild"
    then = (f"p = subprocess.Popen(['sleep', '600']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))")
    process = _child(SILENT.format(then=then))
    children.append(process)
    helper = Helper(process)
    with pytest.raises(HelperTimeout), helper.exchange():
        helper.write(b"go\n")
        bound = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < bound:
            time.sleep(0.05)  # until the grandchild has started
        helper.read_line(helper_process.deadline_in(0.5))
    assert process.returncode == -signal.SIGKILL
    _assert_reaped(process)
    grandchild = int(pid_file.read_text())
    bound = time.monotonic() + 30  # init reaps the orphan: a bound, not a measurement
    while not _gone(grandchild) and time.monotonic() < bound:
        time.sleep(0.05)
    assert _gone(grandchild)


def test_a_child_that_dies_mid_request_is_a_clear_error_not_a_hang(children: list) -> None:
    process = _child(SILENT.format(then="os._exit(3)"))
    children.append(process)
    helper = Helper(process)
    with pytest.raises(HelperEnded, match="it ended"), helper.exchange(600) as deadline:
        helper.write(b"go\n", deadline)
        helper.read_line(deadline)
    assert process.returncode == 3  # its own exit, reaped
    _assert_reaped(process)


def test_ctrl_c_mid_request_raises_and_kills_the_child(children: list) -> None:
    """The child sends this process SIGINT once it has the request, as a Ctrl-C at the
    terminal would: KeyboardInterrupt here, and the child killed and reaped."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # CI may ignore it
    try:
        process = _child(SILENT.format(then="os.kill(os.getppid(), signal.SIGINT)"))
        children.append(process)
        helper = Helper(process)
        with pytest.raises(KeyboardInterrupt), helper.exchange(600) as deadline:
            helper.write(b"go\n", deadline)
            helper.read_line(deadline)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not helper.busy
    assert process.returncode == -signal.SIGKILL
    _assert_reaped(process)


def test_the_child_has_a_process_group_of_its_own(children: list) -> None:
    """A Ctrl-C at the terminal goes to the foreground group: the run's, not its helper's."""
    process = _child(SILENT.format(then=""))
    children.append(process)
    assert os.getpgid(process.pid) == process.pid != os.getpgid(0)
    helper_process.stop(process, None)  # no grace: killed at once, reaped
    assert process.returncode == -signal.SIGKILL
    _assert_reaped(process)
