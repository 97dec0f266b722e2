"""A target's `threads:`: the threads its estimates are for (default: the device's big cores).
More threads than the device has cores is a RecipeError at the `threads` line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import RecipeError
from orchestrator.recipe.loading import load_recipe
from orchestrator.spec.devices import PRESETS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _example(digits_example: Path) -> None:
    """The recipe points at the digits example; build it once."""


def recipe(tmp_path: Path, threads: int | None, device: str = "raspberry-pi-4") -> Path:
    """recipes/digits.yaml with its `pi` target on `device` with `threads`."""
    text = (ROOT / "recipes" / "digits.yaml").read_text()
    text = text.replace("../examples/digits", str(ROOT / "examples" / "digits"))
    old = "    device: raspberry-pi-3\n"
    assert old in text
    text = text.replace(old, f"    device: {device}\n" + (
        f"    threads: {threads}\n" if threads is not None else ""))
    path = tmp_path / "digits.yaml"
    path.write_text(text)
    return path


def test_threads_set_the_targets_device(tmp_path: Path) -> None:
    loaded = load_recipe(recipe(tmp_path, 2))
    devices = loaded.devices()
    pi = devices["pi"]
    assert pi.threads == 2 and pi.default_threads == 2
    assert pi.big_cores == PRESETS["raspberry-pi-4"].big_cores == 4
    assert PRESETS["raspberry-pi-4"].threads is None  # the catalogue is not changed
    assert devices["phone"].threads is None and devices["phone"].default_threads == 2
    # without `threads:` the estimate takes the big cores
    unset = load_recipe(recipe(tmp_path, None)).devices()["pi"]
    assert unset.default_threads == 4
    # all eight cores of a big.LITTLE phone (4 of them little) may be asked for
    eight = load_recipe(recipe(tmp_path, 8, "pixel-4")).devices()["pi"]
    assert eight.default_threads == 8 and eight.big_cores == 4


def test_more_threads_than_cores_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = recipe(tmp_path, 99)
    line = path.read_text().splitlines().index("    threads: 99") + 1
    with pytest.raises(RecipeError) as info:
        load_recipe(path).devices()
    error = info.value
    assert error.exit_code == 2
    assert (error.file, error.line, error.field) == (str(path), line, "targets.1.threads")
    assert f"{path}:{line}:" in str(error)
    assert "threads: 99" in error.message and "4 cores" in error.message
    assert "raspberry-pi-4" in error.message


def test_validate_finds_too_many_threads(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = recipe(tmp_path, 99)
    assert main(["validate", str(path)]) == 2
    assert "threads: 99" in capsys.readouterr().err
