"""Tracking workers forked from one warm process, for a host that runs many recipes.

`python -m orchestrator.tracking.worker` spends about 3 s of CPU importing MLflow before it
logs anything. One run pays that once, beside its own work on the other core; a host that
runs recipe after recipe (a CI runner looping over recipes, the test suite) pays it every
run. The zygote imports MLflow and the worker once, then forks a worker per request, as the
load probe's zygote (measure/load_probe.py) forks its measurements:

    python -m orchestrator.tracking.zygote /run/user/1000/tracking.sock &
    export ORCHESTRATOR_TRACKING_ZYGOTE=/run/user/1000/tracking.sock

A run whose environment names a socket where a zygote answers gets its worker from there
(client.TrackingClient); anywhere else, or when none answers, it starts one as always. The
forked worker is the same code speaking the same protocol, with the run's environment,
working directory and pipes, in a process group of its own; the zygote reports its exit
status over the request's connection, which is what `ForkedWorker.wait` reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Mapping
from typing import IO

SOCKET_ENV = "ORCHESTRATOR_TRACKING_ZYGOTE"
# How long a request may wait for the zygote's answer (it forks at once when idle; a
# busy machine's scheduler is the only delay)
ANSWER_TIMEOUT_S = 30.0
_MAX_REQUEST = 1 << 20  # the run's environment, as JSON


class ForkedWorker:
    """A worker the zygote forked: what TrackingClient uses of a subprocess.Popen (its pipes,
    pid, poll, wait, kill). Its exit status comes from the zygote, its parent."""

    def __init__(self, connection: socket.socket, pid: int, stdin: IO[str],
                 stdout: IO[str]) -> None:
        self.pid = pid
        self.stdin: IO[str] | None = stdin
        self.stdout: IO[str] | None = stdout
        self.returncode: int | None = None
        self.args = [f"{SOCKET_ENV} worker {pid}"]  # for TimeoutExpired's message
        self._connection = connection
        self._pending = b""
        try:  # signals go to this process even after the zygote reaps it and the pid is reused
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # already gone: its status is on the connection
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._connection], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._connection], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read_status()
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def send_signal(self, signum: int) -> None:
        if self.returncode is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def _read_status(self) -> None:
        """The zygote's `{"exit": code}` line (Popen's convention: minus the signal). A
        zygote that ended first sends none: the worker, orphaned, is waited for through its
        pidfd, and its status is unknown (1)."""
        while b"\n" not in self._pending:
            chunk = self._connection.recv(4096)
            if not chunk:
                if self._pidfd is not None:
                    select.select([self._pidfd], [], [])
                self._finish(1)
                return
            self._pending += chunk
        self._finish(int(json.loads(self._pending.partition(b"\n")[0])["exit"]))

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._connection.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def fork_worker(address: str, env: Mapping[str, str]) -> ForkedWorker | None:
    """A tracking worker forked by the zygote at `address`, with `env` and this process's
    working directory and standard error; None when no zygote answers there (the caller
    starts one of its own)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(ANSWER_TIMEOUT_S)
    to_worker, from_worker = os.pipe(), os.pipe()  # (read, write) each
    try:
        connection.connect(address)
        request = json.dumps({"env": dict(env), "cwd": os.getcwd()}).encode() + b"\n"
        socket.send_fds(connection, [request], [to_worker[0], from_worker[1], 2])
        answer = connection.makefile("rb").readline()
        pid = int(json.loads(answer)["pid"])
    except (OSError, ValueError, KeyError):
        connection.close()
        for fd in (*to_worker, *from_worker):
            os.close(fd)
        return None
    finally:
        with contextlib.suppress(OSError):  # the worker's ends are its own now
            os.close(to_worker[0])
            os.close(from_worker[1])
    connection.settimeout(None)
    return ForkedWorker(connection, pid,
                        os.fdopen(to_worker[1], "w", encoding="utf-8"),
                        os.fdopen(from_worker[0], "r", encoding="utf-8"))


# --------------------------------------------------------------------------- the zygote


