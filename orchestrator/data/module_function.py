"""`module:function` data sources: the module is imported with the recipe's folder first
on sys.path, and the function, called without arguments, returns an iterable of numpy
batches or of `(inputs, labels)` tuples. Only the module's own file counts for the cache
fingerprint.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.data.batches import checked
from orchestrator.data.callables import CallableProblem, import_callable, on_sys_path
from orchestrator.data.source import Chunk, LoadStats, Role, hash_file
from orchestrator.errors import DataError
from orchestrator.model.artifact import TensorSpec
from orchestrator.spec.models import DataSource


def check(source: DataSource, base_dir: Path, role: Role, field_path: str,
          input_spec: TensorSpec | None) -> None:
    """The module imports and has the function (not called)."""
    import_function(source.source, base_dir, field_path)


def open_chunks(source: DataSource, base_dir: Path, role: Role, input_spec: TensorSpec | None,
                chunk_size: int, stats: LoadStats | None,
                field_path: str) -> tuple[Iterator[Chunk], str]:
    """The function imported now; called, and its items read, lazily."""
    fn = import_function(source.source, base_dir, field_path)
    names = (f"{source.source} inputs", f"{source.source} labels")
    return (checked(module_chunks(fn, source.source, base_dir, role, field_path), names,
                    None, (f"{field_path}.source", f"{field_path}.source")),
            f"{field_path}.source")


def hash_content(digest: Any, source: DataSource, base_dir: Path) -> None:
    """The module file's source; the module's name when it has no file."""
    module_name = source.source.rpartition(":")[0]
    with on_sys_path(base_dir):
        try:
            spec = importlib.util.find_spec(module_name)
        except (ImportError, ValueError) as exc:
            raise DataError(f"cannot import module {module_name!r}: {exc}") from exc
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        digest.update(module_name.encode())  # built-in or namespace: the name is all
    else:
        hash_file(digest, Path(spec.origin))


def import_function(spec: str, base_dir: Path, field_path: str) -> Callable[[], Any]:
    """The function a `module:function` names; DataError naming the recipe field."""
    try:
        return import_callable(spec, base_dir)
    except CallableProblem as exc:
        raise DataError(str(exc), file=exc.file, field=f"{field_path}.source") from exc


def module_chunks(fn: Callable[[], Any], spec: str, base_dir: Path, role: Role,
                  field_path: str) -> Iterator[Chunk]:
    """The function's items as chunks (labels kept for evaluation only)."""
    field = f"{field_path}.source"
    try:
        with on_sys_path(base_dir):
            items = iter(fn())
        for i, item in enumerate(items):
            if isinstance(item, tuple | list) and len(item) == 2:
                x, y = np.asarray(item[0]), np.asarray(item[1])
            elif isinstance(item, np.ndarray):
                x, y = item, None
            else:
                raise DataError(f"{spec} item {i} is a {type(item).__name__}; expected a numpy "
                                "batch or an (inputs, labels) tuple", field=field)
            if x.ndim == 0:
                raise DataError(f"{spec} item {i} is a scalar; expected a batch", field=field)
            yield x, (y if role == "evaluation" else None)
    except DataError:
        raise
    except Exception as exc:  # raised inside the user's function
        raise DataError(f"{spec} raised {type(exc).__name__}: {exc}", field=field) from exc
