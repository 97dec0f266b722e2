"""Model keys for the encrypt stage: 32 bytes (AES-256), given as base64 or hex in an
environment variable or a key file, and known everywhere else only by their key id.

The key itself never goes into params, logs, MLflow, report.json or cache keys: `ModelKey`
hides it from repr, and error messages never quote what was read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import DataError
from orchestrator.formatting import command_hint

DEFAULT_ENV = "ORCHESTRATOR_MODEL_KEY"
KEY_BYTES = 32
KEY_ID_BYTES = 8
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")  # base64 of a key always ends in "=": never this


class KeyMaterialError(DataError):
    """No key, or not a valid one (exit 2)."""


@dataclass(frozen=True)
class ModelKey:
    """A key, its id (first 8 bytes of its SHA-256, hex) and where it came from."""

    secret: bytes = field(repr=False)
    source: str

    @property
    def key_id(self) -> str:
        return key_id(self.secret)

    def __repr__(self) -> str:
        return f"ModelKey(key_id={self.key_id!r}, source={self.source!r})"


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).digest()[:KEY_ID_BYTES].hex()


def parse_key(text: str | bytes, where: str) -> bytes:
    """32 key bytes from 64 hex digits or base64 (standard or URL-safe). `where` names the
    source in errors; the value itself is never quoted."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise KeyMaterialError(f"the key in {where} is not base64 or hex text") from None
    text = text.strip()
    if not text:
        raise KeyMaterialError(f"{where} is empty: it must hold a {KEY_BYTES}-byte key as "
                               f"base64 or hex (make one with `{command_hint('keygen')}`)")
    if _HEX.fullmatch(text):
        raw = bytes.fromhex(text)
    else:
        try:
            raw = base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            raise KeyMaterialError(f"the key in {where} is neither base64 nor hex (expected "
                                   f"{KEY_BYTES} bytes as 44 base64 characters or 64 hex "
                                   "digits)") from None
    if len(raw) != KEY_BYTES:
        raise KeyMaterialError(f"the key in {where} is {len(raw)} bytes; AES-256 needs "
                               f"{KEY_BYTES} (44 base64 characters or 64 hex digits)")
    return raw


def load_key(env_var: str = DEFAULT_ENV, key_file: Path | None = None,
             environ: Mapping[str, str] | None = None) -> ModelKey:
    """The key from `key_file` when given, else from the environment variable `env_var`."""
    if key_file is not None:
        where = f"key file {key_file}"
        try:
            text = key_file.read_bytes()
        except FileNotFoundError:
            raise KeyMaterialError(f"{where} does not exist (make one with "
                                   f"`{command_hint('keygen', '-o', key_file)}`)") from None
        except OSError as exc:
            raise KeyMaterialError(f"cannot read {where}: {exc.strerror}") from None
        return ModelKey(parse_key(text, where), source=where)
    environ = os.environ if environ is None else environ
    where = f"environment variable {env_var}"
    value = environ.get(env_var)
    if value is None:
        raise KeyMaterialError(f"no model key: set {env_var} to a {KEY_BYTES}-byte key as base64 "
                               "or hex, or name a key_file (make a key with "
                               f"`{command_hint('keygen')}`)")
    return ModelKey(parse_key(value, where), source=where)


def generate_key() -> bytes:
    return os.urandom(KEY_BYTES)


def encode_key(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


def write_key_file(path: Path, key: bytes) -> None:
    """Write the key as base64 to a new file, mode 0600 from the start, atomically (a temp
    file in the same folder, then a link that fails rather than replace an existing key)."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w") as handle:
            handle.write(encode_key(key) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, path)  # FileExistsError when a key is already there: never overwrite
    finally:
        Path(tmp).unlink(missing_ok=True)
