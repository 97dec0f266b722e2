"""Issue 9, full or read-only disks and odd output paths (each was exit 70 with a
traceback): `-o` naming an existing regular file (found only after every stage had run),
`-o` read-only, `-o` under /proc, `-o` full, the store (ORCHESTRATOR_HOME) read-only or
full, the working folder's `mlruns/` read-only or full. Each is a clear error naming the
folder: exit 2 when it can be known before the run (checked first, before any stage), no
partial output, the store consistent (no half entries), and a later run with room works.

Full and read-only disks are small tmpfs mounts (skipped, with the reason, only where the
machine cannot mount one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.robust_helpers import (
    cache_entries,
    check_clean_error,
    cli_in_process,
    output_is_whole_or_absent,
    partial_cache_entries,
    small_recipe,
    write_yaml,
)

pytestmark = pytest.mark.slow


def recipe(workspace: Path, two_variants: bool = False) -> Path:
    data = small_recipe(stages=["freeze", "strip"])
    if two_variants:  # two ~1 MB models to write
        data["pipelines"]["copy"] = {"from": "fp32", "stages": ["fold"]}
    return write_yaml(workspace / "recipe.yaml", data)


def run(workspace: Path, out: Path | str, capsys: pytest.CaptureFixture[str],
        path: Path | None = None) -> tuple[int, str]:
    code, _, err = cli_in_process(["run", path or recipe(workspace), "-o", out], capsys)
    assert "Traceback" not in err, err[-4000:]
    assert code != 70, err[-4000:]
    return code, err


def no_stage_ran(workspace: Path) -> None:
    """Checked before the run: no stage left an entry (the source model's may be there)."""
    home = workspace / ".orchestrator"
    assert partial_cache_entries(home) == []
    assert len(cache_entries(home)) <= 1, sorted(cache_entries(home))


# ---------------------------------------------------------------- -o


def test_output_is_an_existing_regular_file(workspace: Path, prefect_server: None,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = workspace / "out"
    out.write_text("keep me\n")
    code, err = run(workspace, out, capsys)
    check_clean_error(code, err, out)
    assert out.read_text() == "keep me\n"
    no_stage_ran(workspace)


def test_output_inside_a_regular_file(workspace: Path, prefect_server: None,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    (workspace / "file").write_text("x")
    out = workspace / "file" / "out"
    code, err = run(workspace, out, capsys)
    check_clean_error(code, err, workspace / "file")
    no_stage_ran(workspace)


@pytest.mark.parametrize("where", ["the mount itself", "a folder to create in it"])
def test_output_read_only(where: str, workspace: Path, mounts, prefect_server: None,
                          capsys: pytest.CaptureFixture[str]) -> None:
    mount = mounts.tmpfs(workspace / "ro", readonly=True)
    out = mount if where == "the mount itself" else mount / "new" / "out"
    code, err = run(workspace, out, capsys)
    check_clean_error(code, err, mount)
    assert list(mount.iterdir()) == []
    no_stage_ran(workspace)


def test_output_under_proc(workspace: Path, prefect_server: None,
                           capsys: pytest.CaptureFixture[str]) -> None:
    out = Path("/proc/orchestrator-robustness-out")
    code, err = run(workspace, out, capsys)
    check_clean_error(code, err, out)
    assert not out.exists()
    no_stage_ran(workspace)


def test_output_on_a_full_disk(workspace: Path, mounts, prefect_server: None,
                               capsys: pytest.CaptureFixture[str]) -> None:
    mount = mounts.tmpfs(workspace / "full", size="2m")
    mounts.fill(mount, leave_bytes=32 << 10)
    out = mount / "out"
    code, err = run(workspace, out, capsys)
    check_clean_error(code, err, mount)
    assert not out.exists()
    no_stage_ran(workspace)


def test_output_disk_fills_while_writing(workspace: Path, mounts, prefect_server: None,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Room enough to pass any check up front, not for two ~1 MB models: a clear error
    (2, or 3 if it is reported as the writing step failing), nothing of the run in `-o`,
    the store intact; the same run to a roomy folder then succeeds."""
    mount = mounts.tmpfs(workspace / "small", size="3m")
    filler = mounts.fill(mount, leave_bytes=1536 << 10)
    out = mount / "out"
    path = recipe(workspace, two_variants=True)
    code, err = run(workspace, out, capsys, path)
    print(f"-o filling up while writing: exit {code}")
    assert code in (2, 3), err[-3000:]
    check_clean_error(code, err, exit_code=code, progress_ok=True)
    assert str(mount) in err
    assert output_is_whole_or_absent(out) == "absent"
    assert sorted(p.name for p in mount.iterdir()) in ([filler.name], sorted([filler.name, "out"]))
    assert partial_cache_entries(workspace / ".orchestrator") == []
    code, err = run(workspace, workspace / "roomy", capsys, path)
    assert code == 0, err[-3000:]
    assert output_is_whole_or_absent(workspace / "roomy") == "whole"


# ---------------------------------------------------------------- the store


def test_store_read_only(workspace: Path, mounts, prefect_server: None,
                         monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    home = mounts.tmpfs(workspace / "ro-home", size="64m", readonly=True)
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
    code, err = run(workspace, workspace / "out", capsys)
    check_clean_error(code, err, home)
    assert not (workspace / "out").exists()
    assert list(home.iterdir()) == []
    mounts.remount(home, "rw")  # the same store, writable: a run works
    code, err = run(workspace, workspace / "out", capsys)
    assert code == 0, err[-3000:]
    assert partial_cache_entries(home) == []


def test_store_full(workspace: Path, mounts, prefect_server: None,
                    monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> None:
    home = mounts.tmpfs(workspace / "full-home", size="2m")
    filler = mounts.fill(home, leave_bytes=32 << 10)
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
    code, err = run(workspace, workspace / "out", capsys)
    check_clean_error(code, err, home)
    assert not (workspace / "out").exists()
    assert partial_cache_entries(home) == [] and cache_entries(home) == set()
    filler.unlink()
    mounts.remount(home, "size=64m")
    code, err = run(workspace, workspace / "out", capsys)
    assert code == 0, err[-3000:]


def test_store_fills_during_the_run(workspace: Path, mounts, prefect_server: None,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Room for a check up front, not for the ~1 MB model of every stage: a clear error
    naming the store, no half entries, no output; with room, the next run reuses what was
    stored whole."""
    home = mounts.tmpfs(workspace / "small-home", size="3m")
    filler = mounts.fill(home, leave_bytes=1536 << 10)
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
    code, err = run(workspace, workspace / "out", capsys)
    print(f"store filling up during the run: exit {code}")
    assert code in (2, 3), err[-3000:]
    check_clean_error(code, err, exit_code=code, progress_ok=True)
    assert str(home) in err
    assert not (workspace / "out").exists()
    assert partial_cache_entries(home) == []
    assert not [p for p in home.rglob("*.tmp")], "temporary entries left behind"
    filler.unlink()
    mounts.remount(home, "size=64m")
    code, err = run(workspace, workspace / "out", capsys)
    assert code == 0, err[-3000:]
    assert output_is_whole_or_absent(workspace / "out") == "whole"


# ---------------------------------------------------------------- mlruns/


def test_mlruns_read_only(workspace: Path, mounts, prefect_server: None,
                          monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    """No MLFLOW_TRACKING_URI: MLflow writes to ./mlruns, here a read-only mount."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlruns = mounts.tmpfs(workspace / "mlruns", readonly=True)
    code, err = run(workspace, workspace / "out", capsys)
    check_clean_error(code, err, mlruns)
    assert not (workspace / "out").exists()
    assert partial_cache_entries(workspace / ".orchestrator") == []


def test_mlruns_full(workspace: Path, mounts, prefect_server: None,
                     monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlruns = mounts.tmpfs(workspace / "mlruns", size="1m")
    mounts.fill(mlruns, leave_bytes=8 << 10)
    code, err = run(workspace, workspace / "out", capsys)
    check_clean_error(code, err, mlruns)
    assert not (workspace / "out").exists()
    assert partial_cache_entries(workspace / ".orchestrator") == []
