"""Stages a recipe gets by default: an 8-bit lineage ships compact node names.

compact_names goes after the lineage's last graphdef transform (after freeze_ranges, before
memmap/encrypt); `keep_names: true` opts out; the plan, the report's stage list and error
locations all see the stage where it was added.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engine.plan import build_plan
from orchestrator.errors import RecipeError
from orchestrator.model.keys import KeyMaterialError
from orchestrator.recipe.loading import load_recipe

ROOT = Path(__file__).resolve().parents[1]

HEAD = """\
version: 1
name: defaults
model: {{path: {model}}}
data:
  representative: {{source: {data}, array: x_calib}}
  evaluation: {{source: {data}, inputs: x_test, labels: y_test}}
pipelines:
  fp32:
    stages: [freeze, strip, fold, benchmark]
"""


@pytest.fixture
def write(tmp_path: Path, digits_example: Path):  # noqa: ANN201
    def write(pipelines: str) -> Path:
        recipe = tmp_path / "r.yaml"
        recipe.write_text(HEAD.format(model=digits_example / "saved_model",
                                      data=digits_example / "data.npz") + pipelines)
        return recipe
    return write


def names(loaded, pipeline: str) -> list[str]:  # noqa: ANN001
    return [name for name, _ in loaded.stages[pipeline]]


def test_the_readme_pipeline_gets_compact_names_after_freeze_ranges() -> None:
    loaded = load_recipe(ROOT / "recipes" / "digits.yaml")
    assert names(loaded, "int8") == ["quantize_weights", "quantize_nodes", "log_ranges",
                                     "freeze_ranges", "compact_names", "benchmark", "evaluate"]
    assert loaded.added == {"int8": [4]}
    assert "compact_names" not in names(loaded, "fp32")  # no 8-bit ops: names stay
    assert "compact_names" not in names(loaded, "mobile")  # starts from compacted int8
    # the plan runs it: benchmark measures, and mobile starts from, the compacted model
    plan = build_plan(loaded, None, {"representative": "fp"})
    int8 = plan.pipelines["int8"]
    compact = int8[4]
    assert (compact.stage, compact.kind, compact.id) == ("compact_names", "transform",
                                                         "int8/4:compact_names")
    assert compact.input_model_key == int8[3].output_model_key
    assert int8[5].input_model_key == compact.output_model_key
    assert plan.start_keys["mobile"] == compact.output_model_key
    # the float model 8-bit stages compare with is still the one before quantization
    assert compact.float_model_key == int8[0].input_model_key


def test_keep_names_opts_out(write) -> None:  # noqa: ANN001
    recipe = write("""\
  int8:
    from: fp32
    keep_names: true
    stages: [quantize_nodes, log_ranges, freeze_ranges, benchmark]
""")
    loaded = load_recipe(recipe)
    assert names(loaded, "int8") == ["quantize_nodes", "log_ranges", "freeze_ranges",
                                     "benchmark"]
    assert loaded.added == {}
    # and --set can opt out too, as the benchmark does
    digits = load_recipe(ROOT / "recipes" / "digits.yaml", ["pipelines.int8.keep_names=true"])
    assert "compact_names" not in names(digits, "int8") and digits.added == {}


def test_a_listed_compact_names_is_not_added_twice(write) -> None:  # noqa: ANN001
    recipe = write("""\
  int8:
    from: fp32
    stages: [quantize_nodes, log_ranges, freeze_ranges, {compact_names: {prefix: x}}, memmap]
""")
    loaded = load_recipe(recipe)
    assert names(loaded, "int8").count("compact_names") == 1
    assert loaded.stages["int8"][3][1].prefix == "x"  # the user's own, where they put it


def test_it_goes_before_memmap_and_encrypt(write) -> None:  # noqa: ANN001
    recipe = write("""\
  int8:
    from: fp32
    stages: [quantize_weights, quantize_nodes, log_ranges, freeze_ranges, memmap, benchmark]
""")
    assert names(load_recipe(recipe), "int8") == [
        "quantize_weights", "quantize_nodes", "log_ranges", "freeze_ranges", "compact_names",
        "memmap", "benchmark"]


def test_weights_only_pipelines_keep_their_names(write) -> None:  # noqa: ANN001
    recipe = write("""\
  w8:
    from: fp32
    stages: [quantize_weights, benchmark]
""")
    assert names(load_recipe(recipe), "w8") == ["quantize_weights", "benchmark"]


def test_a_child_that_transforms_further_compacts_instead(write) -> None:  # noqa: ANN001
    # int8's ranges are frozen in int8f by node name: compacting int8 would break that
    recipe = write("""\
  int8:
    from: fp32
    stages: [quantize_nodes, log_ranges, benchmark]
  int8f:
    from: int8
    stages: [freeze_ranges, benchmark]
  shipped:
    from: int8f
    stages: [memmap, benchmark]
""")
    loaded = load_recipe(recipe)
    assert names(loaded, "int8") == ["quantize_nodes", "log_ranges", "benchmark"]
    assert names(loaded, "int8f") == ["freeze_ranges", "compact_names", "benchmark"]
    assert names(loaded, "shipped") == ["memmap", "benchmark"]
    assert loaded.added == {"int8f": [1]}


def test_keep_names_is_inherited_and_a_child_may_turn_it_back(write) -> None:  # noqa: ANN001
    recipe = write("""\
  int8:
    from: fp32
    keep_names: true
    stages: [quantize_nodes, log_ranges, benchmark]
  debug:
    from: int8
    stages: [freeze_ranges, benchmark]
  small:
    from: int8
    keep_names: false
    stages: [freeze_ranges, benchmark]
""")
    loaded = load_recipe(recipe)
    assert names(loaded, "debug") == ["freeze_ranges", "benchmark"]
    assert names(loaded, "small") == ["freeze_ranges", "compact_names", "benchmark"]


def test_errors_after_the_added_stage_name_their_own_line(write) -> None:  # noqa: ANN001
    recipe = write("""\
  int8:
    from: fp32
    stages:
      - quantize_nodes
      - log_ranges
      - freeze_ranges
      - encrypt: {key_file: no_such.key}
""")
    loaded = load_recipe(recipe, check_files=False)
    assert names(loaded, "int8")[3:] == ["compact_names", "encrypt"]
    with pytest.raises(KeyMaterialError) as caught:  # the key is loaded with the plan
        build_plan(loaded, None, {})
    error = caught.value
    encrypt_line = recipe.read_text().splitlines().index("      - encrypt: {key_file: no_such.key}")
    assert (error.line, error.field) == (encrypt_line + 1, "pipelines.int8.stages.3")
    # the added stage itself is located at its pipeline's `stages:` key
    added = loaded.error("compact_names failed", ("pipelines", "int8", "stages", 3))
    stages_line = recipe.read_text().splitlines().index("    stages:", 10)
    assert (added.line, added.field) == (stages_line + 1, "pipelines.int8.stages")


def test_keep_names_must_be_a_boolean(write) -> None:  # noqa: ANN001
    recipe = write("""\
  int8:
    from: fp32
    keep_names: maybe
    stages: [quantize_nodes]
""")
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    assert caught.value.field == "pipelines.int8.keep_names"
    assert caught.value.line == recipe.read_text().splitlines().index("    keep_names: maybe") + 1
