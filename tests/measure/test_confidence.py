"""confidence: Wilson bounds against published values and scipy, the samples an agreement
budget needs, and seeded bootstrap bounds of an SQNR and a mean."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.measure.confidence import (
    lowest_meetable,
    mean_bounds,
    proportion_bounds,
    samples_needed,
    sqnr_bounds,
    wilson_bounds,
    z_score,
)
from orchestrator.measure.fidelity import sqnr_db

# Published 95% Wilson intervals (Newcombe 1998, table I; Brown, Cai & DasGupta 2001)
PUBLISHED_95 = {(0, 10): (0.0, 0.2775), (10, 10): (0.7225, 1.0), (50, 100): (0.4038, 0.5962),
                (81, 263): (0.2553, 0.3662)}


@pytest.mark.parametrize(("k", "n"), list(PUBLISHED_95))
def test_wilson_matches_published_values(k: int, n: int) -> None:
    # one-sided 0.975 each side: the two-sided 95% interval
    low, high = wilson_bounds(k, n, 0.975)
    assert (low, high) == pytest.approx(PUBLISHED_95[k, n], abs=1e-4)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (10, 10), (50, 100), (298, 300), (7, 40)])
def test_wilson_matches_scipy(k: int, n: int) -> None:
    from scipy import stats  # scikit-learn's dependency: always installed

    for confidence in (0.9, 0.95):
        expected = stats.binomtest(k, n).proportion_ci(2 * confidence - 1, method="wilson")
        assert wilson_bounds(k, n, confidence) == pytest.approx(
            (expected.low, expected.high), abs=1e-12)


def test_a_perfect_score_on_few_samples_does_not_reach_a_high_budget() -> None:
    assert z_score(0.9) == pytest.approx(1.281552, abs=1e-6)
    # n of n: lower bound n / (n + z^2)
    assert lowest_meetable(300) == pytest.approx(300 / (300 + z_score(0.9) ** 2))
    assert lowest_meetable(300) > 0.99 > lowest_meetable(100)
    assert proportion_bounds(298 / 300, 300)[0] == pytest.approx(0.98407, abs=1e-5)
    assert wilson_bounds(0, 0) == (0.0, 1.0)


def test_samples_needed() -> None:
    # to be met at all: the smallest n with n / (n + z^2) >= 0.99, i.e. n >= 99 z^2 = 162.6
    needed = samples_needed(0.99)
    assert needed == 163
    assert lowest_meetable(needed) >= 0.99 > lowest_meetable(needed - 1)
    # to tell a model measured at 0.99 from 0.98
    apart = samples_needed(0.99, 0.98)
    assert apart == 322
    assert proportion_bounds(0.99, apart)[0] > 0.98 >= proportion_bounds(0.99, apart - 1)[0]
    # surer costs more samples
    assert samples_needed(0.99, 0.98, 0.95) > apart
    with pytest.raises(ValueError, match="below"):
        samples_needed(0.98, 0.99)


def test_sqnr_bounds_hold_the_figure_and_narrow_with_more_samples() -> None:
    rng = np.random.default_rng(3)

    def bounds(n: int) -> tuple[float, float, float]:
        ref = rng.normal(size=(n, 4))
        out = ref + rng.normal(scale=0.1, size=(n, 4))  # about 20 dB
        low, high = sqnr_bounds(out, ref, 0.9)
        assert sqnr_bounds(out, ref, 0.9) == (low, high)  # seeded: the same every call
        return low, sqnr_db(out, ref), high

    small, large = bounds(40), bounds(4000)
    for low, figure, high in (small, large):
        assert low < figure < high
        assert 17.0 < low and high < 23.0
    assert large[2] - large[0] < (small[2] - small[0]) / 5  # about 1/sqrt(100)
    identical = np.ones((5, 2))
    assert sqnr_bounds(identical, identical) == (200.0, 200.0)


def test_mean_bounds_of_an_accuracy_drop() -> None:
    drops = np.zeros(300)
    drops[:6] = 1.0  # the source right and the model wrong on 6 of 300: a drop of 0.02
    low, high = mean_bounds(drops, 0.9)
    assert low < 0.02 < high
    # the binomial's spread: sd sqrt(0.02 * 0.98 / 300) = 0.0081, z 1.28 -> about +-0.0104
    assert high - 0.02 == pytest.approx(0.0104, abs=0.004)
    assert mean_bounds(np.zeros(50)) == (0.0, 0.0)
