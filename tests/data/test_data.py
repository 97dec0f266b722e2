"""Data loaders: npz, image folders, module:function; fitting to the model input; errors."""

from __future__ import annotations

import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from orchestrator.data import (
    LoadStats,
    check_fits,
    check_source,
    fingerprint,
    fit_to_input,
    load_evaluation,
    representative_batches,
)
from orchestrator.errors import DataError
from orchestrator.model.artifact import TensorSpec
from orchestrator.spec.models import DataSource

SPEC = TensorSpec("image", "float32", (None, 4, 4, 1))


@pytest.fixture
def npz(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"
    np.savez(path, x=rng.random((10, 4, 4, 1), dtype=np.float32),
             y=np.arange(10) % 3, flat=rng.random((10, 4, 4), dtype=np.float32))
    return path


def write_image(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array.astype(np.uint8)).save(path)
    return path


# --------------------------------------------------------------------------- npz


def test_npz_batches_samples_and_batch_size(npz: Path) -> None:
    source = DataSource(source="data.npz", array="x", samples=7, batch_size=3)
    batches = list(representative_batches(source, npz.parent, SPEC))
    assert [b.shape for b in batches] == [(3, 4, 4, 1), (3, 4, 4, 1), (1, 4, 4, 1)]
    with np.load(npz) as raw:
        np.testing.assert_array_equal(np.concatenate(batches), raw["x"][:7])
    # the stage's own samples and batch size win over the source's
    batches = list(representative_batches(source, npz.parent, SPEC, samples=4, batch_size=4))
    assert [len(b) for b in batches] == [4]


def test_npz_stream_is_memory_mapped(npz: Path) -> None:
    from orchestrator.data.npz import npz_array

    assert isinstance(npz_array(npz, "x", "data"), np.memmap)
    compressed = npz.with_name("small.npz")
    np.savez_compressed(compressed, x=np.ones((3, 4, 4, 1), np.float32))
    batches = list(representative_batches(DataSource(source="small.npz"), npz.parent, SPEC))
    np.testing.assert_array_equal(np.concatenate(batches), np.ones((3, 4, 4, 1)))


def test_fixed_batch_dimension_wins(npz: Path) -> None:
    spec = TensorSpec("image", "float32", (1, 4, 4, 1))
    batches = list(representative_batches(DataSource(source="data.npz", array="x"),
                                          npz.parent, spec, batch_size=4))
    assert len(batches) == 10 and all(b.shape == (1, 4, 4, 1) for b in batches)


def test_evaluation_with_labels(npz: Path) -> None:
    stats = LoadStats()
    data = load_evaluation(DataSource(source="data.npz", inputs="x", labels="y", samples=8),
                           npz.parent, SPEC, stats=stats)
    assert data.inputs.shape == (8, 4, 4, 1) and data.inputs.dtype == np.float32
    np.testing.assert_array_equal(data.labels, np.arange(8) % 3)
    assert stats.samples == 8
    unlabelled = load_evaluation(DataSource(source="data.npz", inputs="x"), npz.parent, SPEC)
    assert unlabelled.labels is None and len(unlabelled.inputs) == 10


def test_one_hot_labels_become_indices(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((3, 4, 4, 1), np.float32),
             y=np.eye(3, dtype=np.float32)[[2, 0, 1]])
    data = load_evaluation(DataSource(source="d.npz", inputs="x", labels="y"), tmp_path, SPEC)
    np.testing.assert_array_equal(data.labels, [2, 0, 1])


def test_missing_array_lists_available_names(npz: Path) -> None:
    source = DataSource(source="data.npz", inputs="x_tset", labels="y")
    with pytest.raises(DataError) as info:
        load_evaluation(source, npz.parent, SPEC)
    error = info.value
    assert "x_tset" in error.message and "flat, x, y" in error.message
    assert error.file == str(npz) and error.field == "data.evaluation.inputs"
    with pytest.raises(DataError) as info:
        check_source(source, npz.parent, "evaluation", "data.evaluation")
    assert info.value.field == "data.evaluation.inputs"


def test_several_arrays_and_none_named(npz: Path) -> None:
    with pytest.raises(DataError, match="several arrays"):
        representative_batches(DataSource(source="data.npz"), npz.parent, SPEC)


def test_missing_file_and_unsupported_source(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        check_source(DataSource(source="nope.npz"), tmp_path, "representative",
                     "data.representative")
    assert "not found" in info.value.message and info.value.field == "data.representative.source"
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match="expected an .npz file"):
        check_source(DataSource(source="notes.txt"), tmp_path, "representative", "data.r")


def test_samples_zero_is_rejected_by_the_model() -> None:
    with pytest.raises(ValidationError):
        DataSource(source="data.npz", samples=0)


def test_label_count_must_match(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 4, 4, 1), np.float32), y=np.zeros(3, int))
    with pytest.raises(DataError, match="4 inputs .* but 3 labels") as info:
        check_source(DataSource(source="d.npz", inputs="x", labels="y"), tmp_path,
                     "evaluation", "data.evaluation")
    assert info.value.field == "data.evaluation.labels"


