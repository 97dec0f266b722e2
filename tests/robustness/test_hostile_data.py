"""Issue 9, class 4: data accepted that should not be. A complex64 array was cast to real
(exit 0), NaN in the evaluation inputs was scored (exit 0, accuracy 0.78), a 0-d array gave
exit 70, a truncated .npz named the recipe field but not the broken file. Each is exit 2
naming the array (and, for non-finite values, an index) or the .npz file, with no output
and no cache entry. The arrays are built in tmp from examples/digits/data.npz."""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.robust_helpers import (
    DIGITS,
    cache_entries,
    check_clean_error,
    cli_in_process,
    write_yaml,
)

NAN_AT = (17, 2, 3, 0)  # an index inside the first 200 samples of either array


def digits_arrays() -> dict[str, np.ndarray]:
    with np.load(DIGITS / "data.npz") as archive:
        return {name: archive[name] for name in archive.files}


def recipe_for(folder: Path, source: Path, role: str, **fields: str) -> Path:
    data: dict = {"version": 1, "name": "hostile-data",
                  "model": {"path": str(DIGITS / "saved_model"),
                            "inputs": [{"name": "image", "dtype": "float32",
                                        "shape": [1, 8, 8, 1]}]}}
    if role == "evaluation":
        data["data"] = {"evaluation": {"source": str(source), "inputs": "x_test",
                                       "labels": "y_test", **fields}}
        stages: list = ["freeze", "evaluate"]
    else:
        data["data"] = {"representative": {"source": str(source), "array": "x_calib",
                                           "samples": 200, **fields}}
        stages = ["freeze", "strip", "fold", "quantize_nodes", {"log_ranges": {"samples": 200}},
                  "freeze_ranges"]
    data["pipelines"] = {"p": {"stages": stages}}
    return write_yaml(folder / "recipe.yaml", data)


def index_forms(index: tuple[int, ...], shape: tuple[int, ...]) -> list[str]:
    """Ways a message may name an element: the sample, the full index, the flat index."""
    flat = int(np.ravel_multi_index(index, shape))
    return [str(index), str(list(index)), ", ".join(map(str, index)), f"[{index[0]}]",
            f"sample {index[0]}", f"index {index[0]}", f"index {flat}", f"[{flat}]",
            f"element {flat}", f"row {index[0]}"]


def with_nan(value: float) -> Callable[[dict], tuple[str, tuple[int, ...]]]:
    def change(arrays: dict) -> tuple[str, tuple[int, ...]]:
        name = "x_test"
        arrays[name] = arrays[name].copy()
        arrays[name][NAN_AT] = value
        return name, NAN_AT
    return change


def calib_with(value: float) -> Callable[[dict], tuple[str, tuple[int, ...]]]:
    def change(arrays: dict) -> tuple[str, tuple[int, ...]]:
        arrays["x_calib"] = arrays["x_calib"].copy()
        arrays["x_calib"][NAN_AT] = value
        return "x_calib", NAN_AT
    return change


def labels_with_nan(arrays: dict) -> tuple[str, tuple[int, ...]]:
    labels = arrays["y_test"].astype(np.float64)
    labels[NAN_AT[0]] = np.nan
    arrays["y_test"] = labels
    return "y_test", (NAN_AT[0],)


NON_FINITE = {
    "nan-in-evaluation-inputs": ("evaluation", with_nan(np.nan)),
    "inf-in-evaluation-inputs": ("evaluation", with_nan(np.inf)),
    "minus-inf-in-evaluation-inputs": ("evaluation", with_nan(-np.inf)),
    "nan-in-labels": ("evaluation", labels_with_nan),
    "nan-in-representative": ("representative", calib_with(np.nan)),
    "inf-in-representative": ("representative", calib_with(np.inf)),
}


def run(recipe: Path, workspace: Path, capsys: pytest.CaptureFixture[str], *names: object) -> str:
    out = workspace / "out"
    code, _, err = cli_in_process(["run", recipe, "-o", out], capsys)
    message = check_clean_error(code, err, *names)
    assert not out.exists(), "outputs written for bad data"
    assert cache_entries(workspace / ".orchestrator") == set()
    return message


