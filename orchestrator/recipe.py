"""Recipe loading: YAML with line/column for every field, `--set` overrides, and validation
of the whole recipe (shape, stage names and params, wiring) before anything runs."""

from __future__ import annotations

import difflib
import glob
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator import paths
from orchestrator.errors import OrchestratorError, RecipeError
from orchestrator.limits import (
    MAX_NESTING_DEPTH,
    MAX_RECIPE_BYTES,
    MAX_YAML_NODES,
    name_problem,
)
from orchestrator.recipe_models import Pipeline, Recipe

if TYPE_CHECKING:
    from orchestrator.devices import Device

Loc = tuple[str | int, ...]


@dataclass
class Located:
    """YAML data plus the (line, column) of every key and value, by dotted path."""

    data: Any
    marks: dict[Loc, tuple[int, int]] = field(default_factory=dict)


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


def dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)


def make_error(cls: type, message: str, path: Path | str, loc: Loc,
               marks: Mapping[Loc, tuple[int, int]]) -> Any:
    """An error located at the deepest part of `loc` that has a YAML mark."""
    for depth in range(len(loc), -1, -1):
        if loc[:depth] in marks:
            line, column = marks[loc[:depth]]
            return cls(message, file=str(path), line=line, column=column,
                       field=dotted(loc) or None)
    return cls(message, file=str(path), field=dotted(loc) or None)


# ---------------------------------------------------------------- YAML with marks


def _construct(node: yaml.Node, loc: Loc, marks: dict[Loc, tuple[int, int]], path: Path) -> Any:
    marks.setdefault(loc, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                found = "a list" if isinstance(key_node, yaml.SequenceNode) else "a mapping"
                raise RecipeError(f"a key must be a plain name, found {found}",
                                  file=str(path), line=key_node.start_mark.line + 1,
                                  column=key_node.start_mark.column + 1, field=dotted(loc))
            key = _scalar(key_node)
            if key == "<<":
                raise make_error(RecipeError, "YAML merge keys are not supported", path, loc,
                                 marks)
            if key in result:
                raise RecipeError(f"duplicate key {key!r}", file=str(path),
                                  line=key_node.start_mark.line + 1,
                                  column=key_node.start_mark.column + 1,
                                  field=dotted((*loc, key)))
            child = (*loc, key)
            marks[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            result[key] = _construct(value_node, child, marks, path)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, (*loc, i), marks, path) for i, item in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    return yaml.SafeLoader("").construct_object(node, deep=True)


def check_yaml_bounds(text: str, where: str, line_offset: int = 0) -> None:
    """Refuse YAML that nests deeper than MAX_NESTING_DEPTH or expands (aliases included)
    to more than MAX_YAML_NODES, before it is composed: the composer recurses per level
    and expands every alias, so a few thousand `[` or an alias bomb would crash or hang
    it. The event stream that this walks is produced without recursion."""
    depth = total = 0
    sizes: dict[str, int] = {}  # anchor -> nodes it expands to
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, total when it started)

    def fail(message: str, event: yaml.Event) -> RecipeError:
        mark = event.start_mark
        return RecipeError(message, file=where, line=mark.line + 1 + line_offset,
                           column=mark.column + 1)

    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                total += sizes.get(event.anchor, 1)
            elif isinstance(event, yaml.ScalarEvent):
                total += 1
                if event.anchor:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.CollectionStartEvent):
                total += 1
                depth += 1
                if depth > MAX_NESTING_DEPTH:
                    raise fail(f"nesting deeper than the limit of {MAX_NESTING_DEPTH} levels "
                               "of mappings and lists", event)
                open_nodes.append((event.anchor, total - 1))
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                anchor, start = open_nodes.pop()
                if anchor:
                    sizes[anchor] = total - start
            if total > MAX_YAML_NODES:
                raise fail(f"more than {MAX_YAML_NODES:,} values once YAML aliases are "
                           "expanded (an alias bomb?)", event)
    except yaml.YAMLError:
        return  # a syntax error: composing reports it, with its line


