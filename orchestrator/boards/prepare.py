"""Making a board ready to measure, without internet on the board.

This host downloads the wheels for the board's own platform and Python (pip's
`--platform`, `--python-version`, `--only-binary`), installs them into a folder here, and
sends that folder over the run's SSH connection into the board's
`~/.cache/orchestrator-board/site-cpXY-<machine>`, which the measuring program puts first on its
path. Nothing is installed system-wide on the board, and nothing there needs pip. The
emulated board is built instead (boards/emulated_board.py).
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.boards import emulated_board
from orchestrator.boards.errors import DeviceUnreachable
from orchestrator.boards.session import BoardSession
from orchestrator.boards.transports.ssh import SshTransport
from orchestrator.boards.urls import DeviceURL

# what `--runtime` can add to the default set, by the module the board imports
RUNTIME_PACKAGES = {"numpy": "numpy", "ai_edge_litert": "ai-edge-litert",
                    "cryptography": "cryptography", "tensorflow": "tensorflow"}
DEFAULT_RUNTIMES = ("numpy", "ai_edge_litert", "cryptography")


def wheel_platforms(board: dict[str, Any]) -> list[str]:
    """pip's --platform tags the board takes: manylinux up to its glibc, for its machine."""
    machine = board.get("machine") or ""
    libc = str(board.get("libc") or "")
    minor = 17
    if libc.startswith("glibc-"):
        try:
            minor = int(libc.split("-")[1].split(".")[1])
        except (IndexError, ValueError):
            minor = 17
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{machine}"]


def _pinned(package: str) -> str:
    """The host's own release of LiteRT (the same kernels measured on both sides)."""
    if package == "ai-edge-litert":
        from importlib.metadata import version

        return f"{package}=={version(package)}"
    return package


def describe_board(url: DeviceURL, accept_new_host_key: bool = False) -> dict[str, Any]:
    """What the board is (machine, CPU, cores, memory, Python, runtimes)."""
    from orchestrator.boards.transports import transport_for

    transport = (SshTransport(url, accept_new_host_key) if url.scheme == "ssh"
                 else transport_for(url))
    with BoardSession(transport, url.text) as session:
        board = session.describe()
    return {k: v for k, v in board.items() if k != "blobs"}


def prepare(url: DeviceURL, runtimes: list[str], say: Callable[[str], None] = print
            ) -> dict[str, Any]:
    """Install `runtimes` (module names) on the board; what the board has afterwards."""
    if url.emulated:
        if emulated_board.missing_setup() is not None:
            emulated_board.build(say=say)
        if "tensorflow" in runtimes:
            emulated_board.add_tensorflow(say=say)
        return describe_board(url)
    board = describe_board(url)
    packages = [_pinned(RUNTIME_PACKAGES[r]) for r in runtimes]
    tag = str(board["python_tag"])
    version = f"{tag[2]}.{tag[3:]}"
    say(f"{url.text}: {board['machine']} {board.get('cpu') or ''}, Python {board['python']}; "
        f"downloading {', '.join(packages)} for it")
    with tempfile.TemporaryDirectory() as folder:
        site = Path(folder) / "site"
        platforms = [arg for p in wheel_platforms(board) for arg in ("--platform", p)]
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--no-compile", "--target", str(site), *platforms, "--implementation", "cp",
             "--python-version", version, "--only-binary=:all:", *packages],
            capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise DeviceUnreachable(f"no wheels of {', '.join(packages)} for "
                                    f"{board['machine']} and Python {version}: "
                                    f"{done.stderr.strip().splitlines()[-1:]}")
        archive = io.BytesIO()
        # the fastest gzip level: most of the bytes are already-compressed shared objects
        with tarfile.open(fileobj=archive, mode="w:gz", compresslevel=1) as tar:
            tar.add(site, arcname="site")
        say(f"sending {archive.tell() / 2**20:.1f} MiB to {board['site']}")
        transport = SshTransport(url)
        transport.open()
        try:
            parent = str(Path(board["site"]).parent)
            sent = transport.run(f"mkdir -p '{parent}' && rm -rf '{board['site']}.new' && "
                                 f"mkdir '{board['site']}.new' && tar -xzf - -C "
                                 f"'{board['site']}.new' --strip-components=1 && rm -rf "
                                 f"'{board['site']}' && mv '{board['site']}.new' "
                                 f"'{board['site']}'", timeout=600, data=archive.getvalue())
        except subprocess.TimeoutExpired:
            raise DeviceUnreachable(f"{url.text}: sending the runtimes took over 600 s") from None
        finally:
            transport.close()
        if sent.returncode != 0:
            raise DeviceUnreachable(f"{url.text}: unpacking the runtimes failed: "
                                    f"{sent.stderr.decode(errors='replace').strip()}")
    return describe_board(url)
