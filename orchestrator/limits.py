"""Hard limits on what a recipe may hold, and the rule for names that reach the file system.

A recipe is read by people and by schedulers alike: these bounds keep a hostile or broken
one from hanging the loader, eating memory, flooding MLflow or writing outside its folders.
Each limit is documented in docs/troubleshooting.md ("Limits"); a recipe over one gets exit 2 naming
the file, the line and the limit.
"""

from __future__ import annotations

import re

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
