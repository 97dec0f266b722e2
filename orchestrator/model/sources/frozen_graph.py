"""Frozen GraphDef loader: binary `.pb` or text `.pbtxt`.

The graph must already hold its weights as Const nodes. It is imported once into a scratch
graph so that a corrupt or foreign file fails here, with its name, rather than in a stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.sources._common import (
    FrozenSignature,
    build_artifact,
    check_no_variables,
    error,
    require_file,
    short,
)

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

SUFFIXES = (".pb", ".pbtxt")


def _parse_text(data: bytes) -> GraphDef:
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    return text_format.Parse(data.decode("utf-8"), graph_pb2.GraphDef())


def _parse_binary(data: bytes) -> GraphDef:
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString(data)
    return graph_def


def read_graph_def(path: Path) -> GraphDef:
    """Parse a GraphDef file (text if it ends in .pbtxt, else binary, then text)."""
    require_file(path, "graph file")
    data = path.read_bytes()
    parsers = (_parse_text, _parse_binary) if path.suffix == ".pbtxt" else (
        _parse_binary, _parse_text)
    first_exc: Exception | None = None
    for parse in parsers:
        try:
            graph_def = parse(data)
            break
        except Exception as exc:  # DecodeError, ParseError, UnicodeDecodeError
            first_exc = first_exc or exc
    else:
        raise error(path, f"not a GraphDef (neither binary nor text protobuf): "
                          f"{short(first_exc) if first_exc else ''}") from first_exc
    if not graph_def.node:
        raise error(path, "not a GraphDef: it holds no nodes")
    return graph_def


def validate(path: Path, graph_def: GraphDef) -> None:
    """Import into a scratch graph: unknown ops, dangling inputs and garbage fail here."""
    import tensorflow as tf

    try:
        with tf.Graph().as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    except Exception as exc:  # ValueError, InvalidArgumentError, NotFoundError, ...
        raise error(path, f"not a valid TensorFlow graph: {short(exc)}") from exc


def load(path: Path, inputs: Sequence[TensorSpec] | None = None,
         outputs: Sequence[str] | None = None) -> ModelArtifact:
    """Load a frozen GraphDef file."""
    graph_def = read_graph_def(path)
    validate(path, graph_def)
    check_no_variables(path, graph_def)
    return build_artifact(path, "frozen_graph", FrozenSignature(graph_def), inputs, outputs)
