"""The local Prefect API server `orchestrator run` uses when PREFECT_API_URL is not set.

Prefect would start a temporary server inside every run: about 2.5 s of CPU, and on a
cached re-run the longest thing left. We start that same server (uvicorn serving
`prefect.server.api.server:create_app` with the services of an ephemeral server, plus
Prefect's UI: see server_process.create_app) in a session of its own, record it in the
store folder, and let the runs that follow attach to it. `orchestrator ui` attaches the
same way while it shows the UI. Like a
compiler-cache server it then exits by itself, once no run has used it for
ORCHESTRATOR_PREFECT_IDLE_S seconds (default 600). With 0 each run gets its own server,
stopped when the run ends; with PREFECT_API_URL set, that server is used and none started.

Files in the store folder: prefect-server.json (pid, port, versions), prefect-server.lock
(held while a run looks for or starts a server), prefect-server.lease (a shared lock per
attached run; the server exits only when it can lock it exclusively, see server_process),
and prefect.db, the server's database: the project's flow runs, as mlruns/ holds its MLflow
runs, so that its UI shows this project's runs only (unless PREFECT_HOME or
PREFECT_API_DATABASE_CONNECTION_URL is set: that database then, as Prefect would).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import IO, Any

from orchestrator.errors import OrchestratorError

log = logging.getLogger("orchestrator")

STATE_FILE = "prefect-server.json"
LOCK_FILE = "prefect-server.lock"
LEASE_FILE = "prefect-server.lease"
LOG_FILE = "prefect-server.log"
IDLE_ENV = "ORCHESTRATOR_PREFECT_IDLE_S"
DEFAULT_IDLE_S = 600.0


def idle_seconds() -> float:
    raw = os.environ.get(IDLE_ENV, "").strip()
    if not raw:
        return DEFAULT_IDLE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also catches nan
        raise OrchestratorError(f"environment variable {IDLE_ENV}={raw!r}: expected seconds "
                                ">= 0 (0 stops the Prefect server with each run)")
    return value


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on `port` now (as uvicorn binds: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortTaken(OrchestratorError):
    """A port the user asked for is in use (exit 2)."""

    def __init__(self, port: int, option: str) -> None:
        super().__init__(f"port {port} is taken ({option} {port}): stop what listens "
                         f"there, or choose another port")
        self.port = port


def ui_url(api_url: str) -> str:
    """The address of the UI of the Prefect server whose API is at `api_url`."""
    return api_url.rstrip("/").removesuffix("/api") + "/"


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (not a zombie, not someone else's process that reused it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now holds that pid
        return False
    try:  # exited but not yet reaped by its parent (a zombie) is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS)
        return True


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_state(home: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((home / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _write_state(home: Path, state: dict[str, Any]) -> None:
    temp = home / f".{STATE_FILE}.{os.getpid()}.tmp"
    temp.write_text(json.dumps(state, indent=2))
    temp.replace(home / STATE_FILE)


def forget_server(home: Path, pid: int) -> None:
    """Remove the record of the server `pid` (and only that one)."""
    with _locked(home / LOCK_FILE):
        state = _read_state(home)
        if state is not None and state.get("pid") == pid:
            (home / STATE_FILE).unlink(missing_ok=True)


# set per process, or by us: not what makes two servers different
_NOT_IDENTITY = ("PREFECT_API_URL", "PREFECT_CLIENT_", "PREFECT_LOGGING_")
# what server_process serves; bumped when that changes, so that a run never attaches to a
# server of an older orchestrator (one without the UI, before 2)
DAEMON_REVISION = "3"  # 3: its database in the project (DATABASE_FILE)
DATABASE_FILE = "prefect.db"
DATABASE_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"


def _identity() -> dict[str, str]:
    """What a server must share with this run to be reused: the same installation and the
    same Prefect settings (PREFECT_HOME, database URL...), hashed with any URL credentials
    redacted first, as this goes to a file."""
    from orchestrator.redaction import redact

    settings = sorted(f"{k}={redact(v)}" for k, v in os.environ.items()
                      if k.startswith("PREFECT_") and not k.startswith(_NOT_IDENTITY))
    # the installation is its prefix: bin/python and bin/python3 (a console script) are one
    return {"prefect": version("prefect"), "python": sys.prefix, "daemon": DAEMON_REVISION,
            "settings": hashlib.sha256("\n".join(settings).encode()).hexdigest()[:16]}


class PrefectServerError(OrchestratorError):
    """The local Prefect server could not start or stopped answering."""


def api_lost(exc: BaseException) -> PrefectServerError | None:
    """The error to report when `exc` (or what caused it) is the Prefect API not answering
    mid-run (the server stopped, the network went away), naming the API's URL; None for
    any other failure. Prefect's client has retried by then (PREFECT_CLIENT_MAX_RETRIES)."""
    import httpx

    from orchestrator.redaction import redact

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, httpx.TransportError):
            url = os.environ.get("PREFECT_API_URL") or _api_url_setting()
            return PrefectServerError(redact(
                f"the Prefect API at {url} stopped answering during the run "
                f"({type(cause).__name__}: {cause}). The run failed; the stages it "
                "completed are in the store, and a run after the server is back reuses "
                "them"), field="PREFECT_API_URL")
        cause = cause.__cause__ or cause.__context__
    return None


