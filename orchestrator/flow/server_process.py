"""The process behind `local_server.LocalServer`: Prefect's API server and its UI, plus a
watch that ends it once it is no longer needed.

    python -m orchestrator.flow.server_process --port P --idle S --home DIR --parent PID

Lingering (`--idle` > 0): runs hold a shared flock on DIR/prefect-server.lease while they
use the server, and touch it when they attach and leave. The watch polls for an exclusive
lock: when it gets it, no run is attached. Once the last touch is `--idle` seconds old it
forgets the server (removes DIR/prefect-server.json) while it still holds the lock, so a
run arriving at that moment starts a new server instead of attaching to this one.
Per run (`--idle 0`): the run stops the server; the watch ends it if the run died first.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.flow.local_server import LEASE_FILE, forget_server

log = logging.getLogger("orchestrator.flow.server_process")

# how often the watch looks, at most
_POLL_S = 5.0


def _last_touch(path: Path) -> float:
    """The lease's last touch on the monotonic clock (0 when it cannot be read)."""
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return 0.0
    return time.monotonic() - max(age, 0.0)


async def _watch_idle(home: Path, idle_s: float) -> None:
    """Returns once no run has been attached for idle_s seconds."""
    poll = min(_POLL_S, max(idle_s / 4, 0.2))
    with open(home / LEASE_FILE, "a+") as lease:
        idle_since = time.monotonic()
        while True:
            await asyncio.sleep(poll)
            try:
                fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a run is attached
                idle_since = time.monotonic()
                continue
            try:
                idle_since = max(idle_since, _last_touch(home / LEASE_FILE))
                if time.monotonic() - idle_since >= idle_s:
                    forget_server(home, os.getpid())
                    return
            finally:
                fcntl.flock(lease, fcntl.LOCK_UN)


async def _watch_parent(parent: int) -> None:
    """Returns once the run that started this server is gone (it was killed)."""
    while os.getppid() == parent:
        await asyncio.sleep(1.0)


def create_app() -> Any:
    """Prefect's server app as its own temporary server runs it (the API with only the
    services an ephemeral server needs: no scheduler, no late-run sweeps), plus Prefect's
    UI, which `create_app` leaves out of an ephemeral server. The UI's static files are
    copied once per Prefect version (create_ui_app caches them), then only served."""
    import prefect
    from prefect.server.api.server import create_app as prefect_app
    from prefect.server.api.server import create_ui_app
    from starlette.routing import Mount

    app = prefect_app(ephemeral=True, final=True)
    routes = app.router.routes
    for index, route in enumerate(routes):
        if isinstance(route, Mount) and route.name == "ui":
            routes[index] = Mount(route.path or "/", app=create_ui_app(ephemeral=False),
                                  name="ui")
            # the UI's pages link /favicon.ico, which its build keeps under ico/: without
            # this, every page load logs a 404 in the browser's console
            icons = Path(prefect.__ui_static_path__) / "ico"
            routes[index:index] = [_file_route(f"/{name}", icons / name)
                                   for name in ("favicon.ico", "favicon-dark.ico")
                                   if (icons / name).is_file()]
            break
    return app


def _file_route(path: str, file: Path) -> Any:
    from starlette.responses import FileResponse
    from starlette.routing import Route

    async def send_file(_request: Any) -> FileResponse:
        return FileResponse(file)

    return Route(path, send_file)


async def _run_server(args: argparse.Namespace) -> None:
    import uvicorn

    config = uvicorn.Config("orchestrator.flow.server_process:create_app", factory=True,
                            host="127.0.0.1", port=args.port, log_level="error",
                            lifespan="on")
    server = uvicorn.Server(config)
    watch = asyncio.create_task(_watch_idle(args.home, args.idle) if args.idle > 0
                                else _watch_parent(args.parent))

    def stop(task: asyncio.Task[Any]) -> None:
        # done, or failed (the store folder was deleted...): either way, stop serving
        if not task.cancelled() and task.exception() is not None:
            log.error("stopping: %s", task.exception())
        server.should_exit = True

    watch.add_done_callback(stop)
    try:
        await server.serve()
    finally:
        watch.remove_done_callback(stop)
        watch.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.flow.server_process")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle", type=float, required=True,
                        help="exit after this many seconds with no run attached; "
                             "0: a server for one run")
    parser.add_argument("--home", type=Path, required=True, help="the store folder")
    parser.add_argument("--parent", type=int, required=True, help="the run that started it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    # uvicorn shuts down gracefully on SIGTERM, then raises it again: exit normally then,
    # so that the record below is removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        asyncio.run(_run_server(args))
    finally:
        if args.idle > 0:
            try:
                forget_server(args.home, os.getpid())  # the record must not outlive us
            except OSError:
                pass  # the store folder is gone, and the record with it


if __name__ == "__main__":
    main()
