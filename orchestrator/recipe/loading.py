"""Recipe loading, the entry point: `load_recipe` reads the YAML with line/column for every
field (spec/yaml_reader.py), applies `--set` overrides, and validates the whole recipe before
anything runs: its shape (pydantic, errors by spec/error_locations.py), stage names and params,
names, wiring and kinds (recipe/checks.py), then adds the stages a recipe gets by default
(recipe/defaults.py) and checks the files it names. `LoadedRecipe` is what it returns.

The names other modules imported from here before the split are re-exported.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ValidationError

from orchestrator import paths
from orchestrator.errors import OrchestratorError, RecipeError
from orchestrator.limits import MAX_NESTING_DEPTH
from orchestrator.recipe.checks import (
    check_connections,
    check_from,
    check_kinds,
    check_names,
    check_wiring,
    entry_as_written,
    lineage,
    parse_stage_entry,
)
from orchestrator.recipe.defaults import (
    add_default_stages,
    default_compactions,
    keeps_names,
)
from orchestrator.spec.error_locations import (
    Loc,
    RecipeErrors,
    collected,
    dotted,
    make_error,
    pydantic_errors,
)
from orchestrator.spec.models import Recipe
from orchestrator.spec.yaml_reader import (
    Located,
    apply_overrides,
    check_yaml_bounds,
    load_yaml,
    nesting_depth,
)

if TYPE_CHECKING:
    from orchestrator.spec.devices import Device

__all__ = ["LoadedRecipe", "Loc", "Located",
           "RecipeErrors",
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
        from orchestrator.spec.devices import resolve_device

        devices = {}
        for index, target in enumerate(self.recipe.targets):
            try:
                device = resolve_device(target.device)
            except ValueError as exc:
                raise self.error(str(exc), ("targets", index, "device")) from exc
            if target.threads is not None:
                if target.threads > device.cores:
                    raise self.error(too_many_threads(target.threads, device),
                                     ("targets", index, "threads"))
                device = device.model_copy(update={"threads": target.threads})
            devices[target.name] = device
        return devices

    def relocate(self, exc: OrchestratorError, loc: Loc, prefix: str = "") -> Any:
        """`exc` (of the same class) moved onto the recipe field `loc`, keeping the file it
        was about (a broken .npz, a model) in the message."""
        where = exc.location() if exc.file and exc.file != str(self.path) else ""
        if where and Path(exc.file or "").name in exc.message:
            where = ""  # the message names the file already
        message = f"{prefix}{where}: {exc.message}" if where else f"{prefix}{exc.message}"
        return make_error(type(exc), message, self.path, self.yaml_loc(loc), self.marks)


def _check_files(loaded: LoadedRecipe, parts: Collection[str] | None = None,
                 stage_files: Mapping[str, list[tuple[int, str, BaseModel]]] | None = None
                 ) -> list[OrchestratorError]:
    """The model path and data sources exist (cheap checks; shapes are checked at run), the
    files stages name, and each target's device. Every problem is returned. `parts`: the
    recipe's top-level fields that validated (all by default); `stage_files`: pipeline ->
    [(index in the YAML, stage, params)] when the stages were not all valid."""
    from orchestrator.data import check_source
    from orchestrator.errors import DataError, ModelSourceError

    errors: list[OrchestratorError] = []
    recipe = loaded.recipe
    if parts is None or "model" in parts:
        model_path = loaded.resolve(recipe.model.path)
        problem = paths.path_problem(model_path, "file_or_dir")
        # a TF1 checkpoint may be named by its prefix (model.ckpt -> model.ckpt.index, ...)
        if problem == "not found" and "\0" not in str(model_path) and any(
                model_path.parent.glob(glob.escape(model_path.name) + ".*")):
            problem = None
        if problem:
            message = ("model path does not exist" if problem == "not found"
                       else f"cannot read the model path: {problem}")
            errors.append(loaded.error(f"{message}: {model_path}", ("model", "path"),
                                       ModelSourceError))
        elif model_path.is_dir() and recipe.model.format == "auto":  # cheap: names, no TF
            from orchestrator.model.sources import detect_format

            try:
                detect_format(model_path)
            except ModelSourceError as exc:
                errors.append(loaded.relocate(exc, ("model", "path")))
    # a declared input's dtype (only: shapes are checked at run, against the model) lets a
    # string-input model take string arrays; otherwise data must be numbers
    declared = None
    if (parts is None or "model" in parts) and recipe.model.inputs:
        from orchestrator.model.artifact import TensorSpec

        declared = TensorSpec(recipe.model.inputs[0].name, recipe.model.inputs[0].dtype)
    for role in ("representative", "evaluation") if parts is None or "data" in parts else ():
        source = getattr(recipe.data, role)
        if source is None:
            continue
        try:
            check_source(source, loaded.base_dir, role, f"data.{role}", input_spec=declared)
        except DataError as exc:  # relocate it onto the recipe's line
            field_loc: Loc = tuple(exc.field.split(".")) if exc.field else ("data", role)
            errors.append(loaded.relocate(exc, field_loc))
    if stage_files is None:
        stage_files = {name: [(i, stage, params) for i, (stage, params) in enumerate(entries)]
                       for name, entries in loaded.stages.items()}
    for name, entries in stage_files.items():
        for index, stage_name, params in entries:
            from orchestrator.stages import get_stage

            for param in get_stage(stage_name).file_params:
                value = getattr(params, param, None)
                problem = None if value is None else paths.path_problem(
                    loaded.resolve(value), "file")
                if problem:
                    shown = "file not found" if problem == "not found" else problem
                    errors.append(loaded.error(
                        f"{param}: {shown}: {loaded.resolve(value)}",
                        ("pipelines", name, "stages", index, stage_name, param), RecipeError))
    from orchestrator.spec.devices import Device, resolve_device

    # preset names as written: a target with another bad field (a budget's typo) still has
    # its device checked in the same run
    raw_targets = loaded.raw.get("targets") if isinstance(loaded.raw, dict) else None
    for index, target in enumerate(raw_targets if isinstance(raw_targets, list) else []):
        device = target.get("device") if isinstance(target, dict) else None
        if isinstance(device, dict) and isinstance(device.get("cores"), int):
            resolved = Device.model_construct(**device)  # an inline spec: pydantic checked it
        elif not isinstance(device, str):
            continue
        else:
            try:
                resolved = resolve_device(device)
            except ValueError as exc:
                errors.append(loaded.error(str(exc), ("targets", index, "device")))
                continue
        threads = target.get("threads")
        if isinstance(threads, int) and threads > resolved.cores:
            errors.append(loaded.error(too_many_threads(threads, resolved),
                                       ("targets", index, "threads")))
    return errors


def too_many_threads(threads: int, device: Any) -> str:
    """Why a target's `threads:` is refused: more than its device's cores."""
    return (f"threads: {threads} is more than the {device.cores} cores of "
            f"{device.name or 'this device'}: threads beyond its cores only share them")


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
    """Load and validate a recipe completely. Every independent error is reported at once
    (RecipeErrors, sorted by line, when there are several); one error is raised as itself
    (RecipeError, ModelSourceError or DataError)."""
    path = _recipe_path(path) if str(path) != "-" else Path(path)
    try:
        located = load_yaml(path)
    except RecipeError as exc:
        if exc.line is None:  # unreadable, empty: nothing to say about its contents
            raise
        raise RecipeErrors([exc], str(path), note="the rest of the recipe is checked once "
                           "its YAML parses") from None
    try:
        data = apply_overrides(located.data, overrides or []) if overrides else located.data
    except RecipeError as exc:  # name the recipe the overrides apply to
        raise RecipeError(exc.message, file=str(path),
                          field=f"--set {exc.field}" if exc.field else "--set") from None
    if nesting_depth(data) > MAX_NESTING_DEPTH:
        raise RecipeError(f"with the --set overrides, the recipe nests deeper than the limit "
                          f"of {MAX_NESTING_DEPTH} levels", file=str(path), field="--set")
    marks = located.marks
    errors: list[OrchestratorError] = []
    try:
        recipe = Recipe.model_validate(data)
        parts: set[str] | None = None
    except ValidationError as exc:
        errors += pydantic_errors(exc, path, marks, data=data)
        recipe, parts = _partial_recipe(data, exc)
    # stage entries, each on its own: a bad one leaves its pipeline out of what follows
    entries: dict[str, list[tuple[int, str, BaseModel]]] = {}
    broken: set[str] = set()
    as_written: set[tuple[str, int]] = set()  # bad params: no file of theirs is checked
    for name, pipeline in recipe.pipelines.items() if _has(parts, "pipelines") else ():
        entries[name] = []
        for i, entry in enumerate(pipeline.stages):
            try:
                entries[name].append((i, *parse_stage_entry(
                    entry, ("pipelines", name, "stages", i), path, marks)))
            except RecipeError as exc:
                errors.append(exc)
                written = entry_as_written(entry)
                if written is None:
                    broken.add(name)
                else:  # its params are bad, its place in the pipeline is known
                    entries[name].append((i, *written))
                    as_written.add((name, i))
    stages = {name: [(stage, params) for _, stage, params in found]
              for name, found in entries.items() if name not in broken}
    if _has(parts, "name") or _has(parts, "pipelines") or _has(parts, "targets"):
        errors += check_names(recipe, path, marks, parts)
    if _has(parts, "pipelines") or _has(parts, "targets"):
        errors += check_connections(recipe, stages, path, marks, parts)
    deferred: list[str] = list(data["pipelines"]) if isinstance(data.get("pipelines"),
                                                                  dict) else []
    if _has(parts, "pipelines"):
        found_from, sound = check_from(recipe, stages, path, marks, deferred or None)
        errors += found_from
        raw_data = data.get("data") if isinstance(data.get("data"), dict) else {}
        defined = [r for r in ("representative", "evaluation") if raw_data.get(r) is not None]
        errors += check_wiring(recipe, stages, path, marks, sound, defined)
        errors += check_kinds(recipe, stages, path, marks, sound)
        deferred = [name for name in deferred if name not in sound]
    # a lineage through a bad stage or `from:` is not checked further (its errors would
    # follow from that one): say so
    note = (f"the stage order of pipeline{'s' if len(deferred) > 1 else ''} "
            f"{', '.join(map(str, deferred))} is checked once "
            f"{'these are' if len(errors) > 1 else 'this is'} fixed"
            if deferred and errors else None)
    if errors or parts is not None:
        # no default stages on a recipe with errors: the files are checked as written
        loaded = LoadedRecipe(recipe=recipe, path=path, marks=marks, raw=data, stages=stages)
        if check_files:
            checked = {name: [e for e in found if (name, e[0]) not in as_written]
                       for name, found in entries.items()}
            errors += _check_files(loaded, parts, checked)
        raise collected(errors, path, note)  # type: ignore[misc]
    # after the checks, which locate stages by their YAML index (the added stage is valid
    # where it goes: a graphdef transform among graphdef transforms, needing nothing)
    added = add_default_stages(recipe, stages)
    loaded = LoadedRecipe(recipe=recipe, path=path, marks=marks, raw=data, stages=stages,
                          added=added)
    if check_files:
        found_files = _check_files(loaded)
        if found_files:
            raise collected(found_files, path)  # type: ignore[misc]
    return loaded


def _has(parts: Collection[str] | None, name: str) -> bool:
    return parts is None or name in parts


def _partial_recipe(data: dict[str, Any], exc: ValidationError) -> tuple[Recipe, set[str]]:
    """A Recipe (not validated as a whole) of the parts of `data` that are valid on their
    own, and the names of those top-level fields: the later checks run on them, so that
    errors independent of pydantic's are reported in the same run. A field with errors
    inside some of its mapping's keys (a pipeline, a data role, a model key) is kept
    without those keys when the rest validates alone."""
    from pydantic import TypeAdapter

    bad: dict[str, set[Any]] = {}
    for err in exc.errors():
        loc = err["loc"]
        if loc:
            bad.setdefault(str(loc[0]), set()).add(loc[1] if len(loc) > 1 else None)
    values: dict[str, Any] = {}
    for name, info in Recipe.model_fields.items():
        key = info.alias or name
        if key not in data:
            continue
        value = data[key]
        if key in bad:
            if None in bad[key] or not isinstance(value, dict):
                continue
            value = {k: v for k, v in value.items() if k not in bad[key]}
        try:
            # the field's constraints (lengths...), not its FieldInfo: an alias there means
            # nothing to a TypeAdapter, and pydantic warns about it on every call
            field_type = (Annotated[(info.annotation, *info.metadata)]  # type: ignore[valid-type]
                          if info.metadata else info.annotation)
            values[name] = TypeAdapter(field_type).validate_python(value)
        except ValidationError:
            continue
    recipe = Recipe.model_construct(**values)
    for name, info in Recipe.model_fields.items():  # absent fields get their defaults
        if name not in values and not info.is_required() and (info.alias or name) not in data:
            values[name] = getattr(recipe, name)
    return recipe, set(values)
