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

ROOT = Path(__file__).resolve().parents[2]

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


# ---- measure_on_device: the board's stage, added per connected target, and kept off -----

TARGETS = """\
targets:
  - {{name: pi, device: raspberry-pi-4, connect: "ssh://pi@board"}}
  - {{name: arm, device: phone-modern, connect: "{arm}"}}
  - {{name: phone, device: phone-2016}}
"""


def with_boards(write, pipelines: str, arm: str = "ssh://arm@board") -> Path:  # noqa: ANN001
    recipe = write(pipelines)
    recipe.write_text(recipe.read_text() + TARGETS.format(arm=arm))
    return recipe


def boards(loaded, pipeline: str) -> list[str]:  # noqa: ANN001
    return [params.target for name, params in loaded.stages[pipeline]
            if name == "measure_on_device"]


def test_measure_on_device_false_or_a_list_keeps_boards_off_a_pipeline(write) -> None:  # noqa: ANN001
    loaded = load_recipe(with_boards(write, """\
    measure_on_device: false
  lite:
    from: fp32
    stages: [{convert_tflite: {mode: dynamic_range}}]
    measure_on_device: [arm]
  lite2:
    from: lite
    stages: [benchmark]
"""))
    assert boards(loaded, "fp32") == []
    assert boards(loaded, "lite") == ["arm"]
    assert boards(loaded, "lite2") == ["pi", "arm"]  # not inherited along from:
    assert {n.stage for n in build_plan(loaded).nodes if n.pipeline == "fp32"} == {
        "freeze", "strip", "fold", "benchmark"}


@pytest.mark.parametrize(("setting", "says", "field"), [
    ("measure_on_device: [pi, phone, pie]", "'phone', 'pie': no such target with a board "
     "(targets with connect: pi, arm)", "pipelines.fp32.measure_on_device"),
    ("measure_on_device: maybe", "bool", "pipelines.fp32.measure_on_device"),
])
def test_a_bad_measure_on_device_is_exit_2_at_its_line(write, setting: str, says: str,  # noqa: ANN001
                                                       field: str) -> None:
    recipe = with_boards(write, f"    {setting}\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    text = str(caught.value)
    assert caught.value.exit_code == 2
    assert "r.yaml:10:" in text and field in text and says in text, text


def test_false_and_a_listed_measurement_contradict(write) -> None:  # noqa: ANN001
    recipe = write("")
    recipe.write_text(recipe.read_text().replace(
        "benchmark]", "benchmark, {measure_on_device: {target: pi}}]\n"
        "    measure_on_device: false") + TARGETS.format(arm="ssh://arm@board"))
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    assert "r.yaml:9:" in str(caught.value) and "pipelines.fp32.stages.4" in str(caught.value)
    assert "remove one or the other" in str(caught.value)


def test_a_set_measure_on_device_naming_no_board_is_exit_2(write) -> None:  # noqa: ANN001
    with pytest.raises(RecipeError) as caught:
        load_recipe(with_boards(write, ""), ["pipelines.fp32.measure_on_device=[nope]"])
    assert "pipelines.fp32.measure_on_device" in str(caught.value)
    assert "'nope': no such target with a board (targets with connect: pi, arm)" in str(
        caught.value)


def test_measure_on_device_is_checked_beside_a_broken_target(write) -> None:  # noqa: ANN001
    # a target that does not validate: the pipelines' own measure_on_device contradiction
    # is still said in the same run (which targets have a board is not known, so a name
    # is not judged)
    recipe = write("")
    recipe.write_text(recipe.read_text().replace(
        "benchmark]", "benchmark, {measure_on_device: {target: pi}}]\n"
        "    measure_on_device: false") + TARGETS.format(arm="ssh://arm@board").replace(
        "device: phone-2016}", "device: phone-2016, budgets: {max_size_mb: -1}}"))
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe, check_files=False)
    text = str(caught.value)
    assert "targets.2.budgets.max_size_mb" in text, text
    assert "pipelines.fp32.stages.4" in text and "remove one or the other" in text, text
    assert "no such target" not in text and "no connect:" not in text, text


def test_validate_says_which_variants_a_board_cannot_run(
        write, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
        capsys: pytest.CaptureFixture[str]) -> None:
    """Known from the recipe: a GraphDef needs TensorFlow on the board (the emulated board
    built here without it cannot run one), a memmapped package runs on none; each board
    and reason once, with the real, shell-quoted command; a pipeline kept off is not named."""
    import shlex

    from orchestrator.cli.main import main

    boards_home = tmp_path / "boards"
    (boards_home / "aarch64").mkdir(parents=True)
    (boards_home / "aarch64" / "board.json").write_text('{"python": "3.11"}')  # no tensorflow
    monkeypatch.setenv("ORCHESTRATOR_BOARDS", str(boards_home))
    qemu = "qemu://aarch64?cpu=cortex-a76"
    recipe = with_boards(write, """\
  int8:
    from: fp32
    stages: [quantize_weights]
  mobile:
    from: int8
    stages: [memmap]
  lite:
    from: fp32
    stages: [{convert_tflite: {mode: dynamic_range}}]
  kept_off:
    from: fp32
    stages: [strip]
    measure_on_device: false
""", arm=qemu)
    capsys.readouterr()
    assert main(["validate", str(recipe)]) == 0
    out = capsys.readouterr().out
    notes = [line.removeprefix("  note: ") for line in out.splitlines()[1:]]
    quoted = shlex.quote(qemu)
    assert quoted == f"'{qemu}'"
    assert notes == [
        "pi (ssh://pi@board) runs fp32, int8 only with TensorFlow there: a GraphDef "
        "(`orchestrator device check ssh://pi@board` says if it has it; `orchestrator device "
        "prepare ssh://pi@board --runtime tensorflow` adds it); `measure_on_device: false` "
        "in a pipeline keeps the board off it",
        f"arm ({quoted}) cannot run fp32, int8: a GraphDef needs TensorFlow there, which it "
        f"has not (`orchestrator device prepare {quoted} --runtime tensorflow` adds it: "
        "1.5 GB); `measure_on_device: false` in a pipeline keeps the board off it",
        "pi (ssh://pi@board) cannot run mobile: a memmapped package runs on no board (its "
        "graph is measured in the pipeline before memmap); `measure_on_device: false` in a "
        "pipeline keeps the board off it",
        f"arm ({quoted}) cannot run mobile: a memmapped package runs on no board (its graph "
        "is measured in the pipeline before memmap); `measure_on_device: false` in a "
        "pipeline keeps the board off it"], out
    # the command as printed is one the shell runs as written: the URL one argument
    command = notes[1].split("`")[1]
    assert shlex.split(command)[3] == qemu
