"""Issue 39: every count a recipe or a flag takes has a bound (orchestrator/limits.py) that
the schema states and `validate` enforces at its line, saying the bound and why. Without
them `benchmark: {threads: 1000000}` ended in SIGABRT and `{runs: 10^12}` ran until killed.

The walks below fail when a new count slips in without a bound: every int (and every
timeout) of the recipe's models, the device spec and each stage's params, and every
numeric option of the command line."""

from __future__ import annotations

import argparse
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from orchestrator import limits
from orchestrator.cli.main import build_parser, main
from orchestrator.errors import OrchestratorError
from orchestrator.recipe.loading import load_recipe
from orchestrator.recipe.schema import recipe_schema
from orchestrator.spec.devices import Device
from orchestrator.spec.models import Recipe
from orchestrator.stages import all_stages

# --------------------------------------------------------------------------- the walk


def _leaves(annotation: Any, metadata: tuple = (), path: tuple = ()
            ) -> Iterator[tuple[type, tuple, tuple]]:
    """(a scalar type, its constraints, where it sits: "[]" per list or tuple level) for
    every number inside an annotation; models are walked by `_fields`."""
    if get_origin(annotation) is Annotated:
        inner, *extra = get_args(annotation)
        found = tuple(m for item in extra
                      for m in (item.metadata if isinstance(item, FieldInfo) else [item]))
        yield from _leaves(inner, metadata + found, path)
    elif get_origin(annotation) in (Union, types.UnionType) or isinstance(
            annotation, types.UnionType):
        for arg in get_args(annotation):
            yield from _leaves(arg, metadata, path)
    elif get_origin(annotation) in (list, tuple):
        for arg in get_args(annotation):
            if arg is not Ellipsis:
                yield from _leaves(arg, (), (*path, "[]"))
    elif get_origin(annotation) is dict:
        yield from _leaves(get_args(annotation)[1], (), (*path, "{}"))
    elif get_origin(annotation) is Literal or annotation is bool:
        return  # a choice among a few values, or a switch: not a count
    elif isinstance(annotation, type) and issubclass(annotation, int | float):
        yield annotation, metadata, path


def _fields(model: type[BaseModel], prefix: tuple = (), seen: frozenset = frozenset()
            ) -> Iterator[tuple[tuple, type, tuple]]:
    """(field path, scalar type, constraints) of every number in `model` and the models
    it holds."""
    for name, info in model.model_fields.items():
        key = info.alias or name
        stack = [(info.annotation, tuple(info.metadata))]
        for leaf, metadata, where in _leaves(info.annotation, tuple(info.metadata)):
            yield (*prefix, key, *where), leaf, metadata
        while stack:
            annotation, _ = stack.pop()
            for arg in (get_args(annotation) or ()):
                stack.append((arg, ()))
            if isinstance(annotation, type) and issubclass(annotation, BaseModel) \
                    and annotation not in seen:
                yield from _fields(annotation, (*prefix, key), seen | {annotation})


def _upper(metadata: tuple) -> float | None:
    return next((getattr(m, a) for m in metadata for a in ("le", "lt")
                 if getattr(m, a, None) is not None), None)


def _lower(metadata: tuple) -> float | None:
    return next((getattr(m, a) for m in metadata for a in ("ge", "gt")
                 if getattr(m, a, None) is not None), None)


def _is_count(path: tuple, leaf: type) -> bool:
    """Whole numbers, and the float settings that are durations (a timeout)."""
    return leaf is int or str(path[-1] if path[-1] not in ("[]", "{}") else path[-2]
                              ).endswith("_s")


def _models() -> list[tuple[str, type[BaseModel]]]:
    return [("recipe", Recipe), ("device", Device),
            *((f"stage {s.name}", s.params) for s in all_stages())]


def test_every_count_has_an_upper_and_a_lower_bound() -> None:
    counted, unbounded = 0, []
    for owner, model in _models():
        for path, leaf, metadata in _fields(model):
            if not _is_count(path, leaf):
                continue
            counted += 1
            if _upper(metadata) is None or _lower(metadata) is None:
                unbounded.append(f"{owner}: {'.'.join(map(str, path))}")
    assert counted >= 25  # the walk sees the counts (runs, warmup, threads, samples, ...)
    assert not unbounded, f"counts without a bound in orchestrator/limits.py: {unbounded}"


def test_the_schema_states_the_bounds() -> None:
    schema = recipe_schema()
    benchmark = next(e for e in schema["$defs"]["StageEntry"]["anyOf"][1:]
                     if "benchmark" in e["properties"])["properties"]["benchmark"]["anyOf"][0]
    assert benchmark["properties"]["runs"]["maximum"] == limits.BOUNDS["runs"].high
    assert benchmark["properties"]["warmup"]["maximum"] == limits.BOUNDS["warmup"].high
    threads = benchmark["properties"]["threads"]["anyOf"]
    assert threads[0]["maximum"] == 256 and threads[1]["items"]["maximum"] == 256
    assert threads[1]["maxItems"] == limits.MAX_THREAD_SETTINGS
    assert schema["$defs"]["Tune"]["properties"]["max_trials"]["maximum"] == 1000