# --------------------------------------------------------------------------- shapes, dtypes


def test_wrong_shape_says_expected_and_found(npz: Path) -> None:
    spec = TensorSpec("image", "float32", (None, 8, 8, 1))
    # read in batches of 3: the message names the array's 10 rows, never a batch's 3
    with pytest.raises(DataError) as info:
        representative_batches(DataSource(source="data.npz", array="x", batch_size=3),
                               npz.parent, spec)
    error = info.value
    assert error.message == ("data.npz[x]: input 'image' expects samples of shape (8, 8, 1) "
                             "(model input (?, 8, 8, 1)), found (4, 4, 1) (array (10, 4, 4, 1))")
    assert error.file == str(npz) and error.field == "data.representative.array"
    with pytest.raises(DataError) as info:
        load_evaluation(DataSource(source="data.npz", inputs="x", labels="y", batch_size=3),
                        npz.parent, spec)
    assert "(array (10, 4, 4, 1))" in info.value.message
    assert info.value.field == "data.evaluation.inputs"
    # a batch (all a module's function or an image folder gives at a time) says it is one
    with pytest.raises(DataError) as info:
        fit_to_input(np.zeros((3, 4, 4, 1)), spec, "data:batches")
    assert info.value.message.endswith("found (4, 4, 1) (in a batch of 3 read from it)")
    # validation sees it too, from the .npy header alone
    with pytest.raises(DataError, match="found \\(4, 4, 1\\)"):
        check_source(DataSource(source="data.npz", array="x"), npz.parent, "representative",
                     "data.representative", input_spec=spec)


def test_missing_channel_dim_of_one_is_added(npz: Path) -> None:
    batch = next(representative_batches(DataSource(source="data.npz", array="flat"),
                                        npz.parent, SPEC))
    assert batch.shape == (10, 4, 4, 1)
    assert check_fits((5, 4, 4), SPEC, "x") == (5, 4, 4, 1)
    with pytest.raises(DataError):  # only a channel of 1 is ever added
        check_fits((5, 4, 4), TensorSpec("x", "float32", (None, 4, 4, 3)), "x")
    assert check_fits((2, 7, 9, 1), TensorSpec("x", "float32", (None, None, None, 1)),
                      "x") == (2, 7, 9, 1)


def test_cast_to_input_dtype() -> None:
    spec = TensorSpec("x", "uint8", (None, 3))
    out = fit_to_input(np.array([[-3.0, 1.6, 300.0]]), spec, "x")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, [[0, 2, 255]])
    assert fit_to_input(np.array([[1, 2, 3]]), TensorSpec("x", "float32", (None, 3)),
                        "x").dtype == np.float32


