"""What the subcommand modules share: the error line and argument types."""

from __future__ import annotations

import argparse
import sys

from orchestrator.errors import OrchestratorError


def print_error(exc: OrchestratorError) -> int:
    """`error: ...` on stderr (text any terminal can show); the error's exit code."""
    # a hostile recipe may hold text the terminal cannot encode (lone surrogates, NUL)
    text = str(exc).encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\0")
    print(f"error: {text}", file=sys.stderr)
    return exc.exit_code


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (a usage error, exit 2, otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, found {text!r}")
    return value
