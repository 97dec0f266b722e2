"""Ways to reach a board, one module each: what it takes to start Python there.

A transport opens (`open()`: a connection made once and reused by every measurement of a
run, with its failure explained), gives the command that starts the board's Python
(`python_command`), and closes. Android over adb will be one more module beside these.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.boards.urls import DeviceURL


class Transport(Protocol):
    url: DeviceURL

    def open(self) -> None: ...

    def python_command(self, *args: str) -> list[str]: ...

    def close(self) -> None: ...


def transport_for(url: DeviceURL) -> Transport:
    if url.scheme == "qemu":
        from orchestrator.boards.transports.qemu import QemuTransport

        return QemuTransport(url)
    from orchestrator.boards.transports.ssh import SshTransport

    return SshTransport(url)
