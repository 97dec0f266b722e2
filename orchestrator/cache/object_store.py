"""The artifact store on an object store: ORCHESTRATOR_HOME=s3://bucket/prefix (any fsspec
URL), shared by runs and Dask workers on several machines.

Layout in the bucket (a contract: tests and other tools read it):

    <prefix>/cache/<key[:2]>/<key>/<writer_id>/...    the entry's files, named as in a
                                                      local entry (model.pb, signature.json,
                                                      result.json, files/...)
    <prefix>/cache/<key[:2]>/<key>/manifest.json      written last: {"format": 1, "key",
                                                      "payload": writer_id, "files":
                                                      {relpath: {"sha256", "bytes"}}}

An entry exists iff its manifest does, and a manifest is only written once every object of
its payload is. Object stores have no rename, so this is what makes a put atomic: a writer
killed half-way leaves a payload folder no manifest points at, never a visible entry.

Readers verify: an entry is downloaded into a local mirror (a local `Store` in the user's
cache folder, named by the URL's hash, with its own atomic renames) only when every file's
size and sha256 match the manifest. A missing object, a mismatch or an unreadable manifest
is a cache miss with a warning naming the entry: the stage is recomputed and its put
replaces the bad entry. Once mirrored, an entry is answered from the mirror: entries are
content-addressed and immutable.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import Any

from orchestrator.cache.store import Store, StoredResult, entry_payload
from orchestrator.errors import OutputError
from orchestrator.model.artifact import ModelArtifact
from orchestrator.paths import describe_os_error
from orchestrator.redaction import redact

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 1
# An unreachable endpoint fails within seconds, not after botocore's and s3fs's retries
# with back-off (minutes): connect in 5 s, one botocore attempt, s3fs retries twice.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
S3FS_RETRIES = 2
# How often a reader follows a manifest that changed under it (a racing writer replaced
# the entry and removed the payload the first manifest named) before calling it a miss.
MANIFEST_RETRIES = 3


def mirror_folder(url: str) -> Path:
    """The local mirror of the store at `url`: $XDG_CACHE_HOME (else ~/.cache)
    /orchestrator/stores/<hash of the URL>: every run of this user on this machine shares
    it, whatever the project."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    digest = hashlib.sha256(redact(url).encode("utf-8")).hexdigest()[:16]
    return Path(cache) / "orchestrator" / "stores" / digest


def writer_id() -> str:
    """Unique per put: host, process and 8 random hex digits."""
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())
    return f"{host or 'host'}-{os.getpid()}-{secrets.token_hex(4)}"