@pytest.mark.parametrize("case", sorted(NON_FINITE))
def test_non_finite_values(case: str, digits_example: Path, workspace: Path,
                           prefect_server: None, capsys: pytest.CaptureFixture[str]) -> None:
    role, change = NON_FINITE[case]
    arrays = digits_arrays()
    name, index = change(arrays)
    source = workspace / "data.npz"
    np.savez(source, **arrays)
    message = run(recipe_for(workspace, source, role), workspace, capsys, name)
    assert any(form in message for form in index_forms(index, arrays[name].shape)), \
        f"the message names no index of the bad value {index}:\n{message}"


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("role", ["evaluation", "representative"])
def test_complex_arrays(dtype: str, role: str, digits_example: Path, workspace: Path,
                        prefect_server: None, capsys: pytest.CaptureFixture[str]) -> None:
    arrays = digits_arrays()
    name = "x_test" if role == "evaluation" else "x_calib"
    arrays[name] = arrays[name].astype(dtype)
    source = workspace / "data.npz"
    np.savez(source, **arrays)
    message = run(recipe_for(workspace, source, role), workspace, capsys, name)
    assert "complex" in message


def test_complex_labels(digits_example: Path, workspace: Path, prefect_server: None,
                        capsys: pytest.CaptureFixture[str]) -> None:
    arrays = digits_arrays()
    arrays["y_test"] = arrays["y_test"].astype(np.complex64)
    source = workspace / "data.npz"
    np.savez(source, **arrays)
    run(recipe_for(workspace, source, "evaluation"), workspace, capsys, "y_test")


SHAPES = {
    "0-d inputs": ("x_test", ()),
    "0-d labels": ("y_test", ()),
    "0-d representative": ("x_calib", ()),
    "rank 2 inputs": ("x_test", (450, 64)),
    "rank 5 inputs": ("x_test", (450, 1, 8, 8, 1)),
    "rank 2 representative": ("x_calib", (1000, 64)),
    "rank 6 representative": ("x_calib", (1000, 1, 1, 8, 8, 1)),
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_wrong_rank(case: str, digits_example: Path, workspace: Path, prefect_server: None,
                    capsys: pytest.CaptureFixture[str]) -> None:
    name, shape = SHAPES[case]
    arrays = digits_arrays()
    arrays[name] = np.array(1.0, dtype=arrays[name].dtype) if shape == () \
        else arrays[name].reshape(shape)
    source = workspace / "data.npz"
    np.savez(source, **arrays)
    role = "representative" if name == "x_calib" else "evaluation"
    run(recipe_for(workspace, source, role), workspace, capsys, name)


def _truncated(raw: bytes) -> bytes:
    return raw[: len(raw) // 2]


def _corrupt_member(raw: bytes, member: str) -> bytes:
    """Flip 4 KB in the middle of one array's bytes: the zip's CRC-32 no longer matches."""
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        info = archive.getinfo(member)
    header = raw[info.header_offset:info.header_offset + 30]
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    start = info.header_offset + 30 + name_length + extra_length + info.compress_size // 2
    return raw[:start] + bytes(b ^ 0xFF for b in raw[start:start + 4096]) + raw[start + 4096:]


def _no_zip(raw: bytes) -> bytes:
    return b"this is not a zip file\n" * 100


def _empty(raw: bytes) -> bytes:
    return b""


def _truncated_tail(raw: bytes) -> bytes:
    return raw[:-100]


BROKEN: dict[str, Callable[[bytes], bytes] | None] = {
    "truncated-half": _truncated, "corrupt-array-bytes": None,  # None: see _corrupt_member
    "not-a-zip": _no_zip, "empty": _empty, "truncated-tail": _truncated_tail}


@pytest.mark.parametrize("role", ["evaluation", "representative"])
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_npz_names_the_file(case: str, role: str, digits_example: Path,
                                   workspace: Path, prefect_server: None,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    source = workspace / "broken.npz"
    raw = (DIGITS / "data.npz").read_bytes()
    used = "x_test.npy" if role == "evaluation" else "x_calib.npy"
    broken = BROKEN[case]
    source.write_bytes(_corrupt_member(raw, used) if broken is None else broken(raw))
    recipe = recipe_for(workspace, source, role)
    run(recipe, workspace, capsys, source.name)
    # validate names it too, when it looks (it may leave the contents to the run)
    code, _, err = cli_in_process(["validate", recipe], capsys)
    assert code in (0, 2) and "Traceback" not in err
    if code == 2:
        check_clean_error(code, err, source.name)


def test_good_data_still_runs(digits_example: Path, workspace: Path, prefect_server: None,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """The checks refuse only bad data: float64 inputs and int32 labels are fine."""
    arrays = digits_arrays()
    arrays["x_test"] = arrays["x_test"].astype(np.float64)
    arrays["y_test"] = arrays["y_test"].astype(np.int32)
    source = workspace / "data.npz"
    np.savez(source, **arrays)
    code, _, err = cli_in_process(["run", recipe_for(workspace, source, "evaluation"), "-o",
                                   workspace / "out"], capsys)
    assert code == 0, err
    assert (workspace / "out" / "report.json").is_file()
