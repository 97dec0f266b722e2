"""Content-addressed artifact store under `.orchestrator/cache/`.

An entry is a folder named by its cache key, holding the node's model (transform nodes: the
file of its artifact kind, e.g. model.pb or model.enc, and signature.json naming the kind),
its result (metrics, info, warnings), and any files the stage produced. Entries are written
into a temporary folder and renamed into place, so a failed or killed run never leaves a
partial entry, and a present entry is always complete.

The same store on an fsspec URL (ORCHESTRATOR_HOME=s3://bucket/prefix) lives in
orchestrator/cache/object_store.py, which builds on this one; `project.open_store` opens
either by its location.
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
from pathlib import Path, PurePosixPath
from typing import Any

from orchestrator.errors import OutputError
from orchestrator.model import kinds
from orchestrator.model.artifact import ModelArtifact
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


def entry_payload(result: StoredResult, artifact: ModelArtifact | None,
                  files: dict[str, bytes]) -> dict[str, bytes]:
    """An entry's files by their name inside the entry: the model file of its kind and
    signature.json (transform nodes), files/<name> for each stage file, result.json.
    Sets `result.files`. A stage file name that would leave files/ is a ValueError."""
    payload: dict[str, bytes] = {}
    if artifact is not None:
        payload[kinds.file_name(artifact.kind)] = kinds.to_bytes(artifact)
        payload[SIGNATURE_FILE] = artifact.signature_json().encode("utf-8")
    for name, data in files.items():
        parts = PurePosixPath(name).parts
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
            raise ValueError(f"stage file name escapes its folder: {name!r}")
        payload[f"{FILES_DIR}/{name}"] = data
    result.files = sorted(files)
    payload[RESULT_FILE] = json.dumps(result.__dict__, indent=2, default=float).encode("utf-8")
    return payload


class Store:
    """The cache. Keys are hex digests computed by the plan."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.cache = self.root / "cache"
        self.shown = str(self.root)  # how messages name the store

    def check_writable(self) -> str | None:
        """Why the store cannot be written, or None."""
        from orchestrator.paths import writable_dir_problem

        return writable_dir_problem(self.root)

    def remove_all(self) -> None:
        """Delete the whole store (a run's scratch store at its end)."""
        shutil.rmtree(self.root, ignore_errors=True)

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
        if self.entry(key).exists() and not replace:
            return
        self.install(key, entry_payload(result, artifact, files), replace)

    def install(self, key: str, payload: dict[str, bytes], replace: bool = False) -> None:
        """Write an entry's files (relative name -> bytes, as `entry_payload` makes them)
        into a temporary folder and rename it into place. OSError as raised."""
        final = self.entry(key)
        if final.exists() and not replace:
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{key[:12]}.", suffix=".tmp"))
        try:
            for name, data in payload.items():
                target = tmp / name
                if tmp.resolve() not in target.resolve().parents:
                    raise ValueError(f"store file name escapes its entry: {name!r}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
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
