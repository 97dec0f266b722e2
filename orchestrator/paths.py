"""Paths a user names (the recipe, its model and data, `-o`, the store): one place that
resolves them and says, before anything reads or writes, why one cannot be used.

Special files are refused up front: a FIFO with no writer would hang a reader, `/dev/zero`
never ends, a symlink loop or a NUL byte makes the standard library raise odd errors.

Also how a file is written whole (atomic_write_bytes) and with which mode.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Literal

Want = Literal["file", "dir", "file_or_dir"]

# Below this much free space, a folder we are about to write into is called full up front.
MIN_FREE_BYTES = 1 << 20


def resolve(path: str | os.PathLike[str], base_dir: Path) -> Path:
    """`path` (with `~`) relative to `base_dir` unless absolute; not resolved through
    symlinks, so a loop is reported by `path_problem`, not raised here."""
    candidate = Path(os.path.expanduser(os.fspath(path)))
    return candidate if candidate.is_absolute() else Path(base_dir) / candidate


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def path_problem(path: Path, want: Want) -> str | None:
    """Why `path` cannot be read as `want`, or None. Follows symlinks."""
    try:
        mode = os.stat(path).st_mode
    except ValueError:
        return "the path holds a NUL byte"
    except OSError as exc:
        return _os_reason(exc)
    ok = {"file": stat.S_ISREG(mode), "dir": stat.S_ISDIR(mode),
          "file_or_dir": stat.S_ISREG(mode) or stat.S_ISDIR(mode)}[want]
    if not ok:
        expected = {"file": "a regular file", "dir": "a folder",
                    "file_or_dir": "a regular file or a folder"}[want]
        return f"expected {expected}, found {_kind(mode)}"
    if not os.access(path, os.R_OK | (os.X_OK if stat.S_ISDIR(mode) else 0)):
        return "permission denied"
    return None


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "not found"
    if exc.errno == errno.ELOOP:
        return "a symlink loop (too many levels of symbolic links)"
    if exc.errno == errno.ENAMETOOLONG:
        return "the path is too long"
    return exc.strerror or str(exc)


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. Raises ValueError with the
    reason otherwise, without ever blocking on a FIFO or reading a device."""
    problem = path_problem(path, "file")
    if problem:
        raise ValueError(problem)
    try:
        # O_NONBLOCK: should the file be swapped for a FIFO after the check, open returns
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ValueError(_os_reason(exc)) from exc
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"expected a regular file, found {_kind(os.fstat(fd).st_mode)}")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than the limit of {limit:,} bytes")
    return data


def nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists."""
    current = path
    while not os.path.lexists(current) and current.parent != current:
        current = current.parent
    return current


def writable_dir_problem(path: Path) -> str | None:
    """Why we could not create files in folder `path` (creating it if missing), or None.
    Probes for real, with a temporary folder that is removed at once: permission bits say
    nothing about read-only mounts, /proc or full disks."""
    if "\0" in os.fspath(path):
        return "the path holds a NUL byte"
    try:
        os.fspath(path).encode()
        existing = nearest_existing(path)
        mode = os.stat(existing).st_mode
        if not stat.S_ISDIR(mode):
            where = "it exists and" if existing == path else f"{existing}"
            return f"{where} is {_kind(mode)}, not a folder"
        probe = Path(tempfile.mkdtemp(dir=existing, prefix=".orchestrator-probe-"))
    except UnicodeEncodeError:
        return "the path is not valid text"
    except OSError as exc:
        if exc.errno == errno.ENOENT:  # /proc and the like: the folder exists, files don't
            return f"files cannot be created in {existing}"
        return _write_reason(exc)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = MIN_FREE_BYTES
    finally:
        os.rmdir(probe)
    if free < MIN_FREE_BYTES:
        return f"no space left on its device ({free:,} bytes free)"
    return None


def _write_reason(exc: OSError) -> str:
    reasons = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
               errno.EPERM: "operation not permitted", errno.ENOSPC: "no space left on device",
               errno.EDQUOT: "disk quota exceeded"}
    return reasons.get(exc.errno or 0) or _os_reason(exc)


def describe_os_error(exc: OSError) -> str:
    """A short reason for an OSError met while writing (read-only, full, ...)."""
    return _write_reason(exc)


def current_umask() -> int:
    """The process's umask. Reading it means setting it: not while another thread creates
    files (the CLI's writers run in the main thread)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def plain_file_mode() -> int:
    """The mode a plain open() gives a new file (0666 less the umask), for a temporary file
    renamed into place as an ordinary one: mkstemp makes 0600."""
    return 0o666 & ~current_umask()


def atomic_write_bytes(path: Path, data: bytes, plain_mode: bool = False) -> None:
    """Write via a temp file in the same folder (made with its parents), fsynced, then
    renamed: readers never see half a file. Mode 0600, as mkstemp makes it (a decrypted
    model stays private), unless `plain_mode`: then as open() would make it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if plain_mode:
            os.fchmod(fd, plain_file_mode())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str, plain_mode: bool = False) -> None:
    """atomic_write_bytes of `text` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), plain_mode)


# scheme://... (two letters or more: C:/ is a Windows drive); pathlib joins collapse the
# '//' of a URL (Path("s3://b/p") / "x" is "s3:/b/p/x"), so one slash is taken back too
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(/?)")


def store_url(location: str) -> str | None:
    """The fsspec URL a store location names (s3://bucket/prefix, trailing '/' dropped),
    or None for a local folder (a plain path or file://)."""
    found = _URL.match(location)
    if found is None or found.group(1).lower() == "file":
        return None
    return f"{found.group(1)}://{location[found.end():]}".rstrip("/")
