"""Special files for every path a recipe names: the recipe itself, `model.path`, a data
source, a `freeze_ranges: {log_file: ...}` param, and `-o`. A FIFO with no writer (must not
hang), a device (/dev/zero: must not be read forever), a folder where a file is expected, a
symlink loop, an unreadable file: each is exit 2 naming the path as the user wrote it, with
nothing written and no cache entry.

FIFOs run in this process with a watchdog that unblocks a stuck reader (the test then
fails as a hang); devices and unreadable files run as subprocesses (memory cap; and when we
are root, whom chmod 000 does not stop, without root's file-access override)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.robust_helpers import (
    DIGITS,
    LOAD_TIMEOUT_S,
    RUN_MEMORY_CAP,
    assert_no_hang,
    base_env,
    cache_entries,
    check_clean_error,
    cli_in_process,
    cli_subprocess,
    fifo_unblocker,
    write_yaml,
)

FIXTURE_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "unrelated_ranges.log"
ROLES = ["recipe", "model", "data", "log_file", "output"]
KINDS = ["fifo", "device", "directory", "symlink_loop", "unreadable"]
FILE_NAMES = {"recipe": "recipe.yaml", "model": "model.keras", "data": "data.npz",
              "log_file": "ranges.log", "output": "out"}
CONTENT = {"model": DIGITS / "model.keras", "data": DIGITS / "data.npz", "log_file": FIXTURE_LOG}


def recipe_data(role: str, special: Path) -> dict:
    model = str(special) if role == "model" else str(DIGITS / "saved_model")
    data: dict = {"version": 1, "name": "special", "model": {"path": model}}
    if role == "data":
        data["data"] = {"evaluation": {"source": str(special), "inputs": "x_test",
                                       "labels": "y_test"}}
        stages: list = ["freeze", "evaluate"]
    elif role == "log_file":
        stages = ["freeze", "strip", "fold", "quantize_nodes",
                  {"freeze_ranges": {"log_file": str(special)}}]
    else:
        stages = ["freeze"]
    data["pipelines"] = {"fp32": {"stages": stages}}
    return data


def make_special(path: Path, kind: str, role: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":  # a character device like /dev/zero (a link to it, failing that)
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))
        except OSError:
            path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink_loop":
        path.symlink_to(path.name)
    elif kind == "unreadable":
        if role == "output":
            path.mkdir()
        elif role == "recipe":
            write_yaml(path, recipe_data("recipe", path))
        else:
            shutil.copyfile(CONTENT[role], path)
        path.chmod(0)


@pytest.fixture
def sandbox() -> Iterator[Path]:
    """A folder every user may enter (pytest's tmp folders are root's own, mode 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="orchestrator-special-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        for path in folder.rglob("*"):  # chmod 000 leftovers
            if not path.is_symlink():
                path.chmod(0o700)
        shutil.rmtree(folder, ignore_errors=True)


def cases() -> Iterator[object]:
    for role in ROLES:
        for kind in KINDS:
            if role == "output" and kind == "directory":
                continue  # a folder is what -o names
            for command in (["run"] if role == "output" else ["validate", "run"]):
                yield pytest.param(role, kind, command, id=f"{role}-{kind}-{command}")


@pytest.mark.parametrize(("role", "kind", "command"), list(cases()))
def test_special_file(role: str, kind: str, command: str, sandbox: Path,
                      prefect_api_url: str, unprivileged: bool, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    special = sandbox / FILE_NAMES[role]
    recipe = special if role == "recipe" else sandbox / "recipe.yaml"
    out = special if role == "output" else sandbox / "out"
    if role != "recipe":
        write_yaml(recipe, recipe_data(role, special))
    make_special(special, kind, role)
    home = sandbox / ".orchestrator"
    args = ["validate", recipe] if command == "validate" else ["run", recipe, "-o", out]

    if kind in ("device", "unreadable"):
        env = base_env(home, f"sqlite:///{sandbox / 'mlruns' / 'mlflow.db'}", prefect_api_url,
                       HOME=str(sandbox))
        done = cli_subprocess(args, env, sandbox, timeout=LOAD_TIMEOUT_S * 2,
                              memory_cap=RUN_MEMORY_CAP,
                              unprivileged=unprivileged and kind == "unreadable")
        print(f"{command} with {role} = {kind}: exit {done.code} after {done.seconds:.1f} s")
        assert_no_hang(done, f"orchestrator {command} with {role} = {kind}")
        code, err = done.code, done.err
    else:
        monkeypatch.chdir(sandbox)
        monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{sandbox / 'mlruns' / 'mlflow.db'}")
        with fifo_unblocker(special) as hung:
            code, _, err = cli_in_process(args, capsys)
        assert not hung, f"orchestrator {command} blocked on the FIFO {special}"
    message = check_clean_error(code, err, special)  # type: ignore[arg-type]
    print(message)
    if role != "output":
        assert not out.exists(), f"{out} was written"
    assert cache_entries(home) == set()
