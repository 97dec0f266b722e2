"""Prefect's settings as this tool wants them, set before Prefect is imported."""

from __future__ import annotations

import os
import sys


def configure_prefect_defaults() -> None:
    """Offline-friendly defaults; an explicit environment always wins. Run logs do go to
    the API: the flow sends its stages' log lines there, for the Prefect UI. Also readies
    the process's logging for Prefect's import (see `_absl_on_current_stderr`)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # our log lines outside a run (none are sent then) need no warning about it
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    _absl_on_current_stderr()


class _CurrentStderr:
    """A stream that is whatever sys.stderr is at each write, and that closing leaves open."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def close(self) -> None:
        pass


def _absl_on_current_stderr() -> None:
    """Prefect's first import configures logging (logging.config.dictConfig), which closes
    every handler of the process. absl's handler, made when TensorFlow is first imported,
    holds the sys.stderr of that moment, and its close() closes that stream unless it is
    still sys.stderr: a stream the host had put there meanwhile (a redirect_stderr buffer,
    pytest's capture file) would be closed under it. absl itself writes to the current
    sys.stderr (until absl flags are parsed, which we never do): its handler is given one
    that is always the current sys.stderr and that it cannot close."""
    try:
        from absl import logging as absl_logging
    except ImportError:  # no TensorFlow (absl comes with it): no such handler
        return
    handler = absl_logging.get_absl_handler().python_handler
    if not isinstance(handler.stream, _CurrentStderr):
        handler.setStream(_CurrentStderr())  # type: ignore[arg-type]
