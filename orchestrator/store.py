"""Content-addressed artifact store under `.orchestrator/cache/`.

An entry is a folder named by its cache key, holding the node's model (transform nodes: the
file of its artifact kind, e.g. model.pb or model.enc, and signature.json naming the kind),
its result (metrics, info, warnings), and any files the stage produced. Entries are written
into a temporary folder and renamed into place, so a failed or killed run never leaves a
partial entry, and a present entry is always complete.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import kinds
from orchestrator.errors import OutputError
from orchestrator.model import ModelArtifact
from orchestrator.paths import describe_os_error

SIGNATURE_FILE = "signature.json"
RESULT_FILE = "result.json"
FILES_DIR = "files"


@dataclass
class StoredResult:
    """What a node left in the store (everything but the model itself)."""

    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)  # model_facts of the stored model


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder, then rename: readers never see half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while a few renames commit (or discard) a set of files, so
    that the set appears whole or not at all; a signal that came meanwhile is acted on
    right after. A Python-level handler, not a signal mask: whichever thread the kernel
    picks, the handler runs in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, lambda signum, frame: pending.append(signum))
                for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            handler = previous[pending[0]]
            if callable(handler):
                handler(pending[0], None)  # e.g. raises KeyboardInterrupt
            elif handler == signal.SIG_DFL:
                signal.raise_signal(pending[0])


class Store:
    """The cache. Keys are hex digests computed by the plan."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.cache = self.root / "cache"

    def entry(self, key: str) -> Path:
        return self.cache / key[:2] / key

    def has(self, key: str) -> bool:
        return (self.entry(key) / RESULT_FILE).is_file()

    def has_model(self, key: str) -> bool:
        # the signature is written with the model, in the same atomic rename
        return (self.entry(key) / SIGNATURE_FILE).is_file()

    def put(self, key: str, result: StoredResult, artifact: ModelArtifact | None,
            files: dict[str, bytes], replace: bool = False) -> None:
        """Write a whole entry atomically. An existing entry for the key is kept, unless
        `replace` (--no-cache: what was just computed wins over what was stored).
        A full or read-only store is an OutputError naming it; no partial entry is left."""
        try:
            self._put(key, result, artifact, files, replace)
        except OSError as exc:
            raise OutputError(f"cannot write to the store {self.root} (ORCHESTRATOR_HOME): "
                              f"{describe_os_error(exc)}", file=str(self.root)) from exc

    def _put(self, key: str, result: StoredResult, artifact: ModelArtifact | None,
             files: dict[str, bytes], replace: bool) -> None:
        final = self.entry(key)
        if final.exists() and not replace:
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{key[:12]}.", suffix=".tmp"))
        try:
            if artifact is not None:
                (tmp / kinds.file_name(artifact.kind)).write_bytes(kinds.to_bytes(artifact))
                (tmp / SIGNATURE_FILE).write_text(artifact.signature_json())
            for name, data in files.items():
                target = tmp / FILES_DIR / name
                if FILES_DIR not in target.resolve().parts or ".." in Path(name).parts:
                    raise ValueError(f"stage file name escapes its folder: {name!r}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            result.files = sorted(files)
            (tmp / RESULT_FILE).write_text(json.dumps(result.__dict__, indent=2, default=float))
            if replace and final.exists():  # move the old entry aside, swap the new in
                trash = final.with_name(f".{key[:12]}.{os.getpid()}.old")
                os.rename(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            try:
                os.rename(tmp, final)
            except OSError:
                # a concurrent run wrote the same key first: its entry is as good as ours,
                # and a reader may be using it, so it stays
                if not final.exists():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def get_result(self, key: str) -> StoredResult:
        data = json.loads((self.entry(key) / RESULT_FILE).read_text())
        known = StoredResult.__dataclass_fields__
        return StoredResult(**{k: v for k, v in data.items() if k in known})

    def get_model(self, key: str) -> ModelArtifact:
        signature = self.signature_path(key).read_text()
        return kinds.load(self.model_path(key).read_bytes(), signature)

    def get_signature(self, key: str) -> dict[str, Any]:
        """The stored model's inputs/outputs/metadata, without parsing the graph (no TF)."""
        return json.loads((self.entry(key) / SIGNATURE_FILE).read_text())

    def signature_path(self, key: str) -> Path:
        return self.entry(key) / SIGNATURE_FILE

    def model_path(self, key: str) -> Path:
        """The stored model's file, named by its kind (model.pb, model.mmap, model.enc)."""
        kind = self.get_signature(key).get("kind", kinds.DEFAULT_KIND)
        return self.entry(key) / kinds.file_name(kind)

    def file_path(self, key: str, name: str) -> Path:
        return self.entry(key) / FILES_DIR / name
