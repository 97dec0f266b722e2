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
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator import helper_process
from orchestrator.boards import board_runner
from orchestrator.boards.errors import DeviceLost, DeviceUnreachable
from orchestrator.boards.transports import Transport, transport_for
from orchestrator.boards.urls import DeviceURL

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
        self._channel: helper_process.Helper | None = None
        self.stderr = tempfile.TemporaryFile()
        self.ready: dict[str, Any] = {}

    @property
    def busy(self) -> bool:
        """A request (or the start) is under way: the board works and reads nothing more
        until it replies, so a close now kills it rather than waiting for it."""
        return self._channel is not None and self._channel.busy

    def __enter__(self) -> BoardSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> dict[str, Any]:
        self.transport.open()
        self.process = helper_process.start(
            self.transport.python_command("-u", "-c", BOOTSTRAP), stderr=self.stderr,
            new_session=True)
        self._channel = helper_process.Helper(self.process)
        source = runner_source()
        with self._channel.exchange():
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
        """One request and its reply (JSON, then binary blobs) within `timeout` seconds.
        Cut short (Ctrl-C, an error), the board's process is killed now (exchange): it
        would read nothing until its measurement ends, and the frames are out of step."""
        assert self._channel is not None
        data = json.dumps({**message, "blobs": len(blobs), "timeout_s": timeout}).encode()
        frames = [FRAME.pack(len(data)), data]
        for blob in blobs:
            frames += [FRAME.pack(len(blob)), blob]
        with self._channel.exchange(timeout) as deadline:
            self._write(b"".join(frames), timeout, doing)
            reply = self._read_message(deadline, doing)
            out = [self._read_frame(deadline, doing) for _ in range(reply.get("blobs", 0))]
        return reply, out

    def describe(self) -> dict[str, Any]:
        reply, _ = self.request({"op": "describe"}, timeout=START_TIMEOUT_S,
                                doing="describing the board")
        return reply

    def close(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None and self.busy:
            helper_process.kill(process)  # mid-request (another thread's): no goodbye
        elif process is not None and process.poll() is None:
            assert self._channel is not None
            try:
                self._channel.write_frame(b'{"op": "bye"}', helper_process.deadline_in(5))
            except helper_process.HelperError:
                helper_process.kill(process)
            helper_process.stop(process, 10)
        self.stderr.close()
        self.transport.close()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- the frames, each within a deadline

    def _lost(self, doing: str, why: str) -> DeviceLost:
        process = self.process
        if process is not None:
            helper_process.kill(process)
        self.stderr.seek(0)
        said = [line for line in self.stderr.read().decode(errors="replace").splitlines()
                if line.strip() and "XNNPACK delegate" not in line]
        tail = f" (the board said: {said[-1].strip()})" if said else ""
        return DeviceLost(f"{self.where}: {why} while {doing}{tail}")

    def _write(self, data: bytes, timeout: float, doing: str) -> None:
        assert self._channel is not None
        try:
            self._channel.write(data, helper_process.deadline_in(timeout))
        except helper_process.HelperTimeout:
            raise self._lost(doing, f"the board took nothing in {timeout:.0f} s") from None
        except helper_process.HelperEnded:
            raise self._lost(doing, "the connection was lost") from None

    def _read_frame(self, deadline: float | None, doing: str) -> bytes:
        assert self._channel is not None
        try:
            return self._channel.read_frame(deadline)
        except helper_process.HelperTimeout:
            raise self._lost(doing, "no answer in time (the measurement's timeout_s)"
                             ) from None
        except helper_process.HelperEnded:
            code = self._channel.process.poll()  # closed meanwhile: self.process is None
            why = "the connection was lost" if code in (None, 255) else (
                f"the board's Python ended (exit {code})")
            raise self._lost(doing, why) from None

    def _read_message(self, deadline: float | None, doing: str) -> dict[str, Any]:
        return json.loads(self._read_frame(deadline, doing))


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
