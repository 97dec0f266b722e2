"""How a person reads a figure: one home for the console table, the selection reasons, the
report page, `benchmark`, the gate and the history table.

- Timings: 3 significant digits, in µs below 1 ms (LiteRT's 5 µs would be "0.005 ms", one
  significant digit; 0.299 ms reads as 299 µs), else in ms.
- Sizes and RAM: MiB (1,048,576 bytes), the unit of the budget keys `max_size_mb` and
  `max_ram_mb` (orchestrator.measure.budgets.MB), 3 significant digits. One unit family
  everywhere, stated once where a table is shown (SIZE_UNIT_NOTE).
- Counts: thousands separated.
- Layer names: the same short name everywhere (console, page, plots): the first name of a
  LiteRT op fused from several graph nodes, without `StatefulPartitionedCall/` and the
  scope every layer of the model shares, and when still too long its tail (the layer and
  its op), cut at a `/`.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
import shlex
import shutil
import sys
import sysconfig
from collections.abc import Callable, Iterable, Sequence

MIB = 1024 * 1024
SIZE_UNIT = "MiB"
SIZE_UNIT_NOTE = ("MiB = 1,048,576 bytes, the unit of the budgets max_size_mb and "
                  "max_ram_mb")
DASH = "-"

# TF2 SavedModels wrap the whole model in one call: its name says nothing about a layer
_CALL_PREFIX = re.compile(r"^(?:(?:StatefulPartitionedCall|PartitionedCall)(?:_\d+)?/)+")


def significant(value: float, digits: int = 3) -> str:
    """`value` with `digits` significant digits, in fixed notation; whole numbers with
    thousands separated from 10**digits on (never rounded to zeros): 0.00512 -> "0.00512",
    57.04 -> "57.0", 1234.5 -> "1,234"."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    rounded = float(f"{value:.{digits - 1}e}")  # 9.996 -> 10.0: decimals follow the rounding
    magnitude = math.floor(math.log10(abs(rounded)))
    if magnitude >= digits:
        return f"{value:,.0f}"
    return f"{rounded:.{max(digits - 1 - magnitude, 0)}f}"


def format_ms(value: float | None, digits: int = 3) -> str:
    """A timing given in ms, 3 significant digits: below 1 ms in µs ("5.12 µs", "299 µs"),
    else in ms ("1.25 ms", "225 ms", "1,234 ms"); None -> "-"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    value = float(value)
    if abs(value) < 1.0 and value != 0:
        micro = float(significant(value * 1000.0, digits).replace(",", ""))
        if abs(micro) < 1000.0:  # 0.9996 ms rounds to 1,000 µs: say 1.00 ms
            return f"{significant(value * 1000.0, digits)} µs"
        return f"{significant(value, digits)} ms"
    return f"{significant(value, digits)} ms"


def apart(first: float, second: float, show: Callable[[float, int], str], digits: int = 3
          ) -> tuple[str, str]:
    """Two different figures shown by `show(value, digits)`, with more digits than `digits`
    where fewer would print them equal (1.0004 MiB over a 1 MiB budget)."""
    while (first != second and show(first, digits) == show(second, digits)
           and digits < 9):
        digits += 1
    return show(first, digits), show(second, digits)


def format_size(size_bytes: float | None, digits: int = 3, unit: bool = True) -> str:
    """Bytes as MiB, 3 significant digits: 1,076,839 -> "1.03 MiB", 272,520 -> "0.260 MiB";
    `unit=False` for a column whose header names the unit. None -> "-"."""
    if size_bytes is None:
        return DASH
    text = significant(float(size_bytes) / MIB, digits)
    return f"{text} {SIZE_UNIT}" if unit else text


def format_mib(mib: float | None, digits: int = 3, unit: bool = True) -> str:
    """A figure already in MiB (a budget, a measured growth), like format_size."""
    return DASH if mib is None else format_size(float(mib) * MIB, digits, unit)


def format_count(count: int | float | None) -> str:
    """268364 -> "268,364"; None -> "-"."""
    return DASH if count is None else f"{int(count):,}"


def format_number(value: float | None, spec: str = "") -> str:
    """A figure as format() writes it with `spec` (accuracy ".4f" -> "0.9812", a drop
    "+.4f" -> "-0.0031", bytes "," -> "272,520"); None or NaN (not measured) -> "-", as
    format_ms shows a missing timing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return format(value, spec)


# --- layer names ------------------------------------------------------------------------


def _first_name(name: str) -> str:
    """A LiteRT op fused from several graph nodes is named "a;b;c": its first node."""
    return _CALL_PREFIX.sub("", name.split(";")[0])


def shared_scope(names: Iterable[str]) -> str:
    """The scope (whole `/` parts) that every scoped name shares, after _first_name: the
    model's own scope, e.g. "digits_cnn_1/" (a name without any scope, such as LiteRT's
    output "Identity", does not count). Never the whole of a name."""
    parts = [p for p in (_first_name(n).split("/")[:-1] for n in names) if p]
    if len(parts) < 2:  # one name alone: its scope may be all that tells it apart
        return ""
    shared: list[str] = []
    for column in zip(*parts, strict=False) if parts else ():
        if len(set(column)) != 1:
            break
        shared.append(column[0])
    return "".join(part + "/" for part in shared)


def layer_name(name: str, scope: str = "", width: int | None = None) -> str:
    """A readable layer name: the first name of a fused op, without the call prefixes and
    `scope` (see shared_scope); longer than `width`, its tail after a `/`, marked "…/"."""
    short = _first_name(name)
    if scope and short.startswith(scope) and len(short) > len(scope):
        short = short[len(scope):]
    if width is None or len(short) <= width:
        return short
    parts = short.split("/")
    tail = parts[-1]
    for part in reversed(parts[:-1]):  # whole parts while they fit
        if len(part) + 1 + len(tail) + 2 > width:
            break
        tail = f"{part}/{tail}"
    if len(tail) + 2 > width:  # one part longer than the room: its end
        return "…" + tail[len(tail) - width + 1:]
    return "…/" + tail


def layer_names(names: Sequence[str], width: int | None = None) -> dict[str, str]:
    """Each name's layer_name, without the scope all of `names` share."""
    scope = shared_scope(names)
    return {name: layer_name(name, scope, width) for name in names}


def unknown_name_message(what: str, name: str, known: Iterable[str]) -> str:
    """`unknown variant 'nope' (did you mean "a"?); the recipe has: a, b`: one line, the
    hint worded as the recipe checks word theirs (in double quotes, before the list)."""
    choices = sorted(known)
    by_lower = {choice.lower(): choice for choice in choices}  # `INT8` is a typo of `int8`
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    hint = f' (did you mean "{by_lower[close[0]]}"?)' if close else ""
    listed = ", ".join(choices) if choices else "none"
    return f"unknown {what} {name!r}{hint}; the recipe has: {listed}"


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


# `extra=` of a log record the console already shows another way (the progress display,
# the summary): it goes to the Prefect run's logs only (the CLI's console handler skips it)
NOT_ON_CONSOLE = {"console": False}
