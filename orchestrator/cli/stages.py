"""`orchestrator stages`: every stage with its summary and params, as a recipe writes them.

Types read as a recipe's values do (`int >= 1`, `fp32 | dynamic_range | float16 | int8`,
`float | null`), defaults as YAML (`true`, `null`, `[Identity, CheckNumerics]`). The params
every stage accepts (StageParams' own, e.g. `ignore_errors`) are listed once, first.
"""

from __future__ import annotations

import argparse
import shutil
import textwrap
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from orchestrator.limits import shown

_INDENT = "    "


# --------------------------------------------------------------------------- types


def _bounds(metadata: list[Any]) -> str:
    """' >= 1', ' in [1, 100]', ' in [0, 50)' from annotated-types constraints, else ''."""
    low = high = None
    for item in metadata:
        for attr, sign in (("ge", ">="), ("gt", ">")):
            if getattr(item, attr, None) is not None:
                low = (sign, getattr(item, attr))
        for attr, sign in (("le", "<="), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                high = (sign, getattr(item, attr))
    if low and high:
        left = "[" if low[0] == ">=" else "("
        right = "]" if high[0] == "<=" else ")"
        return f" in {left}{shown(low[1])}, {shown(high[1])}{right}"
    bound = low or high
    return f" {bound[0]} {shown(bound[1])}" if bound else ""


def _min_length(metadata: list[Any]) -> int:
    found = [getattr(item, "min_length", None) for item in metadata]
    return max((n for n in found if n is not None), default=0)


def type_text(annotation: Any, metadata: list[Any] | None = None) -> str:
    """A type as a recipe writer reads it: unions as `a | b`, a Literal's choices, bounds."""
    metadata = list(metadata or [])
    if get_origin(annotation) is Annotated:
        inner, *extra = get_args(annotation)
        for item in extra:
            metadata += item.metadata if isinstance(item, FieldInfo) else [item]
        return type_text(inner, metadata)
    origin = get_origin(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(str(v) if isinstance(v, str) else _yaml(v) for v in get_args(annotation))
    if origin is Union or isinstance(annotation, types.UnionType):
        parts = [type_text(arg, metadata) for arg in get_args(annotation)]
        return " | ".join(dict.fromkeys(parts))
    if origin in (list, tuple, dict, set, frozenset):
        args = [type_text(a) for a in get_args(annotation) if a is not Ellipsis]
        name = origin.__name__
        text = f"{name}[{', '.join(args)}]" if args else name
        if origin is list and _min_length(metadata) == 1:
            text = f"non-empty {text}"
        return text
    if isinstance(annotation, type):
        return annotation.__name__ + _bounds(metadata)
    return str(annotation).replace("typing.", "")


def _yaml(value: Any) -> str:
    """A default as it reads in YAML (flow style, one line)."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def param_line(name: str, field: FieldInfo) -> str:
    """`name: type (default ...)` or `name: type (required)`."""
    kind = type_text(field.annotation, field.metadata)
    if field.is_required():
        default = "required"
    elif field.default_factory is not None:
        default = f"default {_yaml(field.default_factory())}"  # type: ignore[call-arg]
    else:
        default = f"default {_yaml(field.default)}"
    return f"{name}: {kind} ({default})"


# --------------------------------------------------------------------------- docs


def summary_and_rest(doc: str | None) -> tuple[str, str]:
    """The first paragraph of a docstring as one line (whole sentences), and the rest."""
    text = textwrap.dedent((doc or "").strip("\n")).strip()
    first, _, rest = text.partition("\n\n")
    return " ".join(first.split()), rest.strip()


def _wrapped(text: str, indent: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False) or [indent.rstrip()]


def format_stages(verbose: bool = False, width: int | None = None) -> str:
    """What `orchestrator stages` prints."""
    from orchestrator.stages import all_stages
    from orchestrator.stages.base import StageParams

    width = width or max(60, min(shutil.get_terminal_size((100, 24)).columns, 100))
    common = StageParams.model_fields
    lines = ["Every stage also accepts:"]
    for name, field in common.items():
        lines.append(f"{_INDENT}{param_line(name, field)}")
        lines += _wrapped(field.description or "", _INDENT * 2, width)
    lines.append("")
    for stage in all_stages():
        summary, rest = summary_and_rest(stage.doc)
        lines.append(f"{stage.name}  [{stage.kind}]")
        lines += _wrapped(summary, _INDENT, width)
        if verbose and rest:
            lines += [f"{_INDENT}{line}".rstrip() for line in textwrap.dedent(rest).splitlines()]
        for name, field in stage.params.model_fields.items():
            if name in common:
                continue
            lines.append(f"{_INDENT}{param_line(name, field)}")
            if field.description:
                lines += _wrapped(field.description, _INDENT * 2, width)
        extras = []
        if stage.requires:
            extras.append(f"requires earlier: {', '.join(stage.requires)}")
        if stage.uses_data:
            extras.append(f"uses data: {', '.join(stage.uses_data)}")
        extras.append(f"accepts: {', '.join(sorted(stage.accepts))}"
                      + (f"; produces: {stage.produces}" if stage.produces else ""))
        lines += _wrapped(f"({'; '.join(extras)})", _INDENT, width)
        lines.append("")
    if not verbose:
        lines.append("(-v: each stage's full documentation)")
    return "\n".join(lines)


def cmd_stages(args: argparse.Namespace) -> int:
    print(format_stages(args.verbose))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    stages = sub.add_parser("stages", help="list the stages with their params")
    stages.add_argument("-v", "--verbose", action="store_true", help="full docs")
    stages.set_defaults(fn=cmd_stages)
