"""A helper process and the byte stream to it: start, a request within a deadline, cancel,
reap, Ctrl-C. What the run's helpers share: the load probe's zygote (measure/load_probe.py),
the drawing process (results/plots.py), the tracking worker (tracking/client.py) and the
board's runner (boards/session.py, over its transport's ssh or qemu pipes).

- `start` runs a command with pipes to its stdin and stdout, in a process group of its own
  (or a session: no terminal either): a Ctrl-C at the terminal reaches the run only, and
  the run decides how its helper ends.
- `Channel` reads and writes a byte stream (a helper's pipes, or a socket), each read and
  write within a deadline: a line (JSON per line), a length-prefixed frame, or everything up
  to the end. No answer in time is a `HelperTimeout`; a stream that ends, a `HelperEnded`.
- `Helper.exchange` marks a request under way: whatever cuts it short (no answer in time,
  the helper's end, a Ctrl-C, the caller's own error) kills the helper and reaps it, as
  its replies would be out of step with its requests. A caller whose helper must outlive
  an interrupted request (the tracking worker records the interruption) reads without it.
- `kill` (SIGKILL to the helper's group, then reaped: no zombie) and `stop` (its input
  closed, a grace period, then killed; a Ctrl-C while waiting kills it at once).

The child may be a `subprocess.Popen` or anything that acts like one (zygote.ForkedProcess).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import struct
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Protocol

# a frame's header: its length, 8 bytes little-endian (the board runner's, which sends
# its own copy to the board)
FRAME = struct.Struct("<Q")
REAP_TIMEOUT_S = 10.0  # after a SIGKILL: only a process stuck in the kernel takes longer
_CHUNK = 1 << 20


class HelperError(Exception):
    """The helper gave no answer: `why` says what happened, for the caller's own message."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class HelperTimeout(HelperError):
    """No answer (or nothing taken) before the deadline."""


class HelperEnded(HelperError):
    """The stream ended: the helper exited, or the connection was lost."""


