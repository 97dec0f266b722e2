"""Representative and evaluation data: `.npz` arrays, image folders, or `module:function`.

A `DataSource` (recipe_models.py) names one of three kinds of source:

- an `.npz` file: arrays by name. Uncompressed members (`np.savez`) are memory-mapped, so
  streaming a big calibration set reads only the batches used; compressed ones
  (`np.savez_compressed`) load just the named array.
- a folder of images, read recursively in sorted order with Pillow, one file at a time:
  converted to `channels` (1 = grey, 3 = RGB), resized to `resize` = [height, width]
  (bilinear), then `(x - mean) / std`, as label_image's --input_mean/--input_std. Files
  without an image extension are skipped with a warning and counted in `LoadStats`; a file
  with an image extension that Pillow cannot decode is a DataError. For evaluation,
  `labels` may name a text file of class names, one per line (label_image's labels.txt):
  an image's label is the line index of its parent folder's name.
- `module:function`: the module is imported with the recipe's folder first on sys.path,
  and the function, called without arguments, returns an iterable of numpy batches or of
  `(inputs, labels)` tuples. Only the module's own file counts for the cache fingerprint.

Fitting to the model (first input only; other inputs of multi-input models are not fed):

- the batch dimension is free; every other dimension must match where the model fixes it;
- a missing trailing channel dimension is added when the model's is 1, so (N, 28, 28)
  feeds a (None, 28, 28, 1) input; no other reshaping is ever guessed;
- values are cast to the input's dtype (floats into integer dtypes are rounded and clipped);
  strings, bytes, records and objects that are not numbers are a DataError naming the file
  and the recipe field (an .npz's are refused at validation already, from its headers);
- a model with a fixed batch dimension (e.g. 1) gets batches of exactly that size;
- image folders default `channels` and `resize` to the model input's shape.

Every user-caused failure is a DataError naming the file and the recipe field.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import re
import struct
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from orchestrator import paths
from orchestrator.callables import CallableProblem, import_callable, on_sys_path
from orchestrator.errors import DataError
from orchestrator.model import TensorSpec
from orchestrator.recipe_models import DataSource
from orchestrator.stages.base import EvaluationData

__all__ = ["LoadStats", "SourceKind", "IMAGE_EXTENSIONS", "source_kind", "source_path",
           "representative_batches", "load_evaluation", "fingerprint", "check_source",
           "check_fits", "fit_to_input"]

log = logging.getLogger("orchestrator.data")

SourceKind = Literal["npz", "images", "module"]
Role = Literal["representative", "evaluation"]

# Raster formats only: Pillow also "opens" .h5, .eps, .mpg..., which are not images here.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".dib",
                              ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm",
                              ".pnm", ".tga"})
_MODULE_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

Chunk = tuple[np.ndarray, np.ndarray | None]  # (inputs, labels or None)


@dataclass
class LoadStats:
    """Filled in while data is read, for the report: samples yielded, files skipped."""

    samples: int = 0
    skipped: list[str] = field(default_factory=list)

    @property
    def skipped_count(self) -> int:
        return len(self.skipped)


# --------------------------------------------------------------------------- public API


def source_kind(source: DataSource, base_dir: Path, field_path: str = "data") -> SourceKind:
    """Which kind of source this is. DataError when the path is missing or unsupported."""
    path = _resolve(source.source, base_dir)
    problem = paths.path_problem(path, "file_or_dir")
    if _MODULE_FUNCTION.match(source.source) and problem == "not found":
        return "module"
    if problem:
        message = ("data source not found" if problem == "not found"
                   else f"cannot read the data source: {problem}")
        raise DataError(f"{message}: {path}", file=str(path), field=f"{field_path}.source")
    if path.is_dir():
        return "images"
    if path.suffix.lower() == ".npz":
        return "npz"
    raise DataError(f"unsupported data source {path.name!r}: expected an .npz file, a "
                    "folder of images, or module:function", file=str(path),
                    field=f"{field_path}.source")


def source_path(source: DataSource, base_dir: Path) -> Path:
    """The source's path, resolved against the recipe's folder (for messages and reports)."""
    return _resolve(source.source, base_dir)


def representative_batches(source: DataSource, base_dir: Path,
                           input_spec: TensorSpec | None = None, samples: int | None = None,
                           batch_size: int | None = None, *, stats: LoadStats | None = None,
                           field_path: str = "data.representative") -> Iterator[np.ndarray]:
    """Stream batches of representative inputs, fitted to `input_spec`.

    `samples` and `batch_size` override the source's own (a stage's `samples` wins); a
    model input with a fixed batch dimension overrides `batch_size`. The source is opened
    and checked now, so that a missing file or array fails at call time; reading is lazy.
    """
    limit = samples if samples is not None else source.samples
    size, fixed = _batch_size(input_spec, batch_size or source.batch_size)
    chunks, input_field = _open(source, base_dir, "representative", input_spec, size, stats,
                                field_path)
    desc = _describe(source)
    file = str(source_path(source, base_dir))

    def generate() -> Iterator[np.ndarray]:
        for inputs, _ in _rebatch(chunks, size, limit, drop_partial=fixed):
            batch = fit_to_input(inputs, input_spec, desc, file=file, field=input_field)
            if stats is not None:
                stats.samples += len(batch)
            yield batch

    return generate()


def load_evaluation(source: DataSource, base_dir: Path, input_spec: TensorSpec | None = None,
                    *, stats: LoadStats | None = None,
                    field_path: str = "data.evaluation") -> EvaluationData:
    """Evaluation inputs (fitted to `input_spec`) and integer labels, held in memory.

    At most `source.samples` samples. Labels are None when the source has none; one-hot
    labels become class indices.
    """
    chunks, input_field = _open(source, base_dir, "evaluation", input_spec, source.batch_size,
                                stats, field_path)
    desc = _describe(source)
    file = str(source_path(source, base_dir))
    inputs, labels = [], []
    for x, y in _rebatch(chunks, source.batch_size, source.samples, drop_partial=False):
        inputs.append(fit_to_input(x, input_spec, desc, file=file, field=input_field))
        labels.append(y)
    if not inputs:
        raise DataError(f"{desc} has no samples", file=file, field=f"{field_path}.source")
    have = [y is not None for y in labels]
    if any(have) and not all(have):
        raise DataError(f"{desc} gives labels for some batches only", file=file,
                        field=f"{field_path}.labels")
    x_all = np.concatenate(inputs)
    y_all = None
    if all(have):
        y_all = _class_labels(np.concatenate(labels), desc, file, f"{field_path}.labels")
        if len(y_all) != len(x_all):
            raise DataError(f"{desc}: {len(x_all)} inputs but {len(y_all)} labels", file=file,
                            field=f"{field_path}.labels")
    if stats is not None:
        stats.samples += len(x_all)
    return EvaluationData(inputs=x_all, labels=y_all)


def fingerprint(source: DataSource, base_dir: Path) -> str:
    """A content hash for cache keys: the source's settings plus its content.

    npz: the file's bytes. Image folder: sorted (relative name, size, mtime_ns) of every
    file, plus the labels file's bytes. module:function: the module file's source.
    """
    digest = hashlib.sha256(source.model_dump_json().encode())
    kind = source_kind(source, base_dir)
    path = source_path(source, base_dir)
    if kind == "npz":
        _hash_file(digest, path)
    elif kind == "images":
        for file in _walk(path):
            stat = file.stat()
            digest.update(f"{file.relative_to(path).as_posix()}\0{stat.st_size}\0"
                          f"{stat.st_mtime_ns}\n".encode())
        if source.labels:
            _hash_file(digest, _resolve(source.labels, base_dir))
    else:
        module_name = source.source.rpartition(":")[0]
        with on_sys_path(base_dir):
            try:
                spec = importlib.util.find_spec(module_name)
            except (ImportError, ValueError) as exc:
                raise DataError(f"cannot import module {module_name!r}: {exc}") from exc
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            digest.update(module_name.encode())  # built-in or namespace: the name is all
        else:
            _hash_file(digest, Path(spec.origin))
    return digest.hexdigest()


def check_source(source: DataSource, base_dir: Path, role: Role, field_path: str,
                 input_spec: TensorSpec | None = None) -> None:
    """Recipe validation, without reading the data: the path exists, the npz has the named
    arrays (the message lists those it has), the folder has images, the module imports and
    has the function. With `input_spec`, npz array shapes are checked against it too.
    """
    kind = source_kind(source, base_dir, field_path)
    path = source_path(source, base_dir)
    if kind == "npz":
        headers = _npz_headers(path, field_path)
        name, name_field = _npz_input_name(source, role, headers, path, field_path)
        shape, dtype = headers[name]
        _check_dtype(dtype, input_spec, f"{path.name}: array {name!r}", file=str(path),
                     field=name_field, stored=True)
        if not shape:
            raise DataError(f"{path.name}: array {name!r} is a single value (a 0-d array); "
                            "expected one row per sample", file=str(path), field=name_field)
        if input_spec is not None:
            check_fits(shape, input_spec, f"{path.name}[{name}]", file=str(path),
                       field=name_field)
        if role == "evaluation" and source.labels:
            _npz_require(source.labels, headers, path, f"{field_path}.labels")
            label_dtype = headers[source.labels][1]
            if label_dtype.kind not in "biuf":
                raise DataError(f"{path.name}: labels array {source.labels!r} has dtype "
                                f"{label_dtype} ({_kind_name(label_dtype)}); labels must be "
                                "integer class indices (or one-hot numbers)", file=str(path),
                                field=f"{field_path}.labels")
            if not headers[source.labels][0]:
                raise DataError(f"{path.name}: labels array {source.labels!r} is a single "
                                "value (a 0-d array); expected one label per sample",
                                file=str(path), field=f"{field_path}.labels")
            n_labels = headers[source.labels][0][0]
            if n_labels != shape[0]:
                raise DataError(f"{path.name}: {shape[0]} inputs in {name!r} but {n_labels} "
                                f"labels in {source.labels!r}", file=str(path),
                                field=f"{field_path}.labels")
    elif kind == "images":
        if not any(f.suffix.lower() in IMAGE_EXTENSIONS for f in _walk(path)):
            raise DataError(f"no images in {path} (looked for "
                            f"{', '.join(sorted(IMAGE_EXTENSIONS))})", file=str(path),
                            field=f"{field_path}.source")
        if role == "evaluation" and source.labels:
            _read_label_names(_resolve(source.labels, base_dir), f"{field_path}.labels")
    else:
        _import_function(source.source, base_dir, field_path)


def check_fits(array_shape: tuple[int, ...], input_spec: TensorSpec | None, source_desc: str,
               *, file: str | None = None, field: str | None = None) -> tuple[int, ...]:
    """The shape `array_shape` takes when fed to `input_spec`, or DataError.

    The batch dimension (first) is free. A missing trailing channel dimension is added when
    the model's is 1. Other dimensions must equal the model's where it fixes them.
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
            f"{_fmt(want[1:])} (model input {_fmt(want)}), found {_fmt(shape[1:])} "
            f"(array {_fmt(tuple(array_shape))})", file=file, field=field)
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
    shape = check_fits(array.shape, input_spec, source_desc, file=file, field=field)
    array = array.reshape(shape)
    _check_dtype(array.dtype, input_spec, source_desc, file=file, field=field)
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