def _api_url_setting() -> str:
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value() or "(PREFECT_API_URL not set)")


class LocksUnavailable(OSError):
    """The store folder's file system has no flock: runs cannot share a server there."""


# how long a recorded server's command line may read empty: it is still inside execve
EXEC_WINDOW_S = 2.0


def _command_line(pid: int) -> bytes:
    """/proc/PID/cmdline, NUL-separated; OSError where there is no /proc."""
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _is_our_daemon(pid: int, port: int) -> bool:
    """pid is alive and is a server_process on `port` (not a process that reused the pid).
    A server spawned a moment ago may still be inside execve: Popen returns once its old
    image is gone, before the kernel has set up its arguments, and until then its command
    line reads empty (seen as a second server started beside a booting one, under load).
    An empty one is read again for up to EXEC_WINDOW_S."""
    if not pid_alive(pid):
        return False
    deadline = time.monotonic() + EXEC_WINDOW_S
    try:
        raw = _command_line(pid)
        while not raw and time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.01)
            raw = _command_line(pid)
        argv = raw.split(b"\0")
    except OSError:  # no /proc (macOS)
        command = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], check=False,
                                 capture_output=True, timeout=10).stdout
        argv = command.split()
    return b"orchestrator.flow.server_process" in argv and str(port).encode() in argv


def _touch(path: Path) -> None:
    """Runs mark the lease when they attach and leave: the server's idle time counts from
    the last mark, even for runs shorter than its polling interval."""
    try:
        os.utime(path)
    except OSError:
        pass


@dataclass
class LocalServer:
    """A Prefect server on this machine that this run is attached to."""

    api_url: str
    pid: int
    lingers: bool  # outlives this run (idle timeout); else stopped by release()
    started_here: bool
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    lease: IO[str] | None = field(default=None, repr=False)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until the server answers; PrefectServerError if it died or timed out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.process.poll() is not None if self.process is not None
                    else not pid_alive(self.pid)):
                raise self._error("exited")
            if _answers(f"{self.api_url}/health"):
                return
            time.sleep(0.05)
        raise self._error(f"did not answer in {timeout:.0f} s")

    def _error(self, what: str) -> PrefectServerError:
        tail = ""
        if self.log is not None:
            self.log.flush()
            self.log.seek(0)
            tail = self.log.read().decode(errors="replace").strip()[-1500:]
        where = f" (log: {self.log_path})" if self.log_path else ""
        return PrefectServerError(
            f"Prefect's local server at {self.api_url} {what}{where}"
            + (f":\n{tail}\n" if tail else ". ")
            + f"Run again to start a new one, set {IDLE_ENV}=0 for a server per run, or "
            "PREFECT_API_URL to use a server of your own.")

    def release(self) -> None:
        """Detach this run. A server of this run alone is asked to stop; its graceful
        shutdown (~0.2 s) finishes on its own, as nothing of the run depends on it."""
        if self.lease is not None:
            _touch(Path(self.lease.name))
            self.lease.close()  # drops the shared lock
            self.lease = None
        if not self.lingers and self.process is not None:
            self.process.terminate()
            self.process = None
        if self.log is not None:
            self.log.close()
            self.log = None
        # this process may run again (embedding, notebooks): not with a stale address
        os.environ.pop("PREFECT_API_URL", None)


