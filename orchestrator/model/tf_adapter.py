"""The only module that touches private TensorFlow entry points.

Each is looked up lazily and wrapped, so that a future TF that drops one fails with a clear
message naming what is missing instead of an AttributeError deep in a stage.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

# Quiet TF's C++ start-up banner and keep oneDNN's reordered float math out of the 1e-5
# comparisons; both must be set before TensorFlow is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


# TensorFlow 2.21's __init__ imports this Keras module eagerly, in a try/except ImportError,
# for registrations that only Keras objects need; with Keras 3 installed that is about half
# of TensorFlow's import (10 s of CPU in all, 5.4 without it, on this project's 2-core
# machine).
_EAGER_KERAS_MODULE = "keras.src.optimizers"


def import_tensorflow() -> ModuleType:
    """TensorFlow, imported without the Keras it would load eagerly. Freezing, rewriting,
    quantizing and running graphs never use Keras; a model kind that does imports `keras`
    itself (model/sources/keras.py), which then loads those modules as usual. A process
    that imported TensorFlow already gets it as it is."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    blocked = _EAGER_KERAS_MODULE not in sys.modules
    if blocked:  # None in sys.modules: that import fails at once, and TF goes on without it
        sys.modules[_EAGER_KERAS_MODULE] = None  # type: ignore[assignment]
    try:
        return importlib.import_module("tensorflow")
    finally:
        if blocked and sys.modules.get(_EAGER_KERAS_MODULE, False) is None:
            del sys.modules[_EAGER_KERAS_MODULE]  # a later `import keras` loads it


class TFEntryPointMissing(RuntimeError):
    """This TensorFlow lacks a private entry point the orchestrator relies on."""


def _private(module: str, attribute: str) -> Any:
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        import tensorflow as tf

        raise TFEntryPointMissing(
            f"TensorFlow {tf.__version__} lacks {module}.{attribute}; "
            "orchestrator needs TensorFlow 2.21 (pip install 'tensorflow-cpu==2.21.*')"
        ) from exc


def transform_graph(graph_def: GraphDef, inputs: list[str], outputs: list[str],
                    transforms: str) -> GraphDef:
    """Run Graph Transform Tool transforms (e.g. 'fold_constants(ignore_errors=true)').

    Raises ValueError with TF's own message when a transform fails.
    """
    from tensorflow.core.framework import graph_pb2

    fn = _private("tensorflow.python.util._pywrap_transform_graph",
                  "TransformGraphWithStringInputs")
    out = fn(graph_def.SerializeToString(), ",".join(inputs), ",".join(outputs), transforms)
    result = graph_pb2.GraphDef()
    result.ParseFromString(out)
    return result


def freeze_requantization_ranges(graph_def: GraphDef, inputs: list[str], outputs: list[str],
                                 log: str, min_percentile: float, max_percentile: float
                                 ) -> GraphDef:
    """GTT's freeze_requantization_ranges with the range log given as text. The transform
    only reads a file by path, so the log goes through a private temporary file."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="orchestrator-ranges-") as tmp:
        path = Path(tmp) / "ranges.log"
        path.write_text(log)
        return transform_graph(
            graph_def, inputs, outputs,
            f'freeze_requantization_ranges(min_max_log_file="{path}", '
            f"min_percentile={float(min_percentile)!r}, "
            f"max_percentile={float(max_percentile)!r})")


def optimize_graph(config_proto: Any, metagraph: Any, graph_id: bytes = b"orchestrator") -> Any:
    """Grappler (tf_optimizer.OptimizeGraph), used for function inlining and lowering."""
    fn = _private("tensorflow.python.grappler.tf_optimizer", "OptimizeGraph")
    return fn(config_proto, metagraph, graph_id=graph_id)


def op_def(op_type: str) -> Any:
    """The OpDef registered for `op_type` in this TensorFlow (None for an unknown op)."""
    return _private("tensorflow.python.framework.op_def_registry", "get")(op_type)


def convert_to_constants() -> Any:
    """The convert_to_constants module (v1 and v2 freezing)."""
    try:
        return importlib.import_module("tensorflow.python.framework.convert_to_constants")
    except ImportError as exc:
        raise TFEntryPointMissing(
            "this TensorFlow lacks tensorflow.python.framework.convert_to_constants") from exc


def memmapped_directory_proto() -> Any:
    """A new MemmappedFileSystemDirectory proto (the directory MemmappedEnv reads)."""
    module = importlib.import_module("tensorflow.core.util.memmapped_file_system_pb2")
    return module.MemmappedFileSystemDirectory()


def kernel_for_node(node_def: Any) -> tuple[str, str | None] | None:
    """(op type, CPU kernel class name) that TF's selective-registration library finds for
    `node_def`, or None when no CPU kernel matches it. `node_def` is copied, never changed
    (the library sets the device of the node it is given)."""
    fn = _private("tensorflow.python.tools.selective_registration_header_lib",
                  "get_ops_from_nodedef")
    copy = type(node_def)()
    copy.CopyFrom(node_def)
    return fn(copy)


def registration_header(ops_and_kernels: list[tuple[str, str | None]]) -> str:
    """The text of `ops_to_register.h` (TF's SELECTIVE_REGISTRATION header) for these
    (op type, kernel class) pairs; a None kernel registers the op alone."""
    fn = _private("tensorflow.python.tools.selective_registration_header_lib",
                  "get_header_from_ops_and_kernels")
    return fn(ops_and_kernels, False)
