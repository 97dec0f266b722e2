"""Waiting for a condition in tests: a generous deadline, never a timed assertion."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 120.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `deadline_s`."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.2)
    pytest.fail(f"gave up waiting for {what}")
