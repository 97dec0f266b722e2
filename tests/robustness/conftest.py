"""Fixtures of the robustness suite: subprocess environments, tmpfs mounts, and the fuzz
outcome summary printed at the end of the session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.project_env import new_mlflow_database
from support.robust_helpers import (
    FUZZ_FAILURES,
    FUZZ_OUTCOMES,
    TEST_MODEL_KEY,
    base_env,
    drop_file_access_override,
)


@pytest.fixture(autouse=True)
def _fixed_locale_and_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What these tests rely on, whatever the machine or CI sets."""
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("ORCHESTRATOR_MODEL_KEY", TEST_MODEL_KEY)
    if hasattr(time, "tzset"):
        time.tzset()
    yield
    if hasattr(time, "tzset"):
        time.tzset()


@pytest.fixture(scope="session")
def prefect_api_url(prefect_server: None) -> str:
    """The session's Prefect server (tests/conftest.py), for subprocesses to share."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "prefect_test_harness set no PREFECT_API_URL"
    return str(url)


@pytest.fixture
def run_env(tmp_path: Path, prefect_api_url: str, mlflow_template: Path) -> dict[str, str]:
    """Environment for an `orchestrator` subprocess: store in tmp_path/.orchestrator,
    MLflow in tmp_path/mlruns (an empty database, its tables made), the session's Prefect
    server."""
    return base_env(tmp_path / ".orchestrator",
                    new_mlflow_database(mlflow_template, tmp_path / "mlruns"), prefect_api_url)


@pytest.fixture
def load_env(tmp_path: Path) -> dict[str, str]:
    """Environment for an `orchestrator validate` subprocess (no Prefect needed)."""
    return base_env(tmp_path / ".orchestrator",
                    f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", None)


class Mounts:
    """Small tmpfs file systems, unmounted at teardown. Skips the test, with the reason,
    where the machine cannot mount one (that is tried, not guessed)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounted: list[Path] = []

    def tmpfs(self, target: Path, size: str = "2m", readonly: bool = False) -> Path:
        target.mkdir(parents=True, exist_ok=True)
        options = f"size={size},mode=0755" + (",ro" if readonly else "")
        if shutil.which("mount") is None:
            pytest.skip("cannot simulate a small or read-only disk: no `mount` command")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot simulate a small or read-only disk: `mount -t tmpfs -o "
                        f"{options}` failed: {done.stderr.strip() or done.returncode}")
        self.mounted.append(target)
        return target

    def remount(self, target: Path, options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(target)], check=True,
                       capture_output=True)

    @staticmethod
    def fill(target: Path, leave_bytes: int) -> Path:
        """Fill the file system of `target` until about `leave_bytes` are free."""
        stats = os.statvfs(target)
        free = stats.f_bavail * stats.f_frsize
        filler = target / "filler.bin"
        with open(filler, "wb") as handle:
            remaining = max(0, free - leave_bytes)
            chunk = b"\0" * (64 << 10)
            while remaining > 0:
                try:
                    handle.write(chunk[:remaining])
                    handle.flush()
                except OSError:
                    break
                remaining -= min(len(chunk), remaining)
        return filler

    def unmount_all(self) -> None:
        for target in reversed(self.mounted):
            done = subprocess.run(["umount", str(target)], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(target)], capture_output=True)
        self.mounted.clear()


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Mounts]:
    found = Mounts(tmp_path)
    try:
        yield found
    finally:
        found.unmount_all()


@pytest.fixture(scope="session")
def unprivileged(tmp_path_factory: pytest.TempPathFactory) -> bool:
    """Whether subprocesses must drop root's file-access override so that chmod 000 and
    read-only modes apply to them (True when we are root). Tried for real: skips, with the
    reason, where the kernel refuses to drop it."""
    if os.geteuid() != 0:
        return False
    probe = tmp_path_factory.mktemp("cap-probe") / "secret"
    probe.write_text("x")
    probe.chmod(0)
    done = subprocess.run(
        [sys.executable, "-c", f"open({str(probe)!r}).read()"], capture_output=True,
        text=True, preexec_fn=drop_file_access_override)
    if "PermissionError" not in done.stderr:
        pytest.skip("running as root, where chmod 000 does not stop reads, and dropping "
                    f"CAP_DAC_OVERRIDE did not help: {done.stderr.strip()[-300:] or 'read ok'}")
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:  # noqa: D103
    if not FUZZ_OUTCOMES:
        return
    total = sum(FUZZ_OUTCOMES.values())
    parts = ", ".join(f"{name}: {count}" for name, count in sorted(FUZZ_OUTCOMES.items()))
    terminalreporter.write_sep("-", "robustness fuzz")
    terminalreporter.write_line(f"examples fuzzed: {total}; outcomes: {parts}")
    for failure in FUZZ_FAILURES[:20]:
        terminalreporter.write_line(f"  property failed: {failure}")