def test_uncastable_batch_is_a_data_error() -> None:
    spec = TensorSpec("x", "float32", (None, 3))
    for batch in (np.array([["a", "b", "c"]]), np.array([[b"1", b"2", b"3"]]),
                  np.array([[{"a": 1}, None, "x"]], dtype=object)):
        with pytest.raises(DataError) as info:
            fit_to_input(batch, spec, "d.npz[x]", file="d.npz", field="data.evaluation.inputs")
        error = info.value
        assert error.exit_code == 2
        assert error.file == "d.npz" and error.field == "data.evaluation.inputs"
        assert "d.npz[x]" in error.message and str(batch.dtype) in error.message
    with pytest.raises(DataError, match="not an array of numbers"):  # ragged
        fit_to_input([[1.0, 2.0, 3.0], [1.0]], spec, "f", file="f", field="data.r.source")
    # objects that are numbers cast; strings feed a string input untouched
    out = fit_to_input(np.array([[1, 2.5, 3]], dtype=object), spec, "x")
    assert out.dtype == np.float32
    text = np.array(["a", "b"])
    assert fit_to_input(text, TensorSpec("t", "string", (None,)), "x") is not None


@pytest.fixture
def strings_npz(tmp_path: Path) -> Path:
    path = tmp_path / "words.npz"
    np.savez(path, x=np.full((3, 4, 4, 1), "a"), y=np.array(["cat", "dog", "cat"]),
             n=np.zeros((3, 4, 4, 1), np.float32), obj=np.array([{"a": 1}, None, 2]))
    return path


def test_string_npz_is_rejected_at_validation_from_headers(strings_npz: Path) -> None:
    source = DataSource(source="words.npz", inputs="x")
    with pytest.raises(DataError) as info:
        check_source(source, strings_npz.parent, "evaluation", "data.evaluation")
    error = info.value
    assert error.file == str(strings_npz) and error.field == "data.evaluation.inputs"
    assert "array 'x'" in error.message and "<U1" in error.message
    assert "strings" in error.message
    # object arrays too (they need pickle to be read at all)
    with pytest.raises(DataError) as info:
        check_source(DataSource(source="words.npz", array="obj"), strings_npz.parent,
                     "representative", "data.representative")
    assert info.value.field == "data.representative.array"
    assert "array 'obj'" in info.value.message and "object" in info.value.message
    # labels of strings are not class indices
    with pytest.raises(DataError) as info:
        check_source(DataSource(source="words.npz", inputs="n", labels="y"),
                     strings_npz.parent, "evaluation", "data.evaluation")
    assert info.value.field == "data.evaluation.labels"
    assert "'y'" in info.value.message and "<U3" in info.value.message
    # a string-input model may take strings
    check_source(source, strings_npz.parent, "evaluation", "data.evaluation",
                 input_spec=TensorSpec("text", "string", None))


def test_string_npz_is_a_data_error_when_loaded(strings_npz: Path) -> None:
    with pytest.raises(DataError) as info:
        load_evaluation(DataSource(source="words.npz", inputs="x"), strings_npz.parent, SPEC)
    error = info.value
    assert error.file == str(strings_npz) and error.field == "data.evaluation.inputs"
    assert "<U1" in error.message and "'image' takes float32" in error.message
    with pytest.raises(DataError) as info:
        next(representative_batches(DataSource(source="words.npz", array="x"),
                                    strings_npz.parent, SPEC))
    assert info.value.field == "data.representative.array"


def test_string_npz_recipe_exits_2_at_the_field(tmp_path: Path, strings_npz: Path,
                                                digits_example: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.main import main
    from orchestrator.recipe.loading import load_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"""version: 1
name: strings
model:
  path: {digits_example / "saved_model"}
data:
  evaluation:
    source: words.npz
    inputs: x
pipelines:
  fp32:
    stages: [freeze, evaluate]
""")
    with pytest.raises(DataError) as info:
        load_recipe(recipe)
    error = info.value
    assert error.file == str(recipe) and error.line == 8
    assert error.field == "data.evaluation.inputs"
    assert "array 'x'" in error.message and "<U1" in error.message
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"{recipe}:8:" in err and "Traceback" not in err


# --------------------------------------------------------------------------- image folders


