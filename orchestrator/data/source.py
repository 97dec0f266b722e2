"""What a data source is, whatever its kind: which kind (npz, images, module), its path, the
chunks a kind's reader yields, the statistics filled in while reading, and the hashing of a
file for fingerprints. The kind modules (npz.py, images.py, module_function.py) build on it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from orchestrator import paths
from orchestrator.errors import DataError
from orchestrator.spec.models import DataSource

# the name data warnings have always been logged under (tests and users filter on it)
log = logging.getLogger("orchestrator.data")

SourceKind = Literal["npz", "images", "module"]
Role = Literal["representative", "evaluation"]
Chunk = tuple[np.ndarray, np.ndarray | None]  # (inputs, labels or None)

MODULE_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass
class LoadStats:
    """Filled in while data is read, for the report: samples yielded, files skipped."""

    samples: int = 0
    skipped: list[str] = field(default_factory=list)

    @property
    def skipped_count(self) -> int:
        return len(self.skipped)


def source_kind(source: DataSource, base_dir: Path, field_path: str = "data") -> SourceKind:
    """Which kind of source this is. DataError when the path is missing or unsupported."""
    path = paths.resolve(source.source, base_dir)
    problem = paths.path_problem(path, "file_or_dir")
    if MODULE_FUNCTION.match(source.source) and problem == "not found":
        return "module"
    if problem:
        message = ("data source not found" if problem == "not found"
                   else f"cannot read the data source: {problem}")
        raise DataError(f"{message}: {path}", file=str(path), field=f"{field_path}.source")
    if path.is_dir():
        return "images"
    if path.suffix.lower() == ".npz":
        return "npz"
    raise DataError(f"unsupported data source {path.name!r}: expected an .npz file, a "
                    "folder of images, or module:function", file=str(path),
                    field=f"{field_path}.source")


def source_path(source: DataSource, base_dir: Path) -> Path:
    """The source's path, resolved against the recipe's folder (for messages and reports)."""
    return paths.resolve(source.source, base_dir)


def describe(source: DataSource) -> str:
    """The source as messages name it: `data.npz[x]`, or its path or module:function."""
    name = source.array or source.inputs
    return f"{source.source}[{name}]" if name else source.source


def hash_file(digest: Any, path: Path) -> None:
    """Feed a file's bytes to `digest` (hashlib); DataError when it cannot be read."""
    try:
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}", file=str(path)) from exc


@dataclass(frozen=True)
class EvaluationData:
    """Labelled (or unlabelled) evaluation inputs. `labels` is None when the data has none."""

    inputs: np.ndarray
    labels: np.ndarray | None
