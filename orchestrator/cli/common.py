"""What the subcommand modules share: the error line and argument types."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from orchestrator.errors import OrchestratorError, interrupts_seen
from orchestrator.limits import bound_problem


def print_error(exc: OrchestratorError) -> int:
    """`error: ...` on stderr (text any terminal can show); the error's exit code."""
    # a hostile recipe may hold text the terminal cannot encode (lone surrogates, NUL)
    text = str(exc).encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\0")
    print(f"error: {text}", file=sys.stderr)
    return exc.exit_code


# whether `interrupted` is said (the Ctrl-C seen, `interrupts_seen`, are in orchestrator.errors)
interrupted_said: list[bool] = []


def say_interrupted() -> None:
    """`interrupted` on stderr, once per command however many Ctrl-C came."""
    if not interrupted_said:
        interrupted_said.append(True)
        print("interrupted", file=sys.stderr)


def command_error(exc: OrchestratorError) -> int:
    """A command's error: `interrupted` (130) when a Ctrl-C inside a library (a model
    loading) became that error, else its `error: ...` line and exit code."""
    if interrupts_seen:
        say_interrupted()
        return 130
    return print_error(exc)


def bounded_flag(kind: str) -> Callable[[str], int]:
    """argparse type: a whole number within orchestrator/limits.py's bound `kind`, the same
    bound a recipe's count of that kind has; outside it, a usage error (exit 2) saying the
    bound and why: `argument --runs: 1000000000000 is above 100000: ...`."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number, found {text!r}") from None
        problem = bound_problem(kind, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind  # argparse names the type in its own messages
    return parse


def bounded_list_flag(kind: str) -> Callable[[str], str]:
    """argparse type: a comma-separated list of whole numbers (`1,2,4`), each within the
    bound `kind`; returns the text, which the command parses (and checks the rest of)."""
    check = bounded_flag(kind)

    def parse(text: str) -> str:
        for item in text.split(","):
            if item.strip().lstrip("-").isdigit():
                check(item)
        return text

    parse.__name__ = kind
    return parse

