"""A run's output folder belongs to one recipe and holds one run's outputs.

`.orchestrator-recipe` in the folder (JSON: the recipe's name and path, and when that run
wrote the folder) names the recipe that owns it. A run of another recipe there, or into a
folder of other files, is exit 2 before anything is written, unless `--force`. A run
replaces the folder's contents whole: the outputs are built in a hidden `.staging-*` folder
inside it, then, with Ctrl-C held, the old entries move out (to `.old-*`) and the new ones
in (renames within one folder), so that the folder holds the previous run's outputs or this
run's, never a mix of the two; stale files of earlier runs (a variant since removed from
the recipe, a picture no longer drawn) do not survive. The swap is a run's last step, right
after MLflow recorded the outputs (read from the hidden folder, with Ctrl-C held from the
record to the swap, so that MLflow never says a run finished that the folder lacks): a
run that fails, is interrupted (Ctrl-C, SIGTERM) or is killed leaves the folder exactly as
it was (`held_by`: what it still holds), and a run that completes but breaks a budget
(exit 1) replaces it.

A run holds a lock (flock) on its working folders while it writes them; the working
folders of a run that was killed (`kill -9`) are removed by the next run of the folder
(`remove_leftovers`), never those of a run still writing.

The folder itself is never renamed (a shell whose working directory it is, a mount point
or a symlink stay valid); a partial run (`--variant`) replaces it whole too, as report.json
then lists only what that run made.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OutputError

if TYPE_CHECKING:
    from orchestrator.engine.node_run import NodeOutcome, RunData
    from orchestrator.engine.plan import Plan

MARKER = ".orchestrator-recipe"
WRITTEN_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # the marker's time of writing, to the microsecond
# hidden working folders of a run: this one's, or another run's that is still writing
_WORKING = (".staging-", ".old-", ".orchestrator-probe-", ".history-")
# those a run builds and swaps its outputs with (locked while in use: remove_leftovers)
_SWAP_FOLDERS = (".staging-", ".old-")
# what an earlier version (before the marker) wrote besides a report.json: `history`
_UNMARKED_OURS = {"history.png"}


@dataclass(frozen=True)
class Owner:
    """The recipe an output folder belongs to: its name and file (absolute, normalized).
    The marker holds the file relative to the folder: a project moved or cloned elsewhere
    with its outputs still owns them."""

    name: str
    path: str

    def shown(self) -> str:
        return f"'{self.name}' ({_short(self.path)})"


def _short(path: str) -> str:
    """`path` relative to the working directory when that is shorter."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    # not `../..`: a path that climbs out of the working directory reads worse than its own
    return relative if len(relative) < len(path) and not relative.startswith("..") else path


def owner_of(recipe_name: str, recipe_path: Path | str) -> Owner:
    return Owner(recipe_name, os.path.realpath(recipe_path))


class _Unreadable:
    """A marker file that is not one we wrote (damaged, or not JSON)."""


