"""A small 1-D convolutional model with two sigmoid heads, on synthetic signals.

Built by tests (not shipped): seeded and fast (seconds on 2 cores). Like a real audio
model: Conv1D blocks with BatchNormalization (one strided, the unequal-stride Conv2D a
Conv1D lowers to), then named sigmoid Dense heads:
- `tones` (3 units): which of three tones (low, mid, high band) the signal holds;
- `burst` (1 unit): whether a short high-frequency burst is in it.
Signals are sums of sinusoids of random frequency in their band, phase and amplitude,
plus Gaussian noise. Writes `model.keras` and `data.npz` (x_calib, x_test, and the test
labels tones_test, burst_test).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

from testbed.model_builds import deterministic, fit  # noqa: E402

SEED = 4321
LENGTH = 256  # samples per signal
INPUT_NAME = "signal"
OUTPUT_NAMES = ("tones", "burst")
# cycles per signal: each tone's band, and the burst's frequency
BANDS = ((4.0, 8.0), (16.0, 24.0), (36.0, 48.0))
BURST_CYCLES = 96.0
NOISE = 0.3
BN_MOMENTUM = 0.9  # few training steps: moving statistics must forget (0, 1) quickly
# Conv1D blocks: (filters, kernel, stride)
BLOCKS = ((16, 9, 1), (32, 5, 2), (32, 5, 1))


def make_signals(count: int, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(signals (count, LENGTH, 1), tones (count, 3) 0/1, burst (count, 1) 0/1)."""
    t = np.arange(LENGTH, dtype=np.float64) / LENGTH
    tones = (rng.random((count, len(BANDS))) < 0.5).astype(np.float32)
    burst = (rng.random((count, 1)) < 0.5).astype(np.float32)
    x = rng.normal(0.0, NOISE, size=(count, LENGTH))
    for k, (low, high) in enumerate(BANDS):
        cycles = rng.uniform(low, high, size=(count, 1))
        phase = rng.uniform(0, 2 * np.pi, size=(count, 1))
        amplitude = rng.uniform(0.5, 1.0, size=(count, 1))
        x += tones[:, k:k + 1] * amplitude * np.sin(2 * np.pi * cycles * t + phase)
    start = rng.integers(0, LENGTH - LENGTH // 4, size=(count, 1))
    window = (np.arange(LENGTH) >= start) & (np.arange(LENGTH) < start + LENGTH // 4)
    x += burst * window * np.sin(2 * np.pi * BURST_CYCLES * t)
    return x[..., None].astype(np.float32), tones, burst


def build_model():  # noqa: ANN201
    """Conv1D + BN + ReLU three times (the middle one with stride 2), global average
    pooling, Dense + ReLU, and the two sigmoid heads."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=(LENGTH, 1), name=INPUT_NAME)
    x = inputs
    for index, (filters, kernel, stride) in enumerate(BLOCKS):
        x = layers.Conv1D(filters, kernel, strides=stride, padding="same", use_bias=False,
                          name=f"conv{index}")(x)
        x = layers.BatchNormalization(momentum=BN_MOMENTUM, name=f"bn{index}")(x)
        x = layers.ReLU(name=f"relu{index}")(x)
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    x = layers.Dense(32, activation="relu", name="dense")(x)
    tones = layers.Dense(len(BANDS), activation="sigmoid", name="tones")(x)
    burst = layers.Dense(1, activation="sigmoid", name="burst")(x)
    return keras.Model(inputs, [tones, burst], name="conv1d_heads")


def make(out: Path, epochs: int = 8, train: int = 2000) -> dict[str, float]:
    """Train, then write out/model.keras and out/data.npz; returns per-head test accuracy
    (thresholded at 0.5) and the parameter count."""
    import keras

    deterministic(SEED)  # seeds, op determinism, one thread: the same weights every run
    rng = np.random.default_rng(SEED)
    x_train, tones_train, burst_train = make_signals(train, rng)
    x_test, tones_test, burst_test = make_signals(400, rng)
    x_calib, _, _ = make_signals(200, rng)
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss={"tones": "binary_crossentropy", "burst": "binary_crossentropy"})
    fit(model, x_train, {"tones": tones_train, "burst": burst_train}, epochs=epochs,
              batch_size=64, verbose=0)
    tones_pred, burst_pred = model.predict(x_test, verbose=0)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    np.savez(out / "data.npz", x_calib=x_calib, x_test=x_test, tones_test=tones_test,
             burst_test=burst_test)
    return {"tones_accuracy": float(np.mean((tones_pred > 0.5) == (tones_test > 0.5))),
            "burst_accuracy": float(np.mean((burst_pred > 0.5) == (burst_test > 0.5))),
            "params": float(model.count_params())}