def _read_request(connection: socket.socket) -> tuple[dict[str, object], list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, _MAX_REQUEST, 3)
    try:
        while not data.endswith(b"\n"):
            chunk = connection.recv(_MAX_REQUEST)
            if not chunk or len(data) > _MAX_REQUEST:
                raise ValueError("an incomplete request")
            data += chunk
        request = json.loads(data)
        if len(fds) != 3:
            raise ValueError("a request without its three pipes")
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    return request, fds


def _become_worker(request: Mapping[str, object], fds: list[int]) -> int:
    """In the forked child: take the run's pipes, environment and folder, then run the
    worker's own main, as `python -m orchestrator.tracking.worker` would."""
    from orchestrator.tracking import worker

    os.setpgid(0, 0)  # the run's Ctrl-C must not reach it (see client._spawn)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})
    os.chdir(str(request["cwd"]))
    return worker.main()


def serve(address: str) -> int:
    """Import MLflow and the worker, listen at `address`, fork a worker per connection.
    Ends on SIGTERM or SIGINT, or at the end of its standard input when that is a pipe
    (the process that started it is gone). Returns the exit code: in a forked child, the
    worker's."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)
    old_umask = os.umask(0o177)  # the run's environment, and so its key, crosses it
    try:
        listener.bind(address)
    finally:
        os.umask(old_umask)
    listener.listen(16)  # bound first: a run that comes early waits in line
    # what worker.main sets before MLflow's import reads it (the run's environment wins)
    from orchestrator.tracking.common import HTTP_DEFAULTS

    for name, value in {"MLFLOW_LOGGING_LEVEL": "WARNING", **HTTP_DEFAULTS}.items():
        os.environ.setdefault(name, value)
    import mlflow.artifacts  # noqa: F401
    import mlflow.entities  # noqa: F401
    import mlflow.tracking  # noqa: F401
    from mlflow.store.tracking import sqlalchemy_store  # noqa: F401

    import orchestrator.tracking.registry  # noqa: F401
    import orchestrator.tracking.worker  # noqa: F401
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that it wakes us
    stopping = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.append(True))
    watch_stdin = stat.S_ISFIFO(os.fstat(0).st_mode)
    print(json.dumps({"ready": address}), flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    if watch_stdin:
        selector.register(0, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # worker pid -> its request's connection
    in_child = False
    try:
        while not stopping:
            for key, _ in selector.select():
                if key.fileobj == 0 and not os.read(0, 4096):
                    stopping.append(True)
                elif key.fileobj == wake_read:
                    os.read(wake_read, 4096)
                    _reap(children)
                elif key.fileobj is listener:
                    connection, _ = listener.accept()
                    try:
                        request, fds = _read_request(connection)
                    except (OSError, ValueError):
                        connection.close()
                        continue
                    pid = os.fork()
                    if pid == 0:  # the worker: nothing of the zygote's loop stays open
                        in_child = True
                        signal.set_wakeup_fd(-1)
                        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                            signal.signal(signum, signal.SIG_DFL)
                        selector.close()
                        for open_socket in (listener, connection, *children.values()):
                            open_socket.close()
                        os.close(wake_read)
                        os.close(wake_write)
                        return _become_worker(request, fds)
                    for fd in fds:
                        os.close(fd)
                    children[pid] = connection
                    with contextlib.suppress(OSError):
                        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            _reap(children)
    finally:
        if not in_child:  # a worker leaves the zygote's socket alone
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
    return 0


def _reap(children: dict[int, socket.socket]) -> None:
    """Each worker that ended: its status to its run, over its connection."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                code = os.waitstatus_to_exitcode(status)
                connection.sendall(json.dumps({"exit": code}).encode() + b"\n")
            connection.close()


if __name__ == "__main__":  # python -m orchestrator.tracking.zygote SOCKET
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m orchestrator.tracking.zygote SOCKET")
    exit_code = serve(sys.argv[1])
    import gc

    gc.freeze()  # no collector passes over MLflow's heap at exit (as the worker does)
    raise SystemExit(exit_code)
