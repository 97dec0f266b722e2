"""What the subcommand modules share: the error line, argument types, unknown names, and
the command line a hint prints."""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import shlex
import shutil
import sys
import sysconfig
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
    """`unknown variant 'nope' (did you mean "a"?); the recipe has: a, b`: one line, the
    hint worded as the recipe checks word theirs (in double quotes, before the list)."""
    choices = sorted(known)
    by_lower = {choice.lower(): choice for choice in choices}  # `INT8` is a typo of `int8`
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    hint = f' (did you mean "{by_lower[close[0]]}"?)' if close else ""
    listed = ", ".join(choices) if choices else "none"
    return f"unknown {what} {name!r}{hint}; the recipe has: {listed}"


def check_variants(loaded: Any, variants: Iterable[str] | None) -> None:
    """`--variant NAME` names a pipeline of the loaded recipe: else exit 2 (RecipeError)
    naming it, the recipe's pipelines and the closest one."""
    from orchestrator.errors import RecipeError

    pipelines = loaded.recipe.pipelines
    for name in variants or ():
        if name not in pipelines:
            raise RecipeError(unknown_name_message("variant", name, pipelines),
                              file=str(loaded.path), field="--variant")


COMMAND = "orchestrator"


def command_hint(*words: object) -> str:
    """`orchestrator WORDS` as the user can paste it: `orchestrator` when that name on PATH
    is the command running now, else the running command's path (relative to the working
    directory when shorter, e.g. `.venv/bin/orchestrator` before the venv is activated),
    else `PYTHON -m orchestrator`. Each word shell-quoted."""
    return shlex.join([*command_prefix(), *map(str, words)])


@functools.lru_cache(maxsize=1)
def command_prefix() -> tuple[str, ...]:
    running = _running_script()
    if running is None:
        return (_shortest(sys.executable), "-m", COMMAND)
    found = shutil.which(COMMAND)
    if found is not None and _same_file(found, running):
        return (COMMAND,)
    shown = _shortest(running)
    # a bare name would be looked up on PATH, where it is not (or is another one)
    return (shown if os.sep in shown else f".{os.sep}{shown}",)


def _running_script() -> str | None:
    """The `orchestrator` script this process runs: sys.argv[0] when it is one, else the
    console script of this environment (`python -m orchestrator`, a test runner)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == COMMAND and os.path.isfile(argv0):
        return os.path.abspath(argv0)
    scripts = sysconfig.get_path("scripts")
    candidate = os.path.join(scripts, COMMAND) if scripts else ""
    return candidate if candidate and os.path.isfile(candidate) else None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _shortest(path: str) -> str:
    """`path` relative to the working directory when that is shorter, else absolute."""
    path = os.path.abspath(path)
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return relative if len(relative) < len(path) else path
