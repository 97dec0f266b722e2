"""Whole-recipe checks after pydantic's, each a RecipeError on the recipe's line: stage
entries (a known name, valid params), names (limits.name_problem), wiring (`from:` names a
pipeline without forming a cycle; each stage's required stages and data come earlier in its
lineage) and artifact kinds (each stage accepts what the one before it produces).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.errors import RecipeError
from orchestrator.limits import name_problem
from orchestrator.recipe_errors import Loc, make_error, pydantic_error
from orchestrator.recipe_models import Pipeline, Recipe


def parse_stage_entry(entry: Any, loc: Loc, path: Path,
                      marks: Mapping[Loc, tuple[int, int]]) -> tuple[str, BaseModel]:
    """'fold' or {'fold': {...}} -> (name, validated params). The name is checked first:
    `- nope: 3` is an unknown stage, whatever its params."""
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
    except KeyError:
        hint = suggest(name) or f"; stages are: {', '.join(STAGE_MODULES)}"
        raise make_error(RecipeError, f"unknown stage {name!r}{hint}", path, params_loc,
                         marks) from None
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise make_error(RecipeError, f"params of stage {name!r} must be a mapping, found "
                         f"{type(params).__name__}", path, params_loc, marks)
    try:
        return name, stage.params.model_validate(params)
    except ValidationError as exc:
        raise pydantic_error(exc, path, marks, params_loc, model=stage.params,
                              data=params) from exc


def lineage(pipelines: Mapping[str, Pipeline], name: str) -> list[str]:
    """[root, ..., name] following `from:`; assumes no cycles (checked first)."""
    chain = [name]
    while pipelines[chain[-1]].from_:
        chain.append(pipelines[chain[-1]].from_)  # type: ignore[arg-type]
    return chain[::-1]


def check_wiring(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]],
                 path: Path, marks: Mapping[Loc, tuple[int, int]]) -> None:
    """Each `from:` names a pipeline and forms no cycle; each stage finds the stages it
    requires earlier in its lineage, and the data it uses defined in the recipe."""
    from orchestrator.stages import get_stage

    for name, pipeline in recipe.pipelines.items():
        if pipeline.from_ is not None and pipeline.from_ not in recipe.pipelines:
            close = difflib.get_close_matches(pipeline.from_, list(recipe.pipelines), n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise make_error(RecipeError, f"from: names pipeline {pipeline.from_!r}, which does "
                             f"not exist{hint}; pipelines are: {', '.join(recipe.pipelines)}",
                             path, ("pipelines", name, "from"), marks)
    for name in recipe.pipelines:
        seen = [name]
        current = recipe.pipelines[name].from_
        while current is not None:
            if current in seen:
                cycle = " -> ".join([*seen, current])
                raise make_error(RecipeError, f"from: forms a cycle: {cycle}", path,
                                 ("pipelines", name, "from"), marks)
            seen.append(current)
            current = recipe.pipelines[current].from_
    for name in recipe.pipelines:
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
                    raise make_error(RecipeError, f"{stage_name} needs an earlier {required} in "
                                     f"the same lineage (pipeline {name!r} and its from: chain); "
                                     f"found before it: {', '.join(earlier) or 'nothing'}",
                                     path, loc, marks)
            because = stage.data_for(params) if stage.data_for is not None else {}
            for role in (*stage.uses_data, *because):
                if getattr(recipe.data, role) is None:
                    why = f" ({because[role]})" if role in because else ""
                    raise make_error(RecipeError, f"{stage_name} needs data.{role}{why}, "
                                     "which the recipe does not define", path, loc, marks)
            earlier.append(stage_name)



def check_kinds(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]],
                path: Path, marks: Mapping[Loc, tuple[int, int]]) -> None:
    """Each stage accepts the artifact kind it is given: walk every lineage from the source
    (a graphdef) through `from:`, tracking the kind and the stage that made it."""
    from orchestrator.stages import get_stage

    ends: dict[str, tuple[str, str]] = {}  # pipeline -> (kind, who made it)
    for name in recipe.pipelines:
        for pipeline in lineage(recipe.pipelines, name):
            if pipeline in ends:
                continue
            parent = recipe.pipelines[pipeline].from_
            kind, maker = ends[parent] if parent else ("graphdef", "the model source")
            for index, (stage_name, _) in enumerate(stages[pipeline]):
                stage = get_stage(stage_name)
                loc: Loc = ("pipelines", pipeline, "stages", index)
                if kind not in stage.accepts:
                    reason = stage.refuses.get(kind)
                    raise make_error(RecipeError, f"{stage_name} accepts "
                                     f"{' or '.join(sorted(stage.accepts))}; found {kind} "
                                     f"(made by {maker})" + (f": {reason}" if reason else ""),
                                     path, loc, marks)
                if stage.produces is not None and stage.produces != kind:
                    line, column = marks.get(loc, (None, None))
                    kind = stage.produces
                    maker = f"{stage_name} at {path}:{line}:{column}"
            ends[pipeline] = (kind, maker)


def check_names(recipe: Recipe, path: Path, marks: Mapping[Loc, tuple[int, int]]) -> None:
    """Names that become folders, Prefect runs and MLflow runs follow limits.name_problem."""
    named: list[tuple[Any, Loc]] = [(recipe.name, ("name",))]
    named += [(name, ("pipelines", name)) for name in recipe.pipelines]
    named += [(target.name, ("targets", i, "name")) for i, target in enumerate(recipe.targets)]
    for name, loc in named:
        problem = name_problem(name)
        if problem:
            raise make_error(RecipeError, problem, path, loc, marks)
