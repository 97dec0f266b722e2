"""Fitting data to the model's first input: shapes (the batch dimension is free, a missing
trailing channel of 1 is added), dtypes (what can be cast, and how), and evaluation labels
as integer class indices. Every refusal is a DataError naming the file and recipe field.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from orchestrator.errors import DataError
from orchestrator.model.artifact import TensorSpec

# numpy kinds that never cast to a numeric input: strings, bytes, records, dates/times
_KIND_NAMES = {"c": "complex numbers: pass the real part, or real and imaginary parts as "
               "separate inputs", "U": "strings", "S": "bytes", "O": "Python objects",
               "V": "structured records",
               "M": "dates", "m": "time deltas"}


def check_fits(array_shape: tuple[int, ...], input_spec: TensorSpec | None, source_desc: str,
               *, file: str | None = None, field: str | None = None,
               batch: bool = False) -> tuple[int, ...]:
    """The shape `array_shape` takes when fed to `input_spec`, or DataError.

    The batch dimension (first) is free. A missing trailing channel dimension is added when
    the model's is 1. Other dimensions must equal the model's where it fixes them.
    `batch`: the shape is one batch read from the source, not the source's whole array (the
    message then says so, and never passes a batch's rows for the array's).
    """
    shape = tuple(int(d) for d in array_shape)
    if input_spec is None or input_spec.shape is None:
        return shape
    want = tuple(input_spec.shape)
    if len(shape) == len(want) - 1 and len(want) >= 2 and want[-1] == 1:
        shape = (*shape, 1)
    fits = len(shape) == len(want) and all(
        w is None or w < 0 or w == s for w, s in zip(want[1:], shape[1:], strict=True))
    if not fits:
        raise DataError(
            f"{source_desc}: input {input_spec.name!r} expects samples of shape "
            f"{fmt_shape(want[1:])} (model input {fmt_shape(want)}), found "
            f"{fmt_shape(shape[1:])} " + (f"(in a batch of {shape[0]} read from it)" if batch
                                          else f"(array {fmt_shape(tuple(array_shape))})"),
            file=file, field=field)
    return shape


def fit_to_input(batch: Any, input_spec: TensorSpec | None, source_desc: str, *,
                 file: str | None = None, field: str | None = None) -> np.ndarray:
    """`batch` checked against `input_spec` (see `check_fits`), reshaped and cast to its
    dtype. Floats cast to integer dtypes are rounded and clipped to the dtype's range.
    Data that cannot be cast (strings, bytes or objects for a numeric input) is a DataError
    naming `file` and `field`."""
    try:
        array = np.asarray(batch)
    except (ValueError, TypeError) as exc:  # e.g. ragged nested lists
        raise DataError(f"{source_desc}: not an array of numbers: {exc}", file=file,
                        field=field) from exc
    if input_spec is None:
        return array
    shape = check_fits(array.shape, input_spec, source_desc, file=file, field=field,
                       batch=True)
    array = array.reshape(shape)
    check_dtype(array.dtype, input_spec, source_desc, file=file, field=field)
    try:
        dtype = np.dtype(input_spec.dtype)
    except TypeError:  # e.g. quint8: let TensorFlow convert on feed
        return array
    if array.dtype == dtype:
        return array
    try:
        if np.issubdtype(dtype, np.integer) and np.issubdtype(array.dtype, np.floating):
            info = np.iinfo(dtype)
            array = np.clip(np.rint(array), info.min, info.max)
        return array.astype(dtype)
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. objects that are not numbers
        raise DataError(f"{source_desc}: cannot cast {array.dtype} data to the input "
                        f"{input_spec.name!r} dtype {input_spec.dtype}: {exc}", file=file,
                        field=field) from exc


def kind_name(dtype: np.dtype) -> str:
    """What values of `dtype` are, in words ("strings", "dates"...; "numbers" otherwise)."""
    return _KIND_NAMES.get(dtype.kind, "numbers")


def check_dtype(dtype: np.dtype, input_spec: TensorSpec | None, what: str, *,
                file: str | None, field: str | None, stored: bool = False) -> None:
    """DataError unless data of `dtype` can feed `input_spec` (any numeric input when the
    spec is unknown). Strings only feed a string input. Object arrays are cast one by one
    when they come from a function (`stored=False`); stored in an .npz (`stored=True`) they
    are refused outright: they cannot be read without pickle."""
    text_input = input_spec is not None and input_spec.dtype in ("string", "str", "bytes")
    if dtype.kind in "biuf" or (dtype.kind == "O" and not stored):
        return
    if text_input and dtype.kind in "US":
        return
    if input_spec is None:
        model = "model inputs must be numbers (int, float or bool)"
    else:
        model = f"the model input {input_spec.name!r} takes {input_spec.dtype}"
    raise DataError(f"{what} has dtype {dtype} ({kind_name(dtype)}), which cannot be cast: "
                    f"{model}", file=file, field=field)


def class_labels(labels: np.ndarray, desc: str, file: str, field: str) -> np.ndarray:
    """Integer class indices from integer (or integral float) labels, or one-hot rows."""
    if labels.ndim == 2 and labels.shape[1] > 1:
        labels = labels.argmax(axis=1)
    labels = labels.reshape(len(labels), -1)
    if labels.shape[1] != 1:
        raise DataError(f"{desc}: labels must be one class index per sample, found shape "
                        f"{fmt_shape(labels.shape)}", file=file, field=field)
    labels = labels[:, 0]
    if not np.issubdtype(labels.dtype, np.integer):
        if not np.issubdtype(labels.dtype, np.number) or not np.all(labels == np.rint(labels)):
            raise DataError(f"{desc}: labels must be integer class indices, found "
                            f"{labels.dtype} values", file=file, field=field)
    return labels.astype(np.int64)


def fmt_shape(shape: tuple) -> str:
    """(None, 28, 28, 1) -> "(?, 28, 28, 1)"."""
    return "(" + ", ".join("?" if d is None or d < 0 else str(d) for d in shape) + ")"