# --------------------------------------------------------------------------- recipes

HEAD = ("version: 1\nname: bounds\nmodel:\n  path: model.pb\n"
        "data:\n  representative: {source: data.npz, array: x}\n"
        "  evaluation: {source: data.npz, inputs: x, labels: y}\n"
        "targets:\n  - {name: phone, device: phone-2016, connect: 'qemu://aarch64'}\n")


def _value(high: float, where: tuple) -> Any:
    """A value just above `high`, wrapped as the field holds it."""
    value: Any = int(high) + 1
    for level in reversed(where):
        value = [value, 1] if level == "[]" else {"k": value}
    return value


def _stage_cases() -> Iterator[Any]:
    for stage in all_stages():
        for path, leaf, metadata in _fields(stage.params):
            if _is_count(path, leaf):
                yield pytest.param(stage.name, path, _upper(metadata),
                                   id=f"{stage.name}.{'.'.join(map(str, path))}")


# the recipe's own counts, each with the YAML that holds one too large (`{v}`), its
# dotted field, and its path in the models (the walk checks this table is complete)
RECIPE_CASES = {
    ("model", "inputs", "shape", "[]"): (
        "model:\n  path: model.pb\n  inputs: [{name: x, shape: [{v}, 8]}]\n",
        "model.inputs.0.shape.0", "dimension"),
    ("data", "representative", "samples"): (
        "data:\n  representative: {source: data.npz, array: x, samples: {v}}\n",
        "data.representative.samples", "samples"),
    ("data", "representative", "batch_size"): (
        "data:\n  representative: {source: data.npz, array: x, batch_size: {v}}\n",
        "data.representative.batch_size", "batch"),
    ("data", "representative", "resize", "[]"): (
        "data:\n  representative: {source: images, resize: [8, {v}]}\n",
        "data.representative.resize.1", "image_side"),
    ("targets", "device", "cores"): (
        "targets:\n  - name: t\n    device: {flops_per_second: 1.0e+9, ram_mb: 64,\n"
        "             cores: {v}}\n", "targets.0.device.cores", "cores"),
    ("targets", "threads"): (
        "targets:\n  - name: t\n    device: raspberry-pi-4\n    threads: {v}\n",
        "targets.0.threads", "threads"),
    ("targets", "device", "threads"): (
        "targets:\n  - name: t\n    device: {flops_per_second: 1.0e+9, ram_mb: 64, cores: 4,\n"
        "             threads: {v}}\n", "targets.0.device.threads", "cores"),
    ("targets", "device", "clusters", "count"): (
        "targets:\n  - name: t\n    device: {flops_per_second: 1.0e+9, ram_mb: 64, cores: 4,\n"
        "             clusters: [{core: a, ghz: 1, fp32_flops_per_cycle: 8,\n"
        "                         count: {v}}]}\n", "targets.0.device.clusters.0.count", "cores"),
    ("tune", "max_trials"): ("tune:\n  max_trials: {v}\n", "tune.max_trials", "trials"),
    ("tune", "timeout_s"): ("tune:\n  timeout_s: {v}\n", "tune.timeout_s", "timeout_s"),
    ("execution", "workers"): ("execution:\n  executor: dask\n  workers: {v}\n",
                               "execution.workers", "workers"),
    ("execution", "threads_per_worker"): ("execution:\n  threads_per_worker: {v}\n",
                                          "execution.threads_per_worker", "threads"),
}
# the same fields reached through the other data role: the same models
SAME_MODEL = {"evaluation": "representative"}


def _errors(path: Path) -> list[OrchestratorError]:
    with pytest.raises(OrchestratorError) as caught:
        load_recipe(path, check_files=False)
    return list(getattr(caught.value, "errors", None) or [caught.value])


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_the_recipe_table_covers_every_count_of_the_recipe() -> None:
    walked = {tuple(SAME_MODEL.get(p, p) for p in path)
              for path, leaf, _ in _fields(Recipe) if _is_count(path, leaf)}
    assert walked == set(RECIPE_CASES)


