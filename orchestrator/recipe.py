"""Recipe loading, the entry point: `load_recipe` reads the YAML with line/column for every
field (recipe_yaml.py), applies `--set` overrides, and validates the whole recipe before
anything runs: its shape (pydantic, errors by recipe_errors.py), stage names and params,
names, wiring and kinds (recipe_checks.py), then adds the stages a recipe gets by default
(recipe_defaults.py) and checks the files it names. `LoadedRecipe` is what it returns.

The names other modules imported from here before the split are re-exported.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from orchestrator import paths
from orchestrator.errors import OrchestratorError, RecipeError
from orchestrator.limits import MAX_NESTING_DEPTH
from orchestrator.recipe_checks import (
    check_kinds,
    check_names,
    check_wiring,
    lineage,
    parse_stage_entry,
)
from orchestrator.recipe_defaults import (
    COMPACTED_AFTER,
    DEFAULT_COMPACTION,
    add_default_stages,
    default_compactions,
    keeps_names,
)
from orchestrator.recipe_errors import Loc, dotted, make_error, pydantic_error
from orchestrator.recipe_models import Recipe
from orchestrator.recipe_yaml import (
    Located,
    apply_overrides,
    check_yaml_bounds,
    load_yaml,
    nesting_depth,
)

if TYPE_CHECKING:
    from orchestrator.devices import Device

__all__ = ["COMPACTED_AFTER", "DEFAULT_COMPACTION", "LoadedRecipe", "Loc", "Located",
           "add_default_stages", "apply_overrides", "check_yaml_bounds", "default_compactions",
           "dotted", "keeps_names", "lineage", "load_recipe", "load_yaml", "make_error",
           "parse_stage_entry"]


@dataclass
class LoadedRecipe:
    """A validated recipe with where it came from."""

    recipe: Recipe
    path: Path
    marks: dict[Loc, tuple[int, int]]
    raw: dict[str, Any]
    stages: dict[str, list[tuple[str, BaseModel]]]  # pipeline -> [(stage name, params)]
    # pipeline -> indices in `stages` of the stages added by default (not in the YAML)
    added: dict[str, list[int]] = field(default_factory=dict)

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def resolve(self, relative: str) -> Path:
        """A path from the recipe, relative to the recipe file (through symlinks where they
        resolve: a loop or a NUL byte is reported by the check of the path, not raised)."""
        path = paths.resolve(relative, self.base_dir)
        try:
            return path.resolve()
        except (OSError, RuntimeError, ValueError):
            return Path(os.path.abspath(path))

    def error(self, message: str, loc: Loc, cls: type[RecipeError] = RecipeError) -> RecipeError:
        """An error at recipe field `loc` (a stage by its index in `stages`)."""
        return make_error(cls, message, self.path, self.yaml_loc(loc), self.marks)

    def yaml_loc(self, loc: Loc) -> Loc:
        """`loc` with a stage index of `stages` turned into the stage's index in the YAML;
        a stage added by default is located at its pipeline's `stages` key."""
        if len(loc) < 4 or loc[0] != "pipelines" or loc[2] != "stages" \
                or not isinstance(loc[3], int) or not self.added.get(str(loc[1])):
            return loc
        added = self.added[str(loc[1])]
        if loc[3] in added:
            return loc[:3]
        return (*loc[:3], loc[3] - sum(1 for index in added if index < loc[3]), *loc[4:])

    def devices(self) -> dict[str, Device]:
        """Each target's device, resolved from its preset name or inline spec; an unknown
        one is a RecipeError at the target's `device` line."""
        from orchestrator.devices import resolve_device

        devices = {}
        for index, target in enumerate(self.recipe.targets):
            try:
                devices[target.name] = resolve_device(target.device)
            except ValueError as exc:
                raise self.error(str(exc), ("targets", index, "device")) from exc
        return devices

    def relocate(self, exc: OrchestratorError, loc: Loc, prefix: str = "") -> Any:
        """`exc` (of the same class) moved onto the recipe field `loc`, keeping the file it
        was about (a broken .npz, a model) in the message."""
        where = exc.location() if exc.file and exc.file != str(self.path) else ""
        if where and Path(exc.file or "").name in exc.message:
            where = ""  # the message names the file already
        message = f"{prefix}{where}: {exc.message}" if where else f"{prefix}{exc.message}"
        return make_error(type(exc), message, self.path, self.yaml_loc(loc), self.marks)


