"""What the subcommand modules share: the error line, and argument types."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable
from typing import Any

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


def unknown_name_message(what: str, name: str, known: Iterable[str]) -> str:
    """`unknown variant 'nope'; the recipe has: a, b (did you mean 'a'?)`: one line."""
    choices = sorted(known)
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(choices) if choices else "none"
    return f"unknown {what} {name!r}; the recipe has: {listed}{hint}"


def check_variants(loaded: Any, variants: Iterable[str] | None) -> None:
    """`--variant NAME` names a pipeline of the loaded recipe: else exit 2 (RecipeError)
    naming it, the recipe's pipelines and the closest one."""
    from orchestrator.errors import RecipeError

    pipelines = loaded.recipe.pipelines
    for name in variants or ():
        if name not in pipelines:
            raise RecipeError(unknown_name_message("variant", name, pipelines),
                              file=str(loaded.path), field="--variant")
