"""Talking to the board: the runner sent over the transport, requests and replies in frames.

A session starts the board's Python once (`-c` with a small bootstrap that reads the
runner's source from stdin), then sends requests and waits for each reply within a
deadline. A reply that does not come in time, a connection that drops, a runner that dies:
the process is killed (the whole group, the ssh client with it) and `DeviceLost` names
the board and what it was doing. The board's own side ends itself too (an alarm per
request, and a broken pipe), and the next runner there removes what a dead one left.

A request cut short (Ctrl-C while the board measures, or while its Python starts) kills
the board's process at once: its reply would come only when the measurement is done, and
the frames are out of step anyway. Closing a session that is mid-request does the same,
rather than saying goodbye to a runner that is not listening.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.devices import board_runner
from orchestrator.devices.errors import DeviceLost, DeviceUnreachable
from orchestrator.devices.transports import Transport, transport_for
from orchestrator.devices.urls import DeviceURL

FRAME = board_runner.FRAME
# reads the runner's source (a length line, then the bytes) and runs it; the marker names
# the process on the board (ps, pgrep)
BOOTSTRAP = ("import sys  # orchestrator-board-runner\n"
             "i = sys.stdin.buffer\n"
             "s = i.read(int(i.readline())).decode()\n"
             "exec(compile(s, 'orchestrator-board-runner', 'exec'), "
             "{'BOARD_ROLE': 'runner', 'BOARD_SOURCE': s, '__name__': 'board_runner'})\n")
START_TIMEOUT_S = 120  # an emulated board's Python imports slowly


def runner_source() -> bytes:
    return Path(board_runner.__file__).read_bytes()


class BoardSession:
    def __init__(self, transport: Transport, where: str) -> None:
        self.transport = transport
        self.where = where  # how messages name the board: the target and its URL
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr = tempfile.TemporaryFile()
        self.ready: dict[str, Any] = {}
        # a request (or the start) is under way: the board works and reads nothing more
        # until it replies, so a close now kills it rather than waiting for it
        self.busy = False

    def __enter__(self) -> BoardSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> dict[str, Any]:
        self.transport.open()
        self.process = subprocess.Popen(
            self.transport.python_command("-u", "-c", BOOTSTRAP), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.stderr, start_new_session=True)
        source = runner_source()
        with self._in_flight():
            self._write(str(len(source)).encode() + b"\n" + source, START_TIMEOUT_S,
                        "starting")
            try:
                self.ready = self._read_message(time.monotonic() + START_TIMEOUT_S,
                                                "starting")
            except DeviceLost as exc:
                raise DeviceUnreachable(f"{self.where}: the board's Python did not start the "
                                        f"measuring program: {exc.message}") from None
        return self.ready

    def request(self, message: dict[str, Any], blobs: list[bytes] = (), *,
                timeout: float = 600, doing: str = "measuring"
                ) -> tuple[dict[str, Any], list[bytes]]:
        """One request and its reply (JSON, then binary blobs) within `timeout` seconds."""
        data = json.dumps({**message, "blobs": len(blobs), "timeout_s": timeout}).encode()
        frames = [FRAME.pack(len(data)), data]
        for blob in blobs:
            frames += [FRAME.pack(len(blob)), blob]
        deadline = time.monotonic() + timeout
        with self._in_flight():
            self._write(b"".join(frames), timeout, doing)
            reply = self._read_message(deadline, doing)
            out = [self._read_frame(deadline, doing) for _ in range(reply.get("blobs", 0))]
        return reply, out

    @contextmanager
    def _in_flight(self) -> Iterator[None]:
        """A request under way; cut short (Ctrl-C, an error), the board's process is killed
        now: it would read nothing until its measurement ends, and the frames are out of
        step. Either way the request is over: `busy` is False after it."""
        self.busy = True
        try:
            yield
        except BaseException:
            process = self.process
            if process is not None and process.returncode is None:  # not killed yet
                _kill(process)
            raise
        finally:
            self.busy = False

    def describe(self) -> dict[str, Any]:
        reply, _ = self.request({"op": "describe"}, timeout=START_TIMEOUT_S,
                                doing="describing the board")
        return reply

    def close(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None and self.busy:
            _kill(process)  # mid-request (another thread's): it would not read a goodbye
        elif process is not None and process.poll() is None:
            try:
                self._write_to(process, FRAME.pack(13) + b'{"op": "bye"}', 5)
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, DeviceLost):
                _kill(process)
        self.stderr.close()
        self.transport.close()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- the frames, each within a deadline

    def _lost(self, doing: str, why: str) -> DeviceLost:
        process = self.process
        if process is not None:
            _kill(process)
        self.stderr.seek(0)
        said = [line for line in self.stderr.read().decode(errors="replace").splitlines()
                if line.strip() and "XNNPACK delegate" not in line]
        tail = f" (the board said: {said[-1].strip()})" if said else ""
        return DeviceLost(f"{self.where}: {why} while {doing}{tail}")

    def _write(self, data: bytes, timeout: float, doing: str) -> None:
        assert self.process is not None
        try:
            self._write_to(self.process, data, timeout)
        except DeviceLost as exc:
            raise self._lost(doing, exc.message) from None

    @staticmethod
    def _write_to(process: subprocess.Popen[bytes], data: bytes, timeout: float) -> None:
        failed: list[BaseException] = []

        def write() -> None:
            try:
                assert process.stdin is not None
                process.stdin.write(data)
                process.stdin.flush()
            except OSError as exc:
                failed.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(timeout)
        if writer.is_alive():
            raise DeviceLost(f"the board took nothing in {timeout:.0f} s")
        if failed:
            raise DeviceLost("the connection was lost")

    def _read_exact(self, count: int, deadline: float, doing: str) -> bytes:
        process = self.process
        assert process is not None and process.stdout is not None
        fd = process.stdout.fileno()
        chunks: list[bytes] = []
        while count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._lost(doing, "no answer in time (the measurement's timeout_s)")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, min(count, 1 << 20))
            if not chunk:
                code = process.poll()
                why = "the connection was lost" if code in (None, 255) else (
                    f"the board's Python ended (exit {code})")
                raise self._lost(doing, why)
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

    def _read_frame(self, deadline: float, doing: str) -> bytes:
        (size,) = FRAME.unpack(self._read_exact(FRAME.size, deadline, doing))
        return self._read_exact(size, deadline, doing)

    def _read_message(self, deadline: float, doing: str) -> dict[str, Any]:
        return json.loads(self._read_frame(deadline, doing))


def _kill(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


# this process's sessions, by URL: one connection and one runner per board, reused by every
# measurement of the run (and of later runs in a long-lived worker)
_shared: dict[str, BoardSession] = {}


def shared_session(url: DeviceURL, where: str) -> BoardSession:
    """This process's open session to the board at `url`, started on first use (again
    after one was lost)."""
    session = _shared.get(url.text)
    if session is None or not session.alive:
        if session is not None:
            session.close()
        session = BoardSession(transport_for(url), where)
        _shared[url.text] = session
        try:
            session.start()
        except BaseException:
            _shared.pop(url.text, None)
            session.close()
            raise
    return session


def drop_session(url: DeviceURL) -> None:
    session = _shared.pop(url.text, None)
    if session is not None:
        session.close()


@atexit.register
def close_sessions() -> None:
    for text in list(_shared):
        _shared.pop(text).close()
