"""qemu://aarch64?cpu=NAME: the emulated board on this host (boards/emulated_board.py)."""

from __future__ import annotations

from orchestrator.boards import emulated_board
from orchestrator.boards.errors import DeviceUnreachable
from orchestrator.boards.urls import DeviceURL


class QemuTransport:
    def __init__(self, url: DeviceURL) -> None:
        self.url = url

    def open(self) -> None:
        assert self.url.cpu is not None
        try:
            emulated_board.check_cpu(self.url.cpu)
        except emulated_board.BoardSetupError as exc:
            raise DeviceUnreachable(exc.message) from None
        why = emulated_board.missing_setup()
        if why is not None:
            raise DeviceUnreachable(why)

    def python_command(self, *args: str) -> list[str]:
        assert self.url.cpu is not None
        return [str(emulated_board.python_for(self.url.cpu)), *args]

    def close(self) -> None:
        return None
