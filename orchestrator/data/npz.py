"""`.npz` data sources: arrays by name. Validation reads only the .npy headers; reading
memory-maps members stored uncompressed (`np.savez`), so streaming a big calibration set
reads only the batches used, and loads a compressed member (`np.savez_compressed`) alone.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.data.batches import checked, slices
from orchestrator.data.fitting import check_dtype, check_fits, kind_name
from orchestrator.data.source import Chunk, LoadStats, Role, hash_file, source_path
from orchestrator.errors import DataError
from orchestrator.model.artifact import TensorSpec
from orchestrator.spec.models import DataSource

Headers = dict[str, tuple[tuple[int, ...], np.dtype]]


def check(source: DataSource, base_dir: Path, role: Role, field_path: str,
          input_spec: TensorSpec | None) -> None:
    """The named arrays exist (the message lists those there are), hold numbers, one row
    per sample, fitting `input_spec`; labels as many as inputs. Headers only."""
    path = source_path(source, base_dir)
    headers = npz_headers(path, field_path)
    name, name_field = input_name(source, role, headers, path, field_path)
    shape, dtype = headers[name]
    check_dtype(dtype, input_spec, f"{path.name}: array {name!r}", file=str(path),
                field=name_field, stored=True)
    if not shape:
        raise DataError(f"{path.name}: array {name!r} is a single value (a 0-d array); "
                        "expected one row per sample", file=str(path), field=name_field)
    if input_spec is not None:
        check_fits(shape, input_spec, f"{path.name}[{name}]", file=str(path),
                   field=name_field)
    if role == "evaluation" and source.labels:
        require(source.labels, headers, path, f"{field_path}.labels")
        label_dtype = headers[source.labels][1]
        if label_dtype.kind not in "biuf":
            raise DataError(f"{path.name}: labels array {source.labels!r} has dtype "
                            f"{label_dtype} ({kind_name(label_dtype)}); labels must be "
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


def open_chunks(source: DataSource, base_dir: Path, role: Role, input_spec: TensorSpec | None,
                chunk_size: int, stats: LoadStats | None,
                field_path: str) -> tuple[Iterator[Chunk], str]:
    """The arrays opened now (memory-mapped where stored uncompressed), their chunks read
    lazily; and the recipe field naming the inputs array."""
    path = source_path(source, base_dir)
    labels_field = f"{field_path}.labels"
    headers = npz_headers(path, field_path)
    name, input_field = input_name(source, role, headers, path, field_path)
    check_dtype(headers[name][1], input_spec, f"{path.name}: array {name!r}",
                file=str(path), field=input_field, stored=True)
    inputs = npz_array(path, name, field_path)
    labels = None
    if role == "evaluation" and source.labels:
        require(source.labels, headers, path, labels_field)
        labels = npz_array(path, source.labels, field_path)
    names = (f"{path.name}: array {name!r}", f"{path.name}: labels array {source.labels!r}")
    for array, what, where in ((inputs, names[0], input_field),
                               (labels, names[1], labels_field)):
        if array is not None and array.ndim == 0:
            raise DataError(f"{what} is a single value (a 0-d array); expected one row "
                            "per sample", file=str(path), field=where)
    if input_spec is not None:  # the whole array's shape, before any batch is read
        check_fits(inputs.shape, input_spec, f"{path.name}[{name}]", file=str(path),
                   field=input_field)
    return checked(slices(inputs, labels, chunk_size), names, str(path),
                   (input_field, labels_field)), input_field


def hash_content(digest: Any, source: DataSource, base_dir: Path) -> None:
    """The file's bytes."""
    hash_file(digest, source_path(source, base_dir))


def npz_headers(path: Path, field_path: str) -> Headers:
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


def input_name(source: DataSource, role: Role, headers: Headers, path: Path,
               field_path: str) -> tuple[str, str]:
    """The inputs array's name and its recipe field. Representative data reads `array`,
    evaluation reads `inputs`; either falls back to the other, then to a lone array."""
    order = ("array", "inputs") if role == "representative" else ("inputs", "array")
    for key in order:
        name = getattr(source, key)
        if name:
            require(name, headers, path, f"{field_path}.{key}")
            return name, f"{field_path}.{key}"
    candidates = [n for n in headers if n != source.labels]
    if len(candidates) == 1:
        return candidates[0], f"{field_path}.source"
    raise DataError(f"{path.name} holds several arrays ({', '.join(sorted(headers))}): name "
                    f"one with `{order[0]}:`", file=str(path), field=f"{field_path}.{order[0]}")


def require(name: str, headers: Headers, path: Path, field: str) -> None:
    """DataError listing the arrays there are, unless `name` is one of them."""
    if name not in headers:
        raise DataError(f"{path.name} has no array {name!r}; it has: "
                        f"{', '.join(sorted(headers)) or '(none)'}", file=str(path), field=field)


def npz_array(path: Path, name: str, field_path: str) -> np.ndarray:
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
