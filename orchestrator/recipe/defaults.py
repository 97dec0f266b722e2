"""Stages a recipe gets by default, without listing them: an 8-bit lineage (one with a
stage that `ships_compact_names`) ships compact node names, so the stage that
`compacts_names` goes after its last graphdef transform unless the lineage lists it or
keeps its names (`keep_names`); and a target's board (`connect:`) measures every pipeline
with the `per_board` stage. Which stages those are is a field of their `Stage` record.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from orchestrator.recipe.checks import lineage
from orchestrator.spec.models import Recipe
from orchestrator.stages import Stage, all_stages, get_stage


def _the_stage(role: str) -> Stage:
    """The one registered stage whose record sets the flag `role`."""
    found = [stage for stage in all_stages() if getattr(stage, role)]
    if len(found) != 1:
        raise RuntimeError(f"exactly one stage must set {role}, found {len(found)}")
    return found[0]


def compaction_stage() -> Stage:
    """Added after the last graphdef transform of an 8-bit lineage: the shipped names."""
    return _the_stage("compacts_names")


def board_stage() -> Stage:
    """Added at the end of every pipeline, once per target with `connect:`."""
    return _the_stage("per_board")


def _compaction_point(entries: list[tuple[str, BaseModel]], kind: str) -> int | None:
    """The index just after the last stage of `entries` that turns a graphdef into a
    graphdef (`kind` is what the pipeline starts from), or None if there is none."""
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
        if point is None or not any(get_stage(s).ships_compact_names for s in listed) \
                or any(get_stage(s).compacts_names for s in listed) or keeps_names(recipe, name):
            continue
        if any(points[other] is not None and name in lineage(recipe.pipelines, other)[:-1]
               for other in recipe.pipelines):
            continue  # a descendant transforms the graph further: it compacts instead
        added[name] = point
    return added


def add_default_stages(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]]
                       ) -> dict[str, list[int]]:
    """Insert the stages a recipe gets by default (the compaction, see default_compactions;
    the boards' measurements) into `stages`; returns pipeline -> the indices they got."""
    added = default_compactions(recipe, stages)
    compaction = compaction_stage()
    for name, index in added.items():
        stages[name].insert(index, (compaction.name, compaction.params()))
    indices = {name: [index] for name, index in added.items()}
    for name, index in add_device_measurements(recipe, stages).items():
        indices.setdefault(name, []).extend(index)
    return indices


def add_device_measurements(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]]
                            ) -> dict[str, list[int]]:
    """Every pipeline measured on every target's board (`connect:`), at its end, unless it
    lists measure_on_device for that target itself or keeps the target's board off
    (`measure_on_device: false`, or a list of the targets that measure it); a listed stage
    gets the target's URL."""
    connect = {t.name: t.connect for t in recipe.targets if t.connect is not None}
    board = board_stage()
    added: dict[str, list[int]] = {}
    for name, entries in stages.items():
        listed = set()
        for index, (stage, params) in enumerate(entries):
            if stage == board.name:
                target = getattr(params, "target", None)
                listed.add(target)
                if getattr(params, "connect", None) is None and target in connect:
                    entries[index] = (stage, params.model_copy(
                        update={"connect": connect[target]}))
        chosen = recipe.pipelines[name].measure_on_device if name in recipe.pipelines else None
        for target, url in connect.items():
            if target not in listed and (chosen in (None, True) or (
                    isinstance(chosen, list) and target in chosen)):
                entries.append((board.name, board.params(target=target, connect=url)))
                added.setdefault(name, []).append(len(entries) - 1)
    return added


def _emulated_has_tensorflow() -> bool | None:
    """Whether the emulated board built on this host carries TensorFlow (None: not built);
    read from its folder, without starting it."""
    import json

    from orchestrator.boards.emulated_board import board_folder

    try:
        facts = json.loads((board_folder() / "board.json").read_text())
    except (OSError, ValueError):
        return None
    return bool(facts.get("tensorflow"))


def board_limits(recipe: Recipe, stages: Mapping[str, list[tuple[str, BaseModel]]]
                 ) -> list[str]:
    """What `validate` says of the variants a target's board cannot run, known from the
    recipe alone: a memmapped package (no board runs one), a GraphDef where the board has
    no TensorFlow (the emulated board says so from its folder; an SSH board may have it).
    One line per board and reason, naming the pipelines and the way out."""
    import shlex

    from orchestrator.boards.measurement import prepare_command
    from orchestrator.boards.urls import DeviceURLError, parse_device_url

    kinds = shipped_kinds(recipe, stages)
    board_name = board_stage().name
    found: dict[tuple[str, str], list[str]] = {}
    for name, entries in stages.items():
        for stage, params in entries:
            where = getattr(params, "connect", None)
            if stage != board_name or where is None:
                continue
            try:
                url = parse_device_url(where)
            except DeviceURLError:
                continue  # check_connections said so at its line
            board = f"{params.target} ({shlex.quote(where)})"
            kind = kinds.get(name, ("graphdef", False))[0]
            if kind == "memmapped":
                why = ("cannot run {}: a memmapped package runs on no board (its graph is "
                       "measured in the pipeline before memmap)")
            elif kind == "graphdef" and url.emulated and _emulated_has_tensorflow() is False:
                why = ("cannot run {}: a GraphDef needs TensorFlow there, which it has not "
                       f"(`{prepare_command(where, 'tensorflow')}` adds it: 1.5 GB)")
            elif kind == "graphdef" and not url.emulated:
                why = ("runs {} only with TensorFlow there: a GraphDef (`orchestrator device "
                       f"check {shlex.quote(where)}` says if it has it; "
                       f"`{prepare_command(where, 'tensorflow')}` adds it)")
            else:
                continue
            found.setdefault((board, why), []).append(name)
    return [f"{board} {why.format(', '.join(names))}; `{board_name}: false` in a "
            "pipeline keeps the board off it" for (board, why), names in found.items()]
