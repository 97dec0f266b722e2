"""The name of a recipe's run, the same in Prefect and MLflow: `<recipe>@<short commit>`."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def git_commit(path: Path) -> str | None:
    """The last commit of the recipe file, with '-dirty' when it has uncommitted changes;
    None outside git."""
    try:
        commit = subprocess.run(["git", "-C", str(path.parent), "log", "-n1", "--format=%H",
                                 "--", path.name], capture_output=True, text=True, timeout=10,
                                check=False).stdout.strip()
        if not commit:
            return None
        dirty = subprocess.run(["git", "-C", str(path.parent), "status", "--porcelain", "--",
                                path.name], capture_output=True, text=True, timeout=10,
                               check=False).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_name(recipe_name: str, recipe_path: Path, commit: str | None = None) -> str:
    """`<recipe>@<7-hex commit>[-dirty]`, or `<recipe>@<UTC time>` outside git."""
    commit = commit or git_commit(recipe_path)
    if commit:
        return f"{recipe_name}@{commit[:7]}{'-dirty' if commit.endswith('-dirty') else ''}"
    return f"{recipe_name}@{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
