"""Nothing above stages/ names a stage: what the engine, the guard, the results, tracking and
the recipe's defaults need to know of a stage is a field of its `Stage` record
(orchestrator/stages/base.py), so a new stage (a new quantization method) is one module.

The check reads every string literal of those modules (docstrings aside: prose may name a
stage) and fails on one that is a registered stage's name, or that names one with an
underscore in it as a word ("set quantize_nodes: {guard: true}"). Two kinds of literal share
a word with a stage and are not one: the stage kinds ("transform", "measure": a stage's
`kind`) and the info keys report.json shows (`results.report.INFO_SHOWN`).
"""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from orchestrator.results.report import INFO_SHOWN
from orchestrator.stages import STAGE_MODULES
from orchestrator.stages.base import StageKind

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"
NO_STAGE_NAMES = ("engine", "guard", "results", "tracking", "recipe/defaults.py")
NOT_STAGES = {*typing.get_args(StageKind), *INFO_SHOWN}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            found.add(id(node.body[0].value))
    return found


def stage_names_in(source: str, names: list[str]) -> list[tuple[int, str, str]]:
    """(line, stage, literal) for each string literal of `source` that names a stage."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    words = {name: re.compile(rf"\b{re.escape(name)}\b") for name in names if "_" in name}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) \
                or id(node) in docs or node.value in NOT_STAGES:
            continue
        for name in names:
            if node.value == name or (name in words and words[name].search(node.value)):
                found.append((node.lineno, name, node.value))
    return found


def _modules() -> list[Path]:
    files: list[Path] = []
    for part in NO_STAGE_NAMES:
        path = PACKAGE / part
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_stage_is_named_above_the_stages(path: Path) -> None:
    found = stage_names_in(path.read_text(encoding="utf-8"), sorted(STAGE_MODULES))
    assert not found, "\n".join(
        f"{path.relative_to(PACKAGE.parent)}:{line}: names the stage {stage!r} ({text!r}): "
        "make what this needs a field of the Stage record" for line, stage, text in found)


def test_the_check_sees_a_stage_name() -> None:
    source = '''"""A docstring may say quantize_nodes."""
KIND = "transform"
STAGES = ("evaluate", "memmap")
advice = f"set quantize_nodes: {{guard: true}} on {1}"
'''
    found = stage_names_in(source, sorted(STAGE_MODULES))
    assert [(line, stage) for line, stage, _ in found] == [(3, "evaluate"),
                                                          (4, "quantize_nodes")]
