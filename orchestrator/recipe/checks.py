"""Whole-recipe checks after pydantic's, each error a RecipeError on the recipe's line:
stage entries (a known name, valid params), names (limits.name_problem), `from:` (names a
pipeline without forming a cycle), wiring (each stage's required stages and data come
earlier in its lineage) and artifact kinds (each stage accepts what the one before it
produces). The checks return every error they find, as a compiler lists them; a check
skips what depends on an earlier error (a lineage through a broken pipeline).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.errors import RecipeError
from orchestrator.limits import name_problem
from orchestrator.spec.error_locations import Loc, collected, make_error, pydantic_errors
from orchestrator.spec.models import Pipeline, Recipe


def parse_stage_entry(entry: Any, loc: Loc, path: Path,
                      marks: Mapping[Loc, tuple[int, int]]) -> tuple[str, BaseModel]:
    """'fold' or {'fold': {...}} -> (name, validated params). The name is checked first:
    `- nope: 3` is an unknown stage, whatever its params. Every error of its params is
    reported (RecipeErrors when there are several)."""
    from orchestrator.stages import STAGE_MODULES, get_stage, suggest

    if isinstance(entry, str):
        name, params, params_loc = entry, {}, loc
    elif isinstance(entry, dict) and len(entry) == 1:
        name, params = next(iter(entry.items()))
        params_loc = (*loc, name)
    else:
        raise make_error(RecipeError, "a stage is a name or a one-key mapping of name to params",
                         path, loc, marks)
    try:
        stage = get_stage(name)
    except (KeyError, TypeError):  # TypeError: a name YAML made a list or mapping
        hint = suggest(str(name)) or f"; stages are: {', '.join(STAGE_MODULES)}"
        raise make_error(RecipeError, f"unknown stage {name!r}{hint}", path, params_loc,
                         marks) from None
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise make_error(RecipeError, f"params of stage {name!r} must be a mapping, found "
                         f"{type(params).__name__}", path, params_loc, marks)
    try:
        return name, stage.params.model_validate(params)
    except ValidationError as exc:
        raise collected(pydantic_errors(exc, path, marks, params_loc, model=stage.params,
                                        data=params), path) from exc  # type: ignore[misc]


def entry_as_written(entry: Any) -> tuple[str, BaseModel] | None:
    """A stage entry whose params did not validate, as its stage and its params as written
    (unchecked): the checks of stage order and kinds need only the stage's name, so a bad
    param does not hide the errors of the pipelines that follow. None when the name is no
    known stage or its params are no mapping."""
    from orchestrator.stages import get_stage

    if not isinstance(entry, dict) or len(entry) != 1:
        return None
    name, params = next(iter(entry.items()))
    try:
        stage = get_stage(name)
    except (KeyError, TypeError):
        return None
    if params is not None and not isinstance(params, dict):
        return None
    fields = stage.params.model_fields
    return name, stage.params.model_construct(**{k: v for k, v in (params or {}).items()
                                                 if k in fields})


def lineage(pipelines: Mapping[str, Pipeline], name: str) -> list[str]:
    """[root, ..., name] following `from:`; assumes no cycles (checked first)."""
    chain = [name]
    while pipelines[chain[-1]].from_:
        chain.append(pipelines[chain[-1]].from_)  # type: ignore[arg-type]
    return chain[::-1]


def check_from(recipe: Recipe, stages: Mapping[str, list[tuple[str, BaseModel]]], path: Path,
               marks: Mapping[Loc, tuple[int, int]], names: Collection[str] | None = None
               ) -> tuple[list[RecipeError], set[str]]:
    """Each `from:` names a pipeline (one of `names`, every pipeline the YAML has) and forms
    no cycle. Returns the errors, and the pipelines whose whole lineage the later checks
    can follow: every pipeline in it exists, is valid and has valid stages (in `stages`)."""
    errors: list[RecipeError] = []
    names = list(recipe.pipelines) if names is None else list(names)
    for name, pipeline in recipe.pipelines.items():
        if pipeline.from_ is not None and pipeline.from_ not in names:
            close = difflib.get_close_matches(pipeline.from_, names, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            errors.append(make_error(RecipeError, f"from: names pipeline {pipeline.from_!r}, "
                                     f"which does not exist{hint}; pipelines are: "
                                     f"{', '.join(names)}", path, ("pipelines", name, "from"),
                                     marks))
    sound: set[str] = set()
    cycles: set[str] = set()
    for name in recipe.pipelines:
        seen = [name]
        current = recipe.pipelines[name].from_
        while current is not None and current in recipe.pipelines and current not in seen:
            seen.append(current)
            current = recipe.pipelines[current].from_
        if current is not None and current in seen:
            cycle = seen[seen.index(current):] + [current]
            if current == name and not set(cycle) & cycles:  # once, at its first pipeline
                errors.append(make_error(RecipeError, f"from: forms a cycle: "
                                         f"{' -> '.join(cycle)}", path,
                                         ("pipelines", name, "from"), marks))
            cycles.update(cycle if current == name else [name])
        elif current is None and all(p in stages for p in seen):
            sound.add(name)
    return errors, sound - cycles


def check_wiring(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]],
                 path: Path, marks: Mapping[Loc, tuple[int, int]],
                 sound: Collection[str] | None = None,
                 defined: Collection[str] | None = None) -> list[RecipeError]:
    """Each stage finds the stages it requires earlier in its lineage, and the data it uses
    defined in the recipe (`defined`: the data roles the YAML defines). Only the pipelines
    in `sound` (see check_from) are checked: every error is returned."""
    from orchestrator.stages import get_stage

    errors: list[RecipeError] = []
    sound = recipe.pipelines if sound is None else sound
    if defined is None:
        defined = [r for r in ("representative", "evaluation")
                   if getattr(recipe.data, r) is not None]
    for name in recipe.pipelines:
        if name not in sound:
            continue
        earlier: list[str] = []
        for ancestor in lineage(recipe.pipelines, name)[:-1]:
            earlier += [s for s, _ in stages[ancestor]]
        for index, (stage_name, params) in enumerate(stages[name]):
            stage = get_stage(stage_name)
            loc: Loc = ("pipelines", name, "stages", index)
            waived = stage.requires_unless is not None and getattr(
                params, stage.requires_unless, None) is not None
            for required in () if waived else stage.requires:
                if required not in earlier:
                    errors.append(make_error(
                        RecipeError, f"{stage_name} needs an earlier {required} in the same "
                        f"lineage (pipeline {name!r} and its from: chain); found before it: "
                        f"{', '.join(earlier) or 'nothing'}", path, loc, marks))
            because = stage.data_for(params) if stage.data_for is not None else {}
            for role in (*stage.uses_data, *because):
                if role not in defined:
                    why = f" ({because[role]})" if role in because else ""
                    errors.append(make_error(RecipeError, f"{stage_name} needs data.{role}"
                                             f"{why}, which the recipe does not define", path,
                                             loc, marks))
            earlier.append(stage_name)
    return errors


def check_kinds(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]],
                path: Path, marks: Mapping[Loc, tuple[int, int]],
                sound: Collection[str] | None = None) -> list[RecipeError]:
    """Each stage accepts the artifact kind it is given: walk every lineage (of the
    pipelines in `sound`) from the source (a graphdef) through `from:`, tracking the kind
    and the stage that made it. A lineage stops at its first mismatch (what follows
    depends on it); other lineages go on."""
    from orchestrator.stages import get_stage

    errors: list[RecipeError] = []
    ends: dict[str, tuple[str, str] | None] = {}  # pipeline -> (kind, who made it); None: bad
    for name in recipe.pipelines:
        if sound is not None and name not in sound:
            continue
        for pipeline in lineage(recipe.pipelines, name):
            if pipeline in ends:
                continue
            parent = recipe.pipelines[pipeline].from_
            start = ends[parent] if parent else ("graphdef", "the model source")
            if start is None:
                ends[pipeline] = None
                continue
            kind, maker = start
            for index, (stage_name, _) in enumerate(stages[pipeline]):
                stage = get_stage(stage_name)
                loc: Loc = ("pipelines", pipeline, "stages", index)
                if kind not in stage.accepts:
                    reason = stage.refuses.get(kind)
                    errors.append(make_error(
                        RecipeError, f"{stage_name} accepts {' or '.join(sorted(stage.accepts))}"
                        f"; found {kind} (made by {maker})" + (f": {reason}" if reason else ""),
                        path, loc, marks))
                    break
                if stage.produces is not None and stage.produces != kind:
                    line, column = marks.get(loc, (None, None))
                    kind = stage.produces
                    maker = f"{stage_name} at {path}:{line}:{column}"
            else:
                ends[pipeline] = (kind, maker)
                continue
            ends[pipeline] = None
    return errors


def check_names(recipe: Recipe, path: Path, marks: Mapping[Loc, tuple[int, int]],
                parts: Collection[str] | None = None) -> list[RecipeError]:
    """Names that become folders, Prefect runs and MLflow runs follow limits.name_problem
    (of the recipe's `parts` that validated: all by default)."""
    named: list[tuple[Any, Loc]] = []
    if parts is None or "name" in parts:
        named.append((recipe.name, ("name",)))
    if parts is None or "pipelines" in parts:
        named += [(name, ("pipelines", name)) for name in recipe.pipelines]
    if parts is None or "targets" in parts:
        named += [(target.name, ("targets", i, "name"))
                  for i, target in enumerate(recipe.targets)]
    return [make_error(RecipeError, problem, path, loc, marks) for name, loc in named
            if (problem := name_problem(name))]


def check_connections(recipe: Recipe, stages: Mapping[str, list[tuple[str, BaseModel]]],
                      path: Path, marks: Mapping[Loc, tuple[int, int]],
                      parts: Collection[str] | None = None) -> list[RecipeError]:
    """Each target's `connect:` is a device URL we can use; each measure_on_device stage
    names a target that has one; a pipeline's `measure_on_device:` names only such targets
    and does not contradict its stages. Of the recipe's `parts` that validated (all by
    default): the pipelines' checks run with or without the targets, those naming a target
    only where the targets validated (else which have a board is not known)."""
    from orchestrator.boards.urls import DeviceURLError, parse_device_url

    errors: list[RecipeError] = []
    targets_known = parts is None or "targets" in parts
    connected = []
    for index, target in enumerate(recipe.targets if targets_known else ()):
        if target.connect is None:
            continue
        try:
            parse_device_url(target.connect)
            connected.append(target.name)
        except DeviceURLError as exc:
            errors.append(make_error(RecipeError, str(exc), path,
                                     ("targets", index, "connect"), marks))
    pipelines = recipe.pipelines if parts is None or "pipelines" in parts else {}
    for name, pipeline in pipelines.items():  # `measure_on_device:` of a pipeline
        chosen = pipeline.measure_on_device
        unknown = [t for t in chosen if t not in connected] \
            if isinstance(chosen, list) and targets_known else []
        listed = [i for i, (s, _) in enumerate(stages.get(name, [])) if s == "measure_on_device"]
        if unknown:
            errors.append(make_error(
                RecipeError, f"measure_on_device: {', '.join(map(repr, unknown))}: no "
                "such target with a board (" + (f"targets with connect: {', '.join(connected)}"
                                            if connected else "no target has connect:") + ")",
                path, ("pipelines", name, "measure_on_device"), marks))
        elif chosen is False and listed:
            errors.append(make_error(
                RecipeError, "measure_on_device: false, but the pipeline lists a "
                "measure_on_device stage: remove one or the other", path,
                ("pipelines", name, "stages", listed[0]), marks))
    for name, found in stages.items() if targets_known else ():
        for index, (stage, params) in enumerate(found):
            target = getattr(params, "target", None)
            if stage == "measure_on_device" and target not in connected and getattr(
                    params, "connect", None) is None:
                have = (f"targets with connect: {', '.join(connected)}" if connected else
                        "no target has connect:")
                errors.append(make_error(
                    RecipeError, f"measure_on_device measures on target {target!r}'s board, "
                    f"but it has no connect: URL ({have})", path,
                    ("pipelines", name, "stages", index), marks))
    return errors


def check_variants(loaded: Any, variants: Iterable[str] | None) -> None:
    """`--variant NAME` names a pipeline of the loaded recipe: else exit 2 (RecipeError)
    naming it, the recipe's pipelines and the closest one."""
    from orchestrator.formatting import unknown_name_message

    pipelines = loaded.recipe.pipelines
    for name in variants or ():
        if name not in pipelines:
            raise RecipeError(unknown_name_message("variant", name, pipelines),
                              file=str(loaded.path), field="--variant")
