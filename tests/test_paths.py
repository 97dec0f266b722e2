"""orchestrator.paths' writers: a file written whole, with the mode it should have; the
umask read without changing it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.paths import atomic_write_bytes, atomic_write_text, current_umask, plain_file_mode


@pytest.fixture
def umask_027():  # noqa: ANN201
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "out" / "report.json"
    atomic_write_bytes(target, b"first")
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]


@pytest.mark.usefixtures("umask_027")
def test_the_umask_is_read_not_changed() -> None:
    assert current_umask() == 0o027
    assert current_umask() == 0o027
    assert plain_file_mode() == 0o640


@pytest.mark.usefixtures("umask_027")
def test_modes_private_unless_plain(tmp_path: Path) -> None:
    """0600 by default (a decrypted model stays private); `plain_mode` as open() makes a
    file (the schema, a recipe, history.png)."""
    private, plain = tmp_path / "model.pb", tmp_path / "schema.json"
    atomic_write_bytes(private, b"x")
    atomic_write_text(plain, "{}\n", plain_mode=True)
    assert private.stat().st_mode & 0o777 == 0o600
    assert plain.stat().st_mode & 0o777 == 0o640
    assert plain.read_text(encoding="utf-8") == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pb", "schema.json"]
