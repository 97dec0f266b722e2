"""The name a recipe run goes by, in Prefect and in MLflow alike: `<recipe>@<commit>`; in
MLflow, a re-run of the same commit adds its number (`digits-cnn@249b3fe #2`), so that no
two runs of an experiment share a name (distinct_name).

No MLflow or Prefect here: the flow names its run with the same function the tracking
worker names the MLflow parent run with.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

SHORT_COMMIT = 7
DIRTY = "-dirty"


def git_commit(path: Path) -> str | None:
    """The last commit that changed the recipe file (full hash), with '-dirty' when the file
    has uncommitted changes; None outside git or for a file git does not track."""
    path = Path(path)
    try:
        commit = subprocess.run(["git", "-C", str(path.parent), "log", "-n1", "--format=%H",
                                 "--", path.name], capture_output=True, text=True, timeout=10,
                                check=False).stdout.strip()
        if not commit:
            return None
        dirty = subprocess.run(["git", "-C", str(path.parent), "status", "--porcelain", "--",
                                path.name], capture_output=True, text=True, timeout=10,
                               check=False).stdout.strip()
        return commit + (DIRTY if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def short_commit(commit: str | None) -> str | None:
    """'0123456789ab...-dirty' -> '0123456-dirty'."""
    if not commit:
        return None
    dirty = commit.endswith(DIRTY)
    return commit.removesuffix(DIRTY)[:SHORT_COMMIT] + (DIRTY if dirty else "")


def run_name(recipe_name: str, recipe_path: Path, commit: str | None = None) -> str:
    """`<recipe>@<short commit>` (plus '-dirty'), or `<recipe>@<UTC YYYYmmdd-HHMMSS>` when
    the recipe file is not in git. `commit`, when the caller has it, saves the git calls."""
    short = short_commit(commit or git_commit(recipe_path))
    if short is None:
        short = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{recipe_name}@{short}"


def distinct_name(base: str, taken: Iterable[str | None]) -> str:
    """`base`, or `base #N` when runs already go by `base` (the first, unnumbered) or
    `base #k`: N is one more than the highest of them, so that a deleted run's number is
    not given out again while any later one exists."""
    numbered = re.compile(re.escape(base) + r" #(\d+)")
    numbers = [1 if name == base else int(match.group(1)) for name in taken if name
               and (name == base or (match := numbered.fullmatch(name)))]
    return f"{base} #{max(numbers) + 1}" if numbers else base
