"""Cutting a kind's chunks into the batches a model is fed: slices of (memory-mapped)
arrays, re-batching to a size and a sample limit, the model's fixed batch size, and the
refusal of non-finite values on the way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from orchestrator.data.source import Chunk, log
from orchestrator.errors import DataError
from orchestrator.model.artifact import TensorSpec


def checked(chunks: Iterable[Chunk], names: tuple[str, str], file: str | None,
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


def slices(inputs: np.ndarray, labels: np.ndarray | None, size: int) -> Iterator[Chunk]:
    """Chunks of `size` samples of whole arrays, copied out one at a time."""
    # Slicing a memmap reads only that slice; np.array copies it out of the page cache.
    for start in range(0, len(inputs), size):
        yield (np.array(inputs[start:start + size]),
               None if labels is None else np.array(labels[start:start + size]))


def rebatch(chunks: Iterable[Chunk], size: int, limit: int | None,
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
            bx, by, pending_x, pending_y = split(pending_x, pending_y, size)
            count -= size
            yield bx, by
        if limit is not None and taken >= limit:
            break  # before pulling another chunk: a folder reads no image it won't use
    if count and not drop_partial:
        yield split(pending_x, pending_y, count)[:2]
    elif count:
        log.warning("dropped the last %d sample(s): the model's batch size is fixed at %d",
                    count, size)


def split(xs: list[np.ndarray], ys: list[np.ndarray | None],
          size: int) -> tuple[np.ndarray, np.ndarray | None, list, list]:
    """The first `size` samples of the pending pieces, and what is left."""
    x = np.concatenate(xs) if len(xs) > 1 else xs[0]
    y = None if any(v is None for v in ys) else (np.concatenate(ys) if len(ys) > 1 else ys[0])
    rest_x = [x[size:]] if len(x) > size else []
    rest_y = [None if y is None else y[size:]] if len(x) > size else []
    return x[:size], None if y is None else y[:size], rest_x, rest_y


def model_batch_size(spec: TensorSpec | None, requested: int) -> tuple[int, bool]:
    """(batch size, whether the model fixes it): the model input's batch dimension when it
    fixes one, else `requested`."""
    if spec is not None and spec.shape and spec.shape[0] is not None and spec.shape[0] > 0:
        return int(spec.shape[0]), True
    return requested, False
