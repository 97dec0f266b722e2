"""A module-scoped fixture's way to run commands in a project folder of its own."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def in_project(work: Path, env: Mapping[str, str]) -> Iterator[None]:
    """The cwd at `work` and `env` set in os.environ; both as they were afterwards."""
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    cwd = Path.cwd()
    os.chdir(work)
    try:
        yield
    finally:
        os.chdir(cwd)
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
