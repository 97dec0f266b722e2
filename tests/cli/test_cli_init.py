"""`orchestrator init`: a first recipe from a model, valid as written, never overwriting."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli.init import choose_data, recipe_name
from orchestrator.cli.main import main
from orchestrator.errors import DataError
from orchestrator.model.artifact import TensorSpec
from orchestrator.paths import plain_file_mode
from orchestrator.recipe import schema
from orchestrator.recipe.loading import load_recipe

# A line a user uncomments: `# ` before YAML content (a key or a list item), as an editor's
# "toggle comment" removes it. Prose comments start otherwise (a capital, a backtick...).
CODE_COMMENT = re.compile(r"^(\s*)# (\s*(?:- |[a-z_0-9]+:(?: |$)))")


def uncomment(text: str) -> str:
    return "\n".join(CODE_COMMENT.sub(r"\1\2", line) for line in text.splitlines()) + "\n"


def stage_names(path: Path) -> dict[str, list[str]]:
    loaded = load_recipe(path)
    return {name: [s for s, _ in stages] for name, stages in loaded.stages.items()}


@pytest.fixture
def project(tmp_path: Path, digits_example: Path) -> Path:
    """A git project holding the digits example (model and data)."""
    (tmp_path / ".git").mkdir()
    shutil.copytree(digits_example / "saved_model", tmp_path / "models" / "digits" /
                    "saved_model")
    shutil.copy(digits_example / "model.keras", tmp_path / "models" / "digits" / "model.keras")
    shutil.copy(digits_example / "data.npz", tmp_path / "models" / "digits" / "data.npz")
    return tmp_path


def test_a_recipe_that_runs_at_once_without_data(project: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    recipe = project / "recipes" / "digits.yaml"
    assert main(["init", str(project / "models/digits/saved_model"), "-o", str(recipe)]) == 0
    out = capsys.readouterr().out
    from orchestrator.formatting import command_hint

    # the hint names the command to paste (`orchestrator`, or its path when not on PATH)
    assert f"wrote {recipe}" in out and f"next: {command_hint('validate', recipe)}" in out
    text = recipe.read_text()
    lines = text.splitlines()
    # the editor's schema: none in the project yet, so one beside the recipe
    assert lines[0] == "# yaml-language-server: $schema=recipe.schema.json"
    assert (project / "recipes" / schema.SCHEMA_FILE).read_text() == schema.schema_text()
    assert "  path: ../models/digits/saved_model" in text  # relative: moves with the project
    assert "# detected: saved_model" in text
    assert "inputs: [{name: image, dtype: float32, shape: [1, 8, 8, 1]}]" in text
    assert "outputs: [output_0]" in text
    assert main(["validate", str(recipe)]) == 0
    # live: what needs no data; the rest commented out, each saying what it needs
    assert stage_names(recipe) == {
        "fp32": ["freeze", "strip", "fold", "benchmark"],
        "int8": ["quantize_weights", "quantize_nodes", "compact_names", "benchmark"]}
    assert "# - evaluate                    # needs data.evaluation" in text
    assert "# - log_ranges: {samples: 200}  # needs data.representative" in text
    assert "  # litert_int8:" in text
    assert "# targets:" in text and "#     budgets: {max_size_mb: 0.35," in text
    assert oct(recipe.stat().st_mode & 0o777) == oct(plain_file_mode())
    assert sorted(p.name for p in recipe.parent.iterdir()) == ["digits.yaml",
                                                               schema.SCHEMA_FILE]


def test_uncommenting_the_data_targets_and_stages_gives_a_valid_full_recipe(
        project: Path) -> None:
    """The commented sections are the recipe a user ends with: fill in the data (here
    data.npz beside the recipe, as the comment names it) and uncomment."""
    recipe = project / "recipes" / "digits.yaml"
    assert main(["init", str(project / "models/digits/saved_model"), "-o", str(recipe)]) == 0
    shutil.copy(project / "models/digits/data.npz", project / "recipes" / "data.npz")
    full = project / "recipes" / "full.yaml"
    full.write_text(uncomment(recipe.read_text()))
    loaded = load_recipe(full)
    assert [t.name for t in loaded.recipe.targets] == ["phone", "pi"]
    assert loaded.recipe.data.representative.array == "x_calib"
    assert loaded.recipe.data.evaluation.labels == "y_test"
    names = {name: [s for s, _ in stages] for name, stages in loaded.stages.items()}
    assert names == {
        "fp32": ["freeze", "strip", "fold", "benchmark", "evaluate"],
        "int8": ["quantize_weights", "quantize_nodes", "log_ranges", "freeze_ranges",
                 "compact_names", "benchmark", "evaluate"],
        "litert_int8": ["convert_tflite", "benchmark", "evaluate"]}
    convert = dict(loaded.stages["litert_int8"])["convert_tflite"]
    assert (convert.mode, convert.io) == ("int8", "float")


def test_with_data_every_stage_is_live(project: Path) -> None:
    recipe = project / "digits.yaml"  # at the project root: the project has no schema yet
    (project / "recipes").mkdir()
    (project / schema.PROJECT_SCHEMA).write_text(schema.schema_text())
    assert main(["init", str(project / "models/digits/saved_model"), "-o", str(recipe),
                 "--data", str(project / "models/digits/data.npz")]) == 0
    text = recipe.read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=recipes/recipe.schema.json"
    assert not (project / schema.SCHEMA_FILE).exists()  # the project's own is named
    assert ("representative: {source: models/digits/data.npz, array: x_calib, samples: 200}"
            in text)
    assert ("evaluation: {source: models/digits/data.npz, inputs: x_test, labels: y_test}"
            in text)
    assert "#     budgets: {max_size_mb: 0.35, max_accuracy_drop: 0.01," in text
    assert main(["validate", str(recipe)]) == 0
    assert stage_names(recipe) == {
        "fp32": ["freeze", "strip", "fold", "benchmark", "evaluate"],
        "int8": ["quantize_weights", "quantize_nodes", "log_ranges", "freeze_ranges",
                 "compact_names", "benchmark", "evaluate"],
        "litert_int8": ["convert_tflite", "benchmark", "evaluate"]}


def test_keras_and_default_name(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    assert main(["init", "models/digits/model.keras"]) == 0
    recipe = project / "digits.yaml"  # named after the model's folder (model.keras says little)
    text = recipe.read_text()
    assert "name: digits" in text and "# detected: keras" in text
    assert "outputs: [probs]" in text  # Keras' output name
    assert main(["validate", str(recipe)]) == 0


def test_frozen_graph_and_checkpoint(tmp_path: Path) -> None:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 3), name="x")
        w = tf.compat.v1.get_variable("w", initializer=np.ones((3, 2), np.float32),
                                      use_resource=False)
        tf.nn.softmax(tf.matmul(x, w), name="y")
        init = tf.compat.v1.global_variables_initializer()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init)
            saver.save(session, str(tmp_path / "ckpt" / "net.ckpt"))
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), ["y"])
    (tmp_path / "tiny.pb").write_bytes(frozen.SerializeToString())
    for model, fmt in ((tmp_path / "tiny.pb", "frozen_graph"), (tmp_path / "ckpt",
                                                                 "checkpoint")):
        recipe = tmp_path / "recipes" / f"{fmt}.yaml"
        assert main(["init", str(model), "-o", str(recipe)]) == 0
        text = recipe.read_text()
        assert f"# detected: {fmt}" in text
        assert "inputs: [{name: x, dtype: float32, shape: [1, 3]}]" in text
        assert "outputs: [y]" in text and "keep only the real outputs" in text
        assert main(["validate", str(recipe)]) == 0
    # named after the file asked for (-o), not the model
    assert "name: frozen_graph" in (tmp_path / "recipes" / "frozen_graph.yaml").read_text()


def test_never_overwrites(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = project / "mine.yaml"
    recipe.write_text("my own recipe\n")
    assert main(["init", str(project / "models/digits/saved_model"), "-o", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"error: {recipe}: the file exists, and init never overwrites one" in err
    assert recipe.read_text() == "my own recipe\n"
    assert sorted(p.name for p in project.iterdir()) == [".git", "mine.yaml", "models"]


def test_a_bad_model_path_is_exit_2_and_writes_nothing(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    out = tmp_path / "out" / "r.yaml"
    assert main(["init", str(tmp_path / "no_such_model"), "-o", str(out)]) == 2
    assert f"error: {tmp_path / 'no_such_model'}: model path not found" in (
        capsys.readouterr().err)
    (tmp_path / "notes.txt").write_text("not a model")
    assert main(["init", str(tmp_path / "notes.txt"), "-o", str(out)]) == 2
    assert "cannot tell the model format" in capsys.readouterr().err
    (tmp_path / "broken.pb").write_bytes(b"\x00garbage")
    assert main(["init", str(tmp_path / "broken.pb"), "-o", str(out)]) == 2
    assert "broken.pb" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_data_that_does_not_fit_is_exit_2_and_writes_nothing(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(project / "wrong.npz", a=np.zeros((4, 5), np.float32))
    out = project / "r.yaml"
    assert main(["init", str(project / "models/digits/saved_model"), "-o", str(out),
                 "--data", str(project / "wrong.npz")]) == 2
    assert "no array fits the model input 'image' [N, 8, 8, 1]; arrays: a [4, 5] float32" in (
        capsys.readouterr().err)
    assert not out.exists() and not (project / schema.SCHEMA_FILE).exists()


@pytest.mark.parametrize("path, name", [
    ("/p/examples/digits/saved_model", "digits"),
    ("/p/examples/digits/saved_model/saved_model.pb", "digits"),
    ("/p/models/face net/model.keras", "face-net"),
    ("/p/exports/resnet50/1", "resnet50"),
    ("/p/frozen/mobilenet_v1.pb", "mobilenet_v1"),
    ("/srv/ckpt/model.ckpt", "srv"),
    ("/model/saved_model", "model"),
])
def test_recipe_name(path: str, name: str) -> None:
    assert recipe_name(Path(path)) == name


def test_choose_data_by_shape_then_name(tmp_path: Path) -> None:
    spec = TensorSpec("image", "float32", (None, 8, 8, 1))
    npz = tmp_path / "d.npz"
    np.savez(npz, y_val=np.zeros(7, np.int64), x_val=np.zeros((7, 8, 8), np.float32),
             x_train=np.zeros((9, 8, 8, 1), np.float32), y_train=np.zeros(9, np.int64),
             meta=np.zeros((3,), np.float32))
    chosen = choose_data(npz, spec)
    assert (chosen.representative.name, chosen.evaluation.name, chosen.labels.name) == (
        "x_train", "x_val", "y_val")
    only = tmp_path / "one.npz"
    np.savez_compressed(only, images=np.zeros((5, 8, 8, 1), np.uint8))
    chosen = choose_data(only, spec)
    assert (chosen.representative.name, chosen.evaluation.name, chosen.labels) == (
        "images", "images", None)
    with pytest.raises(DataError, match="takes an .npz"):
        choose_data(tmp_path, spec)
    (tmp_path / "bad.npz").write_text("no zip")
    with pytest.raises(DataError, match="cannot read the .npz"):
        choose_data(tmp_path / "bad.npz", spec)


@pytest.mark.slow
def test_the_recipes_init_writes_run(project: Path, prefect_server: None,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Both starters run end to end as written: without data (fp32 and int8, benchmarked)
    and with --data (every stage, LiteRT int8 too)."""
    import json

    monkeypatch.chdir(project)
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(project / ".orchestrator"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    model = "models/digits/saved_model"
    assert main(["init", model, "-o", "recipes/bare.yaml"]) == 0
    assert main(["init", model, "-o", "recipes/full.yaml", "--data",
                 "models/digits/data.npz"]) == 0
    assert main(["run", "recipes/bare.yaml", "-o", "out/bare"]) == 0
    bare = json.loads((project / "out/bare/report.json").read_text())
    assert set(bare["variants"]) == {"fp32", "int8"}
    assert bare["variants"]["int8"]["size_bytes"] < bare["variants"]["fp32"]["size_bytes"] / 3
    assert main(["run", "recipes/full.yaml", "-o", "out/full"]) == 0
    full = json.loads((project / "out/full/report.json").read_text())
    assert set(full["variants"]) == {"fp32", "int8", "litert_int8"}
    for variant in full["variants"].values():
        assert variant["accuracy_drop"] <= 0.02 and variant["fidelity"] >= 0.98


def test_a_recipe_that_does_not_validate_is_not_written(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """init checks its own output with the loader first: nothing is kept when that fails,
    not even the folders made for it, and the message names the file asked for."""
    import orchestrator.cli.init as cli_init

    monkeypatch.setattr(cli_init, "recipe_text", lambda *args, **kwargs: (
        "version: 1\nname: x\nmodel: {path: ../../models/digits/saved_model}\n"
        "pipelines:\n  fp32:\n    stages: [freez]\n"))
    out = project / "new" / "deeper" / "r.yaml"
    assert main(["init", str(project / "models/digits/saved_model"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert (f"error: {out}:6:14 [pipelines.fp32.stages.0]: the recipe init made does not "
            "validate, so it was not written: unknown stage 'freez'") in err
    assert not (project / "new").exists()


def test_sizes_are_in_mib_as_the_budgets_and_the_table(project: Path) -> None:
    """The comment above the budgets says the float model's size in MiB (the unit of
    max_size_mb and of the report's table), as formatting.format_size prints it."""
    from orchestrator.formatting import format_size
    from orchestrator.model.sources import load_model

    recipe = project / "recipes" / "digits.yaml"
    assert main(["init", str(project / "models/digits/saved_model"), "-o", str(recipe)]) == 0
    size = load_model(project / "models/digits/saved_model").graph_def.ByteSize()
    text = recipe.read_text()
    assert f"# The float model is about {format_size(size)}; 8-bit" in text
    assert " MB" not in text and "MiB" in text
    budget = float(re.search(r"max_size_mb: ([\d.]+),", text).group(1))  # type: ignore[union-attr]
    assert size / 2**20 / 3 <= budget < size / 2**20 / 3 * 1.05  # a third, in MiB


def test_the_name_comes_from_the_file_asked_for(project: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`init MODEL` and `init MODEL -o recipes/mine.yaml` name two recipes, not one `digits`
    twice: they would share out/digits and an MLflow experiment."""
    monkeypatch.chdir(project)
    model = "models/digits/saved_model"
    assert main(["init", model]) == 0
    assert main(["init", model, "--data", "models/digits/data.npz", "-o",
                 "recipes/mine.yaml"]) == 0
    assert load_recipe(project / "digits.yaml").recipe.name == "digits"  # as before
    assert load_recipe(project / "recipes" / "mine.yaml").recipe.name == "mine"
    assert "named the recipe" not in capsys.readouterr().out


def test_a_name_another_recipe_has_is_made_unique(project: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """recipes/ holds a recipe named `digits-cnn` (in demo.yaml): `init -o
    recipes/digits-cnn.yaml` names the new one `digits-cnn-2`, and says so."""
    monkeypatch.chdir(project)
    model = "models/digits/saved_model"
    assert main(["init", model, "-o", "recipes/demo.yaml", "--name", "digits-cnn"]) == 0
    capsys.readouterr()
    assert main(["init", model, "-o", "recipes/digits-cnn.yaml"]) == 0
    out = capsys.readouterr().out
    assert load_recipe(project / "recipes" / "digits-cnn.yaml").recipe.name == "digits-cnn-2"
    assert ("named the recipe 'digits-cnn-2': recipes/demo.yaml is already named "
            "'digits-cnn'") in out
    # a name given with --name is kept, with a warning
    assert main(["init", model, "-o", "recipes/third.yaml", "--name", "digits-cnn"]) == 0
    assert "recipes/demo.yaml is also named 'digits-cnn'" in capsys.readouterr().err
    assert load_recipe(project / "recipes" / "third.yaml").recipe.name == "digits-cnn"
    # without -o, the default file is named after the unique name
    monkeypatch.chdir(project / "recipes")
    (project / "recipes" / "digits.yaml").write_text(
        (project / "recipes" / "demo.yaml").read_text().replace("name: digits-cnn",
                                                                "name: digits"))
    assert main(["init", str(project / model)]) == 0  # `digits` is taken here: digits-2
    assert load_recipe(project / "recipes" / "digits-2.yaml").recipe.name == "digits-2"


def test_samples_are_what_the_data_has(project: Path) -> None:
    """Issue 39: `samples: 200` beside the comment `x_calib: [100, ...]`. A recipe asks for
    at most the rows the representative array holds (and the log_ranges stage too)."""
    with np.load(project / "models/digits/data.npz") as data:
        arrays = {name: data[name] for name in data.files}
    arrays["x_calib"] = arrays["x_calib"][:30]
    np.savez(project / "small.npz", **arrays)
    recipe = project / "small.yaml"
    assert main(["init", str(project / "models/digits/saved_model"), "-o", str(recipe),
                 "--data", str(project / "small.npz")]) == 0
    text = recipe.read_text()
    assert "(x_calib: [30, 8, 8, 1] float32)" in text
    assert "representative: {source: small.npz, array: x_calib, samples: 30}" in text
    assert "      - log_ranges: {samples: 30}" in text
    loaded = load_recipe(recipe)
    assert loaded.recipe.data.representative.samples == 30
