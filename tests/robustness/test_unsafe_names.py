"""Issue 9, class 3: names that reach the file system (a security hole). A pipeline named
`../escaped` wrote files outside `-o DIR`; an absolute one wrote there too; `..` and a
recipe name holding `/` crashed. Recipe, pipeline and target names become folder names,
Prefect runs and MLflow runs: whatever they hold, `validate` and `run` refuse them with
exit 2 and the recipe's line (limits.name_problem is the rule), and nothing is written
anywhere, inside `-o DIR` or outside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.robust_helpers import DIGITS, cache_entries, check_clean_error, cli_in_process, tree

from orchestrator import limits

TEMPLATE = """version: 1
name: {recipe}
model:
  path: {model}
targets:
  - name: {target}
    device: phone-2016
pipelines:
  {pipeline}:
    stages: [freeze]
"""
LINES = {"recipe": 2, "target": 6, "pipeline": 9}

BAD_NAMES = {
    "parent-escape": "../escaped",
    "parent": "..",
    "dot": ".",
    "slash": "a/b",
    "absolute": "<ABSOLUTE>",
    "backslash": "a\\b",
    "backslash-parent": "..\\escaped",
    "drive-letter": "C:",
    "drive-path": "C:\\Windows\\escaped",
    "unc": "\\\\server\\share",
    "nul": "a\x00b",
    "bell": "a\x07b",
    "tab": "a\tb",
    "newline": "a\nb",
    "terminal-escape": "a\x1b[31mred",
    "long-300": "n" * 300,
    "empty": "",
    "leading-dash": "-rf",
    "hidden": ".hidden",
    "right-to-left-override": "a\u202eb",
    "non-ascii": "名前",
    "space": "a b",
    "tilde": "~",
}
GOOD_NAMES = ["fp32", "v1.2-int8_x", "A", "n" * limits.MAX_NAME_LENGTH]


def recipe(folder: Path, recipe: str = "robust", target: str = "phone",
           pipeline: str = "fp32") -> Path:
    path = folder / "recipe.yaml"
    # JSON strings are YAML double-quoted scalars: every character survives, escaped
    path.write_text(TEMPLATE.format(recipe=json.dumps(recipe, ensure_ascii=False),
                                    target=json.dumps(target, ensure_ascii=False),
                                    pipeline=json.dumps(pipeline, ensure_ascii=False),
                                    model=json.dumps(str(DIGITS / "saved_model"))),
                    encoding="utf-8")
    return path


def name_for(case: str, workspace: Path) -> str:
    return str(workspace / "absolute-escape") if BAD_NAMES[case] == "<ABSOLUTE>" \
        else BAD_NAMES[case]


@pytest.mark.parametrize("where", sorted(LINES))
@pytest.mark.parametrize("case", sorted(BAD_NAMES))
def test_bad_name_is_refused_with_its_line(case: str, where: str, workspace: Path,
                                           prefect_server: None,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    name = name_for(case, workspace)
    assert limits.name_problem(name) is not None, f"{name!r} passes the name rule"
    sandbox = workspace / "sandbox"
    sandbox.mkdir()
    path = recipe(sandbox, **{where: name})
    out = sandbox / "deep" / "er" / "out"
    before = tree(workspace, skip=[".orchestrator", "mlruns"])
    where_line = f"{path}:{LINES[where]}:"
    for command in (["validate", path], ["run", path, "-o", out]):
        code, _, err = cli_in_process(command, capsys)
        message = check_clean_error(code, err, where_line)
        assert "name" in message
    assert tree(workspace, skip=[".orchestrator", "mlruns"]) == before, "something was written"
    assert not (workspace / "absolute-escape").exists()
    assert cache_entries(workspace / ".orchestrator") == set()


@pytest.mark.parametrize("case", ["parent-escape", "absolute", "slash", "backslash-parent"])
def test_recipe_name_cannot_escape_the_default_output_folder(
        case: str, workspace: Path, prefect_server: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With no `-o`, the output goes to out/<recipe name> in the working folder."""
    name = name_for(case, workspace)
    (workspace / "a" / "b").mkdir(parents=True)
    path = recipe(workspace / "a" / "b", recipe=name if case != "parent-escape"
                  else "../../escaped")
    before = tree(workspace, skip=[".orchestrator", "mlruns"])
    code, _, err = cli_in_process(["run", path], capsys)
    check_clean_error(code, err, f"{path}:{LINES['recipe']}:")
    assert tree(workspace, skip=[".orchestrator", "mlruns"]) == before
    assert cache_entries(workspace / ".orchestrator") == set()


@pytest.mark.parametrize("where", sorted(LINES))
@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names_still_validate(name: str, where: str, workspace: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert limits.name_problem(name) is None
    path = recipe(workspace, **{where: name})
    code, out, err = cli_in_process(["validate", path], capsys)
    assert code == 0, err
    assert "ok" in out


def test_pipeline_named_by_set_is_checked_too(workspace: Path, prefect_server: None,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A name that arrives through `--set` goes through the same rule."""
    path = recipe(workspace)
    out = workspace / "out"
    before = tree(workspace, skip=[".orchestrator", "mlruns"])
    for override in ("name=../escaped", "pipelines.fp32.from=..", "targets.0.name=a/b",
                     "pipelines={'../x': {stages: [freeze]}}"):
        for command in (["validate", path, "--set", override],
                        ["run", path, "-o", out, "--set", override]):
            code, _, err = cli_in_process(command, capsys)
            check_clean_error(code, err)
    assert tree(workspace, skip=[".orchestrator", "mlruns"]) == before
    assert cache_entries(workspace / ".orchestrator") == set()
