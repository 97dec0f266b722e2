"""TF's eight-bit arithmetic in numpy (orchestrator.quant.numerics), bit for bit: the one
rounding and the one dequantize that ranges, layer errors and bias correction share."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.quant import numerics


@pytest.mark.parametrize(("value", "want"), [
    (2.5, 3.0), (-2.5, -3.0), (0.5, 1.0), (-0.5, -1.0), (1.4999999, 1.0), (-1.5, -2.0),
    (7.0, 7.0), (0.0, 0.0),
    # a float32 just under a half: summed in float32 it would round up to 1
    (np.float32(0.49999997), 0.0), (np.float32(-0.49999997), -0.0),
    (np.float32(8388607.5), 8388608.0),  # the largest float32 with a half
])
def test_round_half_away_is_std_round(value: float, want: float) -> None:
    got = numerics.round_half_away(value)
    assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want)
    assert isinstance(got, float)


def test_dequantize_is_tfs_own() -> None:
    """Bit for bit with TF's Dequantize (MIN_FIRST), on ranges across six decades, some
    not containing zero. (Bias correction once had its own dequantize, off from this one
    in the last bits for almost every range.)"""
    import tensorflow as tf

    q = np.arange(256, dtype=np.uint8)
    rng = np.random.default_rng(3)
    ranges = [(-1.0, 1.0), (0.0, 6.0), (-24.2318, 17.6619), (2.0, 2.0), (0.5, 3.0)]
    ranges += [tuple(sorted(rng.normal(size=2) * 10.0 ** rng.uniform(-3, 3, size=2)))
               for _ in range(200)]
    for lo, hi in ranges:
        want = tf.quantization.dequantize(tf.constant(q, tf.quint8), lo, hi,
                                          mode="MIN_FIRST").numpy()
        np.testing.assert_array_equal(numerics.dequantize(q, lo, hi), want)


def test_float_to_quint8_reads_back_its_codes() -> None:
    """quantize_weights' quantization, then TF's Dequantize, then the quantization again:
    the same codes, over ranges with and without zero."""
    values = np.arange(256, dtype=np.uint8)
    for lo, hi in ((-0.3, 1.1), (0.0, 6.0), (-24.2318, 17.6619), (-1e-3, 2e-3)):
        w8 = numerics.dequantize(values, lo, hi)
        assert np.array_equal(numerics.float_to_quint8(w8, lo, hi), values)
