"""The recipe schema that editors read: the committed recipes/recipe.schema.json is what the
code generates (it cannot drift), every example recipe names it on its first line, and the
example recipes are valid under it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema  # Prefect's dependency: always installed
import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.recipe import schema

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / schema.PROJECT_SCHEMA
REGENERATE = f"orchestrator schema -o {schema.PROJECT_SCHEMA}"
EXAMPLES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_committed_schema_is_what_the_code_generates() -> None:
    assert COMMITTED.is_file(), f"missing {COMMITTED}: run `{REGENERATE}`"
    assert json.loads(COMMITTED.read_text()) == schema.recipe_schema(), (
        f"{COMMITTED.relative_to(ROOT)} is out of date with the recipe models or the stages' "
        f"params: run `{REGENERATE}` and commit it")
    assert COMMITTED.read_text() == schema.schema_text()  # byte for byte: no diff churn


@pytest.mark.parametrize("recipe", EXAMPLES, ids=lambda p: p.name)
def test_example_recipes_name_the_schema_on_their_first_line(recipe: Path) -> None:
    first = recipe.read_text().splitlines()[0]
    assert first.startswith(schema.MODELINE_PREFIX), first
    named = recipe.parent / first.removeprefix(schema.MODELINE_PREFIX)
    assert named.resolve() == COMMITTED.resolve()
    assert first == schema.modeline(recipe, COMMITTED)


@pytest.mark.parametrize("recipe", EXAMPLES, ids=lambda p: p.name)
def test_example_recipes_are_valid_under_the_schema(recipe: Path) -> None:
    """What an editor checks as the recipe is typed: the schema accepts real recipes."""
    validator = jsonschema.Draft202012Validator(json.loads(COMMITTED.read_text()))
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(yaml.safe_load(recipe.read_text()))]
    assert not errors, errors


def test_the_schema_rejects_what_validate_rejects() -> None:
    validator = jsonschema.Draft202012Validator(json.loads(COMMITTED.read_text()))
    recipe = yaml.safe_load((ROOT / "recipes" / "digits.yaml").read_text())
    recipe["pipelines"]["fp32"]["stages"][0] = "freez"  # an unknown stage
    recipe["pipelines"]["int8"]["stages"][-1] = {"benchmark": {"runz": 3}}  # an unknown param
    assert len(list(validator.iter_errors(recipe))) == 2


def test_schema_prints_or_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == schema.recipe_schema()
    out = tmp_path / "sub" / "recipe.schema.json"
    assert main(["schema", "-o", str(out)]) == 0
    assert out.read_text() == printed
    assert f"wrote the recipe schema to {out}" in capsys.readouterr().out
    assert [p.name for p in out.parent.iterdir()] == ["recipe.schema.json"]  # no temp left


def test_schema_to_an_unwritable_place_is_exit_2(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["schema", "-o", str(blocker / "recipe.schema.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_find_schema_walks_up_to_the_project(tmp_path: Path) -> None:
    (tmp_path / "recipes" / "team").mkdir(parents=True)
    assert schema.find_schema(tmp_path / "recipes" / "team" / "r.yaml", tmp_path) is None
    project = tmp_path / schema.PROJECT_SCHEMA
    project.write_text("{}")
    deep = tmp_path / "models" / "r.yaml"  # outside recipes/: the project's copy
    assert schema.find_schema(deep, tmp_path) == project
    assert schema.modeline(deep, project) == (
        "# yaml-language-server: $schema=../recipes/recipe.schema.json")
    near = tmp_path / "recipes" / "team" / schema.SCHEMA_FILE
    near.write_text("{}")
    assert schema.find_schema(tmp_path / "recipes" / "team" / "r.yaml", tmp_path) == near