def _spawn(home: Path, idle_s: float, log: IO[bytes],
           port: int | None = None) -> tuple[subprocess.Popen[bytes], int]:
    port = port or free_port()
    # Prefect's classic UI unless the user asks for the new one: the new one (v2) asks an
    # analytics host for its config at every page load, whatever
    # PREFECT_SERVER_ANALYTICS_ENABLED says, and these machines have no internet
    env = {"PREFECT_SERVER_UI_V2_ENABLED": "false", **os.environ,
           # the UI's pages call this server's API (Prefect would guess port 4200)
           "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    env.pop("PREFECT_API_URL", None)
    env.update(database_env(home))
    home.mkdir(parents=True, exist_ok=True)  # the database's folder, for a server per run too
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.flow.server_process", "--port", str(port),
         "--idle", str(idle_s), "--home", str(home), "--parent", str(os.getpid())],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
        # never the terminal's Ctrl-C meant for the run: a lingering server outlives it, and
        # a server for one run is stopped by the run (or notices it is gone, see --parent)
        start_new_session=True)
    return process, port


def database_env(home: Path) -> dict[str, str]:
    """The server's database in `home` (the project's), unless the environment names one
    (PREFECT_API_DATABASE_CONNECTION_URL) or a PREFECT_HOME that holds it."""
    if os.environ.get(DATABASE_ENV) or os.environ.get("PREFECT_HOME"):
        return {}
    return {DATABASE_ENV: f"sqlite+aiosqlite:///{Path(os.path.abspath(home)) / DATABASE_FILE}"}


def _attach_or_start(home: Path, idle_s: float, port: int | None = None) -> LocalServer:
    """Attach to the server recorded in `home`, or start one (on `port` when given)."""
    home.mkdir(parents=True, exist_ok=True)
    # the lease first: once it is held, an idle server can no longer decide to exit
    lease = open(home / LEASE_FILE, "a+")  # noqa: SIM115  (held for the whole run)
    try:
        try:
            fcntl.flock(lease, fcntl.LOCK_SH)
        except OSError as exc:
            raise LocksUnavailable(str(exc)) from exc
        _touch(home / LEASE_FILE)
        with _locked(home / LOCK_FILE):
            state = _read_state(home)
            identity = _identity()
            if (state is not None and all(state.get(k) == v for k, v in identity.items())
                    and _is_our_daemon(int(state.get("pid", 0)), int(state.get("port", 0)))):
                # up, or still booting for a run that started it a moment ago
                return LocalServer(api_url=state["api_url"], pid=int(state["pid"]),
                                   lingers=True, started_here=False,
                                   log_path=home / LOG_FILE, lease=lease)
            if port is not None and not port_is_free(port):
                raise PortTaken(port, "--prefect-port")
            log = open(home / LOG_FILE, "w+b")  # noqa: SIM115  (the server's stderr)
            process, port = _spawn(home, idle_s, log, port)
            server = LocalServer(api_url=f"http://127.0.0.1:{port}/api", pid=process.pid,
                                 lingers=True, started_here=True, log_path=home / LOG_FILE,
                                 process=process, log=log, lease=lease)
            try:
                _write_state(home, {"pid": process.pid, "port": port,
                                    "api_url": server.api_url, "started": time.time(),
                                    "idle_s": idle_s, **identity})
            except BaseException:
                process.terminate()  # a server no run could find must not linger
                raise
            return server
    except BaseException:
        lease.close()
        raise


