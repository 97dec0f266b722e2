"""Stages a recipe gets by default, without listing them: an 8-bit lineage (one with
quantize_nodes) ships compact node names, so `compact_names` goes after its last graphdef
transform unless the lineage lists it or keeps its names (`keep_names`).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from orchestrator.recipe.checks import lineage
from orchestrator.spec.models import Recipe

# Added after the last graphdef transform of an 8-bit lineage: the shipped file's names.
DEFAULT_COMPACTION = "compact_names"
# Added at the end of every pipeline, once per target with `connect:`.
DEVICE_STAGE = "measure_on_device"
# What makes a lineage one that ships compact names by default.
COMPACTED_AFTER = "quantize_nodes"


def _compaction_point(entries: list[tuple[str, BaseModel]], kind: str) -> int | None:
    """The index just after the last stage of `entries` that turns a graphdef into a
    graphdef (`kind` is what the pipeline starts from), or None if there is none."""
    from orchestrator.stages import get_stage

    point = None
    for index, (name, _) in enumerate(entries):
        stage = get_stage(name)
        if stage.kind == "transform" and kind == "graphdef" and stage.produces in (
                None, "graphdef"):
            point = index + 1
        kind = stage.produces or kind
    return point


def _start_kinds(recipe: Recipe, stages: Mapping[str, list[tuple[str, BaseModel]]]
                 ) -> dict[str, str]:
    """The artifact kind each pipeline starts from (the source is a graphdef)."""
    from orchestrator.stages import get_stage

    starts: dict[str, str] = {}
    ends: dict[str, str] = {}
    for name in recipe.pipelines:
        for pipeline in lineage(recipe.pipelines, name):
            if pipeline in ends:
                continue
            parent = recipe.pipelines[pipeline].from_
            kind = starts[pipeline] = ends[parent] if parent else "graphdef"
            for stage_name, _ in stages[pipeline]:
                kind = get_stage(stage_name).produces or kind
            ends[pipeline] = kind
    return starts


def shipped_kinds(recipe: Recipe, stages: Mapping[str, list[tuple[str, BaseModel]]]
                  ) -> dict[str, tuple[str, bool]]:
    """Per pipeline, the kind of the file it ships and whether it is encrypted (then the
    kind inside): what a board needs to run it."""
    from orchestrator.stages import get_stage

    starts = _start_kinds(recipe, stages)
    shipped: dict[str, tuple[str, bool]] = {}
    for name in recipe.pipelines:
        kind, inner = starts.get(name, "graphdef"), None
        for stage_name, _ in stages.get(name, []):
            made = get_stage(stage_name).produces
            if made == "encrypted" and kind != "encrypted":
                inner = kind
            kind = made or kind
        shipped[name] = (inner, True) if kind == "encrypted" and inner else (kind, False)
    return shipped


def keeps_names(recipe: Recipe, pipeline: str) -> bool:
    """`keep_names` as it applies to `pipeline`: its own, else its nearest ancestor's."""
    for name in reversed(lineage(recipe.pipelines, pipeline)):
        if recipe.pipelines[name].keep_names is not None:
            return bool(recipe.pipelines[name].keep_names)
    return False


def default_compactions(recipe: Recipe, stages: Mapping[str, list[tuple[str, BaseModel]]]
                        ) -> dict[str, int]:
    """Where compact_names goes by default: pipeline -> index to insert it at.

    A lineage with quantize_nodes ships compact names: its last pipeline to transform the
    graph gets compact_names after its last graphdef transform, so that it comes after
    freeze_ranges (whose diagnostics, like the accuracy guard, match nodes by their float
    names) and before memmap or encrypt. Not where the lineage lists compact_names itself,
    where keep_names is true, or where a `from:` child transforms the graph further (it
    looks nodes up by name: the child gets compact_names then).
    """
    starts = _start_kinds(recipe, stages)
    points = {name: _compaction_point(stages[name], starts[name]) for name in recipe.pipelines}
    added: dict[str, int] = {}
    for name in recipe.pipelines:
        chain = lineage(recipe.pipelines, name)
        listed = [s for p in chain for s, _ in stages[p]]
        point = points[name]
        if point is None or COMPACTED_AFTER not in listed or DEFAULT_COMPACTION in listed \
                or keeps_names(recipe, name):
            continue
        if any(points[other] is not None and name in lineage(recipe.pipelines, other)[:-1]
               for other in recipe.pipelines):
            continue  # a descendant transforms the graph further: it compacts instead
        added[name] = point
    return added


def add_default_stages(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]]
                       ) -> dict[str, list[int]]:
    """Insert the stages a recipe gets by default (compact_names, see default_compactions)
    into `stages`; returns pipeline -> the indices they got."""
    from orchestrator.stages import get_stage

    added = default_compactions(recipe, stages)
    for name, index in added.items():
        stages[name].insert(index, (DEFAULT_COMPACTION, get_stage(DEFAULT_COMPACTION).params()))
    indices = {name: [index] for name, index in added.items()}
    for name, index in add_device_measurements(recipe, stages).items():
        indices.setdefault(name, []).extend(index)
    return indices


def add_device_measurements(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]]
                            ) -> dict[str, list[int]]:
    """Every pipeline measured on every target's board (`connect:`), at its end, unless it
    lists measure_on_device for that target itself; a listed one gets the target's URL."""
    from orchestrator.stages import get_stage

    connect = {t.name: t.connect for t in recipe.targets if t.connect is not None}
    params_type = get_stage(DEVICE_STAGE).params
    added: dict[str, list[int]] = {}
    for name, entries in stages.items():
        listed = set()
        for index, (stage, params) in enumerate(entries):
            if stage == DEVICE_STAGE:
                target = getattr(params, "target", None)
                listed.add(target)
                if getattr(params, "connect", None) is None and target in connect:
                    entries[index] = (stage, params.model_copy(
                        update={"connect": connect[target]}))
        for target, url in connect.items():
            if target not in listed:
                entries.append((DEVICE_STAGE, params_type(target=target, connect=url)))
                added.setdefault(name, []).append(len(entries) - 1)
    return added
