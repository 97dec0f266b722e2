"""An activation range chosen by error, not by min and max: from a tensor's histogram on the
representative data, the clipping [lo, hi] whose uniform quantization (256 levels for int8)
loses least, counting both errors: rounding inside the range (a step squared over 12 per
value) and clipping outside it (each value's distance to the edge, squared).

Min-max spends the levels on the rarest values: one loud sample in a thousand stretches
the step for all the others. The optimum clips such tails (TensorRT's and OCTAV's "optimal
clipping"); on a tensor whose values fill its range (a uniform one, an image's pixels) it
gains next to nothing, and then the min-max range is kept as it is (`min_gain`).
numpy only; litert_quantizer builds the histograms and applies the ranges.
"""

from __future__ import annotations

import numpy as np

BINS = 2048
MIN_GAIN = 0.05  # a clip must cut the expected error by 5% to replace min-max's range
STRIDE = 4  # candidate edges every 4 bins: 513 per side, a grid finer than a step's tenth


def histogram_range(lo: float, hi: float) -> tuple[float, float]:
    """The range a histogram spans for a tensor seen in [lo, hi]: widened to hold zero, as
    LiteRT's asymmetric int8 does (zero must be exact: padding, ReLU)."""
    return min(float(lo), 0.0), max(float(hi), 0.0)


def expected_errors(counts: np.ndarray, lo: float, hi: float, a: np.ndarray, b: np.ndarray,
                    levels: int = 256) -> np.ndarray:
    """The mean squared error of quantizing the histogram's values (`counts` over [lo, hi]
    in equal bins) to `levels` steps of [a, b], for every pair of candidate edges
    (a: edge indices below zero, b: above; an index i is the edge lo + i * bin width).
    Returns an array shaped (len(a), len(b))."""
    p = np.asarray(counts, dtype=np.float64)
    p = p / p.sum()
    n = len(p)
    width = (hi - lo) / n
    edges = lo + width * np.arange(n + 1)
    centres = edges[:-1] + width / 2
    # tail sums: above edge j (bins j..n-1) and below edge j (bins 0..j-1)
    above = [np.concatenate([np.cumsum((p * centres ** k)[::-1])[::-1], [0.0]])
             for k in range(3)]
    below = [np.concatenate([[0.0], np.cumsum(p * centres ** k)]) for k in range(3)]
    ea, eb = edges[a][:, None], edges[b][None, :]
    clipped_hi = above[2][b] - 2 * eb * above[1][b] + eb ** 2 * above[0][b]
    clipped_lo = below[2][a][:, None] - 2 * ea * below[1][a][:, None] + \
        ea ** 2 * below[0][a][:, None]
    inside = 1.0 - above[0][b][None, :] - below[0][a][:, None]
    step = (eb - ea) / (levels - 1)
    return np.maximum(clipped_hi, 0) + np.maximum(clipped_lo, 0) + inside * step ** 2 / 12


def best_range(counts: np.ndarray, lo: float, hi: float, levels: int = 256,
               min_gain: float = MIN_GAIN) -> tuple[float, float]:
    """The clipping range of least expected error for a histogram over [lo, hi] (lo <= 0 <=
    hi: see histogram_range); [lo, hi] itself unless a clip gains `min_gain` of the error."""
    n = len(counts)
    if hi <= lo or not np.any(counts):
        return lo, hi
    width = (hi - lo) / n
    zero = int(np.clip(np.floor(-lo / width), 0, n))  # the last edge at or below zero
    a = np.unique(np.append(np.arange(0, zero + 1, STRIDE), zero))
    b = np.unique(np.append(np.arange(n, zero, -STRIDE), n))
    if lo == 0:
        a = np.array([0])
    errors = expected_errors(counts, lo, hi, a, b, levels)
    full = errors[0, -1]  # a = 0 (lo), b = n (hi): min-max
    i, j = np.unravel_index(np.argmin(errors), errors.shape)
    if errors[i, j] > (1 - min_gain) * full:
        return lo, hi
    return lo + a[i] * width, lo + b[j] * width
