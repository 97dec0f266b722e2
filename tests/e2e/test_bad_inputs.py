"""Bad models and data found at run time: exit 2 (or 3 for a failing stage), a clear
message, and nothing written: no output folder, no cache entry."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits"

pytestmark = pytest.mark.slow


def cache_entries(workspace: Path) -> list[Path]:
    cache = workspace / ".orchestrator" / "cache"
    return [p for p in cache.glob("*/*")] if cache.exists() else []


def run(recipe: Path, workspace: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["run", str(recipe), "-o", str(workspace / "out")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def write_recipe(folder: Path, model: Path, extra: str = "", stages: str = "[freeze]") -> Path:
    recipe = folder / "recipe.yaml"
    recipe.write_text(f"version: 1\nname: bad\nmodel:\n  path: {model}\n{extra}"
                      f"pipelines:\n  fp32:\n    stages: {stages}\n")
    return recipe


@pytest.mark.parametrize("content", [b"", os.urandom(4096)], ids=["empty", "random-bytes"])
def test_model_file_that_is_not_a_model(content: bytes, workspace: Path, prefect_server: None,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    model = workspace / "model.pb"
    model.write_bytes(content)
    code, err = run(write_recipe(workspace, model), workspace, capsys)
    assert code == 2
    assert str(model) in err and "model.path" in err and "recipe.yaml:4:" in err
    assert not (workspace / "out").exists()
    assert cache_entries(workspace) == []


def test_output_name_not_in_graph(digits_example: Path, workspace: Path, prefect_server: None,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(FIXTURES / "recipes" / "bad_io_names.yaml", workspace, capsys)
    assert code == 2
    # at the outputs entry (line 5), not at model.path (line 4)
    assert "no_such_output" in err and "bad_io_names.yaml:5:" in err
    assert "[model.outputs.0]" in err
    assert not (workspace / "out").exists()
    assert cache_entries(workspace) == []


@pytest.mark.parametrize(("entry", "line", "field", "said"), [
    ("{name: image, dtype: float32, shape: [1, 9, 9, 1]}", 8, "model.inputs.0.shape",
     "input 'image' has shape [None, 8, 8, 1] in the model; the recipe's [1, 9, 9, 1] does "
     "not fit it"),
    ("{name: image, dtype: int32, shape: [1, 8, 8, 1]}", 8, "model.inputs.0.dtype",
     "input 'image' is float32 in the model, but the recipe says int32"),
    ("{name: no_such_input}", 8, "model.inputs.0.name", "input 'no_such_input' not found")])
def test_a_wrong_input_entry_is_reported_at_its_line(
        entry: str, line: int, field: str, said: str, digits_example: Path,
        workspace: Path) -> None:
    from orchestrator.engine.prepared_run import load_source
    from orchestrator.errors import ModelSourceError
    from orchestrator.recipe.loading import load_recipe

    recipe = workspace / "recipe.yaml"
    # model.path on line 5, the inputs entry on line 8, as a person lays a recipe out
    recipe.write_text(f"version: 1\nname: bad\n\nmodel:\n  path: {DIGITS / 'saved_model'}\n"
                      f"  format: auto\n  inputs:\n    - {entry}\n"
                      "pipelines:\n  fp32:\n    stages: [freeze]\n")
    with pytest.raises(ModelSourceError) as info:
        load_source(load_recipe(recipe))
    text = str(info.value)
    assert text.startswith(f"{recipe}:{line}:"), text
    assert f"[{field}]" in text and said in text
    assert str(DIGITS / "saved_model") in text  # the model it was checked against


def test_evaluation_shape_does_not_fit(digits_example: Path, workspace: Path,
                                       prefect_server: None,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(FIXTURES / "recipes" / "eval_shape_mismatch.yaml", workspace, capsys)
    assert code == 2
    assert "eval_shape_mismatch.yaml:" in err and "data.evaluation" in err
    assert "(4, 4, 1)" in err or "4, 4, 1" in err
    assert not (workspace / "out").exists()
    assert cache_entries(workspace) == []


def test_representative_shape_does_not_fit(digits_example: Path, workspace: Path,
                                           prefect_server: None,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(FIXTURES / "recipes" / "repr_shape_mismatch.yaml", workspace, capsys)
    assert code == 2
    assert "repr_shape_mismatch.yaml:" in err and "data.representative" in err
    assert not (workspace / "out").exists()
    assert cache_entries(workspace) == []


def test_failing_stage_exits_3_naming_it(digits_example: Path, workspace: Path,
                                         prefect_server: None,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    recipe = write_recipe(
        workspace, DIGITS / "saved_model",
        stages="[freeze, {transform: {transforms: 'no_such_transform'}}, strip]")
    code, err = run(recipe, workspace, capsys)
    assert code == 3
    assert "fp32/transform" in err
    assert not (workspace / "out").exists()
    # the stages before the failure are cached and complete; the failed one left nothing
    entries = cache_entries(workspace)
    assert all((entry / "result.json").is_file() for entry in entries)
    assert not list((workspace / ".orchestrator" / "cache").rglob("*.tmp"))
    assert entries  # freeze's
    # and a rerun with the stage fixed reuses the good entries
    recipe.write_text(recipe.read_text().replace("no_such_transform", "sort_by_execution_order"))
    code, _ = run(recipe, workspace, capsys)
    assert code == 0
    report = json.loads((workspace / "out" / "report.json").read_text())
    assert [s["cached"] for s in report["variants"]["fp32"]["stages"]] == [True, False, False]


def test_range_log_file_with_no_matching_nodes(digits_example: Path, workspace: Path,
                                               prefect_server: None,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(FIXTURES / "recipes" / "log_file_no_match.yaml", workspace, capsys)
    assert code == 2
    assert "log_file_no_match.yaml:12:" in err and "pipelines.int8.stages.4" in err
    assert "matches none of the graph's RequantizationRange nodes" in err
    assert "some/other_node" in err  # what the log names
    assert "expected lines for:" in err and "/q8/range" in err  # what the graph needs
    assert not (workspace / "out").exists()


def test_ignore_errors_passes_the_model_through(digits_example: Path, workspace: Path,
                                                prefect_server: None,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # beside it, in the same run, a pipeline of the freeze stage alone: the reference
    recipe = workspace / "recipe.yaml"
    recipe.write_text(f"version: 1\nname: bad\nmodel:\n  path: {DIGITS / 'saved_model'}\n"
                      "pipelines:\n  fp32:\n    stages: [freeze, {transform: {transforms: "
                      "'no_such_transform', ignore_errors: true}}]\n"
                      "  ref:\n    stages: [freeze]\n")
    code, _ = run(recipe, workspace, capsys)
    assert code == 0
    report = json.loads((workspace / "out" / "report.json").read_text())
    stages = report["variants"]["fp32"]["stages"]
    assert [s["name"] for s in stages] == ["freeze", "transform"]
    assert "ignore_errors" in stages[1]["warnings"][0]
    # the output is the freeze stage's model, unchanged
    assert ((workspace / "out" / "fp32" / "model.pb").read_bytes()
            == (workspace / "out" / "ref" / "model.pb").read_bytes())
    # and the skipped stage was not cached: the next run tries it again
    code, _ = run(recipe, workspace, capsys)
    assert code == 0
    report = json.loads((workspace / "out" / "report.json").read_text())
    assert [s["cached"] for s in report["variants"]["fp32"]["stages"]] == [True, False]
