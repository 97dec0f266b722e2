"""Prefect's settings as this tool wants them, set before Prefect is imported."""

from __future__ import annotations

import os


def configure_prefect_defaults() -> None:
    """Offline-friendly defaults; an explicit environment always wins. Run logs do go to
    the API: the flow sends its stages' log lines there, for the Prefect UI."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # our log lines outside a run (none are sent then) need no warning about it
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
