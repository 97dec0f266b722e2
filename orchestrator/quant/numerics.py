"""Eight-bit arithmetic exactly as TensorFlow's kernels do it (quantization_utils.h,
dequantize_op.cc), in numpy: rounding, quint8 <-> float (MIN_FIRST), qint32 -> float.

Bit for bit, so that what a stage predicts (a frozen range, a bias correction, a layer's
error) is what the 8-bit graph computes; each function is tested against TF's own op.
"""

from __future__ import annotations

import math

import numpy as np


def round_half_away(value: float) -> float:
    """std::round: to the nearest whole number, halves away from zero (2.5 -> 3.0, -2.5 ->
    -3.0), as a float. Exact for float32 values: the sum is taken in float64 (a numpy
    float32 would keep it in float32, where 0.49999997 + 0.5 rounds up to 1)."""
    v = float(value)
    return math.copysign(math.floor(abs(v) + 0.5), v)


def dequantize(values: np.ndarray, range_min: float, range_max: float) -> np.ndarray:
    """quint8 -> float32 bit for bit as TF's Dequantize (MIN_FIRST) computes it: steps of
    (max - min) / 255 from min rounded to a whole step (so that zero stays exact), in
    TF's own mix of float32 and double arithmetic."""
    lo, hi = np.float32(range_min), np.float32(range_max)
    q = np.asarray(values).astype(np.float32)
    if lo == hi:
        return np.full(q.shape, lo, dtype=np.float32)
    scale = float(np.float32(hi - lo)) * (256 / 255.0) / 256  # double, as in TF
    scale_f = np.float32(scale)
    min_rounded = np.float32(np.float32(round_half_away(float(np.float32(lo / scale_f))))
                             * scale_f)
    return q * np.float32(scale) + min_rounded


def float_to_quint8(values: np.ndarray, range_min: float, range_max: float) -> np.ndarray:
    """TF's FloatTensorToQuantizedInPlace<quint8> (quantization_utils.h): the MIN_FIRST
    quantization quantize_weights stores, in float32 arithmetic; returns uint8 values."""
    rmin, rmax = np.float32(range_min), np.float32(range_max)
    if rmin == rmax:
        return np.zeros(np.shape(values), dtype=np.uint8)
    scale = np.float32(255.0 / float(np.float32(rmax - rmin)))
    scaled = (np.asarray(values, dtype=np.float32) * scale).astype(np.float64)
    rounded = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)  # std::round, exact in float64
    min_scaled = np.float32(round_half_away(np.float32(rmin * scale)))
    return np.clip(rounded - min_scaled, 0, 255).astype(np.uint8)


def qint32_to_float(values: np.ndarray, range_min: float, range_max: float) -> np.ndarray:
    """TF's QuantizedToFloat<qint32> (quantization_utils.h), bit for bit, on int32 values.

    Used to turn per-sample qint32 minima/maxima into the floats RequantizationRange
    would report for that sample.
    """
    rmin, rmax = np.float32(range_min), np.float32(range_max)
    values = np.asarray(values)
    if rmin == rmax:
        return np.full(values.shape, rmin, dtype=np.float32)
    steps = float(1 << 32)
    span = float(np.float32(rmax - rmin)) * (steps / (steps - 1.0))
    scale = span / steps
    scale_f = np.float32(scale)
    rounded = np.float32(round_half_away(np.float32(rmin / scale_f)))
    min_rounded = float(np.float32(rounded * scale_f))
    # static_cast<double>(qint32) goes through QInt32's float conversion: float32 first.
    offset = values.astype(np.float32).astype(np.float64) + float(1 << 31)
    return (min_rounded + offset * scale).astype(np.float32)
