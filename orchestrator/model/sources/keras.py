"""Keras loader (.keras, .h5): load the model, trace it with its input signature, freeze.

keras.models.load_model, then a tf.function over model(x, training=False) with one
TensorSpec per model input, its concrete function, and convert_variables_to_constants_v2.
The signature's friendly names are the Keras input names and `model.output_names`.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.sources._common import (
    FrozenSignature,
    build_artifact,
    error,
    freeze_concrete_function,
    require_file,
    short,
)

SUFFIXES = (".keras", ".h5", ".hdf5")


def _op_name(name: str, index: int) -> str:
    """A Keras input name made valid as a TF node name."""
    clean = re.sub(r"[^A-Za-z0-9_.\-/]", "_", name or "")
    return clean if re.match(r"[A-Za-z0-9.]", clean) else f"input_{index}"


def _as_tuple(outputs: Any) -> tuple[Any, ...]:
    if isinstance(outputs, dict):
        return tuple(outputs[k] for k in sorted(outputs))
    if isinstance(outputs, list | tuple):
        return tuple(outputs)
    return (outputs,)


def trace(model: Any) -> tuple[Any, list[str], list[str]]:
    """(concrete function, input names, output names) for a loaded Keras model."""
    import tensorflow as tf

    try:
        keras_inputs = list(model.inputs)
    except (AttributeError, ValueError) as exc:
        raise ValueError("the model has no defined inputs (a subclassed model never "
                         "called?); export it as a SavedModel instead") from exc
    names = [_op_name(getattr(t, "name", ""), i) for i, t in enumerate(keras_inputs)]
    specs = [tf.TensorSpec(shape=t.shape, dtype=t.dtype, name=n)
             for t, n in zip(keras_inputs, names, strict=True)]

    def call(*xs: Any) -> tuple[Any, ...]:
        return _as_tuple(model(xs[0] if len(xs) == 1 else list(xs), training=False))

    concrete = tf.function(call, input_signature=specs).get_concrete_function()
    out_names = list(getattr(model, "output_names", None) or [])
    if len(out_names) != len(concrete.outputs) or len(set(out_names)) != len(out_names):
        out_names = [f"output_{i}" for i in range(len(concrete.outputs))]
    return concrete, names, out_names


def load(path: Path, inputs: Sequence[TensorSpec] | None = None,
         outputs: Sequence[str] | None = None) -> ModelArtifact:
    """Load and freeze a Keras model file."""
    require_file(path, "Keras model")
    if path.suffix == ".keras" and not zipfile.is_zipfile(path):
        raise error(path, "not a .keras file (a .keras model is a zip archive)")
    import keras

    try:
        model = keras.models.load_model(str(path), compile=False)
    except Exception as exc:  # keras raises ValueError, OSError, zipfile errors, ...
        raise error(path, f"not a loadable Keras model: {short(exc)}") from exc
    try:
        concrete, in_names, out_names = trace(model)
        frozen: FrozenSignature = freeze_concrete_function(concrete, in_names, out_names)
    except Exception as exc:
        raise error(path, f"cannot trace and freeze the Keras model: {short(exc)}") from exc
    return build_artifact(path, "keras", frozen, inputs, outputs)
