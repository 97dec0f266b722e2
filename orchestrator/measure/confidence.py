"""How sure a quality figure is, from how many samples it was measured on.

An agreement of 0.9933 on 300 samples and one of 0.983 on 240 others can be the same
model: a verdict that picks the best of many trials on one small set rewards its noise.
So every figure the budgets judge comes with bounds:

- a proportion (top-1 agreement, accuracy: k of n samples): the Wilson score interval,
  which stays inside [0, 1] and is honest at 0 or n of n, where the normal one is not;
- an SQNR or a mean over samples: a percentile bootstrap over the samples (rows resampled
  with replacement, seeded, so the same data gives the same bounds every run).

`confidence` is one-sided: the lower bound is a value the true figure lies above with that
probability (0.9: 9 times in 10), and the upper bound likewise; together they make a
(2 * confidence - 1) two-sided interval (80% for 0.9). The budgets call a figure met only
at its bound (orchestrator/measure/budgets.py).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

DEFAULT_CONFIDENCE = 0.9
RESAMPLES = 1000
SEED = 0
_CHUNK = 100  # resamples drawn at once: bounds memory at _CHUNK x samples indices


def z_score(confidence: float) -> float:
    """The standard normal quantile of a one-sided `confidence` (1.2816 for 0.9)."""
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    return NormalDist().inv_cdf(confidence)


def wilson_bounds(successes: float, n: int, confidence: float = DEFAULT_CONFIDENCE
                  ) -> tuple[float, float]:
    """(lower, upper) Wilson score bounds of a proportion `successes` of `n`, each one-sided
    at `confidence` (so the pair is the two-sided interval at 2 * confidence - 1; scipy's
    `binomtest(k, n).proportion_ci(2 * confidence - 1, method="wilson")`). `successes`
    may be fractional (a proportion times n). (0, 1) for no samples."""
    if n <= 0:
        return 0.0, 1.0
    z = z_score(confidence)
    p = min(max(successes / n, 0.0), 1.0)
    z2n = z * z / n
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / n + z2n / (4 * n))
    low = 0.0 if p == 0.0 else max(0.0, centre - half)
    return low, 1.0 if p == 1.0 else min(1.0, centre + half)


def proportion_bounds(value: float, n: int, confidence: float = DEFAULT_CONFIDENCE
                      ) -> tuple[float, float]:
    """`wilson_bounds` of a measured proportion `value` over `n` samples."""
    return wilson_bounds(value * n, n, confidence)


def samples_needed(budget: float, below: float | None = None,
                   confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The fewest samples an agreement budget needs, by the Wilson lower bound at
    `confidence`:

    - with `below`: for a model measured exactly at `budget` to be told apart from one at
      `below` (its lower bound above `below`): 0.99 against 0.98 at 0.9 needs 322;
    - without: for the budget to be met at all, i.e. a perfect score (n of n) to have its
      lower bound at or above `budget`: n >= z^2 * budget / (1 - budget), 163 for 0.99
      at 0.9 (300 samples then meet 0.99 with 300 agreeing, not with 298).
    """
    if not 0.0 < budget < 1.0:
        raise ValueError(f"budget must be in (0, 1), got {budget}")
    z = z_score(confidence)
    if below is None:
        # the lower bound of n of n is n / (n + z^2)
        return max(1, math.ceil(z * z * budget / (1.0 - budget) - 1e-9))
    if not below < budget:
        raise ValueError(f"below ({below}) must be under the budget ({budget})")
    # the lower bound at a fixed proportion rises with n: double, then bisect
    high = 1
    while proportion_bounds(budget, high, confidence)[0] <= below:
        high *= 2
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        if proportion_bounds(budget, middle, confidence)[0] > below:
            high = middle
        else:
            low = middle
    return high


def lowest_meetable(n: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The highest agreement budget `n` samples can show met: the lower bound of n of n."""
    return wilson_bounds(n, n, confidence)[0]


def _resampled_sums(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """(resamples, columns) sums of `values` (rows: samples) over rows drawn with
    replacement, the same draws for every column."""
    rng = np.random.default_rng(seed)
    n = len(values)
    sums = []
    for start in range(0, resamples, _CHUNK):
        rows = rng.integers(0, n, size=(min(_CHUNK, resamples - start), n))
        sums.append(values[rows].sum(axis=1))
    return np.concatenate(sums)


def _percentiles(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    low, high = np.quantile(draws, [1.0 - confidence, confidence])
    return float(low), float(high)


def sqnr_bounds(outputs: np.ndarray, reference: np.ndarray,
                confidence: float = DEFAULT_CONFIDENCE, resamples: int = RESAMPLES,
                seed: int = SEED, cap_db: float = 200.0) -> tuple[float, float]:
    """Bootstrap (lower, upper) bounds, each one-sided at `confidence`, of the SQNR in dB
    10*log10(sum ref^2 / sum (out - ref)^2) over the samples (axis 0): each resample
    draws as many samples with replacement and sums their signal and noise energy.
    Capped at +-`cap_db` as `fidelity.sqnr_db` is."""
    ref = np.asarray(reference, np.float64).reshape(len(reference), -1)
    err = np.asarray(outputs, np.float64).reshape(len(ref), -1) - ref
    if len(ref) == 0:
        return cap_db, cap_db
    energies = np.stack([np.sum(ref ** 2, axis=1), np.sum(err ** 2, axis=1)], axis=1)
    sums = _resampled_sums(energies, resamples, seed)
    signal, noise = sums[:, 0], sums[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        db = 10.0 * np.log10(signal / noise)
    db = np.where(noise == 0.0, cap_db, np.where(signal == 0.0, -cap_db, db))
    return _percentiles(np.clip(db, -cap_db, cap_db), confidence)


def mean_bounds(values: np.ndarray, confidence: float = DEFAULT_CONFIDENCE,
                resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """Bootstrap (lower, upper) bounds, each one-sided at `confidence`, of the mean of
    per-sample `values` (e.g. source correct minus model correct: the accuracy drop)."""
    values = np.asarray(values, np.float64).reshape(-1)
    if len(values) == 0:
        return 0.0, 0.0
    means = _resampled_sums(values[:, None], resamples, seed)[:, 0] / len(values)
    return _percentiles(means, confidence)


def energy_fidelity_of_db(db: float) -> float:
    """The share of signal energy kept at an SQNR of `db`: 1 - 10^(-db/10), in [0, 1]."""
    return float(min(1.0, max(0.0, 1.0 - 10.0 ** (-db / 10.0))))
