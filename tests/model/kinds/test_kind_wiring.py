"""Validation: a stage after an artifact kind it does not accept is exit 2 at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import RecipeError
from orchestrator.recipe.loading import load_recipe

BAD = Path(__file__).resolve().parents[2] / "fixtures" / "recipes"
ROOT = Path(__file__).resolve().parents[3]

# (fixture, line, field, words in the message)
CASES = [
    ("kind_memmap_after_encrypt.yaml", 11, "pipelines.mobile.stages.0",
     ["memmap accepts graphdef; found encrypted (made by encrypt at",
      "kind_memmap_after_encrypt.yaml:7:"]),
    ("kind_fold_after_memmap.yaml", 10, "pipelines.fp32.stages.2",
     ["fold accepts graphdef; found memmapped (made by memmap at",
      "kind_fold_after_memmap.yaml:9:"]),
    # the first stage of a `from:` child sees its parent's last kind (benchmark passes it on)
    ("kind_quantize_nodes_after_encrypt.yaml", 10, "pipelines.int8.stages.0",
     ["quantize_weights accepts graphdef; found encrypted (made by encrypt at"]),
    # a flatbuffer is mapped as it is: the error says why memmap does not apply
    ("kind_memmap_after_tflite.yaml", 10, "pipelines.lite.stages.2",
     ["memmap accepts graphdef; found tflite (made by convert_tflite at",
      "memory-mapped as it is: memmap does not apply to the LiteRT path"]),
    # int8 calibrates on representative data; dynamic_range (line 9) needs none
    ("tflite_int8_without_data.yaml", 13, "pipelines.lite8.stages.1",
     ["convert_tflite needs data.representative (mode int8 calibrates",
      "mode dynamic_range needs no data"]),
]


@pytest.mark.parametrize(("fixture", "line", "field", "words"), CASES, ids=[c[0] for c in CASES])
def test_stage_after_a_kind_it_does_not_accept(fixture: str, line: int, field: str,
                                               words: list[str], digits_example: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(BAD / fixture)
    error = info.value
    assert error.exit_code == 2
    assert (error.file, error.line, error.field) == (str(BAD / fixture), line, field), str(error)
    assert error.column is not None
    for word in words:
        assert word in str(error)
    assert main(["validate", str(BAD / fixture)]) == 2
    assert f"{BAD / fixture}:{line}:" in capsys.readouterr().err


def test_quantize_nodes_itself_rejects_encrypted(digits_example: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text((BAD / "kind_quantize_nodes_after_encrypt.yaml").read_text()
                      .replace("../../../examples", str(ROOT / "examples"))
                      .replace("[quantize_weights, quantize_nodes]", "[quantize_nodes]"))
    with pytest.raises(RecipeError, match="quantize_nodes accepts graphdef; found encrypted"):
        load_recipe(recipe)


def test_the_table_of_kinds() -> None:
    """Measuring and describing stages take every kind; memmap and encrypt say what they make."""
    from orchestrator.model.kinds import KIND_MODULES
    from orchestrator.stages import get_stage

    for name in ("benchmark", "evaluate", "ops_header"):
        assert get_stage(name).accepts == frozenset(KIND_MODULES)
    # a flatbuffer has no GraphDef to draw
    assert get_stage("graph_view").accepts == frozenset(KIND_MODULES) - {"tflite"}
    assert (get_stage("memmap").accepts, get_stage("memmap").produces) == (
        frozenset({"graphdef"}), "memmapped")
    assert "tflite" in get_stage("memmap").refuses
    assert (get_stage("convert_tflite").accepts, get_stage("convert_tflite").produces) == (
        frozenset({"graphdef"}), "tflite")
    assert get_stage("encrypt").accepts == frozenset({"graphdef", "memmapped", "tflite"})
    assert get_stage("encrypt").produces == "encrypted"
    assert get_stage("fold").accepts == frozenset({"graphdef"})


def test_digits_recipe_mobile_pipeline_is_valid() -> None:
    loaded = load_recipe(ROOT / "recipes" / "digits.yaml", check_files=False)
    assert [name for name, _ in loaded.stages["mobile"]] == ["memmap", "encrypt", "ops_header",
                                                              "benchmark", "evaluate"]
