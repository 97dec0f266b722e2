"""The recipe's JSON Schema, for editors: generated from the pydantic models and the stage
registry, written to a file that recipes name on their first line.

    # yaml-language-server: $schema=recipe.schema.json

The Red Hat YAML extension (VS Code) and any editor speaking yaml-language-server read that
line and complete and check the recipe as it is typed. `recipes/recipe.schema.json` is the
project's copy; a test keeps it equal to what the code generates.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SCHEMA_FILE = "recipe.schema.json"
# Where a project keeps it, relative to the project root (this repository does).
PROJECT_SCHEMA = Path("recipes") / SCHEMA_FILE
MODELINE_PREFIX = "# yaml-language-server: $schema="
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def recipe_schema() -> dict[str, Any]:
    """The recipe's JSON Schema, with each stage's params as a one-key mapping."""
    from orchestrator.spec.models import Recipe
    from orchestrator.stages import all_stages

    schema = Recipe.model_json_schema(by_alias=True)
    entries: list[dict] = []
    names = []
    for stage in all_stages():
        names.append(stage.name)
        entries.append({"type": "object", "additionalProperties": False, "minProperties": 1,
                        "maxProperties": 1, "description": (stage.doc or "").strip(),
                        "properties": {stage.name: {"anyOf": [
                            stage.params.model_json_schema(), {"type": "null"}]}}})
    stage_schema = {"anyOf": [{"type": "string", "enum": names}, *entries]}
    schema.setdefault("$defs", {})["StageEntry"] = stage_schema
    schema["$defs"]["Pipeline"]["properties"]["stages"]["items"] = {
        "$ref": "#/$defs/StageEntry"}
    return {"$schema": JSON_SCHEMA_DIALECT, **schema}


def schema_text() -> str:
    """The schema as `orchestrator schema` prints it and `schema -o` writes it."""
    return json.dumps(recipe_schema(), indent=2) + "\n"


def write_schema(path: Path) -> None:
    """Write the schema to `path` atomically (a temp file renamed into place: a reader
    never sees half a file), with the mode any new file gets."""
    from orchestrator.paths import atomic_write_text

    atomic_write_text(Path(path), schema_text(), plain_mode=True)


def modeline(recipe: Path, schema: Path) -> str:
    """The first line of a recipe at `recipe` naming `schema`, relative to the recipe."""
    relative = os.path.relpath(os.path.abspath(schema), os.path.abspath(recipe.parent))
    return MODELINE_PREFIX + Path(relative).as_posix()


def find_schema(recipe: Path, root: Path) -> Path | None:
    """The schema file a recipe at `recipe` should name: `recipe.schema.json` in its own
    folder or a folder above it up to `root` (the project root), else the project's
    `recipes/recipe.schema.json`; None when there is none."""
    folder = Path(os.path.abspath(recipe)).parent
    root = Path(os.path.abspath(root))
    candidates = [folder]
    if folder.is_relative_to(root):
        candidates += [p for p in folder.parents if p.is_relative_to(root)]
    for candidate in [*(c / SCHEMA_FILE for c in candidates), root / PROJECT_SCHEMA]:
        if candidate.is_file():
            return candidate
    return None
