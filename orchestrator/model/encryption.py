"""The encrypted model format (docs/formats.md has it byte by byte): AES-256-GCM with the
28-byte header authenticated as associated data.

    offset  size  field
    0       4     magic "OENC"
    4       1     format version (1)
    5       1     payload kind: 1 = GraphDef protobuf, 2 = memmapped package, 3 = tflite
    6       2     reserved, zero
    8       8     key id: the first 8 bytes of SHA-256(key)
    16      12    nonce (random, never reused with a key)
    28      n     ciphertext (n = plaintext length)
    28 + n  16    GCM tag

Decryption happens in memory: nothing here writes plaintext anywhere.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import DataError
from orchestrator.model.keys import KEY_ID_BYTES, key_id, parse_key

if TYPE_CHECKING:
    from orchestrator.model.artifact import ModelArtifact

MAGIC = b"OENC"
VERSION = 1
NONCE_BYTES = 12
TAG_BYTES = 16
_HEADER = struct.Struct(f"<4sBBH{KEY_ID_BYTES}s{NONCE_BYTES}s")
HEADER_BYTES = _HEADER.size  # 28
# payload kind byte <-> artifact kind; a new kind that may be encrypted adds a line
PAYLOAD_KINDS: dict[int, str] = {1: "graphdef", 2: "memmapped", 3: "tflite"}
_PAYLOAD_CODES = {kind: code for code, kind in PAYLOAD_KINDS.items()}


class EncryptedFormatError(DataError):
    """Not our encrypted format, modified, truncated, or the wrong key (exit 2)."""


@dataclass(frozen=True)
class Header:
    version: int
    payload_kind: str
    key_id: str
    nonce: bytes


def encrypt(plaintext: bytes, payload_kind: str, key: bytes,
            nonce: bytes | None = None) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if payload_kind not in _PAYLOAD_CODES:
        raise ValueError(f"cannot encrypt a {payload_kind} artifact; encryptable kinds: "
                         f"{', '.join(_PAYLOAD_CODES)}")
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    header = _HEADER.pack(MAGIC, VERSION, _PAYLOAD_CODES[payload_kind], 0,
                          bytes.fromhex(key_id(key)), nonce)
    return header + AESGCM(key).encrypt(nonce, plaintext, header)


def read_header(data: bytes) -> Header:
    """The header, checked for what can be checked without the key."""
    if len(data) < HEADER_BYTES + TAG_BYTES:
        raise EncryptedFormatError(f"truncated encrypted model: {len(data)} bytes, less than "
                                   f"its {HEADER_BYTES}-byte header and {TAG_BYTES}-byte tag")
    magic, version, kind, reserved, kid, nonce = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EncryptedFormatError(f"not an encrypted model: it starts with {magic!r}, not "
                                   f"{MAGIC!r}")
    if version != VERSION:
        raise EncryptedFormatError(f"encrypted model format version {version}; this "
                                   f"orchestrator reads version {VERSION}")
    if kind not in PAYLOAD_KINDS or reserved != 0:
        raise EncryptedFormatError(f"corrupt encrypted model header: payload kind {kind}, "
                                   f"reserved {reserved}")
    return Header(version, PAYLOAD_KINDS[kind], kid.hex(), nonce)


def decrypt(data: bytes, key: bytes) -> tuple[str, bytes]:
    """(payload kind, plaintext). Any modified byte, a truncated file or the wrong key is
    an EncryptedFormatError, and no plaintext is returned."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    header = read_header(data)
    given = key_id(key)
    if header.key_id != given:
        raise EncryptedFormatError(f"wrong key: the model was encrypted with key id "
                                   f"{header.key_id}, the key given has key id {given}")
    try:
        plaintext = AESGCM(key).decrypt(header.nonce, data[HEADER_BYTES:],
                                        data[:HEADER_BYTES])
    except InvalidTag:
        raise EncryptedFormatError("the encrypted model fails authentication: it was "
                                   "modified or truncated") from None
    return header.payload_kind, plaintext


def load_encrypted(path: str | Path, key: bytes | str,
                   signature: str | Path | None = None) -> ModelArtifact | bytes:
    """Decrypt an encrypted model in memory into a runnable (graphdef) ModelArtifact; a
    LiteRT model comes back as its flatbuffer's bytes, which
    `ai_edge_litert.interpreter.Interpreter(model_content=...)` takes as they are.

    `key`: 32 raw bytes, or base64/hex text. `signature`: its signature.json (default: the
    one next to the file); without one, inputs and outputs are detected from the graph.
    """
    import json

    from orchestrator.model import kinds
    path = Path(path)
    raw = key if isinstance(key, bytes) and len(key) == 32 else parse_key(key, "the key given")
    payload_kind, plaintext = decrypt(path.read_bytes(), raw)
    if payload_kind == "tflite":
        return plaintext
    sig_path = Path(signature) if signature is not None else path.with_name("signature.json")
    if sig_path.is_file():
        sig: dict[str, Any] = json.loads(sig_path.read_text())
        sig["kind"] = payload_kind
        inner = kinds.load(plaintext, json.dumps(sig))
    else:
        inner = kinds.load(plaintext, json.dumps({"kind": payload_kind, "inputs": [],
                                                  "outputs": []}))
        runnable = kinds.runnable(inner)
        from orchestrator.model.graph_info import detect_inputs, detect_outputs

        return runnable.replace(inputs=tuple(detect_inputs(runnable.graph_def)),
                                outputs=tuple(detect_outputs(runnable.graph_def)))
    return kinds.runnable(inner)
