"""Helper processes forked from one warm process, for a host that runs many recipes.

A run starts two helper processes of its own: the tracking worker (`python -m
orchestrator.tracking.worker`, about 3 s of CPU to import MLflow before it logs anything)
and the process that draws half of its pictures (`python -m orchestrator.results.plots`,
about 1 s to import matplotlib). One run pays that once, beside its own work on the other
core; a host that runs recipe after recipe (a CI runner looping over recipes, the test
suite) pays it every run. The zygote imports what those helpers import, once, then forks a
helper per request, as the load probe's zygote (measure/load_probe.py) forks its
measurements:

    python -m orchestrator.zygote /run/user/1000/orchestrator.sock &
    export ORCHESTRATOR_ZYGOTE=/run/user/1000/orchestrator.sock

A run whose environment names a socket where a zygote answers gets its helpers from there
(tracking/client.py, results/plots.py); anywhere else, or when none answers, it starts them
as always. A forked helper runs the same module as `python -m` would, with the run's
environment, working directory and pipes, in a process group of its own; the zygote reports
its exit status over the request's connection, which is what `ForkedProcess.wait` reads.
"""

from __future__ import annotations

import contextlib
import importlib
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
from typing import IO, Any

from orchestrator import helper_process

SOCKET_ENV = "ORCHESTRATOR_ZYGOTE"
# How long a request may wait for the zygote's answer (it forks at once when idle; a
# busy machine's scheduler is the only delay)
ANSWER_TIMEOUT_S = 30.0
_MAX_REQUEST = 1 << 20  # the run's environment, as JSON
# The helpers a zygote may fork (a request names the module), as `module: function`: what
# the module's `python -m` runs, returning the exit code; and what the zygote calls first,
# once, for them all (each helper's imports).
HELPERS = {"orchestrator.tracking.worker": "main", "orchestrator.results.plots": "drawing_process"}
PRELOAD = ("orchestrator.tracking.worker:preload", "orchestrator.results.plots:pyplot")


class ForkedProcess:
    """A helper the zygote forked: what its run uses of a subprocess.Popen (its pipes, pid,
    poll, wait, kill). Its exit status comes from the zygote, its parent."""

    def __init__(self, connection: socket.socket, pid: int, stdin: IO[Any],
                 stdout: IO[Any], module: str) -> None:
        self.pid = pid
        self.stdin: IO[Any] | None = stdin
        self.stdout: IO[Any] | None = stdout
        self.returncode: int | None = None
        self.args = [f"{module} (pid {pid}, forked by {SOCKET_ENV})"]  # TimeoutExpired's
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
        zygote that ended first sends none: the helper, orphaned, is waited for through its
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

    def __del__(self) -> None:
        # A helper left to exit on its own (as a Popen may be): the zygote reaps it, and
        # its connection and pidfd go with this object, without a ResourceWarning.
        if self.returncode is None:
            self._connection.close()
            if self._pidfd is not None:
                os.close(self._pidfd)

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._connection.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def fork_module(module: str, env: Mapping[str, str], stderr: int = 2) -> ForkedProcess | None:
    """`python -m MODULE` (one of HELPERS) forked by the zygote this process's environment
    names (SOCKET_ENV), with `env`, this process's working directory, pipes (bytes) to its
    stdin and stdout and `stderr` (a file descriptor); None when no zygote is named or none
    answers there (the caller starts the helper itself)."""
    address = os.environ.get(SOCKET_ENV)
    if not address:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(ANSWER_TIMEOUT_S)
    to_helper, from_helper = os.pipe(), os.pipe()  # (read, write) each
    try:
        connection.connect(address)
        request = json.dumps({"module": module, "env": dict(env),
                              "cwd": os.getcwd()}).encode() + b"\n"
        socket.send_fds(connection, [request], [to_helper[0], from_helper[1], stderr])
        answer = helper_process.Channel(connection).read_line(
            helper_process.deadline_in(ANSWER_TIMEOUT_S))
        pid = int(json.loads(answer)["pid"])
    except (OSError, ValueError, KeyError, helper_process.HelperError):
        connection.close()
        os.close(to_helper[1])  # ours; the helper's ends are closed just below, once
        os.close(from_helper[0])
        return None
    finally:
        with contextlib.suppress(OSError):  # the helper's ends are its own now
            os.close(to_helper[0])
            os.close(from_helper[1])
    connection.settimeout(None)
    stdin, stdout = os.fdopen(to_helper[1], "wb"), os.fdopen(from_helper[0], "rb")
    return ForkedProcess(connection, pid, stdin, stdout, module)


