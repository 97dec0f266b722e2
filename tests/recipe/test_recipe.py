"""Recipe loading and validation: every bad recipe exits 2 with file, line, column and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import DataError, ModelSourceError, RecipeError
from orchestrator.recipe.loading import apply_overrides, load_recipe

ROOT = Path(__file__).resolve().parents[2]
BAD = Path(__file__).resolve().parents[1] / "fixtures" / "recipes"


@pytest.fixture(autouse=True)
def _example(digits_example: Path) -> None:
    """Recipes point at the digits example; build it once."""


def test_digits_recipe_is_valid() -> None:
    loaded = load_recipe(ROOT / "recipes" / "digits.yaml")
    assert "fp32" in loaded.stages
    assert [name for name, _ in loaded.stages["fp32"]][:3] == ["freeze", "strip", "fold"]


# (fixture, error class, expected line, expected field, words in the message)
CASES = [
    ("yaml_syntax.yaml", RecipeError, 8, None, ["YAML syntax error"]),
    ("unknown_top_key.yaml", RecipeError, 5, "pipeline", ["unknown key 'pipeline'",
                                                          'did you mean "pipelines"']),
    ("unknown_stage.yaml", RecipeError, 7, "pipelines.fp32.stages.2",
     ["unknown stage 'flod'", 'did you mean "fold"']),
    ("bad_param_type.yaml", RecipeError, 9, "pipelines.fp32.stages.1.benchmark.runs",
     ["integer", "'many'"]),
    ("from_missing.yaml", RecipeError, 9, "pipelines.int8.from",
     ["'fp23'", 'did you mean "fp32"']),
    ("from_cycle.yaml", RecipeError, 7, "pipelines.a.from", ["cycle", "a -> b -> a"]),
    ("missing_model.yaml", ModelSourceError, 4, "model.path", ["does not exist"]),
    ("npz_missing_array.yaml", DataError, 6, "data.evaluation.inputs", ["x_tset", "x_test"]),
    ("freeze_ranges_without_log.yaml", RecipeError, 12, "pipelines.int8.stages.1",
     ["freeze_ranges needs an earlier log_ranges"]),
    ("log_ranges_without_data.yaml", RecipeError, 7, "pipelines.int8.stages.4",
     ["log_ranges needs data.representative"]),
    ("samples_zero.yaml", RecipeError, 6, "data.representative.samples", ["at least 1, found 0"]),
    ("log_file_missing.yaml", RecipeError, 10, "pipelines.int8.stages.2.freeze_ranges.log_file",
     ["file not found", "no_such_ranges.log"]),
    # union fields (stage entries, devices): the error of the branch that fits the input's
    # type, at the real dotted path (no pydantic branch tags such as `str` or `Device`)
    ("bad_stage_params_list.yaml", RecipeError, 11, "pipelines.fp32.stages.1.fold",
     ["params of stage 'fold' must be a mapping, found list"]),
    ("bad_stage_unknown_mapping.yaml", RecipeError, 10, "pipelines.fp32.stages.1.nope",
     ["unknown stage 'nope'", "stages are:", "freeze_ranges"]),
    ("bad_stage_not_a_name.yaml", RecipeError, 10, "pipelines.fp32.stages.1",
     ["expected a valid string or a valid dictionary", "found 3"]),
    ("bad_device_inline.yaml", RecipeError, 9, "targets.0.device.flops_per_second",
     ["greater than 0", "found -1"]),
    ("bad_device_missing_ram.yaml", RecipeError, 8, "targets.0.device",
     ["missing required field 'ram_mb'"]),
    ("bad_device_extra_key.yaml", RecipeError, 8, "targets.0.device.ram_mbs",
     ["unknown key 'ram_mbs'", 'did you mean "ram_mb"']),
    ("bad_device_type.yaml", RecipeError, 8, "targets.0.device",
     ["expected a valid string or", "instance of Device", "found 5"]),
    # tune.percentiles: 0 <= p < 50, as freeze_ranges' own percentiles; NaN rejected
    ("bad_percentile.yaml", RecipeError, 9, "tune.percentiles.1", ["less than 50", "found 50"]),
    ("bad_percentile_negative.yaml", RecipeError, 6, "tune.percentiles.0",
     ["greater than or equal to 0", "found -1"]),
    ("bad_percentile_nan.yaml", RecipeError, 7, "tune.percentiles.1", ["finite number", "nan"]),
]
UNION_FIXTURES = [c[0] for c in CASES if c[0].startswith(("bad_stage_", "bad_device_"))]


@pytest.mark.parametrize(("fixture", "cls", "line", "field", "words"), CASES,
                         ids=[c[0] for c in CASES])
def test_bad_recipe_is_located(fixture: str, cls: type, line: int, field: str | None,
                               words: list[str]) -> None:
    with pytest.raises(cls) as info:
        load_recipe(BAD / fixture)
    error = info.value
    assert error.exit_code == 2
    assert error.file == str(BAD / fixture)
    assert error.line == line, str(error)
    assert error.column is not None
    if field is not None:
        assert error.field == field
    for word in words:
        assert word in str(error)


@pytest.mark.parametrize("fixture", [c[0] for c in CASES])
def test_validate_command_exits_2(fixture: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(BAD / fixture)]) == 2
    err = capsys.readouterr().err
    assert f"{BAD / fixture}:" in err
    assert "Traceback" not in err


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(ROOT / "recipes" / "digits.yaml")]) == 0
    assert "ok" in capsys.readouterr().out


def test_overrides_set_nested_values() -> None:
    data = {"model": {"path": "a"}, "pipelines": {"p": {"stages": ["freeze", "strip"]}}}
    out = apply_overrides(data, ["model.path=/models/v7", "pipelines.p.stages.1=fold",
                                 "data.evaluation.samples=10"])
    assert out["model"]["path"] == "/models/v7"
    assert out["pipelines"]["p"]["stages"] == ["freeze", "fold"]
    assert out["data"]["evaluation"]["samples"] == 10
    assert data["model"]["path"] == "a"  # the original is untouched


def test_override_is_validated_like_the_file() -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(ROOT / "recipes" / "digits.yaml", ["pipelines.fp32.stages.0=freez"])
    assert 'did you mean "freeze"' in str(info.value)
    with pytest.raises(RecipeError):
        load_recipe(ROOT / "recipes" / "digits.yaml", ["broken"])


@pytest.mark.parametrize("fixture", UNION_FIXTURES)
def test_union_errors_carry_no_branch_tags(fixture: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(BAD / fixture)
    error = info.value
    assert error.field is not None
    tags = {"str", "Device", "[key]"}
    assert not [p for p in error.field.split(".") if p in tags or p.startswith(
        ("dict[", "function-", "nullable["))], error.field
    assert not error.message.startswith("Input should be a valid string")


def test_valid_percentiles_and_inline_device_load() -> None:
    loaded = load_recipe(ROOT / "recipes" / "digits.yaml", [
        "tune.percentiles=[0, 49.5, 5]",
        "targets.0.device={flops_per_second: 1.0e9, cores: 1, ram_mb: 512}"])
    assert loaded.recipe.tune is not None
    assert loaded.recipe.tune.percentiles == [0.0, 49.5, 5.0]
    assert loaded.recipe.targets[0].device.ram_mb == 512  # type: ignore[union-attr]


@pytest.mark.parametrize(("override", "scalar", "child"), [
    ("name.x.y=1", "'name' is 'digits'", "'x'"),
    ("version.x.y=1", "'version' is 1 (int)", "'x'"),
    ("version.x=1", "'version' is 1 (int)", "'x'"),
    ("model.path.deep.er=1", "'model.path' is 'a' (str)", "'deep'"),
    ("pipelines.p.stages.0.x=1", "'pipelines.p.stages.0' is 'freeze'", "'x'"),
])
def test_override_into_a_scalar_is_a_recipe_error(override: str, scalar: str,
                                                  child: str) -> None:
    data = {"version": 1, "name": "digits", "model": {"path": "a"},
            "pipelines": {"p": {"stages": ["freeze"]}}}
    with pytest.raises(RecipeError) as info:
        apply_overrides(data, [override])
    error = info.value
    key = override.partition("=")[0]
    assert error.exit_code == 2
    assert error.file == "--set" and error.field == key and error.line is None
    assert scalar in error.message and f"so it has no {child}" in error.message
    assert "not a mapping or list" in error.message


def test_validate_override_into_a_scalar_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(ROOT / "recipes" / "digits.yaml"), "--set",
                 "name.x.y=1"]) == 2
    err = capsys.readouterr().err
    assert "[--set name.x.y]" in err and "not a mapping or list" in err
    assert "Traceback" not in err


def test_schema_and_stages_commands(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "pipelines" in schema["properties"]
    assert main(["stages"]) == 0
    out = capsys.readouterr().out
    for name in ("freeze", "strip", "fold", "benchmark", "evaluate"):
        assert f"\n{name}  [" in "\n" + out