def _filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system for `url` and the path of the store's root inside it. s3:
    the endpoint from AWS_ENDPOINT_URL, credentials from the standard AWS variables (or
    key:secret@ in the URL, which s3fs itself would take for the bucket's name), bounded
    timeouts and retries. Other protocols: as fsspec reads their URLs."""
    from urllib.parse import unquote, urlsplit

    import fsspec.core

    protocol = url.split("://", 1)[0].lower()
    options: dict[str, Any] = {}
    if protocol in ("s3", "s3a"):
        options = {"skip_instance_cache": True, "config_kwargs": {
            "connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S,
            "retries": {"max_attempts": 1, "mode": "standard"}}}
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options["client_kwargs"] = {"endpoint_url": endpoint}
        parts = urlsplit(url)
        if "@" in parts.netloc:
            credentials, host = parts.netloc.rsplit("@", 1)
            key, _, secret = credentials.partition(":")
            options.update(key=unquote(key), secret=unquote(secret) or None)
            url = f"{parts.scheme}://{host}{parts.path}"
    fs, path = fsspec.core.url_to_fs(url, **options)
    if hasattr(fs, "retries"):
        fs.retries = S3FS_RETRIES
    return fs, path.rstrip("/")


def _io_errors() -> tuple[type[BaseException], ...]:
    """What a file system raises when the store cannot be reached or refuses a request
    (s3fs maps most S3 errors to OSError; connection failures stay botocore's)."""
    errors: list[type[BaseException]] = [OSError, TimeoutError]
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        errors += [BotoCoreError, ClientError]
    except ImportError:  # another fsspec backend
        pass
    return tuple(errors)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return describe_os_error(exc)
    text = " ".join(str(exc).split()) or type(exc).__name__  # one line
    return redact(text if len(text) <= 300 else text[:300] + "...")


class ObjectStore(Store):
    """The store at an fsspec URL; the same interface as `Store`, whose methods answer
    from the verified local mirror (`self.root`), fetching an entry on first use."""

    def __init__(self, url: str, mirror: Path | None = None) -> None:
        super().__init__(mirror or mirror_folder(url))
        self.url = url.rstrip("/")
        self.shown = redact(self.url)  # for messages: never a credential
        self.fs, self.base = _filesystem(self.url)
        self.errors = _io_errors()
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"ObjectStore({self.shown!r})"

    def remote_entry(self, key: str) -> str:
        return f"{self.base}/cache/{key[:2]}/{key}"

    # ------------------------------------------------------------ reading

    def has(self, key: str) -> bool:
        return super().has(key) or self._fetch(key)

    def has_model(self, key: str) -> bool:
        return self.has(key) and super().has_model(key)

    def get_result(self, key: str) -> StoredResult:
        self._require(key)
        return super().get_result(key)

    def get_signature(self, key: str) -> dict[str, Any]:
        self._require(key)
        return super().get_signature(key)

    def signature_path(self, key: str) -> Path:
        self._require(key)
        return super().signature_path(key)

    def model_path(self, key: str) -> Path:
        self._require(key)
        return super().model_path(key)

    def file_path(self, key: str, name: str) -> Path:
        self._require(key)
        return super().file_path(key, name)

    def _require(self, key: str) -> None:
        if not self.has(key):
            raise OutputError(f"the store {self.shown} (ORCHESTRATOR_HOME) has no valid entry "
                              f"{key}", file=self.shown)

    def _fetch(self, key: str) -> bool:
        """Download and verify the entry into the mirror; whether it is there now. A bad
        entry is a miss (warned once per key and process); a store that cannot be read is
        an OutputError."""
        try:
            return self._fetch_verified(key)
        except self.errors as exc:
            raise OutputError(f"cannot read the store {self.shown} (ORCHESTRATOR_HOME): "
                              f"{_reason(exc)}", file=self.shown) from exc

    def _fetch_verified(self, key: str) -> bool:
        entry = self.remote_entry(key)
        problem = "its manifest changed while it was read"
        for _ in range(MANIFEST_RETRIES):
            manifest, problem = self._read_manifest(key)
            if manifest is None:
                break
            writer, files = manifest["payload"], manifest["files"]
            paths = {f"{entry}/{writer}/{name}": name for name in files}
            found = self.fs.cat(list(paths), on_error="return") if paths else {}
            payload: dict[str, bytes] = {}
            missing = []
            for path, name in paths.items():
                data = found.get(path)
                if isinstance(data, FileNotFoundError) or data is None:
                    missing.append(name)
                elif isinstance(data, BaseException):
                    raise data
                else:
                    payload[name] = data
            if missing:
                again, _ = self._read_manifest(key)
                if again is not None and again["payload"] != writer:
                    continue  # replaced by a racing writer: read the new one
                problem = f"payload {writer}: {missing[0]} is missing"
                break
            problem = _mismatch(files, payload)
            if problem is None:
                self.install(key, payload)
                return True
            problem = f"payload {writer}: {problem}"
            break
        if problem is not None and problem != "absent":
            self._warn_bad(key, problem)
        return False

    def _read_manifest(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """(the entry's manifest, None), or (None, why it is no entry: 'absent' or what is
        wrong with it)."""
        try:
            raw = self.fs.cat_file(f"{self.remote_entry(key)}/{MANIFEST}")
        except FileNotFoundError:
            return None, "absent"
        try:
            manifest = json.loads(raw)
            files = manifest["files"]
            valid = (manifest.get("format") == FORMAT and manifest.get("key") == key
                     and isinstance(manifest.get("payload"), str) and manifest["payload"]
                     and "/" not in manifest["payload"] and isinstance(files, dict)
                     and all(isinstance(f.get("sha256"), str) and isinstance(f.get("bytes"), int)
                             for f in files.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            valid = False
        if not valid:
            return None, "its manifest.json is not a valid manifest"
        return manifest, None

    def _warn_bad(self, key: str, problem: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning("store entry %s in %s is corrupt, %s: a cache miss, recomputed and "
                    "replaced", key, self.shown, problem)

    # ------------------------------------------------------------ writing

    def put(self, key: str, result: StoredResult, artifact: ModelArtifact | None,
            files: dict[str, bytes], replace: bool = False) -> None:
        """Upload the entry (payload, then its manifest), then keep it in the mirror. A
        valid entry already in the store is kept unless `replace` (first writer wins).
        A store that refuses the write is an OutputError naming it; no entry is left
        visible without its whole payload."""
        payload = entry_payload(result, artifact, files)
        try:
            if not replace and self._fetch_verified(key):
                return  # another run or worker stored it first; it is now mirrored
            self._upload(key, payload)
        except self.errors as exc:
            raise OutputError(f"cannot write to the store {self.shown} (ORCHESTRATOR_HOME): "
                              f"{_reason(exc)}", file=self.shown) from exc
        try:
            self.install(key, payload, replace=replace)
        except OSError as exc:
            raise OutputError(f"cannot write the local copy of the store {self.shown} at "
                              f"{self.root}: {describe_os_error(exc)}",
                              file=str(self.root)) from exc

    def _upload(self, key: str, payload: dict[str, bytes]) -> None:
        """Payload objects under a folder of this writer's own, then the manifest.

        No conditional put (if-none-match) is needed: each manifest names only its own
        writer's payload, which is complete before the manifest is written, and a single
        object's PUT is atomic, so a reader sees one whole, self-consistent entry or none.
        Two writers racing on a key both store a correct result of the same
        content-addressed computation; whichever manifest lands last is the entry."""
        entry, writer = self.remote_entry(key), writer_id()
        previous, _ = self._read_manifest(key)
        try:
            self.fs.pipe({f"{entry}/{writer}/{name}": data for name, data in payload.items()})
        except BaseException:
            self._remove(f"{entry}/{writer}")  # an orphan at worst: nothing points at it
            raise
        manifest = {"format": FORMAT, "key": key, "payload": writer, "files": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            for name, data in sorted(payload.items())}}
        self.fs.pipe_file(f"{entry}/{MANIFEST}", json.dumps(manifest, indent=2).encode())
        self._warned.discard(key)
        if previous is not None and previous["payload"] != writer:
            # superseded (a bad entry, or --no-cache): a reader still on it re-reads the
            # manifest when an object is gone
            self._remove(f"{entry}/{previous['payload']}")

    def _remove(self, path: str) -> None:
        try:
            self.fs.rm(path, recursive=True)
        except (*self.errors, FileNotFoundError) as exc:
            log.debug("could not remove %s: %s", path, exc)

    def check_writable(self) -> str | None:
        """Why the store cannot take a write (bucket missing, access denied, endpoint
        down), or None: a small object written and removed under <prefix>/.probe/."""
        probe = f"{self.base}/.probe/{writer_id()}"
        try:
            self.fs.pipe_file(probe, b"")
        except self.errors as exc:
            return _reason(exc)
        self._remove(probe)
        return None

    def remove_all(self) -> None:
        """Delete the store's objects and its mirror (a run's scratch store at its end)."""
        import shutil

        self._remove(self.base)
        shutil.rmtree(self.root, ignore_errors=True)


def _mismatch(files: dict[str, Any], payload: dict[str, bytes]) -> str | None:
    for name, expected in files.items():
        data = payload[name]
        if len(data) != expected["bytes"]:
            return f"{name} has {len(data)} bytes, its manifest says {expected['bytes']}"
        if hashlib.sha256(data).hexdigest() != expected["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None