def test_image_folder_preprocessing_and_skips(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    write_image(folder / "a" / "grey.png", np.full((4, 6), 200))           # 6 wide, 4 high
    write_image(folder / "b" / "red.png", np.tile([255, 0, 0], (4, 6, 1)))
    (folder / "README.txt").write_text("not an image")
    source = DataSource(source="images", resize=(2, 3), mean=128, std=128, channels=1)
    stats = LoadStats()
    batches = list(representative_batches(source, tmp_path, None, stats=stats))
    x = np.concatenate(batches)
    assert x.shape == (2, 2, 3, 1)
    np.testing.assert_allclose(x[0], (200 - 128) / 128)
    # Pillow's grey is ITU-R 601: L = R * 299/1000 + ...; pure red -> 76
    np.testing.assert_allclose(x[1], (76 - 128) / 128)
    assert stats.skipped_count == 1 and stats.skipped[0].endswith("README.txt")
    assert stats.samples == 2


def test_image_folder_defaults_from_the_model_input(tmp_path: Path) -> None:
    write_image(tmp_path / "imgs" / "x.png", np.tile([10, 20, 30], (16, 16, 1)))
    spec = TensorSpec("image", "float32", (None, 8, 8, 3))
    x = next(representative_batches(DataSource(source="imgs"), tmp_path, spec))
    assert x.shape == (1, 8, 8, 3)
    np.testing.assert_allclose(x[0, 0, 0], [10, 20, 30])


def test_image_folder_is_read_lazily(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    files = [write_image(folder / f"{i}.png", np.full((4, 4), i)) for i in range(6)]
    stream = representative_batches(DataSource(source="imgs", batch_size=2), tmp_path, SPEC)
    first = next(stream)
    np.testing.assert_array_equal(first[:, 0, 0, 0], [0, 1])
    files[4].write_bytes(b"not a png any more")  # only read when the stream gets there
    np.testing.assert_array_equal(next(stream)[:, 0, 0, 0], [2, 3])
    with pytest.raises(DataError) as info:
        next(stream)
    assert info.value.file == str(files[4]) and "cannot read image" in info.value.message


def test_image_sizes_must_agree_without_resize(tmp_path: Path) -> None:
    write_image(tmp_path / "imgs" / "a.png", np.zeros((4, 4)))
    write_image(tmp_path / "imgs" / "b.png", np.zeros((5, 4)))
    with pytest.raises(DataError, match="resize"):
        list(representative_batches(DataSource(source="imgs", channels=1), tmp_path, None))


def test_image_folder_labels_from_class_folders(tmp_path: Path) -> None:
    write_image(tmp_path / "imgs" / "dog" / "1.png", np.zeros((4, 4)))
    write_image(tmp_path / "imgs" / "cat" / "2.png", np.zeros((4, 4)))
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    data = load_evaluation(DataSource(source="imgs", labels="labels.txt"), tmp_path, SPEC)
    np.testing.assert_array_equal(data.labels, [0, 1])  # sorted: cat/2.png, dog/1.png
    check_source(DataSource(source="imgs", labels="labels.txt"), tmp_path, "evaluation",
                 "data.evaluation")


def test_folder_without_images(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("x")
    with pytest.raises(DataError, match="no images"):
        check_source(DataSource(source="empty"), tmp_path, "representative", "data.r")


# --------------------------------------------------------------------------- module:function


@pytest.fixture
def module(tmp_path: Path) -> Iterator[str]:
    """A module next to the 'recipe' with a generator of (inputs, labels) batches."""
    name = f"mydata_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "import numpy as np\n"
        "def batches():\n"
        "    for i in range(4):\n"
        "        yield np.full((3, 4, 4), i, np.float32), np.full(3, i)\n"
        "def broken():\n"
        "    raise RuntimeError('no data today')\n"
        "def strings():\n"
        "    yield np.full((3, 4, 4), 'x'), np.zeros(3, int)\n"
        "def objects():\n"
        "    yield np.array([{'a': 1}, None, 'x'], dtype=object)\n")
    yield name
    sys.modules.pop(name, None)


def test_module_function_rebatches(tmp_path: Path, module: str) -> None:
    source = DataSource(source=f"{module}:batches", samples=8, batch_size=5)
    batches = list(representative_batches(source, tmp_path, SPEC))
    assert [b.shape for b in batches] == [(5, 4, 4, 1), (3, 4, 4, 1)]
    np.testing.assert_array_equal(np.concatenate(batches)[:, 0, 0, 0],
                                  [0, 0, 0, 1, 1, 1, 2, 2])
    data = load_evaluation(DataSource(source=f"{module}:batches"), tmp_path, SPEC)
    assert data.inputs.shape == (12, 4, 4, 1)
    np.testing.assert_array_equal(data.labels, np.repeat(np.arange(4), 3))
    assert str(tmp_path) not in sys.path  # the recipe's folder was only borrowed


def test_module_errors(tmp_path: Path, module: str) -> None:
    with pytest.raises(DataError) as info:
        check_source(DataSource(source=f"{module}:batchez"), tmp_path, "representative",
                     "data.representative")
    assert "no function 'batchez'" in info.value.message and "batches" in info.value.message
    assert info.value.field == "data.representative.source"
    with pytest.raises(DataError, match="cannot import module"):
        check_source(DataSource(source="no_such_module_xyz:f"), tmp_path, "representative",
                     "data.representative")
    with pytest.raises(DataError, match="raised RuntimeError: no data today"):
        list(representative_batches(DataSource(source=f"{module}:broken"), tmp_path, SPEC))


def test_module_yielding_strings_or_objects(tmp_path: Path, module: str) -> None:
    with pytest.raises(DataError) as info:
        load_evaluation(DataSource(source=f"{module}:strings"), tmp_path, SPEC)
    error = info.value
    assert error.field == "data.evaluation.source" and error.file is not None
    assert f"{module}:strings" in error.message and "<U1" in error.message
    with pytest.raises(DataError) as info:
        next(representative_batches(DataSource(source=f"{module}:objects"), tmp_path,
                                    TensorSpec("x", "float32", (None,))))
    error = info.value
    assert error.field == "data.representative.source"
    assert "cannot cast object data" in error.message


# --------------------------------------------------------------------------- fingerprints


def test_fingerprints_follow_content(tmp_path: Path, npz: Path, module: str) -> None:
    source = DataSource(source="data.npz", array="x")
    before = fingerprint(source, tmp_path)
    assert fingerprint(source, tmp_path) == before
    assert fingerprint(source.model_copy(update={"samples": 5}), tmp_path) != before
    np.savez(npz, x=np.zeros((2, 4, 4, 1), np.float32))
    assert fingerprint(source, tmp_path) != before

    folder = DataSource(source="imgs")
    write_image(tmp_path / "imgs" / "a.png", np.zeros((4, 4)))
    before = fingerprint(folder, tmp_path)
    write_image(tmp_path / "imgs" / "b.png", np.zeros((4, 4)))
    assert fingerprint(folder, tmp_path) != before

    func = DataSource(source=f"{module}:batches")
    before = fingerprint(func, tmp_path)
    with open(tmp_path / f"{module}.py", "a") as stream:
        stream.write("# changed\n")
    assert fingerprint(func, tmp_path) != before


def test_not_a_zip(tmp_path: Path) -> None:
    (tmp_path / "bad.npz").write_bytes(b"garbage")
    assert not zipfile.is_zipfile(tmp_path / "bad.npz")
    with pytest.raises(DataError, match="not a readable .npz"):
        check_source(DataSource(source="bad.npz"), tmp_path, "representative", "data.r")


def test_an_image_folder_past_the_file_limit_is_refused_without_a_full_walk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A source named `/` or `~` by mistake: a clear error, not minutes of walking."""
    from orchestrator.data import images

    folder = tmp_path / "photos"
    (folder / "b").mkdir(parents=True)
    Image.new("L", (4, 4)).save(folder / "b" / "one.png")
    for i in range(3):
        (folder / f"a{i}.txt").write_text("not an image")
    source = DataSource(source="photos")  # a folder: the images kind
    check_source(source, tmp_path, "representative", "data.representative")  # 4 files
    monkeypatch.setattr(images, "MAX_IMAGE_FOLDER_FILES", 3)
    with pytest.raises(DataError) as info:
        check_source(source, tmp_path, "representative", "data.representative")
    assert "more than 3 files under" in info.value.message
    assert info.value.field == "data.representative.source"
    with pytest.raises(ValueError, match="more than 3 files"):
        images.walk(folder)
