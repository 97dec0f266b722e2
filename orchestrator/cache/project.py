"""Where a recipe's run keeps things: the store, MLflow's folder and the default outputs
live at the recipe's project root, whatever the working directory.

The project root is the nearest folder above the recipe that holds `.git` or
`pyproject.toml`; a recipe outside any project uses the working directory. The environment
still wins: ORCHESTRATOR_HOME for the store, MLFLOW_TRACKING_URI for tracking.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.cache.store import Store

STORE_ENV = "ORCHESTRATOR_HOME"
STORE_FOLDER = ".orchestrator"
TRACKING_FOLDER = "mlruns"
PROJECT_MARKERS = (".git", "pyproject.toml")


def project_root(start: Path | str | None = None) -> Path:
    """The nearest folder at or above `start` (a recipe file or a folder; default the
    working directory) that holds `.git` or `pyproject.toml`; else the working directory."""
    here = Path(os.path.abspath(start or Path.cwd()))
    folder = here if here.is_dir() else here.parent
    for candidate in (folder, *folder.parents):
        if any((candidate / marker).exists() for marker in PROJECT_MARKERS):
            return candidate
    return Path(os.path.abspath(Path.cwd()))


def store_dir(root: Path) -> Path | str:
    """The store: ORCHESTRATOR_HOME, a local folder (absolute Path) or an fsspec URL (str,
    e.g. s3://bucket/prefix, as given); else `.orchestrator` under the project root.
    `open_store` opens either."""
    from orchestrator.paths import store_url

    home = os.environ.get(STORE_ENV)
    url = store_url(home) if home else None
    return url if url is not None else Path(os.path.abspath(home or root / STORE_FOLDER))


def open_store(location: str | os.PathLike[str]) -> Store:
    """The store at `location`: a local folder (`store.Store`), or an fsspec URL such as
    s3://bucket/prefix (`object_store.ObjectStore`, same interface, imported only then)."""
    from orchestrator.cache.store import Store
    from orchestrator.paths import store_url

    url = store_url(os.fspath(location))
    if url is None:
        return Store(Path(location))
    from orchestrator.cache.object_store import ObjectStore

    return ObjectStore(url)


def local_home(root: Path) -> Path:
    """This machine's folder for the project's local state (the Prefect server's record):
    the store's folder, or `.orchestrator` under the project root when the store is a URL."""
    store = store_dir(root)
    return store if isinstance(store, Path) else Path(os.path.abspath(root / STORE_FOLDER))


def tracking_folder(root: Path) -> Path:
    return root / TRACKING_FOLDER


def tracking_uri(root: Path) -> str:
    """MLFLOW_TRACKING_URI, else sqlite in `mlruns/` under the project root."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (
        f"sqlite:///{tracking_folder(root) / 'mlflow.db'}")


def default_tracking_uri(root: Path | None = None) -> str:
    """MLFLOW_TRACKING_URI, else sqlite in `mlruns/` at the project root (`root`, else the
    one around the working directory)."""
    return tracking_uri(root or project_root())


def local_tracking_folder(uri: str | None = None, root: Path | None = None) -> Path | None:
    """The local folder a tracking URI writes to (sqlite, file store), else None (a
    server). Without a URI: MLFLOW_TRACKING_URI's, else `mlruns/` at the project root."""
    uri = uri or default_tracking_uri(root)
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///").split("?")[0]).parent
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    if "://" not in uri:
        return Path(uri)
    return None


def output_dir(root: Path, recipe_name: str, requested: Path | str | None = None) -> Path:
    """`-o DIR` as given (relative to the working directory), else `out/<recipe name>`
    under the project root; absolute, not resolved through symlinks (a loop is reported by
    the folder check)."""
    return Path(os.path.abspath(requested if requested else root / "out" / recipe_name))


def check_folders(out_dir: Path, store_root: Path | str, root: Path) -> None:
    """Every folder the run will write to can be written: exit 2 naming it, before the
    run, rather than a failure after every stage has run. A store on an object store takes
    a probe write (bucket missing, access denied, endpoint down), and its local mirror is
    checked as a folder."""
    from orchestrator.errors import OutputError
    from orchestrator.paths import writable_dir_problem
    folders = [(out_dir, "the output folder (-o)")]
    if isinstance(store_root, Path):
        folders.append((store_root, f"the store ({STORE_ENV})"))
    else:
        store = open_store(store_root)
        problem = store.check_writable()
        if problem:
            raise OutputError(f"cannot write to the store {store.shown} ({STORE_ENV}): "
                              f"{problem}", file=store.shown)
        folders.append((store.root, f"the local copy of the store {store.shown}"))
    tracking = local_tracking_folder(tracking_uri(root))
    if tracking is not None:
        named = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else (
            "the project's mlruns/")
        folders.append((tracking, f"MLflow's folder ({named})"))
    for folder, role in folders:
        problem = writable_dir_problem(folder)
        if problem:
            raise OutputError(f"cannot write to {role}: {problem}", file=str(folder))
