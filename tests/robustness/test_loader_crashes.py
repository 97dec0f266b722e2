"""Issue 9, class 1: recipes that crashed the loader (exit 70, a traceback): mapping keys
that are lists or maps, nesting thousands of levels deep (in the recipe and in a `--set`
value), a recipe path that is a symlink loop. Each must be exit 2 naming the file (and the
line, where it comes from YAML), from `validate` and from `run` alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.robust_helpers import (
    cache_entries,
    check_clean_error,
    cli_in_process,
    line_of,
    mentions_number,
    small_recipe,
)

from orchestrator import limits
from orchestrator.errors import OrchestratorError
from orchestrator.recipe.loading import load_recipe

BASE = yaml.safe_dump(small_recipe(), sort_keys=False)


def recipe_text(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def check_loader(path: Path, overrides: list[str] | None = None) -> OrchestratorError:
    """load_recipe raises an OrchestratorError (never RecursionError, TypeError...)."""
    with pytest.raises(OrchestratorError) as caught:
        load_recipe(path, overrides)
    assert caught.value.exit_code == 2
    return caught.value


def run_both(path: Path, workspace: Path, capsys: pytest.CaptureFixture[str],
             *extra: str) -> list[str]:
    """`validate` and `run` of the same recipe: both exit 2 with a clean message, no
    output, no cache entry. Returns both error messages."""
    messages = []
    for command in (["validate", str(path), *extra],
                    ["run", str(path), "-o", str(workspace / "out"), *extra]):
        code, _, err = cli_in_process(command, capsys)
        messages.append(check_clean_error(code, err, path if not extra else ""))
    assert not (workspace / "out").exists()
    assert cache_entries(workspace / ".orchestrator") == set()
    return messages


KEY_CASES = {  # the recipe text, and a piece of the line holding the odd key
    "list-key-at-top": (BASE + "? [a, b]\n: 1\n", "? [a, b]"),
    "map-key-at-top": (BASE + "? {a: 1}\n: 1\n", "? {a: 1}"),
    "flow-list-key-as-pipeline": (BASE.replace("  fp32:", "  [fp32, int8]:"), "[fp32, int8]"),
    "map-key-as-pipeline": (BASE.replace("  fp32:\n", "  ? {name: fp32}\n  :\n"),
                            "? {name: fp32}"),
    "list-key-in-stage-params": (BASE.replace("  - freeze", "  - transform: {[a]: 1}"),
                                 "[a]: 1"),
    "list-key-in-model": (BASE.replace("model:\n", "model:\n  [x, y]: 1\n"), "[x, y]: 1"),
}


@pytest.mark.parametrize("case", sorted(KEY_CASES))
def test_mapping_key_that_is_a_list_or_map(case: str, workspace: Path, prefect_server: None,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    text, needle = KEY_CASES[case]
    path = recipe_text(workspace, text)
    assert yaml.compose(text, Loader=yaml.SafeLoader) is not None  # valid YAML, odd keys
    error = check_loader(path)
    assert error.file == str(path)
    assert error.line == line_of(text, needle), (error.line, str(error))
    for message in run_both(path, workspace, capsys):
        assert f"{path}:{error.line}:" in message


def _deep(kind: str, depth: int) -> str:
    return "[" * depth + "]" * depth if kind == "list" else "{a: " * depth + "1" + "}" * depth


@pytest.mark.parametrize("kind", ["list", "map"])
@pytest.mark.parametrize("depth", [limits.MAX_NESTING_DEPTH + 1, 5000])
def test_deep_nesting_in_the_recipe(kind: str, depth: int, workspace: Path,
                                    prefect_server: None,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    text = BASE.replace("name: robust", f"name: robust\ntags: {_deep(kind, depth)}")
    path = recipe_text(workspace, text)
    error = check_loader(path)
    assert error.file == str(path) and error.line == line_of(text, "tags:")
    assert mentions_number(str(error), limits.MAX_NESTING_DEPTH), str(error)
    run_both(path, workspace, capsys)


def test_nesting_at_the_limit_is_not_refused_for_depth(tmp_path: Path) -> None:
    """A recipe nested exactly MAX_NESTING_DEPTH deep is refused, if at all, for what it
    holds (here an unknown key), not for its depth."""
    inner = limits.MAX_NESTING_DEPTH - 1  # the top-level mapping is one level
    text = BASE.replace("name: robust", f"name: robust\ntags: {_deep('list', inner - 1)}")
    error = check_loader(recipe_text(tmp_path, text))
    assert "tags" in str(error)
    # the message, not str(error): its location is a temporary path, which may hold any number
    assert not mentions_number(error.message, limits.MAX_NESTING_DEPTH), str(error)


@pytest.mark.parametrize("kind", ["list", "map"])
@pytest.mark.parametrize("key", ["model.inputs", "name", "pipelines.fp32.stages"])
def test_deep_nesting_in_a_set_value(kind: str, key: str, workspace: Path,
                                     prefect_server: None,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = recipe_text(workspace, BASE)
    override = f"{key}={_deep(kind, 5000)}"
    error = check_loader(path, [override])
    assert "--set" in str(error) or str(path) in str(error), str(error)
    for message in run_both(path, workspace, capsys, "--set", override):
        assert "--set" in message or str(path) in message
        assert len(message) < 5000, "the 5000-deep value is echoed back whole"


def test_deep_set_key_path(workspace: Path, prefect_server: None,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """A `--set` key path thousands of parts long: exit 2, not a RecursionError."""
    path = recipe_text(workspace, BASE)
    override = "tags." + ".".join(["a"] * 5000) + "=1"
    check_loader(path, [override])
    run_both(path, workspace, capsys, "--set", override)


@pytest.mark.parametrize("shape", ["self", "pair"])
def test_recipe_path_that_is_a_symlink_loop(shape: str, workspace: Path, prefect_server: None,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = workspace / "loop.yaml"
    if shape == "self":
        path.symlink_to(path.name)
    else:
        (workspace / "other.yaml").symlink_to(path.name)
        path.symlink_to("other.yaml")
    error = check_loader(path)
    assert str(path) in str(error) or error.file == str(path)
    run_both(path, workspace, capsys)
