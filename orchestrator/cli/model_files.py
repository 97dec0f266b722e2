"""Commands for model files: `keygen`, `decrypt`, and `inspect` of every model file
`benchmark` takes (model_files.open_model opens both). Keys are never printed, except by
`keygen` without -o (its output)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError


def cmd_keygen(args: argparse.Namespace) -> int:
    from orchestrator.model.keys import encode_key, generate_key, key_id, write_key_file

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
    from orchestrator.model.encryption import decrypt
    from orchestrator.model.keys import DEFAULT_ENV, load_key
    from orchestrator.paths import atomic_write_bytes

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
    from orchestrator.formatting import format_size

    print(f"decrypted {args.file} ({kind}, {format_size(len(plaintext))}) to {args.output} "
          f"with the key from {key.source} (key id {key.key_id})")
    return 0


def _flops_line(flops: int | None, precision: str) -> str:
    """The FLOPs line, worded as `benchmark` words it."""
    from orchestrator.cli.benchmark import flops_text

    return "Estimated (computed from the graph, not measured):\n" + flops_text(flops, precision)


def graph_flops(graph_def: Any, inputs: Any) -> tuple[int | None, str]:
    """A graph's FLOPs for one sample (unknown dimensions as 1), as the benchmark stage
    counts them, and its precision."""
    from collections import Counter

    from orchestrator.measure.flops import count_flops
    from orchestrator.spec.devices import precision_of

    one_sample = {spec.name: (1, *[d or 1 for d in spec.shape[1:]]) for spec in inputs
                  if spec.shape}
    precision = precision_of(Counter(node.op for node in graph_def.node))
    try:
        return count_flops(graph_def, one_sample, []), precision
    except (ValueError, TypeError):  # shapes the profiler cannot resolve
        return None, precision


def _tflite_summary(artifact: Any) -> dict[str, Any]:
    from orchestrator.model.litert_model import describe

    facts = describe(artifact.payload)
    tensor = [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in facts.inputs]
    return {"inputs": tensor,
            "outputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
                        for t in facts.outputs],
            "params": facts.params, "op_counts": facts.op_counts,
            "op_versions": {k: list(v) for k, v in facts.op_versions.items()}}


def _tflite_text(summary: dict[str, Any]) -> str:
    def tensors(noun: str, items: list[dict[str, Any]]) -> str:
        shown = " ".join(f"name={t['name']}, type={t['dtype']}, shape=["
                         + ",".join("?" if d is None else str(d) for d in t["shape"]) + "]"
                         for t in items)
        return f"Found {len(items)} {noun}: {shown}"

    ops = sorted(summary["op_counts"].items(), key=lambda kv: (-kv[1], kv[0]))
    return "\n".join([tensors("inputs", summary["inputs"]),
                      tensors("outputs", summary["outputs"]),
                      f"Found {summary['params']:,} const parameters: the elements of the "
                      "flatbuffer's constant tensors (weights, biases, and small constants "
                      "such as shapes and axes)",
                      "Op types used: " + ", ".join(f"{n} {op}" for op, n in ops),
                      f"{sum(summary['op_counts'].values())} operators"])


def _describe(artifact: Any, keys: Any) -> tuple[dict[str, Any], str, int | None, str]:
    """(summary, its text, FLOPs, precision) of a tflite, graphdef or memmapped artifact."""
    from orchestrator.model.graph_info import format_summary, summarize

    if artifact.kind == "tflite":
        summary = _tflite_summary(artifact)
        tflite = artifact.metadata.get("tflite") or {}
        precision = "int8" if tflite.get("mode") == "int8" else "float32"
        return summary, _tflite_text(summary), tflite.get("flops"), precision
    from orchestrator.model.kinds import runnable

    graph = runnable(artifact, keys)  # a memmapped package as the graph rebuilt from it
    summary = summarize(graph.graph_def, graph.input_names, list(graph.outputs))
    flops, precision = graph_flops(graph.graph_def, graph.inputs)
    return summary, format_summary(summary), flops, precision


def cmd_inspect(args: argparse.Namespace) -> int:
    """summarize_graph for every model file `benchmark` takes: the same inputs, outputs,
    parameters and FLOPs as `benchmark` prints for it."""
    import os

    from orchestrator.model.encryption import MAGIC
    from orchestrator.model.files import open_model
    from orchestrator.model.keys import DEFAULT_ENV

    path = Path(args.model)
    try:
        with path.open("rb") as handle:
            head = handle.read(len(MAGIC))
    except OSError:
        head = b""
    keyless = args.key_env is None and args.key_file is None and not os.environ.get(
        DEFAULT_ENV)
    if head == MAGIC and keyless:  # the header says what it holds; the rest needs the key
        return _inspect_encrypted_header(path, args.json)
    if args.format == "auto" and path.is_file() and head != MAGIC:
        code = inspect_file(path, args.json)  # a memmapped package: its regions too
        if code is not None:
            return code
    opened = open_model(path, args.key_env, args.key_file, fmt=args.format,
                        format_flag="--format")
    inner = opened.inner if opened.inner is not None else opened.artifact
    if inner.kind == "memmapped" and inner.payload is not None:
        # the package as it ships (its ImmutableConst and regions), as for a plain .mmap:
        # not the graph rebuilt from it to run
        from orchestrator.model.memmap_format import read_package

        return _inspect_package(path, read_package(inner.payload), opened.how, args.json,
                                opened.artifact.kind)
    keys = (lambda _wanted: opened.key) if opened.key is not None else None
    summary, text, flops, precision = _describe(inner, keys)
    if args.json:
        print(json.dumps({"model": str(path), "how": opened.how, "kind": opened.artifact.kind,
                          "inner_kind": inner.kind, "summary": summary, "flops": flops,
                          "precision": precision}, indent=2, default=str))
        return 0
    print(f"Model: {path} ({opened.how})")
    print(text)
    print(_flops_line(flops, precision))
    return 0


def _inspect_encrypted_header(path: Path, as_json: bool) -> int:
    from orchestrator.model.encryption import read_header

    data = path.read_bytes()
    header = read_header(data)
    found: dict[str, Any] = {"kind": "encrypted", "version": header.version,
                             "payload_kind": header.payload_kind,
                             "key_id": header.key_id, "bytes": len(data)}
    if as_json:
        _show(found, as_json)
    else:
        from orchestrator.formatting import format_size

        _show({**{k: v for k, v in found.items() if k != "bytes"},
               "size": format_size(len(data))}, as_json)
    if not as_json:
        print("(the model inside: give its key with --key-env VAR or --key-file FILE)")
    return 0


def inspect_file(path: Path, as_json: bool) -> int | None:
    """Inspect a memmapped package (its regions, then the graph); None when `path` is no
    package."""
    from orchestrator.model.memmap_format import MemmappedFormatError, read_package

    data = path.read_bytes()
    try:
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
    return _inspect_package(path, package, "memmapped package", as_json, "memmapped")


def _inspect_package(path: Path, package: Any, how: str, as_json: bool, kind: str) -> int:
    """A memmapped package (read from the file, or from inside an encrypted one) as it
    ships: its regions, its ImmutableConst nodes and its graph as stored; parameters and
    FLOPs of the graph rebuilt from it (what runs)."""
    from orchestrator.formatting import format_size
    from orchestrator.model.graph_info import format_summary, summarize
    from orchestrator.model.memmap_format import rebuild

    converted = package.converted_nodes()
    summary = summarize(package.graph_def)
    rebuilt = rebuild(package)
    summary["params"] = summarize(rebuilt)["params"]
    from orchestrator.model.sources._common import FrozenSignature, build_artifact

    graph = build_artifact(path, "graphdef", FrozenSignature(rebuilt), None, None)
    flops, precision = graph_flops(rebuilt, graph.inputs)
    if as_json:
        print(json.dumps({"model": str(path), "how": how, "kind": kind,
                          "inner_kind": "memmapped",
                          "regions": [r.__dict__ for r in package.regions],
                          "converted_nodes": converted, "summary": summary, "flops": flops,
                          "precision": precision}, indent=2, default=str))
        return 0
    print(f"Model: {path} ({how}): {len(package.regions)} regions, "
          f"{len(converted)} ImmutableConst nodes")
    for region in package.regions:  # offsets are positions in the file: in bytes
        print(f"  region {region.name}  offset {region.offset:,}  length "
              f"{format_size(region.length)}")
    for item in converted:
        print(f"  {item['node']}: {item['dtype']}{item['shape']} -> {item['region']}")
    print(format_summary(summary))
    print(_flops_line(flops, precision))
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
    inspect = sub.add_parser(
        "inspect", help="summarize_graph for any model file benchmark takes",
        description="Inputs, outputs, parameters, op types and FLOPs of a SavedModel folder, "
        ".keras/.h5, .pb/.pbtxt, a checkpoint .meta, .tflite, .mmap or .enc (the figures "
        "`benchmark` prints for the same file). An encrypted model without its key shows "
        "its header.")
    inspect.add_argument("model", help="the model file or SavedModel folder")
    inspect.add_argument("--format", default="auto",
                         choices=["auto", "saved_model", "keras", "frozen_graph", "checkpoint"],
                         help="read it as this source format (default: by its content and "
                         "name)")
    inspect.add_argument("--key-env", default=None, metavar="VAR",
                         help="environment variable holding the key of an encrypted model "
                         "(default ORCHESTRATOR_MODEL_KEY)")
    inspect.add_argument("--key-file", type=Path, default=None,
                         help="file holding the key of an encrypted model")
    inspect.add_argument("--json", action="store_true")
    inspect.set_defaults(fn=cmd_inspect)
