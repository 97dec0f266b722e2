"""A digits CNN with one layer made bad for 8 bits on purpose: a huge weight outlier.

conv1's channel 0 is dead (its kernel and bias are zero: it outputs 0 for every input), and
conv2 reads that channel through one weight 1000x larger than all the others. In float the
outlier multiplies zeros, so the model's outputs do not change at all; in 8 bits conv2's
single per-tensor range must span the outlier, which rounds its other weights to a few
levels. (Killing the channel costs the float model nothing measurable: see `make`'s
return.) Built by tests, seeded, in a subprocess; writes model.keras and data.npz.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

from testbed.model_builds import deterministic, fit  # noqa: E402

SEED = 7
BAD_LAYER = "conv2"
OUTLIER = 1000.0


def make(out: Path, epochs: int = 10) -> dict[str, float]:
    """Train, plant the outlier, write out/model.keras and out/data.npz; returns the float
    accuracy before and after planting."""
    import keras
    from keras import layers
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    deterministic(SEED)  # seeds, op determinism, one thread: the same weights every run
    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target.astype(np.int64), test_size=0.25, random_state=SEED,
        stratify=digits.target)
    inputs = keras.Input(shape=(8, 8, 1), name="image")
    x = layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1")(inputs)
    x = layers.Conv2D(32, 3, padding="same", activation="relu", name=BAD_LAYER)(x)
    x = layers.MaxPooling2D(name="pool")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(64, activation="relu", name="dense1")(x)
    outputs = layers.Dense(10, activation="softmax", name="probs")(x)
    model = keras.Model(inputs, outputs, name="outlier_cnn")
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    fit(model, x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
    before = model.predict(x_test, verbose=0)

    kernel, bias = model.get_layer("conv1").get_weights()
    kernel[..., 0], bias[0] = 0.0, 0.0  # channel 0 is exactly 0 (and adds no wide range)
    model.get_layer("conv1").set_weights([kernel, bias])
    kernel, bias = model.get_layer(BAD_LAYER).get_weights()
    kernel[1, 1, 0, 0] = OUTLIER * float(np.abs(kernel).max())
    model.get_layer(BAD_LAYER).set_weights([kernel, bias])
    after = model.predict(x_test, verbose=0)

    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    np.savez(out / "data.npz", x_calib=x_train, x_test=x_test, y_test=y_test)
    return {"accuracy_before": float(np.mean(before.argmax(1) == y_test)),
            "accuracy_after": float(np.mean(after.argmax(1) == y_test))}