def _check_files(loaded: LoadedRecipe) -> None:
    """The model path and data sources exist (cheap checks; shapes are checked at run)."""
    from orchestrator.data import check_source
    from orchestrator.errors import ModelSourceError

    recipe = loaded.recipe
    model_path = loaded.resolve(recipe.model.path)
    problem = paths.path_problem(model_path, "file_or_dir")
    # a TF1 checkpoint may be named by its prefix (model.ckpt -> model.ckpt.index, ...)
    if problem == "not found" and "\0" not in str(model_path) and any(
            model_path.parent.glob(glob.escape(model_path.name) + ".*")):
        problem = None
    if problem:
        message = ("model path does not exist" if problem == "not found"
                   else f"cannot read the model path: {problem}")
        raise loaded.error(f"{message}: {model_path}", ("model", "path"), ModelSourceError)
    if model_path.is_dir() and recipe.model.format == "auto":  # cheap: names only, no TF
        from orchestrator.sources import detect_format

        try:
            detect_format(model_path)
        except ModelSourceError as exc:
            raise loaded.relocate(exc, ("model", "path")) from exc
    # a declared input's dtype (only: shapes are checked at run, against the model) lets a
    # string-input model take string arrays; otherwise data must be numbers
    declared = None
    if recipe.model.inputs:
        from orchestrator.model import TensorSpec

        declared = TensorSpec(recipe.model.inputs[0].name, recipe.model.inputs[0].dtype)
    for role in ("representative", "evaluation"):
        source = getattr(recipe.data, role)
        if source is None:
            continue
        try:
            check_source(source, loaded.base_dir, role, f"data.{role}", input_spec=declared)
        except Exception as exc:  # DataError: relocate it onto the recipe's line
            from orchestrator.errors import DataError

            if not isinstance(exc, DataError):
                raise
            field_loc: Loc = tuple(exc.field.split(".")) if exc.field else ("data", role)
            raise loaded.relocate(exc, field_loc) from exc
    for name, entries in loaded.stages.items():
        for index, (stage_name, params) in enumerate(entries):
            from orchestrator.stages import get_stage

            for param in get_stage(stage_name).file_params:
                value = getattr(params, param, None)
                problem = None if value is None else paths.path_problem(
                    loaded.resolve(value), "file")
                if problem:
                    shown = "file not found" if problem == "not found" else problem
                    raise loaded.error(f"{param}: {shown}: {loaded.resolve(value)}",
                                       ("pipelines", name, "stages", index, stage_name, param),
                                       RecipeError)
    loaded.devices()


def _recipe_path(path: str | Path) -> Path:
    """The recipe's absolute path, through symlinks when they resolve (a loop is reported
    when the file is read)."""
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return Path(os.path.abspath(path))
    # a link to something that is no recipe (/dev/zero): name the path the user gave
    return resolved if paths.path_problem(resolved, "file") is None else Path(
        os.path.abspath(path))


def load_recipe(path: str | Path, overrides: list[str] | None = None,
                check_files: bool = True) -> LoadedRecipe:
    """Load and validate a recipe completely. Raises RecipeError (or Model/DataError)."""
    path = _recipe_path(path) if str(path) != "-" else Path(path)
    located = load_yaml(path)
    try:
        data = apply_overrides(located.data, overrides or []) if overrides else located.data
    except RecipeError as exc:  # name the recipe the overrides apply to
        raise RecipeError(exc.message, file=str(path),
                          field=f"--set {exc.field}" if exc.field else "--set") from None
    if nesting_depth(data) > MAX_NESTING_DEPTH:
        raise RecipeError(f"with the --set overrides, the recipe nests deeper than the limit "
                          f"of {MAX_NESTING_DEPTH} levels", file=str(path), field="--set")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise pydantic_error(exc, path, located.marks, data=data) from exc
    check_names(recipe, path, located.marks)
    stages: dict[str, list[tuple[str, BaseModel]]] = {}
    for name, pipeline in recipe.pipelines.items():
        stages[name] = [parse_stage_entry(entry, ("pipelines", name, "stages", i), path,
                                          located.marks)
                        for i, entry in enumerate(pipeline.stages)]
    check_wiring(recipe, stages, path, located.marks)
    check_kinds(recipe, stages, path, located.marks)
    # after the checks, which locate stages by their YAML index (the added stage is valid
    # where it goes: a graphdef transform among graphdef transforms, needing nothing)
    added = add_default_stages(recipe, stages)
    loaded = LoadedRecipe(recipe=recipe, path=path, marks=located.marks, raw=data, stages=stages,
                          added=added)
    if check_files:
        _check_files(loaded)
    return loaded
