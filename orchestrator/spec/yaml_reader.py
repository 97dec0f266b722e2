"""Recipe YAML: composed within bounds (nesting depth, alias expansion), with the line and
column of every key and value (`Located`), and `--set key.path=value` overrides applied to a
copy of the data. YAML and override errors are RecipeErrors.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator import paths
from orchestrator.errors import RecipeError
from orchestrator.limits import MAX_NESTING_DEPTH, MAX_RECIPE_BYTES, MAX_YAML_NODES
from orchestrator.spec.error_locations import Loc, dotted, make_error


@dataclass
class Located:
    """YAML data plus the (line, column) of every key and value, by dotted path."""

    data: Any
    marks: dict[Loc, tuple[int, int]] = field(default_factory=dict)



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



def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a copy of `data`."""
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



def nesting_depth(data: Any) -> int:
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

