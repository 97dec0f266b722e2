"""The process behind `prefect_server.LocalServer`: Prefect's API server, plus a watch that
ends it once no run has held the lease for `--idle` seconds.

    python -m orchestrator.prefect_daemon --port P --idle S --home DIR

Runs hold a shared flock on DIR/prefect-server.lease while they use the server. The watch
polls for an exclusive one: when it gets it, no run is attached. After `--idle` seconds of
that it forgets the server (removes DIR/prefect-server.json) while it still holds the lock,
so a run arriving at that moment starts a new server instead of attaching to this one.
With `--idle 0` there is no watch: the run that started the server stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import signal
import sys
import time
from pathlib import Path

from orchestrator.prefect_server import LEASE_FILE, forget_server

# how often the watch looks at the lease, at most
_POLL_S = 5.0


async def _watch_idle(server: object, home: Path, idle_s: float) -> None:
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
                if time.monotonic() - idle_since >= idle_s:
                    forget_server(home, os.getpid())
                    server.should_exit = True  # type: ignore[attr-defined]
                    return
            finally:
                fcntl.flock(lease, fcntl.LOCK_UN)


async def _serve(port: int, idle_s: float, home: Path) -> None:
    import uvicorn

    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True,
                            host="127.0.0.1", port=port, log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    watch = asyncio.create_task(_watch_idle(server, home, idle_s)) if idle_s > 0 else None
    try:
        await server.serve()
    finally:
        if watch is not None:
            watch.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.prefect_daemon")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle", type=float, required=True,
                        help="exit after this many seconds with no run attached; 0: never")
    parser.add_argument("--home", type=Path, required=True, help="the store folder")
    args = parser.parse_args(argv)
    # uvicorn shuts down gracefully on SIGTERM, then raises it again: exit normally then,
    # so that the record below is removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        asyncio.run(_serve(args.port, args.idle, args.home))
    finally:
        if args.idle > 0:
            forget_server(args.home, os.getpid())  # the record must not outlive us


if __name__ == "__main__":
    main()