def read_owner(folder: Path) -> Owner | _Unreadable | None:
    """The recipe named by `folder`'s marker; None without one."""
    try:
        data = json.loads((folder / MARKER).read_text())
        path = os.path.join(os.path.abspath(folder), str(data["recipe_path"]))
        return Owner(str(data["recipe"]), os.path.normpath(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return _Unreadable()


def _entries(folder: Path) -> list[str]:
    """The folder's entries but its marker and runs' working folders."""
    return sorted(name for name in os.listdir(folder)
                  if name != MARKER and not name.startswith(_WORKING))


def _inside(path: Path, folder: Path) -> bool:
    path, folder = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    return path == folder or folder in path.parents


# what --force does where a folder holds another recipe's outputs: `run` replaces them
REPLACES = "pass --force to replace its contents"


@dataclass(frozen=True)
class Protected:
    """A path no output folder may hold (the recipe, the project, the store, MLflow's
    folder), nor, when `within`, lie inside (a folder the orchestrator itself manages)."""

    path: Path
    what: str
    within: bool = False


def protected_paths(root: Path, recipe_path: Path | str) -> list[Protected]:
    """What `run` and `history` never write into: the recipe, the project, the store and
    MLflow's local folder; nor inside the store, or inside MLflow's own folder (`mlruns/`,
    or a file store; a sqlite file's folder may hold anything). A folder that holds the
    project (ORCHESTRATOR_HOME=.) is no folder of ours: outputs may go inside it."""
    from orchestrator.cache.project import STORE_ENV, local_tracking_folder, store_dir, tracking_uri

    protected = [Protected(Path(recipe_path), "the recipe"), Protected(root, "the project")]
    store = store_dir(root)
    if isinstance(store, Path):
        protected.append(Protected(store, f"the store ({STORE_ENV})",
                                   within=not _inside(root, store)))
    uri = tracking_uri(root)
    tracking = local_tracking_folder(uri)
    if tracking is not None:
        own = not os.environ.get("MLFLOW_TRACKING_URI") or not uri.startswith("sqlite:")
        protected.append(Protected(tracking, "MLflow's folder",
                                   within=own and not _inside(root, tracking)))
    return protected


def check(folder: Path, owner: Owner, force: bool,
          protected: Sequence[Protected | tuple[Path, str]] = (),
          force_does: str = REPLACES) -> None:
    """Exit 2 (OutputError) when a run of `owner` must not replace `folder`'s contents:
    it holds one of `protected` (the recipe, the project, the store: never, even with
    force) or lies inside one that is `within`, or it holds another recipe's outputs or
    other files (unless `force`; `force_does` says what --force does for the command)."""
    for item in protected:
        item = item if isinstance(item, Protected) else Protected(*item)
        if _inside(item.path, folder):
            raise OutputError(
                f"cannot be the output folder: it holds {item.what} ({item.path}), and a run "
                "replaces its output folder's contents whole; choose another folder with -o",
                file=str(folder))
        if item.within and _inside(folder, item.path):
            raise OutputError(
                f"cannot be the output folder: it is inside {item.what} ({item.path}), "
                "which the orchestrator manages; choose another folder with -o",
                file=str(folder))
    try:
        if not folder.is_dir():
            return  # missing (created by the run), or not a folder (check_folders says so)
        entries = _entries(folder)
    except OSError:
        return  # unreadable: check_folders names the reason
    found = read_owner(folder)
    if found is None and entries:
        found = _unmarked_owner(folder, entries, owner)
    if not entries or _same_recipe(found, owner):
        return
    if found is None:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more"
                                         if len(entries) > 3 else "")
        holds = f"files that are not a recipe's outputs ({shown})"
    elif isinstance(found, _Unreadable):
        holds = f"a damaged {MARKER} (the name of the recipe whose outputs it holds)"
    else:
        holds = f"the outputs of recipe {found.shown()}"
    if force:
        return
    raise OutputError(f"this output folder holds {holds}, not of recipe {owner.shown()}, "
                      "and a folder holds one recipe's outputs: choose another with -o, or "
                      f"{force_does}", file=str(folder))


def _same_recipe(found: Owner | _Unreadable | None, owner: Owner) -> bool:
    """The marker names this recipe: its name, and its file (or a file that is gone: the
    recipe was moved or renamed)."""
    return (isinstance(found, Owner) and found.name == owner.name
            and (found.path == owner.path or not os.path.exists(found.path)))


def _unmarked_owner(folder: Path, entries: list[str], owner: Owner) -> Owner | None:
    """Who owns a folder an earlier version wrote, before the marker: the recipe its
    report.json names (a folder of `history`'s chart only: this one)."""
    if set(entries) <= _UNMARKED_OURS:
        return owner
    try:
        report = json.loads((folder / "report.json").read_text())
        return Owner(str(report["recipe"]), os.path.realpath(str(report["recipe_path"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_marker(folder: Path, owner: Owner, final: Path | None = None) -> None:
    """The marker naming `owner` in `folder` (atomically: a reader sees the old marker or
    the new), its path relative to `final`, the folder it ends up in (default `folder`)."""
    tmp = folder / f".staging-marker-{uuid.uuid4().hex}"  # not mkstemp: the umask's mode
    try:
        with open(tmp, "x") as handle:
            json.dump({"recipe": owner.name, "recipe_path": os.path.relpath(
                owner.path, os.path.abspath(final or folder)),
                "written": datetime.datetime.now(datetime.UTC).strftime(WRITTEN_FORMAT)},
                      handle)
            handle.write("\n")
        os.replace(tmp, folder / MARKER)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextmanager
def replacing(folder: Path, owner: Owner,
              record: Callable[[Path], object] | None = None) -> Iterator[Path]:
    """An empty hidden folder in `folder` to build the run's outputs in; when the block
    ends without an error, `folder`'s contents are replaced by it, marker included. The
    marker and the folder the old outputs move to are made first, then, with Ctrl-C held,
    `record(built)` (MLflow records the run from the hidden folder) and the swap, the last
    step: a Ctrl-C meanwhile acts once the folder holds this run (and `held_by` says so).
    When the block or `record` fails, `folder` is as it was before it, untouched. An
    OSError of the block or the swap is an OutputError naming `folder`; a folder this
    created is removed on failure. First, the working folders a killed run left in
    `folder` are removed."""
    from orchestrator.cache.store import interrupts_deferred
    from orchestrator.paths import describe_os_error

    def cannot_write(exc: OSError) -> OutputError:
        return OutputError(f"cannot write the outputs to {folder}: {describe_os_error(exc)}",
                           file=str(folder))

    created = not folder.exists()
    locks: list[int] = []
    working: list[Path] = []
    done = False
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            remove_leftovers(folder)
            built = _working_folder(folder, ".staging-", locks)
            working.append(built)
        except OSError as exc:
            raise cannot_write(exc) from exc
        try:
            yield built
            write_marker(built, owner, final=folder)
            old = _working_folder(folder, ".old-", locks)
            working.append(old)
        except OutputError as exc:  # name the folder the user gave, not our hidden one
            raise OutputError(exc.message.replace(str(built), str(folder)),
                              file=str(folder)) from exc
        except OSError as exc:
            raise cannot_write(exc) from exc
        with interrupts_deferred():  # recorded and swapped in, or neither (but a record
            if record is not None:  # that fails: the run failed, the folder stays)
                record(built)
            try:
                _swap_in(folder, built, old)
            except OSError as exc:
                raise cannot_write(exc) from exc
            done = True  # before a Ctrl-C held meanwhile acts: the folder is this run's
    finally:
        for path in working:  # built (empty once swapped in) and the previous outputs
            shutil.rmtree(path, ignore_errors=True)
        for fd in locks:
            os.close(fd)  # the lock goes with it
        if created and not done:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _working_folder(folder: Path, prefix: str, locks: list[int]) -> Path:
    """A new hidden folder in `folder`, locked (flock on the folder itself) while this
    process lives, so that no other run takes it for a killed run's leftover; its lock's
    descriptor appended to `locks`. Where flock is not supported, unlocked (and then never
    removed by another run)."""
    while True:
        path = Path(tempfile.mkdtemp(dir=folder, prefix=prefix))
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):  # being removed as ours
                os.close(fd)
                continue
        try:
            alive = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            alive = False
        if alive:  # not removed between its making and its lock
            locks.append(fd)
            return path
        os.close(fd)


def remove_leftovers(folder: Path) -> list[str]:
    """Remove the `.staging-*` and `.old-*` folders in `folder` that no live process
    holds (a run killed mid-way left them); the names removed. A run's own, still in use,
    is locked and stays."""
    removed = []
    try:
        names = [name for name in os.listdir(folder) if name.startswith(_SWAP_FOLDERS)]
    except OSError:
        return removed
    for name in names:
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # not a folder (a file of ours is inside one), or gone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # in use by a run (or no flock here: left alone)
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def _swap_in(folder: Path, built: Path, old: Path) -> None:
    """Move `folder`'s entries into `old` (report.json first) and `built`'s in
    (report.json last); a rename that fails puts back what had moved. Called with Ctrl-C
    held (`replacing`)."""
    outgoing = sorted(_entries(folder), key=lambda name: name != "report.json")
    if (folder / MARKER).exists():
        outgoing.append(MARKER)
    incoming = sorted(os.listdir(built), key=lambda name: name == "report.json")
    moved: list[tuple[Path, Path]] = []
    try:
        for name in outgoing:
            os.rename(folder / name, old / name)
            moved.append((folder / name, old / name))
        for name in incoming:
            os.rename(built / name, folder / name)
            moved.append((built / name, folder / name))
    except OSError:
        for source, target in reversed(moved):
            with contextlib.suppress(OSError):
                os.rename(target, source)
        raise


def held_by(folder: Path, run_started: datetime.datetime | None = None) -> str:
    """What `folder` holds after a run that failed or was interrupted (it leaves the folder
    as it was): `out/mnv3 still holds the run of 2026-11-29 05:40 UTC`, or that nothing
    was written to it; or, where the failure came after the run's outputs were swapped in
    (a server lost as the flow ended), that they are this run's, complete."""
    shown = _short(str(folder))
    try:
        entries = _entries(folder) if folder.is_dir() else []
    except OSError:
        entries = []
    if not entries:
        return f"nothing was written to {shown}"
    when = _written(folder)
    if when is None:
        return f"{shown} is as it was"
    # to the microsecond: a re-run can start within the second the last run wrote
    if run_started is not None and when >= run_started:
        return (f"{shown} holds this run's outputs, complete (written at {when:%H:%M:%S} "
                "UTC, before the failure)")
    return f"{shown} still holds the run of {when:%Y-%m-%d %H:%M} UTC"


def _written(folder: Path) -> datetime.datetime | None:
    """When the run that `folder` holds wrote it: its marker says (else its report.json's
    time)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        written = json.loads((folder / MARKER).read_text())["written"]
        for form in (WRITTEN_FORMAT, "%Y-%m-%dT%H:%M:%SZ"):  # the second: earlier markers
            with contextlib.suppress(ValueError):
                return datetime.datetime.strptime(written, form).replace(tzinfo=datetime.UTC)
    with contextlib.suppress(OSError):
        return datetime.datetime.fromtimestamp((folder / "report.json").stat().st_mtime,
                                               datetime.UTC)
    return None


def check_output_owner(out_dir: Path, recipe_name: str, recipe_path: Path | str, root: Path,
                       force: bool = False, force_does: str | None = None) -> None:
    """The output folder is this recipe's to replace (see the module's docstring): exit 2 naming it
    and both recipes when it holds another's outputs or other files (unless `force`;
    `force_does` says what --force does for the command), or the recipe, the project, the
    store or MLflow's folder, or lies inside the store or MLflow's folder (always)."""
    check(out_dir, owner_of(recipe_name, recipe_path), force,
          protected_paths(root, recipe_path), force_does or REPLACES)


# --- what a run writes into the folder: each variant, report.json and the page ----------

def write_outputs(built: Path, final: Path, plan: Plan, data: RunData,
                  outcomes: Mapping[str, NodeOutcome], report: Mapping[str, Any],
                  picture_cache: Path | None = None) -> None:
    """DIR/<pipeline>/ (the model file of its kind, signature.json, stage files),
    DIR/report.json and the page, written into `built`: the empty folder that
    `replacing` swaps in whole as `final` (so the page links relative to
    `final`). A folder that cannot be written (full, read-only) is an OutputError naming
    `final`. `picture_cache`: where the pictures of earlier reports are kept, to be
    reused when this report's are the same (plots.report_plots)."""
    from orchestrator.paths import describe_os_error
    from orchestrator.results.page import report_files

    pictures, warnings = report_files(report, final, picture_cache)
    for warning in warnings:  # the run succeeded: its pictures are not worth failing it
        print(f"warning: {warning}", file=sys.stderr)
    report["page_files"] = sorted(pictures)  # type: ignore[index]
    try:
        for name in report["variants"]:
            _write_variant(built / name, name, plan, data, outcomes)
        for name, content in pictures.items():
            (built / name).write_bytes(content)
        (built / "report.json").write_text(json.dumps(report, indent=2, default=_jsonable))
    except OSError as exc:
        raise OutputError(f"cannot write the outputs to {final}: {describe_os_error(exc)}",
                          file=str(final)) from exc


def _write_variant(folder: Path, name: str, plan: Plan, data: RunData,
                   outcomes: Mapping[str, NodeOutcome]) -> None:
    """One variant's folder (inside the staging folder: plain writes suffice)."""
    from orchestrator.model import kinds

    folder.mkdir(parents=True)
    key = plan.final_model_key(name)
    if key in data.unstored_models:
        artifact = data.unstored_models[key]
        (folder / kinds.file_name(artifact.kind)).write_bytes(kinds.to_bytes(artifact))
        (folder / "signature.json").write_text(artifact.signature_json())
    else:  # copy the stored bytes: no need to parse the graph
        stored = data.store.model_path(key)
        shutil.copyfile(stored, folder / stored.name)
        shutil.copyfile(data.store.signature_path(key), folder / "signature.json")
    for node in plan.pipelines[name]:
        outcome = outcomes.get(node.id)
        if outcome is None or not data.store.has(node.key):
            continue
        for file_name in outcome.files:
            target = folder / file_name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(data.store.file_path(node.key, file_name), target)


def _jsonable(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