class Process(Protocol):
    """What a helper's process offers: subprocess.Popen's pipes, pid, poll, wait, kill."""

    pid: int
    returncode: int | None
    stdin: IO[Any] | None
    stdout: IO[Any] | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def deadline_in(timeout: float | None) -> float | None:
    """The monotonic time `timeout` seconds from now (None: no deadline)."""
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def module_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with this package's folder first on PYTHONPATH, so
    that `python -m orchestrator...` finds it from any working directory."""
    env = dict(os.environ if env is None else env)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def start(argv: list[str], *, env: Mapping[str, str] | None = None, stderr: Any = None,
          new_session: bool = False) -> subprocess.Popen[bytes]:
    """`argv` with pipes to its stdin and stdout (bytes), in a process group of its own
    (`new_session`: a session, without the terminal, as an ssh client must be)."""
    group: dict[str, Any] = {"start_new_session": True} if new_session else {
        "process_group": 0}
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr, env=None if env is None else dict(env), **group)


class Channel:
    """A byte stream read and written within deadlines: `reader` and `writer` are file
    objects, sockets or file descriptors (one socket may be both)."""

    def __init__(self, reader: Any, writer: Any = None) -> None:
        self._reader = reader
        self._writer = writer
        self._pending = b""

    @staticmethod
    def _fd(stream: Any) -> int:
        return stream if isinstance(stream, int) else stream.fileno()

    # -- writing

    def write(self, data: bytes, deadline: float | None = None) -> None:
        """All of `data`, before `deadline`; HelperTimeout when the other side takes too
        little in time, HelperEnded when it is gone."""
        fd = self._fd(self._writer)
        view = memoryview(data)
        blocking = os.get_blocking(fd)
        os.set_blocking(fd, False)
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(fd, selectors.EVENT_WRITE)
                while view:
                    left = _left(deadline)
                    if left == 0 or not selector.select(left):
                        raise HelperTimeout(f"it took nothing in {_since(deadline)}")
                    try:
                        view = view[os.write(fd, view[:_CHUNK]):]
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        raise HelperEnded(f"the connection was lost ({exc})") from exc
        finally:
            with contextlib.suppress(OSError):
                os.set_blocking(fd, blocking)

    def write_frame(self, data: bytes, deadline: float | None = None) -> None:
        self.write(FRAME.pack(len(data)) + data, deadline)

    # -- reading

    def ready(self) -> bool:
        """Whether a read would find something now (or the end)."""
        if self._pending:
            return True
        with selectors.DefaultSelector() as selector:
            selector.register(self._fd(self._reader), selectors.EVENT_READ)
            return bool(selector.select(0))

    def _fill(self, deadline: float | None) -> bool:
        """More bytes into the buffer before `deadline`; False at the end of the stream."""
        fd = self._fd(self._reader)
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            left = _left(deadline)
            if left == 0 or not selector.select(left):
                raise HelperTimeout(f"no answer in {_since(deadline)}")
        try:
            chunk = os.read(fd, _CHUNK)
        except ConnectionError:  # the other end went away: the stream ended
            chunk = b""
        except OSError as exc:
            raise HelperEnded(f"reading from it failed: {exc}") from exc
        self._pending += chunk
        return bool(chunk)

    def read_line(self, deadline: float | None = None) -> bytes:
        """The next line, without its newline; HelperEnded when the stream ends first."""
        while b"\n" not in self._pending:
            if not self._fill(deadline):
                raise HelperEnded("it ended")
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def read_exact(self, count: int, deadline: float | None = None) -> bytes:
        while len(self._pending) < count:
            if not self._fill(deadline):
                raise HelperEnded("it ended")
        data, self._pending = self._pending[:count], self._pending[count:]
        return data

    def read_frame(self, deadline: float | None = None) -> bytes:
        """One length-prefixed frame (FRAME, then the bytes)."""
        (size,) = FRAME.unpack(self.read_exact(FRAME.size, deadline))
        return self.read_exact(size, deadline)

    def read_to_end(self, deadline: float | None = None) -> bytes:
        """Everything until the stream ends."""
        while self._fill(deadline):
            pass
        data, self._pending = self._pending, b""
        return data


def _since(deadline: float | None) -> str:
    return "time" if deadline is None else "the time given"


class Helper(Channel):
    """A helper process and the channel over its stdin and stdout."""

    def __init__(self, process: Process) -> None:
        assert process.stdout is not None and process.stdin is not None
        super().__init__(process.stdout, process.stdin)
        self.process = process
        self.busy = False  # a request is under way (see exchange)

    @contextlib.contextmanager
    def exchange(self, timeout: float | None = None) -> Iterator[float | None]:
        """A request under way, yielding its deadline. Cut short by anything (a
        HelperError, a Ctrl-C, an error of the caller's), the helper is killed and
        reaped: it reads nothing more until it answers, and the answers would be out of
        step. `busy` is True meanwhile (a close from another thread then kills it)."""
        self.busy = True
        try:
            yield deadline_in(timeout)
        except BaseException:
            kill(self.process)
            raise
        finally:
            self.busy = False

    def close_input(self) -> None:
        close_streams(self.process, stdout=False)


def close_streams(process: Process, *, stdin: bool = True, stdout: bool = True) -> None:
    """The process's pipes closed (its input ends: a helper's loop ends there)."""
    for stream in ((process.stdin,) if stdin else ()) + ((process.stdout,) if stdout else ()):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def kill(process: Process, reap_timeout: float | None = REAP_TIMEOUT_S) -> None:
    """SIGKILL to the helper and what it started (its process group, where `start` gave it
    one), then reaped (waited for: no zombie)."""
    if isinstance(process, subprocess.Popen):
        if process.returncode is not None:  # reaped: its pid may be another's now
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # no group of its own: itself
            with contextlib.suppress(OSError):
                process.kill()
    elif process.poll() is None:
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=reap_timeout)


def stop(process: Process, grace_s: float | None, *, keep_on_interrupt: bool = False
         ) -> None:
    """The helper's input closed, then `grace_s` for it to end on its own (None: no
    grace), then killed; reaped either way. A Ctrl-C while waiting kills it too (it must
    not outlive the run) and goes on; with `keep_on_interrupt`, it is left to end on its
    own (the tracking worker, marking its runs interrupted)."""
    close_streams(process, stdout=False)
    try:
        if grace_s is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)
        if process.poll() is None:
            kill(process, None)
    except BaseException:
        if not keep_on_interrupt:
            kill(process, None)
        raise
    finally:
        close_streams(process, stdin=False)