def start_module(module: str, env: Mapping[str, str], stderr: int = 2
                 ) -> ForkedProcess | subprocess.Popen[bytes]:
    """`python -m MODULE` (one of HELPERS) as a run's helper, with pipes (bytes) to its
    stdin and stdout: forked by the zygote where one answers (fork_module), else started
    in a process group of its own (helper_process.start), `stderr` a file descriptor."""
    forked = fork_module(module, env, stderr=stderr)
    if forked is not None:
        return forked
    return helper_process.start([sys.executable, "-m", module], env=env, stderr=stderr)


# --------------------------------------------------------------------------- the zygote


def _read_request(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, _MAX_REQUEST, 3)
    try:
        while not data.endswith(b"\n"):
            chunk = connection.recv(_MAX_REQUEST)
            if not chunk or len(data) > _MAX_REQUEST:
                raise ValueError("an incomplete request")
            data += chunk
        request = json.loads(data)
        if len(fds) != 3 or not isinstance(request, dict) \
                or not isinstance(request.get("env"), dict):
            raise ValueError("a request without its environment and three pipes")
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    return request, fds


def _become_helper(request: Mapping[str, Any], fds: list[int]) -> int:
    """In the forked child: take the run's pipes, environment and folder, then run what the
    helper's `python -m` runs; its exit code."""
    os.setpgid(0, 0)  # the run's Ctrl-C is the run's to handle (see tracking/client.py)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    os.chdir(str(request["cwd"]))
    module = str(request["module"])
    sys.argv = [module]
    return int(getattr(importlib.import_module(module), HELPERS[module])())


def serve(address: str) -> int:
    """Listen at `address`, import what the helpers need (PRELOAD), fork a helper per
    connection. Ends on SIGTERM or SIGINT, or at the end of its standard input when that is
    a pipe (the process that started it is gone). Returns the exit code: in a forked child,
    the helper's."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)
    old_umask = os.umask(0o177)  # the run's environment, and so its key, crosses it
    try:
        listener.bind(address)
    finally:
        os.umask(old_umask)
    listener.listen(16)  # bound first: a run that comes early waits in line
    for name in PRELOAD:
        module, _, function = name.partition(":")
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()
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
    children: dict[int, socket.socket] = {}  # helper pid -> its request's connection
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
                        if request.get("module") not in HELPERS:
                            for fd in fds:
                                os.close(fd)
                            raise ValueError(f"not a helper: {request.get('module')!r}")
                    except (OSError, ValueError):
                        connection.close()
                        continue
                    pid = os.fork()
                    if pid == 0:  # the helper: nothing of the zygote's loop stays open
                        in_child = True
                        signal.set_wakeup_fd(-1)
                        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                            signal.signal(signum, signal.SIG_DFL)
                        selector.close()
                        for open_socket in (listener, connection, *children.values()):
                            open_socket.close()
                        os.close(wake_read)
                        os.close(wake_write)
                        return _become_helper(request, fds)
                    for fd in fds:
                        os.close(fd)
                    children[pid] = connection
                    with contextlib.suppress(OSError):
                        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            _reap(children)
    finally:
        if not in_child:  # a helper leaves the zygote's socket alone
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
    return 0


def _reap(children: dict[int, socket.socket]) -> None:
    """Each helper that ended: its status to its run, over its connection."""
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


if __name__ == "__main__":  # python -m orchestrator.zygote SOCKET
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m orchestrator.zygote SOCKET")
    exit_code = serve(sys.argv[1])
    import gc

    gc.freeze()  # no collector passes over MLflow's heap at exit (as the worker does)
    raise SystemExit(exit_code)
