"""Which evaluation samples a verdict is judged on: a fixed held-out split, and the samples
that are also representative ones.

A search that picks the best of many trials on one evaluation set rewards that set's noise,
so the guard judges trials on a "search" part and confirms its choice on a "held_out" part
(the same seeded split every run). Samples that are also representative samples (the same
bytes once fitted to the model) are what every int8 method was fit on: a verdict on them
overstates how the file does on new data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Literal

import numpy as np

from orchestrator.errors import DataError

Part = Literal["all", "search", "held_out"]
HELD_OUT_SEED = 41  # the held-out split's permutation: fixed, so every run holds out the same


def held_out_rows(total: int, share: float) -> np.ndarray:
    """The sorted indices of the held-out part of `total` evaluation samples: the first
    round(share * total) (at least 1) of a permutation seeded with HELD_OUT_SEED, the same
    every run. A set of one sample cannot be split: DataError."""
    if total < 2:
        raise DataError(f"{total} evaluation sample(s) cannot be split into a search and a "
                        "held-out part: give at least 2")
    count = min(total - 1, max(1, round(share * total)))
    order = np.random.default_rng(HELD_OUT_SEED).permutation(total)
    return np.sort(order[:count])


def part_rows(total: int, part: Part, share: float) -> np.ndarray:
    """The indices of `part` of `total` samples."""
    if part == "all":
        return np.arange(total)
    held = held_out_rows(total, share)
    return held if part == "held_out" else np.setdiff1d(np.arange(total), held)


def overlapping(inputs: np.ndarray, representative: Iterable[np.ndarray]) -> np.ndarray:
    """Per evaluation sample, whether its bytes are those of a representative sample."""
    seen: set[bytes] = set()
    for batch in representative:
        batch = np.ascontiguousarray(batch, dtype=inputs.dtype)
        seen.update(_digest(sample) for sample in batch)
    return np.array([_digest(np.ascontiguousarray(s)) in seen for s in inputs], bool)


def _digest(sample: np.ndarray) -> bytes:
    return hashlib.blake2b(sample.tobytes() + str(sample.shape).encode(),
                           digest_size=16).digest()
