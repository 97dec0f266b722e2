"""Issue 9, class 2: recipes that hung or ate memory (killed after 30-150 s, up to 3.9 GB):
a YAML alias bomb, a recipe that is /dev/zero or a FIFO with no writer, tens of thousands
of stages (which also flooded MLflow's params). And the documented limits
(orchestrator/limits.py): over each, exit 2 naming the file, the line and the limit; at
each, the recipe loads.

Inputs that could hang or exhaust memory run in a subprocess with a hang detector and an
address-space cap, so that a regression fails the test instead of stalling the suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from support.robust_helpers import (
    LOAD_TIMEOUT_S,
    RUN_MEMORY_CAP,
    RUN_TIMEOUT_S,
    VALIDATE_MEMORY_CAP,
    assert_no_hang,
    cache_entries,
    check_clean_error,
    cli_subprocess,
    line_of,
    mentions_number,
    small_recipe,
    write_yaml,
)

from orchestrator import limits
from orchestrator.errors import OrchestratorError
from orchestrator.recipe.loading import load_recipe

BASE = yaml.safe_dump(small_recipe(), sort_keys=False)


def alias_bomb(levels: int = 9, fan_out: int = 10) -> str:
    """'Billion laughs': `levels` anchors, each a list of `fan_out` aliases of the last,
    so expanding the last gives fan_out ** levels scalars from a few hundred bytes."""
    lines = ['lol0: &a0 ["lol"]']
    for level in range(1, levels + 1):
        items = ", ".join([f"*a{level - 1}"] * fan_out)
        lines.append(f"lol{level}: &a{level} [{items}]")
    return "\n".join(lines) + "\n"


def validate(path: Path, env: dict[str, str], cwd: Path, *extra: str):  # noqa: ANN201
    done = cli_subprocess(["validate", path, *extra], env, cwd, timeout=LOAD_TIMEOUT_S,
                          memory_cap=VALIDATE_MEMORY_CAP)
    print(f"validate {path.name}: exit {done.code} after {done.seconds:.1f} s")
    assert_no_hang(done, f"orchestrator validate {path}")
    return done


@pytest.mark.parametrize("where", ["top-level keys", "inside a pipeline's stages"])
def test_alias_bomb(where: str, tmp_path: Path, load_env: dict[str, str]) -> None:
    bomb = alias_bomb()
    if where == "top-level keys":
        text = BASE + bomb
    else:  # the expansion lands in a field the recipe really reads
        text = bomb + BASE.replace("  - freeze", "  - *a9")
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    done = validate(path, load_env, tmp_path)
    message = check_clean_error(done.code, done.err, path)  # type: ignore[arg-type]
    assert mentions_number(message, limits.MAX_YAML_NODES), message


def test_alias_bomb_in_a_set_value(tmp_path: Path, load_env: dict[str, str]) -> None:
    path = write_yaml(tmp_path / "recipe.yaml", small_recipe())
    value = "{" + alias_bomb().strip().replace("\n", ", ") + "}"
    done = validate(path, load_env, tmp_path, "--set", f"tags={value}")
    message = check_clean_error(done.code, done.err)  # type: ignore[arg-type]
    assert "--set" in message or str(path) in message


def test_aliases_below_the_limit_still_load(tmp_path: Path) -> None:
    """Aliases are legitimate YAML: a recipe that shares a stage list through an anchor
    loads as before."""
    data = small_recipe(stages=["freeze", "strip"])
    data["pipelines"]["copy"] = {"stages": ["freeze", "strip"]}
    text = yaml.safe_dump(data, sort_keys=False)
    text = text.replace("  fp32:\n    stages:", "  fp32:\n    stages: &shared", 1)
    head, tail = text.split("  copy:\n")
    text = head + "  copy:\n    stages: *shared\n"
    path = tmp_path / "anchors.yaml"
    path.write_text(text)
    loaded = load_recipe(path)
    assert [s for s, _ in loaded.stages["copy"]] == ["freeze", "strip"]


@pytest.mark.parametrize("command", ["validate", "run"])
def test_recipe_that_is_dev_zero(command: str, tmp_path: Path, run_env: dict[str, str]) -> None:
    path = tmp_path / "recipe.yaml"
    path.symlink_to("/dev/zero")
    out = tmp_path / "out"
    args = ["validate", path] if command == "validate" else ["run", path, "-o", out]
    done = cli_subprocess(args, run_env, tmp_path,
                          timeout=LOAD_TIMEOUT_S if command == "validate" else RUN_TIMEOUT_S,
                          memory_cap=VALIDATE_MEMORY_CAP if command == "validate"
                          else RUN_MEMORY_CAP)
    print(f"{command} /dev/zero: exit {done.code} after {done.seconds:.1f} s")
    assert_no_hang(done, f"orchestrator {command} of /dev/zero")
    check_clean_error(done.code, done.err, path)  # type: ignore[arg-type]
    assert not out.exists()


@pytest.mark.parametrize("command", ["validate", "run"])
def test_recipe_that_is_a_fifo_with_no_writer(command: str, tmp_path: Path,
                                              run_env: dict[str, str]) -> None:
    path = tmp_path / "recipe.yaml"
    os.mkfifo(path)
    out = tmp_path / "out"
    args = ["validate", path] if command == "validate" else ["run", path, "-o", out]
    done = cli_subprocess(args, run_env, tmp_path,
                          timeout=LOAD_TIMEOUT_S if command == "validate" else RUN_TIMEOUT_S)
    print(f"{command} FIFO: exit {done.code} after {done.seconds:.1f} s")
    assert_no_hang(done, f"orchestrator {command} of a FIFO")
    check_clean_error(done.code, done.err, path)  # type: ignore[arg-type]
    assert not out.exists()


def test_fifty_thousand_stages(tmp_path: Path, load_env: dict[str, str]) -> None:
    """Refused at validation, naming the limit and the pipeline's line; so nothing reaches
    MLflow (its database is not even created) and no 140,000-character param exists."""
    data = small_recipe(stages=["freeze", *["strip"] * 49_999])
    path = write_yaml(tmp_path / "stages.yaml", data)
    done = validate(path, load_env, tmp_path)
    message = check_clean_error(done.code, done.err, path)  # type: ignore[arg-type]
    assert mentions_number(message, limits.MAX_STAGES_PER_PIPELINE), message
    text = path.read_text()
    assert f"{path}:{line_of(text, 'stages:')}:" in message or \
        f"{path}:{line_of(text, 'fp32:')}:" in message, message
    assert len(message) < 5000, "the stage list is echoed back"
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()
    assert cache_entries(tmp_path / ".orchestrator") == set()


# ---------------------------------------------------------------- each limit, both sides


def over_and_at(kind: str, count: int) -> dict:
    """A small recipe with `count` pipelines, stages or targets."""
    if kind == "pipelines":
        data = small_recipe()
        data["pipelines"] = {f"p{i}": {"stages": ["freeze"]} for i in range(count)}
    elif kind == "stages":
        data = small_recipe(stages=["freeze", *["strip"] * (count - 1)])
    else:
        data = small_recipe(targets=[{"name": f"t{i}", "device": "phone-2016"}
                                     for i in range(count)])
    return data


LIMITS = {"pipelines": "MAX_PIPELINES", "stages": "MAX_STAGES_PER_PIPELINE",
          "targets": "MAX_TARGETS"}


@pytest.mark.parametrize("kind", sorted(LIMITS))
def test_count_limits(kind: str, tmp_path: Path) -> None:
    limit = getattr(limits, LIMITS[kind])
    at = write_yaml(tmp_path / "at.yaml", over_and_at(kind, limit))
    loaded = load_recipe(at)
    assert loaded.recipe is not None
    over = write_yaml(tmp_path / "over.yaml", over_and_at(kind, limit + 1))
    with pytest.raises(OrchestratorError) as caught:
        load_recipe(over)
    error = caught.value
    assert error.exit_code == 2 and error.file == str(over) and error.line is not None
    assert mentions_number(str(error), limit), str(error)


def test_recipe_size_limit(tmp_path: Path) -> None:
    text = yaml.safe_dump(small_recipe(), sort_keys=False)
    padding = limits.MAX_RECIPE_BYTES - len(text.encode()) - 1
    at = tmp_path / "at.yaml"
    at.write_text(text + "#" * padding + "\n")
    assert at.stat().st_size == limits.MAX_RECIPE_BYTES
    load_recipe(at)
    over = tmp_path / "over.yaml"
    over.write_text(text + "#" * (padding + 1) + "\n")
    with pytest.raises(OrchestratorError) as caught:
        load_recipe(over)
    assert caught.value.exit_code == 2 and str(over) in str(caught.value)
    assert mentions_number(str(caught.value), limits.MAX_RECIPE_BYTES), str(caught.value)


def test_huge_recipe_is_refused_without_reading_it_all(tmp_path: Path,
                                                       load_env: dict[str, str]) -> None:
    """A 3 GB sparse recipe: refused by its size, under a 2 GB address-space cap."""
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as handle:
        handle.write(BASE.encode())
        handle.truncate(3 << 30)
    done = validate(path, load_env, tmp_path)
    message = check_clean_error(done.code, done.err, path)  # type: ignore[arg-type]
    assert mentions_number(message, limits.MAX_RECIPE_BYTES), message


def test_name_length_limit(tmp_path: Path) -> None:
    at = write_yaml(tmp_path / "at.yaml", small_recipe(name="n" * limits.MAX_NAME_LENGTH))
    load_recipe(at)
    over = write_yaml(tmp_path / "over.yaml",
                      small_recipe(name="n" * (limits.MAX_NAME_LENGTH + 1)))
    with pytest.raises(OrchestratorError) as caught:
        load_recipe(over)
    assert caught.value.exit_code == 2 and caught.value.line == 2
    assert mentions_number(str(caught.value), limits.MAX_NAME_LENGTH), str(caught.value)