@pytest.mark.parametrize("case", list(RECIPE_CASES), ids=lambda c: ".".join(c))
def test_a_recipe_count_above_its_bound_is_refused_at_its_line(case: tuple,
                                                               tmp_path: Path) -> None:
    snippet, field, kind = RECIPE_CASES[case]
    bound = limits.BOUNDS[kind]
    value = int(bound.high) + 1
    body = snippet.replace("{v}", str(value))
    text = ("version: 1\nname: bounds\n"
            + ("" if body.startswith("model:") else "model:\n  path: model.pb\n")
            + body + "pipelines:\n  fp32:\n    stages: [freeze]\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    found = [e for e in _errors(recipe) if e.field == field]
    assert found, [str(e) for e in _errors(recipe)]
    error = found[0]
    assert error.exit_code == 2 and error.file == str(recipe)
    assert error.line == _line_of(text, str(value))
    assert f"{value} is above {limits.shown(bound.high)}: {bound.why}" in error.message


@pytest.mark.parametrize(("stage", "path", "high"), list(_stage_cases()))
def test_a_stage_count_above_its_bound_is_refused_at_its_line(
        stage: str, path: tuple, high: float, tmp_path: Path) -> None:
    key = path[0]
    where = path[1:]
    value = _value(high, where)
    shown = int(high) + 1
    text = (HEAD + "pipelines:\n  fp32:\n    stages:\n      - freeze\n"
            f"      - {stage}:\n          {key}: {value}\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    field = ".".join(["pipelines.fp32.stages.1", stage, key,
                      *("0" if w == "[]" else "k" for w in where)])
    errors = _errors(recipe)
    found = [e for e in errors if e.field == field]
    assert found, [str(e) for e in errors]
    assert found[0].exit_code == 2
    assert found[0].line == _line_of(text, f"{key}:")
    assert f"{shown} is above {limits.shown(high)}: " in found[0].message


def test_the_issue_s_three_values_each_get_their_reason(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("version: 1\nname: fuzzed\nmodel: {path: model.pb}\npipelines:\n"
                      "  fp32:\n    stages:\n      - benchmark: {threads: 1000000}\n"
                      "      - benchmark: {runs: 1000000000000}\n"
                      "      - benchmark: {warmup: 1000000000000000}\n")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"{recipe}:7:" in err and "[pipelines.fp32.stages.0.benchmark.threads]: " \
        "1000000 is above 256: a board has fewer cores" in err
    assert f"{recipe}:8:" in err and "1000000000000 is above 100000" in err
    assert f"{recipe}:9:" in err and "1000000000000000 is above 10000" in err


@pytest.mark.parametrize("value", ["0", "-3"])
def test_below_the_lower_bound_says_so(value: str, tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("version: 1\nname: low\nmodel: {path: model.pb}\npipelines:\n"
                      f"  fp32:\n    stages: [{{benchmark: {{runs: {value}}}}}]\n")
    [error] = _errors(recipe)
    assert error.line == 6 and error.field == "pipelines.fp32.stages.0.benchmark.runs"
    assert error.message == f"expected at least 1, found {value}"


def test_a_set_override_is_bounded_too(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("version: 1\nname: low\nmodel: {path: model.pb}\npipelines:\n"
                      "  fp32:\n    stages: [freeze]\n")
    with pytest.raises(OrchestratorError) as caught:
        load_recipe(recipe, ["tune={max_trials: 1000000}"], check_files=False)
    assert "1000000 is above 1000" in str(caught.value)
    assert caught.value.field == "tune.max_trials"


# --------------------------------------------------------------------------- flags


def _numeric_options() -> Iterator[tuple[str, argparse.Action]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, subparser in sub.choices.items():
        for action in subparser._actions:
            if action.option_strings and action.type is not None:
                yield command, action


def test_no_option_takes_an_unbounded_number() -> None:
    raw = [f"{command} {action.option_strings[-1]}" for command, action in _numeric_options()
           if action.type in (int, float)]
    assert not raw, f"numeric options without a bound (use cli.common.bounded_flag): {raw}"


def _bounded_options() -> list[Any]:
    return [pytest.param(command, action.option_strings[-1], action.type.__name__,
                         id=f"{command} {action.option_strings[-1]}")
            for command, action in _numeric_options()
            if getattr(action.type, "__name__", None) in limits.BOUNDS]


def test_the_counting_options_are_bounded() -> None:
    options = {(c.values[0], c.values[1]) for c in _bounded_options()}
    assert {("benchmark", "--runs"), ("benchmark", "--warmup"), ("benchmark", "--threads"),
            ("benchmark", "--profile-runs"), ("history", "--last"),
            ("serve", "--limit")} <= options


@pytest.mark.parametrize(("command", "option", "kind"), _bounded_options())
def test_an_option_above_its_bound_is_a_usage_error(command: str, option: str, kind: str,
                                                    capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    bound = limits.BOUNDS[kind]
    too_many = int(bound.high) + 1
    with pytest.raises(SystemExit) as caught:
        main([command, option, str(too_many)])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: {too_many} is above {limits.shown(bound.high)}: " \
        f"{bound.why}" in err
    with pytest.raises(SystemExit):
        main([command, option, str(int(bound.low) - 1)])
    assert f"argument {option}: expected at least {limits.shown(bound.low)}" in \
        capsys.readouterr().err
