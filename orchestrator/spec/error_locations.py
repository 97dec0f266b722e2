"""Recipe errors located in the YAML: `make_error` puts a message on the deepest part of a
field's path that has a line and column, and `pydantic_errors` turns each of pydantic's
errors into one saying what was expected and what was found (union branches sorted out,
"did you mean" for unknown keys). `RecipeErrors` holds every independent error of a recipe,
as a compiler lists them: `collected` raises it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from orchestrator.errors import OrchestratorError, RecipeError
from orchestrator.spec.models import Recipe

# a recipe field's path: keys and list indices (`("pipelines", "int8", "stages", 0)`)
Loc = tuple[str | int, ...]


def dotted(loc: Loc) -> str:
    """("a", 0, "b") -> "a.0.b"."""
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


class RecipeErrors(RecipeError):
    """Several errors of one recipe (or one whose later checks did not run: `note` says
    which), sorted by line. Its file, line, column, field and message are the first
    error's; `errors` holds them all. Printed as a compiler prints them: one
    `file:line:column [field]: message` line each (`error: ` before every line after the
    first, as the command prints `error: ` before the first), then a count line."""

    def __init__(self, errors: Sequence[OrchestratorError], recipe: str,
                 note: str | None = None) -> None:
        first = errors[0]
        super().__init__(first.message, file=first.file, line=first.line,
                         column=first.column, field=first.field)
        self.errors = list(errors)
        self.recipe = recipe
        self.note = note
        self.exit_code = max(e.exit_code for e in self.errors)

    def summary(self) -> str:
        count = len(self.errors)
        text = f"{self.recipe}: {count} error{'s' if count != 1 else ''}"
        return f"{text} ({self.note})" if self.note else text

    def __str__(self) -> str:
        return "\nerror: ".join(str(e) for e in self.errors) + "\n" + self.summary()


def _sort_key(exc: OrchestratorError) -> tuple[int, int, int]:
    # errors of the recipe file by line; those of `--set` (no line) first
    return (0 if exc.line is None else 1, exc.line or 0, exc.column or 0)


def collected(errors: Sequence[OrchestratorError], recipe: Path | str,
              note: str | None = None) -> OrchestratorError | None:
    """The error to raise for `errors` (None when there are none): the error itself when
    it is the only one and every check ran, else a RecipeErrors of all of them, sorted by
    line, each reported once."""
    unique: dict[tuple[Any, ...], OrchestratorError] = {}
    for exc in errors:
        for each in getattr(exc, "errors", None) or [exc]:
            unique.setdefault((each.file, each.line, each.column, each.message), each)
    found = sorted(unique.values(), key=_sort_key)
    if not found:
        return None
    if len(found) == 1 and note is None:
        return found[0]
    return RecipeErrors(found, str(recipe), note)


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


# how pydantic names a validator function's step in a loc: `function-after[check(), Model]`
_VALIDATOR_TAG = re.compile(r"function-(after|before|wrap|plain)\[.*\]", re.DOTALL)


def _is_validator_tag(part: Any) -> bool:
    """A validator's step, where no input tells (a recipe's own key, `function-` say, is
    told apart by being in the input: _tags)."""
    return isinstance(part, str) and _VALIDATOR_TAG.fullmatch(part) is not None


def _tags(err: Mapping[str, Any], data: Any) -> list[bool]:
    """For each part of a pydantic error's loc: True for a union branch tag (`str`,
    `Device`, `dict[str,any]`, `function-after[...]`, `[key]`), False for a real key or
    index of `data`. Tags consume no data; the last part of a `missing` error is the
    missing key itself. Without `data`, only `function-...` parts are tags."""
    loc = err["loc"]
    if data is _NO_DATA:
        return [_is_validator_tag(p) for p in loc]
    node, tags = data, []
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:  # a key of the input, whatever its name
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


def pydantic_error(exc: ValidationError, path: Path, marks: Mapping[Loc, tuple[int, int]],
                    prefix: Loc = (), model: type[BaseModel] | None = None,
                    data: Any = _NO_DATA) -> RecipeError:
    """The first of `pydantic_errors`."""
    return pydantic_errors(exc, path, marks, prefix, model, data)[0]


def _independent(errors: list[Any], data: Any) -> list[list[Any]]:
    """pydantic's errors grouped by the field they are about: a union's branch errors
    (whose locs carry the branch's tag) form one group, every other error its own."""
    groups: dict[Any, list[Any]] = {}
    for index, err in enumerate(errors):
        tags = _tags(err, data)
        depth = next((i for i, tag in enumerate(tags) if tag), None)
        key = ("union", tuple(err["loc"][:depth])) if depth is not None else ("one", index)
        groups.setdefault(key, []).append(err)
    return list(groups.values())


def pydantic_errors(exc: ValidationError, path: Path, marks: Mapping[Loc, tuple[int, int]],
                    prefix: Loc = (), model: type[BaseModel] | None = None,
                    data: Any = _NO_DATA) -> list[RecipeError]:
    """Every independent pydantic error as a located RecipeError saying expected vs found,
    in pydantic's order.

    `data` is the validated input: with it, union branch tags are told from real keys and
    a union's error is the one of the branch that matches the input's type."""
    found = []
    for group in _independent(exc.errors(), data):
        err, real, alternatives = _pick_error(group, data)
        found.append(_located(err, (*prefix, *real), alternatives, path, marks, prefix, model))
    return found


def _located(err: Any, loc: Loc, alternatives: list[Any], path: Path,
             marks: Mapping[Loc, tuple[int, int]], prefix: Loc,
             model: type[BaseModel] | None) -> RecipeError:
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
    elif kind == "literal_error":  # one of a few names: the closest, if a typo
        allowed = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        close = difflib.get_close_matches(str(err.get("input")), allowed, n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        shown = _shown(err.get("input"))
        message = f"found {shown}{hint}; expected one of: {', '.join(allowed)}"
    elif kind == "value_error":  # our own validators' messages say what was found
        message = str(err["msg"]).removeprefix("Value error, ")
    else:
        message = f"{err['msg']}; found {_shown(err.get('input'))}"
    return make_error(RecipeError, message, path, loc, marks)  # type: ignore[no-any-return]
