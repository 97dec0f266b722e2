"""The pre-commit hook (.pre-commit-hooks.yaml), as a user's project runs it: `pre-commit
try-repo` in a scratch git repository, with its own HOME and pre-commit cache. A good recipe
passes; a bad one fails naming file:line; YAML outside recipes/ is not a recipe."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # this venv: pre-commit, and the `orchestrator` it runs
HOOK = "orchestrator-validate"

RECIPE = """\
# yaml-language-server: $schema=recipe.schema.json
version: 1
name: {name}
model:
  path: {model}
pipelines:
  fp32:
    stages:
      - freeze
      - {stage}
      - fold
"""


def git(cwd: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@pytest.fixture
def scratch(tmp_path: Path, digits_example: Path) -> tuple[Path, Path, dict[str, str]]:
    """(the hook repository, a user's project, the environment both run in)."""
    if shutil.which("git") is None or not (BIN / "pre-commit").is_file():
        pytest.skip("needs git and pre-commit (the dev extra)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PRE_COMMIT"))}
    env.update({
        "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.com",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "TF_CPP_MIN_LOG_LEVEL": "2"})
    (tmp_path / "home").mkdir()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    shutil.copy(ROOT / ".pre-commit-hooks.yaml", hooks)
    git(hooks, env, "init", "-q")
    git(hooks, env, "add", ".pre-commit-hooks.yaml")
    git(hooks, env, "commit", "-q", "-m", "hooks")

    project = tmp_path / "project"
    (project / "recipes").mkdir(parents=True)
    (project / "ci").mkdir()
    model = digits_example / "saved_model"
    (project / "recipes" / "good.yaml").write_text(RECIPE.format(name="good", model=model,
                                                                 stage="strip"))
    (project / "recipes" / "bad.yaml").write_text(RECIPE.format(name="bad", model=model,
                                                                stage="strp"))
    (project / "ci" / "build.yaml").write_text("jobs: {test: {runs-on: linux}}\n")
    git(project, env, "init", "-q")
    git(project, env, "add", ".")
    return hooks, project, env


def try_repo(hooks: Path, project: Path, env: dict[str, str], *files: str
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "pre-commit"), "try-repo", str(hooks), HOOK,
                           "--color", "never", "--files", *files],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_a_good_recipe_passes(scratch: tuple[Path, Path, dict[str, str]]) -> None:
    done = try_repo(*scratch, "recipes/good.yaml", "ci/build.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "orchestrator validate (recipes)" in done.stdout and "Passed" in done.stdout


def test_a_bad_recipe_fails_with_its_file_and_line(
        scratch: tuple[Path, Path, dict[str, str]]) -> None:
    hooks, project, env = scratch
    done = try_repo(hooks, project, env, "recipes/good.yaml", "recipes/bad.yaml",
                    "ci/build.yaml")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Failed" in done.stdout
    line = RECIPE.splitlines().index("      - {stage}") + 1
    assert f"recipes/bad.yaml:{line}:" in done.stdout, done.stdout
    assert "unknown stage 'strp'" in done.stdout and "strip" in done.stdout  # did you mean
    assert "good.yaml: ok" in done.stdout  # the good one checked alongside, passing
    assert "build.yaml" not in done.stdout  # not a recipe: never handed to the hook


def test_only_recipe_folders_match(scratch: tuple[Path, Path, dict[str, str]]) -> None:
    """A changed CI file alone runs nothing (the hook is skipped, not failed)."""
    done = try_repo(*scratch, "ci/build.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(no files to check)Skipped" in done.stdout
