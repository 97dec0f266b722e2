"""A small residual SeparableConv2D + BatchNormalization CNN on scikit-learn's 8x8 digits.

Built by tests (not shipped): seeded and fast (a few seconds on 2 cores). Writes
`model.keras` and `data.npz` (x_calib, x_test, y_test; images / 16, like
examples/digits/make_model.py).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

from testbed.model_builds import deterministic, fit  # noqa: E402

SEED = 1234
WIDTH = 96      # channels of the stem and the residual blocks
HIDDEN = 128    # units of the dense head
INPUT_NAME = "image"
OUTPUT_NAME = "probs"
# Few training steps: moving statistics must forget their initial (0, 1) quickly.
BN_MOMENTUM = 0.9


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0)[..., None]  # (1797, 8, 8, 1) in [0, 1]
    labels = digits.target.astype(np.int64)
    return tuple(train_test_split(images, labels, test_size=0.25, random_state=SEED,
                                  stratify=labels))  # type: ignore[return-value]


def build_model():  # noqa: ANN201
    """Conv2D stem + BN + ReLU; two residual blocks of SeparableConv2D + BN (+ ReLU) twice,
    Add(skip), ReLU; global average pooling; Dense + BN + ReLU; Dense softmax."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=(8, 8, 1), name=INPUT_NAME)
    x = layers.Conv2D(WIDTH, 3, padding="same", use_bias=False, name="stem")(inputs)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM, name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    for block in (1, 2):
        skip = x
        y = layers.SeparableConv2D(WIDTH, 3, padding="same", use_bias=False,
                                   name=f"b{block}_sep1")(x)
        y = layers.BatchNormalization(momentum=BN_MOMENTUM, name=f"b{block}_bn1")(y)
        y = layers.ReLU(name=f"b{block}_relu1")(y)
        y = layers.SeparableConv2D(WIDTH, 3, padding="same", use_bias=False,
                                   name=f"b{block}_sep2")(y)
        y = layers.BatchNormalization(momentum=BN_MOMENTUM, name=f"b{block}_bn2")(y)
        x = layers.Add(name=f"b{block}_add")([y, skip])
        x = layers.ReLU(name=f"b{block}_out")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dense(HIDDEN, name="dense1")(x)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM, name="dense1_bn")(x)
    x = layers.ReLU(name="dense1_relu")(x)
    outputs = layers.Dense(10, activation="softmax", name=OUTPUT_NAME)(x)
    return keras.Model(inputs, outputs, name="separable_resnet")


def make(out: Path, epochs: int = 6) -> dict[str, float]:
    """Train, then write out/model.keras and out/data.npz; returns accuracy and params."""
    import keras

    deterministic(SEED)  # seeds, op determinism, one thread: the same weights every run
    x_train, x_test, y_train, y_test = load_data()
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    fit(model, x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    rng = np.random.default_rng(SEED)
    calib = x_train[rng.permutation(len(x_train))[:500]]
    np.savez(out / "data.npz", x_calib=calib, x_test=x_test, y_test=y_test)
    return {"accuracy": float(accuracy), "params": float(model.count_params())}
