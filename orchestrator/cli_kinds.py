"""Commands for deployment files: `keygen`, `decrypt`, and `inspect` of a memmapped package
or an encrypted model. Keys are never printed, except by `keygen` without -o (its output)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError


def cmd_keygen(args: argparse.Namespace) -> int:
    from orchestrator.keys import encode_key, generate_key, key_id, write_key_file

    key = generate_key()
    if args.output is None:
        print(encode_key(key))
        print(f"key id {key_id(key)}", file=sys.stderr)
        return 0
    try:
        write_key_file(args.output, key)
    except FileExistsError:
        print(f"error: {args.output} exists; not overwriting a key", file=sys.stderr)
        return 2
    print(f"wrote a new key to {args.output} (mode 0600), key id {key_id(key)}")
    return 0


def cmd_decrypt(args: argparse.Namespace) -> int:
    from orchestrator.encryption import decrypt
    from orchestrator.keys import DEFAULT_ENV, load_key
    from orchestrator.store import atomic_write_bytes

    try:
        key = load_key(args.key_env or DEFAULT_ENV, args.key_file)
        try:
            data = Path(args.file).read_bytes()
        except OSError as exc:
            raise OrchestratorError(f"cannot read {args.file}: {exc.strerror}",
                                    file=args.file) from None
        kind, plaintext = decrypt(data, key.secret)
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    atomic_write_bytes(args.output, plaintext)
    print(f"decrypted {args.file} ({kind}, {len(plaintext)} bytes) to {args.output} with the "
          f"key from {key.source} (key id {key.key_id})")
    return 0


def inspect_file(path: Path, as_json: bool) -> int | None:
    """Inspect an encrypted model or a memmapped package; None when `path` is neither."""
    from orchestrator.encryption import MAGIC, read_header
    from orchestrator.memmap_format import MemmappedFormatError, read_package

    if not path.is_file():
        return None
    data = path.read_bytes()
    try:
        if data[:len(MAGIC)] == MAGIC:
            header = read_header(data)
            found: dict[str, Any] = {"kind": "encrypted", "version": header.version,
                                     "payload_kind": header.payload_kind,
                                     "key_id": header.key_id, "bytes": len(data)}
            _show(found, as_json)
            return 0
        if path.suffix != ".mmap":
            try:
                package = read_package(data)
            except MemmappedFormatError:
                return None  # not a package: let the model sources try
        else:
            package = read_package(data)
    except OrchestratorError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return exc.exit_code
    from orchestrator.graph_info import format_summary, summarize
    from orchestrator.memmap_format import rebuild

    converted = package.converted_nodes()
    summary = summarize(package.graph_def)
    summary["params"] = summarize(rebuild(package))["params"]
    if as_json:
        print(json.dumps({"kind": "memmapped", "regions": [r.__dict__ for r in package.regions],
                          "converted_nodes": converted, "summary": summary}, indent=2,
                         default=str))
        return 0
    print(f"memmapped package {path}: {len(package.regions)} regions, {len(converted)} "
          "ImmutableConst nodes")
    for region in package.regions:
        print(f"  region {region.name}  offset {region.offset}  length {region.length}")
    for item in converted:
        print(f"  {item['node']}: {item['dtype']}{item['shape']} -> {item['region']}")
    print(format_summary(summary))
    return 0


def _show(found: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(found, indent=2))
    else:
        print("\n".join(f"{k}: {v}" for k, v in found.items()))


def add_parsers(sub: Any) -> None:
    keygen = sub.add_parser("keygen", help="make a 32-byte model key for the encrypt stage")
    keygen.add_argument("-o", "--output", type=Path, default=None,
                        help="write it to this new file (mode 0600) instead of stdout")
    keygen.set_defaults(fn=cmd_keygen)
    decrypt = sub.add_parser("decrypt", help="decrypt an encrypted model to a file")
    decrypt.add_argument("file")
    decrypt.add_argument("-o", "--output", type=Path, required=True)
    decrypt.add_argument("--key-file", type=Path, default=None,
                         help="file holding the key (default: the environment variable)")
    decrypt.add_argument("--key-env", default=None,
                         help="environment variable holding the key (default "
                              "ORCHESTRATOR_MODEL_KEY)")
    decrypt.set_defaults(fn=cmd_decrypt)