# numpy kinds that never cast to a numeric input: strings, bytes, records, dates/times
_KIND_NAMES = {"c": "complex numbers: pass the real part, or real and imaginary parts as "
               "separate inputs", "U": "strings", "S": "bytes", "O": "Python objects",
               "V": "structured records",
               "M": "dates", "m": "time deltas"}


def _kind_name(dtype: np.dtype) -> str:
    return _KIND_NAMES.get(dtype.kind, "numbers")


def _check_dtype(dtype: np.dtype, input_spec: TensorSpec | None, what: str, *,
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
    raise DataError(f"{what} has dtype {dtype} ({_kind_name(dtype)}), which cannot be cast: "
                    f"{model}", file=file, field=field)


# --------------------------------------------------------------------------- opening


def _open(source: DataSource, base_dir: Path, role: Role, input_spec: TensorSpec | None,
          chunk_size: int, stats: LoadStats | None,
          field_path: str) -> tuple[Iterator[Chunk], str]:
    """Open the source now (errors surface here): its lazy chunk stream, and the recipe
    field that names its inputs (for shape errors)."""
    kind = source_kind(source, base_dir, field_path)
    path = source_path(source, base_dir)
    labels_field = f"{field_path}.labels"
    if kind == "npz":
        headers = _npz_headers(path, field_path)
        name, input_field = _npz_input_name(source, role, headers, path, field_path)
        _check_dtype(headers[name][1], input_spec, f"{path.name}: array {name!r}",
                     file=str(path), field=input_field, stored=True)
        inputs = _npz_array(path, name, field_path)
        labels = None
        if role == "evaluation" and source.labels:
            _npz_require(source.labels, headers, path, labels_field)
            labels = _npz_array(path, source.labels, field_path)
        names = (f"{path.name}: array {name!r}", f"{path.name}: labels array {source.labels!r}")
        for array, what, where in ((inputs, names[0], input_field),
                                   (labels, names[1], labels_field)):
            if array is not None and array.ndim == 0:
                raise DataError(f"{what} is a single value (a 0-d array); expected one row "
                                "per sample", file=str(path), field=where)
        return _checked(_slices(inputs, labels, chunk_size), names, str(path),
                        (input_field, labels_field)), input_field
    if kind == "images":
        labeller = None
        if role == "evaluation" and source.labels:
            names = _read_label_names(_resolve(source.labels, base_dir),
                                      f"{field_path}.labels")
            labeller = _folder_labeller(names, source.labels, f"{field_path}.labels")
        return (_images(path, source, input_spec, stats, field_path, labeller),
                f"{field_path}.source")
    fn = _import_function(source.source, base_dir, field_path)
    names = (f"{source.source} inputs", f"{source.source} labels")
    return (_checked(_module_chunks(fn, source.source, base_dir, role, field_path), names,
                     None, (f"{field_path}.source", f"{field_path}.source")),
            f"{field_path}.source")


def _checked(chunks: Iterable[Chunk], names: tuple[str, str], file: str | None,
             fields: tuple[str, str]) -> Iterator[Chunk]:
    """`chunks`, refusing NaN or infinite inputs or labels: a NaN sample would be scored
    (or calibrated on) silently. The message names the array and the first bad index."""
    offset = 0
    for x, y in chunks:
        for array, name, field_name in ((x, names[0], fields[0]), (y, names[1], fields[1])):
            if array is None or np.asarray(array).dtype.kind not in "fc":
                continue
            bad = ~np.isfinite(np.asarray(array))
            if bad.any():
                index = tuple(int(i) for i in np.argwhere(bad)[0])
                where = (offset + index[0], *index[1:])
                raise DataError(f"{name} holds a non-finite value ({array[index]}) at index "
                                f"{list(where)} (sample {where[0]}); inputs and labels must "
                                "be finite numbers", file=file, field=field_name)
        offset += len(x)
        yield x, y


def _slices(inputs: np.ndarray, labels: np.ndarray | None, size: int) -> Iterator[Chunk]:
    # Slicing a memmap reads only that slice; np.array copies it out of the page cache.
    for start in range(0, len(inputs), size):
        yield (np.array(inputs[start:start + size]),
               None if labels is None else np.array(labels[start:start + size]))


def _rebatch(chunks: Iterable[Chunk], size: int, limit: int | None,
             drop_partial: bool) -> Iterator[Chunk]:
    """Re-cut chunks of any size into batches of `size`, stopping after `limit` samples."""
    pending_x: list[np.ndarray] = []
    pending_y: list[np.ndarray | None] = []
    count = taken = 0
    for x, y in chunks:
        if limit is not None and taken + len(x) > limit:
            x = x[:limit - taken]
            y = None if y is None else y[:limit - taken]
        taken += len(x)
        pending_x.append(x)
        pending_y.append(y)
        count += len(x)
        while count >= size:
            bx, by, pending_x, pending_y = _split(pending_x, pending_y, size)
            count -= size
            yield bx, by
        if limit is not None and taken >= limit:
            break  # before pulling another chunk: a folder reads no image it won't use
    if count and not drop_partial:
        yield _split(pending_x, pending_y, count)[:2]
    elif count:
        log.warning("dropped the last %d sample(s): the model's batch size is fixed at %d",
                    count, size)


def _split(xs: list[np.ndarray], ys: list[np.ndarray | None],
           size: int) -> tuple[np.ndarray, np.ndarray | None, list, list]:
    """The first `size` samples of the pending pieces, and what is left."""
    x = np.concatenate(xs) if len(xs) > 1 else xs[0]
    y = None if any(v is None for v in ys) else (np.concatenate(ys) if len(ys) > 1 else ys[0])
    rest_x = [x[size:]] if len(x) > size else []
    rest_y = [None if y is None else y[size:]] if len(x) > size else []
    return x[:size], None if y is None else y[:size], rest_x, rest_y


def _batch_size(spec: TensorSpec | None, requested: int) -> tuple[int, bool]:
    """(batch size, whether the model fixes it)."""
    if spec is not None and spec.shape and spec.shape[0] is not None and spec.shape[0] > 0:
        return int(spec.shape[0]), True
    return requested, False


# --------------------------------------------------------------------------- npz


def _npz_headers(path: Path, field_path: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (shape, dtype) of each array, reading only the .npy headers."""
    headers = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as member:
                    shape, _, dtype = _read_npy_header(member)
                headers[info.filename[:-4]] = (shape, dtype)
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DataError(f"{path} is not a readable .npz file (truncated or corrupt?): {exc}",
                        file=str(path), field=f"{field_path}.source") from exc
    return headers


def _read_npy_header(stream: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(stream)
    return np.lib.format.read_array_header_2_0(stream)


def _npz_input_name(source: DataSource, role: Role, headers: dict, path: Path,
                    field_path: str) -> tuple[str, str]:
    """The inputs array's name and its recipe field. Representative data reads `array`,
    evaluation reads `inputs`; either falls back to the other, then to a lone array."""
    order = ("array", "inputs") if role == "representative" else ("inputs", "array")
    for key in order:
        name = getattr(source, key)
        if name:
            _npz_require(name, headers, path, f"{field_path}.{key}")
            return name, f"{field_path}.{key}"
    candidates = [n for n in headers if n != source.labels]
    if len(candidates) == 1:
        return candidates[0], f"{field_path}.source"
    raise DataError(f"{path.name} holds several arrays ({', '.join(sorted(headers))}): name "
                    f"one with `{order[0]}:`", file=str(path), field=f"{field_path}.{order[0]}")


def _npz_require(name: str, headers: dict, path: Path, field: str) -> None:
    if name not in headers:
        raise DataError(f"{path.name} has no array {name!r}; it has: "
                        f"{', '.join(sorted(headers)) or '(none)'}", file=str(path), field=field)


def _npz_array(path: Path, name: str, field_path: str) -> np.ndarray:
    """One array of an .npz: memory-mapped when stored uncompressed, else loaded alone."""
    try:
        mapped = _npz_memmap(path, name)
        if mapped is not None:
            return mapped
        with np.load(path, allow_pickle=False) as archive:
            return archive[name]
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise DataError(f"cannot read array {name!r} of {path} (truncated or corrupt?): "
                        f"{exc}", file=str(path), field=f"{field_path}.source") from exc


def _npz_memmap(path: Path, name: str) -> np.ndarray | None:
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as raw:
        # The member's bytes follow its local header: 30 fixed bytes, name, extra field.
        raw.seek(info.header_offset)
        local = raw.read(30)
        if local[:4] != b"PK\x03\x04":
            return None
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        raw.seek(info.header_offset + 30 + name_len + extra_len)
        shape, fortran, dtype = _read_npy_header(raw)
        offset = raw.tell()
    if dtype.hasobject or 0 in shape or not shape:
        return None
    with zipfile.ZipFile(path) as archive, archive.open(info) as member:
        while member.read(1 << 20):  # the CRC-32 check: a memmap would skip it
            pass
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape,
                     order="F" if fortran else "C")


# --------------------------------------------------------------------------- images


def skipped_files(source: DataSource, base_dir: Path) -> list[str]:
    """Files an image-folder source skips (not images), found from names alone; [] for
    other sources. For the report, whether or not this run read the data (cache hits)."""
    path = _resolve(source.source, base_dir)
    if not path.is_dir():
        return []
    return [str(f) for f in _walk(path) if f.suffix.lower() not in IMAGE_EXTENSIONS]


def _walk(folder: Path) -> list[Path]:
    """Every file under `folder`, sorted by relative path (names only: cheap)."""
    files = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        # only regular files: a FIFO among the images would hang the reader
        files.extend(Path(root) / n for n in names
                     if paths.path_problem(Path(root) / n, "file") is None)
    return sorted(files, key=lambda f: f.relative_to(folder).as_posix())


def _images(folder: Path, source: DataSource, spec: TensorSpec | None,
            stats: LoadStats | None, field_path: str,
            labeller: Callable[[Path], int] | None) -> Iterator[Chunk]:
    """One (1, H, W, C) chunk per image, read lazily."""
    channels, size = _image_geometry(source, spec)
    first_shape = None
    for file in _walk(folder):
        if file.suffix.lower() not in IMAGE_EXTENSIONS:
            log.warning("skipped %s: not an image", file)
            if stats is not None:
                stats.skipped.append(str(file))
            continue
        image = _read_image(file, channels, size, source, field_path)
        if first_shape is None:
            first_shape = image.shape
        elif image.shape != first_shape:
            raise DataError(f"image is {image.shape[1]}x{image.shape[0]}, the first was "
                            f"{first_shape[1]}x{first_shape[0]}: set `resize: [height, "
                            "width]`", file=str(file), field=f"{field_path}.resize")
        label = None if labeller is None else np.array([labeller(file)], dtype=np.int64)
        yield image[None], label


def _image_geometry(source: DataSource,
                    spec: TensorSpec | None) -> tuple[int, tuple[int, int] | None]:
    """(channels, (height, width) or None): the source's, else the model input's."""
    shape = spec.shape if spec is not None and spec.shape and len(spec.shape) == 4 else None
    channels = source.channels
    if channels is None:
        channels = shape[3] if shape is not None and shape[3] in (1, 3) else 3
    size = tuple(source.resize) if source.resize else None
    if size is None and shape is not None and all(d and d > 0 for d in shape[1:3]):
        size = (int(shape[1]), int(shape[2]))
    return channels, size


def _read_image(file: Path, channels: int, size: tuple[int, int] | None,
                source: DataSource, field_path: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            image = image.convert("L" if channels == 1 else "RGB")
            if size is not None and image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            array = np.asarray(image, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"cannot read image: {exc}", file=str(file),
                        field=f"{field_path}.source") from exc
    if channels == 1:
        array = array[..., None]
    return (array - source.mean) / source.std


def _read_label_names(path: Path, field: str) -> list[str]:
    try:
        text = paths.read_regular_file(path, 16 << 20).decode("utf-8")
        names = [line.strip() for line in text.splitlines() if line.strip()]
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read labels file: {exc}", file=str(path), field=field) from exc
    if not names:
        raise DataError("labels file is empty", file=str(path), field=field)
    return names


def _folder_labeller(names: list[str], labels_file: str, field: str) -> Callable[[Path], int]:
    index = {name: i for i, name in enumerate(names)}

    def label(file: Path) -> int:
        if file.parent.name not in index:
            raise DataError(f"folder {file.parent.name!r} is not a class in {labels_file}",
                            file=str(file), field=field)
        return index[file.parent.name]

    return label


# --------------------------------------------------------------------------- module:function


def _import_function(spec: str, base_dir: Path, field_path: str) -> Callable[[], Any]:
    try:
        return import_callable(spec, base_dir)
    except CallableProblem as exc:
        raise DataError(str(exc), file=exc.file, field=f"{field_path}.source") from exc


def _module_chunks(fn: Callable[[], Any], spec: str, base_dir: Path, role: Role,
                   field_path: str) -> Iterator[Chunk]:
    field = f"{field_path}.source"
    try:
        with on_sys_path(base_dir):
            items = iter(fn())
        for i, item in enumerate(items):
            if isinstance(item, tuple | list) and len(item) == 2:
                x, y = np.asarray(item[0]), np.asarray(item[1])
            elif isinstance(item, np.ndarray):
                x, y = item, None
            else:
                raise DataError(f"{spec} item {i} is a {type(item).__name__}; expected a numpy "
                                "batch or an (inputs, labels) tuple", field=field)
            if x.ndim == 0:
                raise DataError(f"{spec} item {i} is a scalar; expected a batch", field=field)
            yield x, (y if role == "evaluation" else None)
    except DataError:
        raise
    except Exception as exc:  # raised inside the user's function
        raise DataError(f"{spec} raised {type(exc).__name__}: {exc}", field=field) from exc


# --------------------------------------------------------------------------- helpers


def _class_labels(labels: np.ndarray, desc: str, file: str, field: str) -> np.ndarray:
    """Integer class indices from integer (or integral float) labels, or one-hot rows."""
    if labels.ndim == 2 and labels.shape[1] > 1:
        labels = labels.argmax(axis=1)
    labels = labels.reshape(len(labels), -1)
    if labels.shape[1] != 1:
        raise DataError(f"{desc}: labels must be one class index per sample, found shape "
                        f"{_fmt(labels.shape)}", file=file, field=field)
    labels = labels[:, 0]
    if not np.issubdtype(labels.dtype, np.integer):
        if not np.issubdtype(labels.dtype, np.number) or not np.all(labels == np.rint(labels)):
            raise DataError(f"{desc}: labels must be integer class indices, found "
                            f"{labels.dtype} values", file=file, field=field)
    return labels.astype(np.int64)


def _describe(source: DataSource) -> str:
    name = source.array or source.inputs
    return f"{source.source}[{name}]" if name else source.source


_resolve = paths.resolve


def _hash_file(digest: Any, path: Path) -> None:
    try:
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}", file=str(path)) from exc


def _fmt(shape: tuple) -> str:
    return "(" + ", ".join("?" if d is None or d < 0 else str(d) for d in shape) + ")"
