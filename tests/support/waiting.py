"""Waiting for a condition in tests: a generous deadline, never a timed assertion."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 120.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `deadline_s`."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.2)
    pytest.fail(f"gave up waiting for {what}")


def board_is_measuring(lock_folder: Path) -> bool:
    """Whether a measurement holds the board's lock (`lock` in the board program's own
    folder under its TMPDIR): another process's flock makes ours fail."""
    lock = lock_folder / "lock"
    if not lock.exists():
        return False
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False