def _compose(text: str, where: str) -> yaml.Node | None:
    """The YAML node tree of `text`, within the limits; YAML errors become RecipeErrors."""
    check_yaml_bounds(text, where)
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise RecipeError(f"YAML syntax error: {problem}", file=where,
                          line=mark.line + 1 if mark else None,
                          column=mark.column + 1 if mark else None) from exc
    except yaml.YAMLError as exc:
        raise RecipeError(f"YAML error: {exc}", file=where) from exc


def load_yaml(path: Path) -> Located:
    """Parse YAML, recording line/column of every node. YAML errors become RecipeErrors.
    The recipe is read as a regular file of at most MAX_RECIPE_BYTES."""
    try:
        raw = paths.read_regular_file(path, MAX_RECIPE_BYTES)
    except ValueError as exc:
        raise RecipeError(f"cannot read the recipe: {exc}", file=str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"the recipe is not UTF-8 text: {exc}", file=str(path)) from None
    node = _compose(text, str(path))
    if node is None:
        raise RecipeError("the recipe is empty", file=str(path))
    marks: dict[Loc, tuple[int, int]] = {}
    try:
        data = _construct(node, (), marks, path)
    except yaml.YAMLError as exc:
        raise RecipeError(f"YAML error: {exc}", file=str(path)) from exc
    if not isinstance(data, dict):
        raise RecipeError(f"a recipe is a mapping of keys, found {type(data).__name__}",
                          file=str(path), line=1, column=1)
    return Located(data, marks)


def _safe_load_value(text: str, where: str, field: str) -> Any:
    """A `--set` value: YAML within the recipe's limits."""
    try:
        node = _compose(text, where)
    except RecipeError as exc:
        raise RecipeError(f"value is not valid YAML: {exc.message}", file=where,
                          field=field) from None
    if node is None:
        return None
    try:
        return yaml.SafeLoader("").construct_document(node)
    except yaml.YAMLError as exc:
        raise RecipeError(f"value is not valid YAML: {exc}", file=where,
                          field=field) from exc


# ---------------------------------------------------------------- --set overrides


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a copy of `data`."""
    import copy

    result = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw_value = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"--set expects key.path=value, found {item!r}", file="--set")
        key = key.strip()
        value = _safe_load_value(raw_value, "--set", key) if raw_value.strip() else ""
        parts = key.split(".")
        if len(parts) > MAX_NESTING_DEPTH:
            raise RecipeError(f"a key path has at most {MAX_NESTING_DEPTH} parts, found "
                              f"{len(parts)}", file="--set", field=key[:80] + "...")
        target: Any = result
        for i, part in enumerate(parts[:-1]):
            if isinstance(target, list):
                target = target[_index(part, target, key)]
            elif isinstance(target, dict):
                if target.get(part) is None:
                    target[part] = [] if parts[i + 1].isdigit() else {}
                target = target[part]
            else:
                raise _not_container(key, parts[:i], parts[i], target)
        last = parts[-1]
        if isinstance(target, list):
            target[_index(last, target, key)] = value
        elif isinstance(target, dict):
            target[last] = value
        else:
            raise _not_container(key, parts[:-1], last, target)
    return result


def _not_container(key: str, parent: list[str], child: str, value: Any) -> RecipeError:
    """`--set a.b.c=...` where `a.b` holds a scalar: it has no `c` to set."""
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return RecipeError(f"{'.'.join(parent)!r} is {shown} ({type(value).__name__}),"
                       f" not a mapping or list, so it has no {child!r}", file="--set",
                       field=key)


def _index(part: str, target: list[Any], key: str) -> int:
    if not part.isdigit() or int(part) >= len(target):
        raise RecipeError(f"{part!r} is not an index of a list of {len(target)}",
                          file="--set", field=key)
    return int(part)


# ---------------------------------------------------------------- validation


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation may hold (through Optional, list, dict, unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    if get_origin(annotation) in (Union, list, dict, tuple) or get_args(annotation):
        for arg in get_args(annotation):
            yield from _models_in(arg)


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The pydantic model class found at `loc` inside a Recipe, for 'did you mean'."""
    model: type[BaseModel] | None = Recipe
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int) or part not in model.model_fields and not any(
                f.alias == part for f in model.model_fields.values()):
            # list index or dict key: stay on the container's element model
            continue
        info = next(f for n, f in model.model_fields.items() if n == part or f.alias == part)
        candidates = list(_models_in(info.annotation))
        model = candidates[0] if candidates else None
    return model


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items()]


