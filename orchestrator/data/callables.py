"""`module:function` references in recipes (data sources, retrain): imported from the
recipe's folder first, then sys.path."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class CallableProblem(Exception):
    """Why a `module:function` cannot be used; `file` is the module's, when it was found."""

    def __init__(self, message: str, file: str | None = None) -> None:
        super().__init__(message)
        self.file = file


@contextlib.contextmanager
def on_sys_path(folder: Path) -> Iterator[None]:
    entry = str(folder.resolve())
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added and entry in sys.path:
            sys.path.remove(entry)


def import_callable(spec: str, base_dir: Path) -> Callable[..., Any]:
    """The function `spec` ("package.module:function") names; CallableProblem otherwise,
    listing the module's functions when the name is wrong."""
    module_name, _, function_name = spec.rpartition(":")
    with on_sys_path(base_dir):
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # the user's module: any import failure is theirs
            raise CallableProblem(f"cannot import module {module_name!r} (looked in {base_dir} "
                                  f"and sys.path): {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, function_name, None)
    if fn is None or not callable(fn):
        public = sorted(n for n, v in vars(module).items()
                        if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        what = "no function" if fn is None else "a non-callable"
        raise CallableProblem(f"module {module_name!r} has {what} {function_name!r}; its "
                              f"functions: {', '.join(public) or '(none)'}",
                              file=getattr(module, "__file__", None))
    return fn
