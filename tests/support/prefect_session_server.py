"""The one temporary Prefect server of a test session run on several xdist workers.

prefect_test_harness starts a server per process that enters it: one per worker, each
taking ~20 s of CPU to start and ~1.7 s a minute to idle, for the whole session. The
controlling pytest process starts this one instead (tests/conftest.py: pytest_configure),
before its workers, and names it to them in SHARED_URL_ENV; the `prefect_server` fixture
of each worker points its Prefect client at it. It is the harness's server: Prefect's app
in ephemeral mode (the services an ephemeral server runs), on a SQLite database of its own
in a temporary folder, with no UI.

    python tests/support/prefect_session_server.py PORT

serves until its standard input ends: the pytest process that started it closes it, or
is gone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

SHARED_URL_ENV = "ORCHESTRATOR_TEST_PREFECT_API_URL"
SHARED_LOG_ENV = "ORCHESTRATOR_TEST_PREFECT_LOG"
# a copy of the server's database as its migrations left it, before any test wrote to it
TEMPLATE_ENV = "ORCHESTRATOR_TEST_PREFECT_TEMPLATE"
START_TIMEOUT_S = 180


def start(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """This script in a process of its own, serving from `folder`; its API URL. Returns at
    once: the server boots while the workers start (wait_until_ready)."""
    with socket.socket() as probe:  # a free port (the server binds it a moment later)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PREFECT_HOME": str(folder),
           "PREFECT_SERVER_DATABASE_CONNECTION_URL":
               f"sqlite+aiosqlite:///{folder / 'prefect.db'}",
           # what prefect_test_harness's server runs with
           "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           # no test sets an automation: their triggers' periodic evaluation is a third of
           # an idle server's CPU (1.7 -> 1.1 s a minute)
           "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
           TEMPLATE_ENV: str(folder / "template.db")}
    env.pop("PREFECT_API_URL", None)
    with open(folder / "server.log", "wb") as log:
        process = subprocess.Popen([sys.executable, __file__, str(port)], env=env,
                                   stdin=subprocess.PIPE, stdout=log, stderr=log,
                                   start_new_session=True)
    return process, f"http://127.0.0.1:{port}/api"


def stop(process: subprocess.Popen[bytes]) -> None:
    assert process.stdin is not None
    process.stdin.close()  # it serves until the end of its input
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_until_ready(url: str, log: str) -> None:
    """Returns once the server answers its health check; fails the test with its log when it
    does not within START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    text = Path(log).read_text(errors="replace")[-3000:] if Path(log).is_file() else ""
    raise AssertionError(f"the session's Prefect server at {url} did not answer in "
                         f"{START_TIMEOUT_S} s; its log ({log}):\n{text}")


def new_prefect_home(folder: Path) -> Path:
    """`folder` as a new PREFECT_HOME whose database has Prefect's tables made: a copy of the
    session server's fresh one, where a local server started on it would otherwise run
    Prefect's migrations first (about 14 s of CPU). Without the session's server, an empty
    folder: the server makes them."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    url, template = os.environ.get(SHARED_URL_ENV), os.environ.get(TEMPLATE_ENV)
    if url and template:
        wait_until_ready(url, os.environ.get(SHARED_LOG_ENV, ""))  # it is made by then
        shutil.copyfile(template, folder / "prefect.db")
    return folder


def _make_template(database: Path, template: Path) -> None:
    """Prefect's tables made in `database` (what the server would do as it starts), then
    a copy of it at `template`, written whole before the server answers."""
    import asyncio
    import sqlite3

    from prefect.server.database import provide_database_interface

    asyncio.run(provide_database_interface().create_db())
    partial = template.with_name(template.name + ".partial")
    with sqlite3.connect(database) as source, sqlite3.connect(partial) as copy:
        source.backup(copy)
    os.replace(partial, template)


def main() -> None:
    import uvicorn

    _make_template(Path(os.environ["PREFECT_HOME"]) / "prefect.db",
                   Path(os.environ[TEMPLATE_ENV]))

    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True,
                            host="127.0.0.1", port=int(sys.argv[1]), log_level="error",
                            lifespan="on")
    server = uvicorn.Server(config)

    def until_stdin_ends() -> None:
        sys.stdin.buffer.read()
        server.should_exit = True

    threading.Thread(target=until_stdin_ends, daemon=True).start()
    server.run()


if __name__ == "__main__":
    main()