def _is_type_mismatch(err: Mapping[str, Any], depth: int) -> bool:
    """Whether `err` says a union branch (whose tag is at loc[depth - 1]) does not accept the
    input's type at all, rather than finding something wrong inside a value of its type."""
    kind = str(err["type"])
    return len(err["loc"]) == depth and (
        kind.endswith(("_type", "_parsing")) or kind in ("literal_error", "is_instance_of"))


_NO_DATA: Any = object()


def _tags(err: Mapping[str, Any], data: Any) -> list[bool]:
    """For each part of a pydantic error's loc: True for a union branch tag (`str`,
    `Device`, `dict[str,any]`, `function-after[...]`, `[key]`), False for a real key or
    index of `data`. Tags consume no data; the last part of a `missing` error is the
    missing key itself. Without `data`, only `function-...` parts are tags."""
    loc = err["loc"]
    if data is _NO_DATA:
        return [str(p).startswith("function-") for p in loc]
    node, tags = data, []
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node and not str(part).startswith("function-"):
            node, tag = node[part], False
        elif (isinstance(node, list) and isinstance(part, int)
              and not isinstance(part, bool) and 0 <= part < len(node)):
            node, tag = node[part], False
        else:
            tag = not (i == len(loc) - 1 and err["type"] == "missing")
        tags.append(tag)
    return tags


def _pick_error(errors: list[Any], data: Any) -> tuple[Any, Loc, list[Any]]:
    """The error to report, its loc without union tags, and (when the input matches no
    branch of a union) the branches' errors, else [].

    pydantic reports a failed union once per branch, each loc carrying the branch's tag
    (`targets.0.device.str`, `targets.0.device.Device.ram_mb`). The branch that accepts the
    input's type is the one whose errors are not type mismatches at the branch itself: its
    first error is the one that explains the problem.
    """
    chosen = errors[0]
    done = 0  # loc parts before this are resolved
    while True:
        tags = _tags(chosen, data)
        depth = next((i for i in range(done, len(tags)) if tags[i]), None)
        if depth is None:
            break
        prefix = tuple(chosen["loc"][:depth])
        branches: dict[Any, list[Any]] = {}
        for err in errors:
            if tuple(err["loc"][:depth]) == prefix and len(err["loc"]) > depth \
                    and _tags(err, data)[depth]:
                branches.setdefault(err["loc"][depth], []).append(err)
        matching = [errs for errs in branches.values()
                    if not all(_is_type_mismatch(e, depth + 1) for e in errs)]
        if not matching:
            real = tuple(p for p, tag in zip(prefix, tags, strict=False) if not tag)
            return chosen, real, [errs[0] for errs in branches.values()]
        errors = matching[0]
        chosen = errors[0]
        done = depth + 1
    real = tuple(p for p, tag in zip(chosen["loc"], tags, strict=True) if not tag)
    return chosen, real, []


def _shown(value: Any) -> str:
    return repr(value) if not isinstance(value, dict | list) else type(value).__name__


