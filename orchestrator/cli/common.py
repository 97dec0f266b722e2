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


# Ctrl-C seen while a command runs (cli.main notes them)
interrupts_seen: list[int] = []


def command_error(exc: OrchestratorError) -> int:
    """A command's error: `interrupted` (130) when a Ctrl-C inside a library (a model
    loading) became that error, else its `error: ...` line and exit code."""
    if interrupts_seen:
        print("interrupted", file=sys.stderr)
        return 130
    return print_error(exc)


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (a usage error, exit 2, otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, found {text!r}")
    return value
