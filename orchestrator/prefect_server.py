"""The local Prefect API server `orchestrator run` uses when PREFECT_API_URL is not set.

Prefect would start a temporary server inside every run: about 2.5 s of CPU, and on a
cached re-run the longest thing left. We start that same server (uvicorn serving
`prefect.server.api.server:create_app`, with no background services) in a session of its
own, record it in the store folder, and let the runs that follow attach to it. Like a
compiler-cache server it then exits by itself, once no run has used it for
ORCHESTRATOR_PREFECT_IDLE_S seconds (default 600). With 0 each run gets its own server,
stopped when the run ends; with PREFECT_API_URL set, that server is used and none started.

Files in the store folder: prefect-server.json (pid, port, versions), prefect-server.lock
(held while a run looks for or starts a server), prefect-server.lease (a shared lock per
attached run; the server exits only when it can lock it exclusively, see prefect_daemon).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now holds that pid
        return False
    return True


def _server_version(api_url: str, timeout: float) -> str | None:
    """The version a Prefect server at api_url reports, None when none answers."""
    try:
        with urllib.request.urlopen(f"{api_url}/admin/version", timeout=timeout) as response:
            return str(json.loads(response.read()))
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, OSError):
        return None


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


def _identity() -> dict[str, str]:
    """What a server must share with this run to be reused: the same installation, and
    the same Prefect database."""
    return {"prefect": version("prefect"), "python": sys.executable,
            "prefect_home": os.environ.get("PREFECT_HOME", ""),
            # hashed: the URL may hold a password, and this goes to a file
            "database": hashlib.sha256(os.environ.get(
                "PREFECT_API_DATABASE_CONNECTION_URL", "").encode()).hexdigest()[:16]}


@dataclass
class LocalServer:
    """A Prefect server on this machine that this run is attached to."""

    api_url: str
    pid: int
    lingers: bool  # outlives this run (idle timeout); else stopped by release()
    started_here: bool
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    lease: IO[str] | None = field(default=None, repr=False)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until the server answers; RuntimeError if it died or timed out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"Prefect's local server exited: {self._log_tail()}")
            if _answers(f"{self.api_url}/health"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"Prefect's local server did not start in {timeout:.0f} s: "
                           f"{self._log_tail()}")

    def _log_tail(self) -> str:
        if self.log is None:
            return "(no log)"
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:] or "(empty log)"

    def release(self) -> None:
        """Detach this run. A server of this run alone is asked to stop; its graceful
        shutdown (~0.2 s) finishes on its own, as nothing of the run depends on it."""
        if self.lease is not None:
            self.lease.close()  # drops the shared lock
            self.lease = None
        if not self.lingers and self.process is not None:
            self.process.terminate()
            self.process = None
        if self.log is not None:
            self.log.close()
            self.log = None


def _spawn(home: Path, idle_s: float, log: IO[bytes]) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    env = {**os.environ, "PREFECT_UI_ENABLED": "0",
           # what Prefect's own temporary server sets: no background services
           "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    env.pop("PREFECT_API_URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.prefect_daemon", "--port", str(port),
         "--idle", str(idle_s), "--home", str(home)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
        # a lingering server must not get the terminal's Ctrl-C meant for this run
        start_new_session=idle_s > 0)
    return process, port


def _attach_or_start(home: Path, idle_s: float) -> LocalServer:
    home.mkdir(parents=True, exist_ok=True)
    # the lease first: once it is held, an idle server can no longer decide to exit
    lease = open(home / LEASE_FILE, "a+")  # noqa: SIM115  (held for the whole run)
    try:
        fcntl.flock(lease, fcntl.LOCK_SH)
        with _locked(home / LOCK_FILE):
            state = _read_state(home)
            identity = _identity()
            if (state is not None and all(state.get(k) == v for k, v in identity.items())
                    and _pid_alive(int(state.get("pid", 0)))
                    and _server_version(state["api_url"], timeout=2) == identity["prefect"]):
                return LocalServer(api_url=state["api_url"], pid=int(state["pid"]),
                                   lingers=True, started_here=False, lease=lease)
            log = open(home / LOG_FILE, "w+b")  # noqa: SIM115  (the server's stderr)
            process, port = _spawn(home, idle_s, log)
            server = LocalServer(api_url=f"http://127.0.0.1:{port}/api", pid=process.pid,
                                 lingers=True, started_here=True, process=process, log=log,
                                 lease=lease)
            _write_state(home, {"pid": process.pid, "port": port,
                                "api_url": server.api_url, "started": time.time(),
                                "idle_s": idle_s, **identity})
            return server
    except BaseException:
        lease.close()
        raise


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
    if idle_s > 0:
        server = _attach_or_start(home, idle_s)
    else:
        # a file, not a pipe: a chatty server must never block on a full pipe
        log = tempfile.TemporaryFile()  # noqa: SIM115
        process, port = _spawn(home, 0, log)
        server = LocalServer(api_url=f"http://127.0.0.1:{port}/api", pid=process.pid,
                             lingers=False, started_here=True, process=process, log=log)
    os.environ["PREFECT_API_URL"] = server.api_url
    return server