def _pydantic_error(exc: ValidationError, path: Path, marks: Mapping[Loc, tuple[int, int]],
                    prefix: Loc = (), model: type[BaseModel] | None = None,
                    data: Any = _NO_DATA) -> RecipeError:
    """The first pydantic error as a located RecipeError saying expected vs found.

    `data` is the validated input: with it, union branch tags are told from real keys and
    a union's error is the one of the branch that matches the input's type."""
    err, real, alternatives = _pick_error(exc.errors(), data)
    loc: Loc = (*prefix, *real)
    kind = err["type"]
    if alternatives:
        expected = " or ".join(dict.fromkeys(
            str(e["msg"]).removeprefix("Input should be ") for e in alternatives))
        message = f"expected {expected}; found {_shown(err.get('input'))}"
    elif kind == "extra_forbidden":
        key = loc[-1]
        owner = model if model is not None else _model_at(loc[len(prefix):-1])
        allowed = _field_names(owner) if owner else []
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        message = f"unknown key {key!r}{hint}; expected one of: {', '.join(allowed)}"
    elif kind == "missing":
        message = f"missing required field {loc[-1]!r}"
        loc = loc[:-1]  # the mapping that lacks it: the key itself has no line
    elif kind == "value_error":  # our own validators' messages say what was found
        message = str(err["msg"]).removeprefix("Value error, ")
    else:
        message = f"{err['msg']}; found {_shown(err.get('input'))}"
    return make_error(RecipeError, message, path, loc, marks)


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
        raise _pydantic_error(exc, path, marks, params_loc, model=stage.params,
                              data=params) from exc


def lineage(pipelines: Mapping[str, Pipeline], name: str) -> list[str]:
    """[root, ..., name] following `from:`; assumes no cycles (checked first)."""
    chain = [name]
    while pipelines[chain[-1]].from_:
        chain.append(pipelines[chain[-1]].from_)  # type: ignore[arg-type]
    return chain[::-1]


def _check_wiring(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]],
                  path: Path, marks: Mapping[Loc, tuple[int, int]]) -> None:
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


# ---------------------------------------------------------------- stages added by default

# Added after the last graphdef transform of an 8-bit lineage: the shipped file's names.
DEFAULT_COMPACTION = "compact_names"
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
    return {name: [index] for name, index in added.items()}


def _check_kinds(recipe: Recipe, stages: dict[str, list[tuple[str, BaseModel]]],
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


def _nesting_depth(data: Any) -> int:
    """How deep mappings and lists nest in `data` (walked without recursion)."""
    deepest, pending = 0, [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list) and value:
            deepest = max(deepest, depth)
            if depth <= MAX_NESTING_DEPTH:
                children = value.values() if isinstance(value, dict) else value
                pending.extend((child, depth + 1) for child in children)
    return deepest


def _check_names(recipe: Recipe, path: Path, marks: Mapping[Loc, tuple[int, int]]) -> None:
    """Names that become folders, Prefect runs and MLflow runs follow limits.name_problem."""
    named: list[tuple[Any, Loc]] = [(recipe.name, ("name",))]
    named += [(name, ("pipelines", name)) for name in recipe.pipelines]
    named += [(target.name, ("targets", i, "name")) for i, target in enumerate(recipe.targets)]
    for name, loc in named:
        problem = name_problem(name)
        if problem:
            raise make_error(RecipeError, problem, path, loc, marks)


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
    if _nesting_depth(data) > MAX_NESTING_DEPTH:
        raise RecipeError(f"with the --set overrides, the recipe nests deeper than the limit "
                          f"of {MAX_NESTING_DEPTH} levels", file=str(path), field="--set")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise _pydantic_error(exc, path, located.marks, data=data) from exc
    _check_names(recipe, path, located.marks)
    stages: dict[str, list[tuple[str, BaseModel]]] = {}
    for name, pipeline in recipe.pipelines.items():
        stages[name] = [parse_stage_entry(entry, ("pipelines", name, "stages", i), path,
                                          located.marks)
                        for i, entry in enumerate(pipeline.stages)]
    _check_wiring(recipe, stages, path, located.marks)
    _check_kinds(recipe, stages, path, located.marks)
    # after the checks, which locate stages by their YAML index (the added stage is valid
    # where it goes: a graphdef transform among graphdef transforms, needing nothing)
    added = add_default_stages(recipe, stages)
    loaded = LoadedRecipe(recipe=recipe, path=path, marks=located.marks, raw=data, stages=stages,
                          added=added)
    if check_files:
        _check_files(loaded)
    return loaded
