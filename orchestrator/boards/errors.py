"""What goes wrong with a board, and which exit code it is."""

from __future__ import annotations

from orchestrator.errors import OrchestratorError


class DeviceUnreachable(OrchestratorError):
    """A board that cannot be used at all: unreachable, an unknown host key, a runtime
    missing. Exit 2, before any stage runs; the message names the fix."""


class DeviceLost(OrchestratorError):
    """A measurement that did not finish: the connection dropped, the board rebooted or
    hung past the timeout. The stage that measured fails with it (exit 3)."""
