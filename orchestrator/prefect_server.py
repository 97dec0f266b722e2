"""Prefect's temporary local server, started early.

With no PREFECT_API_URL, Prefect starts this same server (uvicorn serving
`prefect.server.api.server:create_app`) at the first flow call, after importing its whole
server package in-process. Starting it ourselves, first thing, lets its ~4 s boot run in
its own process while we import TensorFlow and MLflow and load the model; the flow then
talks to it through PREFECT_API_URL like any other server. It stops when the run ends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TemporaryServer:
    """A Prefect API server for the life of one `orchestrator run`."""

    def __init__(self) -> None:
        import importlib.util

        spec = importlib.util.find_spec("prefect")
        assert spec is not None and spec.origin is not None, "prefect is not installed"
        self.port = _free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        env = {**os.environ, "PREFECT_UI_ENABLED": "0",
               # what Prefect's own temporary server sets: no background services
               "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        # a file, not a pipe: a chatty server must never block on a full pipe
        self.log = tempfile.TemporaryFile()
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(spec.origin).parent.parent),
             "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "error", "--lifespan", "on"],
            env=env, stdout=subprocess.DEVNULL, stderr=self.log)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until the server answers /health; RuntimeError if it died or timed out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                self.log.seek(0)
                stderr = self.log.read().decode(errors="replace")
                raise RuntimeError(f"Prefect's temporary server exited: {stderr[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"Prefect's temporary server did not start in {timeout:.0f} s")

    def stop(self, wait: bool = False) -> None:
        """Ask the server to shut down. Its graceful shutdown (~0.2 s) finishes on its own
        unless `wait`: nothing of the run depends on it any more."""
        if self.process is None:
            return
        self.process.terminate()
        if wait:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self.log.close()


def start_if_needed() -> TemporaryServer | None:
    """Start a temporary server unless PREFECT_API_URL points at one (or a test harness
    set one up); point this process's Prefect client at it."""
    if os.environ.get("PREFECT_API_URL") or "prefect" in sys.modules:
        return None  # configured, or Prefect already decided (tests, embedding)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the server is this very installation: checking its API version costs a round trip
    os.environ.setdefault("PREFECT_CLIENT_SERVER_VERSION_CHECK_ENABLED", "false")
    server = TemporaryServer()
    os.environ["PREFECT_API_URL"] = server.api_url
    return server
