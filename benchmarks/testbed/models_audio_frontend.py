"""A small transcription-style model on raw audio with a high-dynamic-range front end.

Built by tests (not shipped): seeded, about a minute on 2 cores. Like the audio models
people ship (a fixed filterbank on the waveform, then a small CNN, then several sigmoid
heads):
- input `audio`: LENGTH samples of a mono waveform, clips from -40 dB to 0 dB loud;
- a fixed, non-trainable filterbank: one Conv1D of FILTERS Gabor kernels (windowed
  sinusoids, log-spaced centre frequencies), stride HOP, no bias, then a ReLU (half-wave
  rectification, no compression): its outputs span the clips' whole 40 dB;
- two Conv1D + BatchNormalization + ReLU blocks (a max pool between), global average
  pooling, a Dense layer and three named sigmoid heads:
  - `notes` (4 units): which of four tones sound in the clip;
  - `onset` (1): whether the sound starts inside the clip (else it is there from the start);
  - `active` (1): whether any tone sounds at all (else the clip is noise).

Eight-bit activations cannot cover 40 dB at the front end (a quiet clip's filterbank
output is a step or two of a range set by loud clips), while 8-bit weights computed in
float keep every head close to float. Writes `model.keras` and `data.npz` (x_calib,
x_test and the test labels notes_test, onset_test, active_test).

    cd benchmarks && python -m testbed.models_audio_frontend OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

from testbed.model_builds import deterministic, fit  # noqa: E402

SEED = 1707
RATE = 8000
LENGTH = 2048          # samples per clip (a quarter of a second)
FILTERS, KERNEL, HOP = 24, 128, 16
TONES = (220.0, 440.0, 880.0, 1760.0)  # Hz: the `notes` head's four tones
LEVELS_DB = (-40.0, 0.0)               # clip loudness, uniform in dB
NOISE_DB = -30.0                       # noise relative to the clip's level
INPUT_NAME = "audio"
OUTPUT_NAMES = ("notes", "onset", "active")


def gabor_bank() -> np.ndarray:
    """(KERNEL, 1, FILTERS) windowed cosines, centre frequencies log-spaced 100 Hz-3.2 kHz,
    each normalised to unit L2 norm."""
    t = (np.arange(KERNEL) - KERNEL / 2) / RATE
    window = np.hanning(KERNEL)
    centres = np.geomspace(100.0, 3200.0, FILTERS)
    bank = np.stack([window * np.cos(2 * np.pi * f * t) for f in centres], axis=-1)
    bank /= np.linalg.norm(bank, axis=0, keepdims=True)
    return bank[:, None, :].astype(np.float32)


def make_clips(count: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(clips (count, LENGTH, 1), labels per head)."""
    t = np.arange(LENGTH) / RATE
    active = (rng.random((count, 1)) < 0.8).astype(np.float32)
    notes = (rng.random((count, len(TONES))) < 0.5).astype(np.float32) * active
    notes[(active[:, 0] == 1) & (notes.sum(1) == 0), rng.integers(0, len(TONES))] = 1.0
    onset = (rng.random((count, 1)) < 0.5).astype(np.float32) * active
    starts = np.where(onset[:, 0] == 1, rng.integers(LENGTH // 8, LENGTH // 2, count), 0)
    envelope = (np.arange(LENGTH)[None, :] >= starts[:, None]).astype(np.float64)
    x = np.zeros((count, LENGTH))
    for k, freq in enumerate(TONES):
        phase = rng.uniform(0, 2 * np.pi, (count, 1))
        x += notes[:, k:k + 1] * rng.uniform(0.5, 1.0, (count, 1)) * np.sin(
            2 * np.pi * freq * t + phase)
    x = x * envelope + 10 ** (NOISE_DB / 20) * rng.normal(size=(count, LENGTH))
    level = 10 ** (rng.uniform(*LEVELS_DB, size=(count, 1)) / 20)
    clips = (x * level / max(1e-9, np.abs(x).max()) * 0.9)[..., None].astype(np.float32)
    return clips, {"notes": notes, "onset": onset, "active": active}


def build_model():  # noqa: ANN201
    """The filterbank (fixed), two Conv1D blocks, pooling, a Dense and the three heads."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=(LENGTH, 1), name=INPUT_NAME)
    bank = layers.Conv1D(FILTERS, KERNEL, strides=HOP, use_bias=False, trainable=False,
                         name="filterbank")
    x = layers.ReLU(name="rectify")(bank(inputs))
    for index, filters in enumerate((32, 32)):
        x = layers.Conv1D(filters, 3, padding="same", use_bias=False, name=f"conv{index}")(x)
        x = layers.BatchNormalization(momentum=0.9, name=f"bn{index}")(x)
        x = layers.ReLU(name=f"relu{index}")(x)
        if index == 0:
            x = layers.MaxPooling1D(2, name="pool0")(x)
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    x = layers.Dense(32, activation="relu", name="dense")(x)
    heads = [layers.Dense(size, activation="sigmoid", name=name)(x)
             for name, size in zip(OUTPUT_NAMES, (len(TONES), 1, 1), strict=True)]
    model = keras.Model(inputs, heads, name="audio_frontend")
    bank.set_weights([gabor_bank()])
    return model


def make(out: Path, epochs: int = 12, train: int = 2400) -> dict[str, float]:
    """Train, then write out/model.keras and out/data.npz; returns per-head test accuracy
    (thresholded at 0.5), the parameter count, epochs and training seconds."""
    import keras

    started = time.monotonic()
    deterministic(SEED)  # seeds, op determinism, one thread: the same weights every run
    rng = np.random.default_rng(SEED)
    x_train, y_train = make_clips(train, rng)
    x_test, y_test = make_clips(300, rng)
    x_calib, _ = make_clips(300, rng)
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss={name: "binary_crossentropy" for name in OUTPUT_NAMES})
    fit(model, x_train, y_train, epochs=epochs, batch_size=64, verbose=0)
    predicted = dict(zip(OUTPUT_NAMES, model.predict(x_test, verbose=0), strict=True))
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    np.savez(out / "data.npz", x_calib=x_calib, x_test=x_test,
             **{f"{name}_test": y_test[name] for name in OUTPUT_NAMES})
    facts = {f"{name}_accuracy": float(np.mean((predicted[name] > 0.5) == (y_test[name] > 0.5)))
             for name in OUTPUT_NAMES}
    return {**facts, "params": float(model.count_params()), "epochs": epochs,
            "train_seconds": round(time.monotonic() - started, 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(json.dumps(make(args.out)))