def _start_for_this_run(home: Path, port: int | None = None) -> LocalServer:
    if port is not None and not port_is_free(port):
        raise PortTaken(port, "--prefect-port")
    # a file, not a pipe: a chatty server must never block on a full pipe
    log = tempfile.TemporaryFile()  # noqa: SIM115
    process, port = _spawn(home, 0, log, port)
    return LocalServer(api_url=f"http://127.0.0.1:{port}/api", pid=process.pid,
                       lingers=False, started_here=True, process=process, log=log)


def start_if_needed(home: Path) -> LocalServer | None:
    """Attach this run to a local Prefect server, starting one when none is up, unless
    PREFECT_API_URL points at a server (or Prefect was imported already: tests, embedding).
    Points this process's Prefect client at it; call before Prefect is imported."""
    if os.environ.get("PREFECT_API_URL") or "prefect" in sys.modules:
        return None
    idle_s = idle_seconds()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the server is this very installation: checking its API version costs a round trip
    os.environ.setdefault("PREFECT_CLIENT_SERVER_VERSION_CHECK_ENABLED", "false")
    server = None
    if idle_s > 0:
        try:
            server = _attach_or_start(home, idle_s)
        except LocksUnavailable as exc:  # some network file systems
            log.warning("cannot share a Prefect server through %s (%s): starting one for "
                        "this run only", home, exc)
    if server is None:
        server = _start_for_this_run(home)
    os.environ["PREFECT_API_URL"] = server.api_url
    return server


def attach_for_ui(home: Path, port: int | None = None) -> LocalServer:
    """The server whose UI `orchestrator ui` shows: the one runs share, attached with a
    lease so that it stays up while the UI is open, and started (on `port` when given, else
    a free one) when none runs. PortTaken when that port is in use. With
    ORCHESTRATOR_PREFECT_IDLE_S=0, or no file locks in `home`, a server of its own that
    release() stops. Leaves PREFECT_API_URL alone: with it set, show that server instead."""
    idle_s = idle_seconds()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if idle_s > 0:
        try:
            return _attach_or_start(home, idle_s, port)
        except LocksUnavailable as exc:
            log.warning("cannot share a Prefect server through %s (%s): starting one for "
                        "the UI only", home, exc)
    return _start_for_this_run(home, port)


def describe(home: Path) -> dict[str, Any] | None:
    """The local server recorded in `home` (None when there is none that runs), with
    whether a run is attached to it now."""
    state = _read_state(home)
    if state is None or not _is_our_daemon(int(state.get("pid", 0)),
                                           int(state.get("port", 0))):
        return None
    with open(home / LEASE_FILE, "a+") as lease:
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
            in_use = False
            fcntl.flock(lease, fcntl.LOCK_UN)
        except BlockingIOError:
            in_use = True
    return {**state, "in_use": in_use}


def stop_server(home: Path, force: bool = False, timeout: float = 30.0) -> dict[str, Any] | None:
    """Stop the local server recorded in `home` now; None when there was none. Refuses
    (PrefectServerError) while a run uses it, unless `force`."""
    found = describe(home)
    if found is None:
        return None
    pid = int(found["pid"])
    with open(home / LEASE_FILE, "a+") as lease:
        # as the server's own idle exit: forget it while no run can attach
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not force:
                raise PrefectServerError(
                    f"the Prefect server at {found['api_url']} is in use by a run; stop it "
                    "anyway with --force (that run then fails)") from None
        forget_server(home, pid)
    try:
        os.kill(pid, signal.SIGTERM)  # graceful
    except ProcessLookupError:
        return found  # it had just stopped by itself
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    return found
