"""Representative and evaluation data: `.npz` arrays, image folders, or `module:function`.

A `DataSource` (spec/models.py) names one of three kinds of source, each read by one
module of this package, looked up in `KINDS` (as orchestrator.model.sources does for models):

- npz.py: an `.npz` file, arrays by name; uncompressed members are memory-mapped.
- images.py: a folder of images, read one file at a time; non-images skipped (counted in
  `LoadStats`), an evaluation's labels from a file of class names.
- module_function.py: a function returning numpy batches or `(inputs, labels)` tuples.

Each kind module has `check` (validation, no data read), `open_chunks` (opened now, read
lazily) and `hash_content` (for the fingerprint). What they share is in source.py (the
kind, paths, LoadStats), batches.py (re-batching, non-finite values) and fitting.py:

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
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np

from orchestrator.data import images, module_function, npz
from orchestrator.data.batches import model_batch_size, rebatch
from orchestrator.data.fitting import check_fits, class_labels, fit_to_input
from orchestrator.data.images import IMAGE_EXTENSIONS, skipped_files
from orchestrator.data.source import (
    Chunk,
    EvaluationData,
    LoadStats,
    Role,
    SourceKind,
    describe,
    source_kind,
    source_path,
)
from orchestrator.errors import DataError
from orchestrator.model.artifact import TensorSpec
from orchestrator.spec.models import DataSource

__all__ = ["KINDS", "LoadStats", "SourceKind", "IMAGE_EXTENSIONS", "source_kind",
           "source_path", "representative_batches", "load_evaluation", "fingerprint",
           "check_source", "check_fits", "fit_to_input", "skipped_files"]

# kind -> its module, each with check, open_chunks and hash_content
KINDS: dict[SourceKind, ModuleType] = {
    "npz": npz,
    "images": images,
    "module": module_function,
}


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
    size, fixed = model_batch_size(input_spec, batch_size or source.batch_size)
    chunks, input_field = _open(source, base_dir, "representative", input_spec, size, stats,
                                field_path)
    desc = describe(source)
    file = str(source_path(source, base_dir))

    def generate() -> Iterator[np.ndarray]:
        for inputs, _ in rebatch(chunks, size, limit, drop_partial=fixed):
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
    desc = describe(source)
    file = str(source_path(source, base_dir))
    inputs, labels = [], []
    for x, y in rebatch(chunks, source.batch_size, source.samples, drop_partial=False):
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
        y_all = class_labels(np.concatenate(labels), desc, file, f"{field_path}.labels")
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
    KINDS[source_kind(source, base_dir)].hash_content(digest, source, base_dir)
    return digest.hexdigest()


def check_source(source: DataSource, base_dir: Path, role: Role, field_path: str,
                 input_spec: TensorSpec | None = None) -> None:
    """Recipe validation, without reading the data: the path exists, the npz has the named
    arrays (the message lists those it has), the folder has images, the module imports and
    has the function. With `input_spec`, npz array shapes are checked against it too.
    """
    kind = source_kind(source, base_dir, field_path)
    KINDS[kind].check(source, base_dir, role, field_path, input_spec)


def _open(source: DataSource, base_dir: Path, role: Role, input_spec: TensorSpec | None,
          chunk_size: int, stats: LoadStats | None,
          field_path: str) -> tuple[Iterator[Chunk], str]:
    """Open the source now (errors surface here): its lazy chunk stream, and the recipe
    field that names its inputs (for shape errors)."""
    kind = source_kind(source, base_dir, field_path)
    return KINDS[kind].open_chunks(source, base_dir, role, input_spec, chunk_size, stats,
                                   field_path)
