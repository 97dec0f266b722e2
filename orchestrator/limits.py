"""Hard limits on what a recipe may hold, and the rule for names that reach the file system.

A recipe is read by people and by schedulers alike: these bounds keep a hostile or broken
one from hanging the loader, eating memory, flooding MLflow or writing outside its folders.
Each limit is documented in docs/troubleshooting.md ("Limits"); a recipe over one gets exit 2 naming
the file, the line and the limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

# The recipe file itself (a real recipe is a few KB).
MAX_RECIPE_BYTES = 1_000_000
# Nesting of mappings and lists (a real recipe nests about 6 deep).
MAX_NESTING_DEPTH = 32
# Scalars, mappings and lists after expanding every YAML alias (the "billion laughs" bound).
MAX_YAML_NODES = 100_000
# Pipelines in a recipe, stages in one pipeline, and targets.
MAX_PIPELINES = 64
MAX_STAGES_PER_PIPELINE = 128
MAX_TARGETS = 64
# Files under an image-folder data source (named `/` or `~` by mistake, a walk would take
# minutes); an evaluation set of real photos is a few thousand to tens of thousands.
MAX_IMAGE_FOLDER_FILES = 200_000
# A `--set` value is YAML too: the same depth and node bounds apply to it.

# Recipe, pipeline and target names become folder names under `-o DIR` and the store,
# Prefect flow and task run names, and MLflow run names and metric keys. One rule for all:
# a letter or digit first, then letters, digits, `_`, `-` and `.`; no path separators, no
# `..`, no control characters; at most MAX_NAME_LENGTH characters.
MAX_NAME_LENGTH = 64
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def name_problem(name: object) -> str | None:
    """Why `name` cannot name a recipe, pipeline or target, or None when it can."""
    if not isinstance(name, str):
        return f"a name is a string, found {type(name).__name__}"
    if not name:
        return "a name cannot be empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"a name has at most {MAX_NAME_LENGTH} characters, found {len(name)}"
    if not NAME_PATTERN.fullmatch(name) or ".." in name:
        return (f"{name!r} is not a valid name: use letters, digits, '_', '-' and '.', "
                "starting with a letter or digit, with no '..' (names become folder names, "
                "Prefect runs and MLflow runs)")
    return None


# --------------------------------------------------------------------------- counts

# Every count a recipe or a command-line flag takes has a bound, with its reason: the schema
# states it (`minimum` / `maximum`), `orchestrator stages` shows it, `validate` refuses a
# value past it at its line, and a flag past it is a usage error (exit 2). Each bound is
# generous for real use; past it a value crashes (a million threads: SIGABRT), hangs (10^12
# timed runs) or exhausts memory, with nothing said. One table, read by the recipe models
# (`bounded`), the stages' params, the flags (cli/common.bounded_flag) and the docs.


@dataclass(frozen=True)
class Bound:
    """`low` <= value <= `high` (`low` excluded when `open_low`: a timeout of 0 s means
    nothing); `why` says what lies past `high`, `low_why` (if any) what lies below `low`."""

    low: float
    high: float
    why: str
    open_low: bool = False
    low_why: str = ""


_TIMEOUT_WHY = ("a week: longer is no timeout at all, and the system's timers refuse "
                "values far above it (OverflowError)")
_SAMPLES_WHY = ("a million samples take hours on a host and longer on a board; the "
                "statistics settle long before")
_THREADS_WHY = ("a board has fewer cores than that, and each thread is an OS thread: a "
                "million of them ends the process (SIGABRT, pthread_create failed)")
_BATCH_WHY = ("a batch is held in memory whole (4096 images of 224x224x3 floats take "
              "2.5 GB) and larger batches run no faster")
_ELEMENTS_WHY = ("a GraphDef is at most 2 GB (protobuf's limit), so no tensor holds more "
                 "elements or bytes than that")

BOUNDS: dict[str, Bound] = {
    "threads": Bound(1, 256, _THREADS_WHY),
    "cores": Bound(1, 256, "no device in the catalogue's class has more, and threads on "
                   "a board are capped at its cores (at most 256)"),
    "workers": Bound(1, 256, "each worker is a process importing TensorFlow (about "
                     "0.5 GB): more than a machine's cores only compete for them"),
    "runs": Bound(1, 100_000, "100000 runs of a 10 ms model take 17 minutes, and the "
                  "percentiles stop changing after a few thousand"),
    "warmup": Bound(0, 10_000, "caches and allocations settle within a few runs; more only "
                    "delays the timed ones"),
    "profile_runs": Bound(0, 10_000, "each traced run records every op: past a few hundred "
                          "the profile no longer changes, only its cost"),
    "samples": Bound(1, 1_000_000, _SAMPLES_WHY),
    "train_steps": Bound(1, 100_000, "fine-tuning a small model settles within a few "
                         "thousand steps; 100000 take hours on a host"),
    "diagnostic_samples": Bound(0, 1_000_000, _SAMPLES_WHY),
    "batch": Bound(1, 4096, _BATCH_WHY),
    "trials": Bound(1, 1000, "each trial quantizes and evaluates the model again: a "
                    "search that 1000 trials did not settle will not settle"),
    "timeout_s": Bound(0, 604_800, _TIMEOUT_WHY, open_low=True),
    "top_k": Bound(1, 100_000, "no classifier has more classes (ImageNet-21k has 21841)"),
    "iterations": Bound(1, 100, "equalization converges in a few passes; more only cost "
                        "time"),
    "num_steps": Bound(2, 65_536, "65536 levels are 16 bits: more round nothing off a "
                       "float32 weight that matters"),
    "elements": Bound(1, 2**31 - 1, _ELEMENTS_WHY),
    "bytes": Bound(0, 2**31, _ELEMENTS_WHY),
    "dimension": Bound(-1, 2**31 - 1, "TensorFlow Lite stores a dimension as a 32-bit "
                       "integer (-1: unknown)",
                       low_why="a dimension is a size, or -1 where it is unknown"),
    "image_side": Bound(1, 8192, "one 8192x8192 RGB image is 0.8 GB of floats; no model "
                        "for a small device takes larger"),
    "last": Bound(1, 100_000, "the history of one recipe is read from MLflow page by page; "
                  "more runs than that do not fit a table or a plot"),
    "concurrent_runs": Bound(1, 64, "each run is a process with TensorFlow loaded (about "
                             "1 GB) sharing this machine's cores"),
}
# settings in one `threads: [...]` list (each is timed in full)
MAX_THREAD_SETTINGS = 16


def shown(value: float) -> str:
    """A number as the user wrote it: 1000000, 1e+15, 0.5."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def bound_problem(kind: str, value: float) -> str | None:
    """Why `value` is outside the bound `kind` of BOUNDS (saying the bound and, above it,
    why), or None when it is inside. A NaN is left to the type check."""
    bound = BOUNDS[kind]
    if value > bound.high:
        return f"{shown(value)} is above {shown(bound.high)}: {bound.why}"
    if value < bound.low or bound.open_low and value == bound.low:
        word = "more than" if bound.open_low else "at least"
        why = f": {bound.low_why}" if bound.low_why else ""
        return f"expected {word} {shown(bound.low)}, found {shown(value)}{why}"
    return None


def bounded(kind: str) -> Any:
    """The pydantic annotation of a count of kind `kind`: an int (a float for `timeout_s`)
    whose bounds the JSON Schema states (`minimum`, `maximum`) and whose violation
    `validate` reports with bound_problem's message."""
    from pydantic import BeforeValidator, Field

    bound = BOUNDS[kind]

    def check(value: Any) -> Any:
        number = value
        if isinstance(value, str):  # "1000000" in lax mode is that number too
            try:
                number = float(value.strip())
            except ValueError:
                return value
        if isinstance(number, int | float) and not isinstance(number, bool):
            problem = bound_problem(kind, number)
            if problem:
                raise ValueError(problem)
        return value

    low = {"gt": bound.low} if bound.open_low else {"ge": bound.low}
    if kind == "timeout_s":
        return Annotated[float, Field(**low, le=bound.high, allow_inf_nan=False),
                         BeforeValidator(check)]
    return Annotated[int, Field(**low, le=bound.high), BeforeValidator(check)]
