"""A mini-Xception on scikit-learn's digits upscaled to 32x32: a real-model stand-in.

Built by us, not shipped: a strided Conv2D stem, two Xception entry-flow blocks (ReLU,
SeparableConv2D, BatchNormalization twice, then MaxPool /2, added to a strided 1x1 Conv2D
+ BN shortcut), one middle-flow block (identity shortcut), ReLU, global average pooling and
a Dense softmax: about 56k params. Trained briefly, seeded and deterministic (well under a
minute on 2 cores). `make(out)` writes `model.keras` and `data.npz` (x_calib, x_test,
y_test; images bilinear-upscaled 8x8 -> 32x32, / 16 into [0, 1]).

    cd benchmarks && python -m testbed.models_xception OUT_DIR [--epochs N]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

from testbed.model_builds import deterministic, fit  # noqa: E402

SEED = 1234
SIZE = 32             # input side, after upscaling digits' 8x8
WIDTHS = (32, 64, 96)  # stem, entry block 1, entry block 2 (and the middle block)
INPUT_NAME = "image"
OUTPUT_NAME = "probs"
EPOCHS = 5  # 0.998 test accuracy; 8-bit already flips a few of its 450 test images
CALIB_SAMPLES = 500
# Few training steps: moving statistics must forget their initial (0, 1) quickly.
BN_MOMENTUM = 0.9


def upscale(images: np.ndarray) -> np.ndarray:
    """(N, 8, 8) digits in 0..16 -> (N, 32, 32, 1) float32 in [0, 1], bilinear."""
    import tensorflow as tf

    x = (images.astype(np.float32) / 16.0)[..., None]
    return np.clip(tf.image.resize(x, (SIZE, SIZE), method="bilinear").numpy(), 0.0, 1.0)


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x_train, x_test, y_train, y_test: a stratified 75/25 split, seeded."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = upscale(digits.images)
    labels = digits.target.astype(np.int64)
    return tuple(train_test_split(images, labels, test_size=0.25, random_state=SEED,
                                  stratify=labels))  # type: ignore[return-value]


def build_model():  # noqa: ANN201
    """The mini-Xception (Keras functional model, input `image`, output `probs`)."""
    import keras
    from keras import layers

    def sep_bn(x, width: int, name: str):  # noqa: ANN001, ANN202
        x = layers.SeparableConv2D(width, 3, padding="same", use_bias=False, name=name)(x)
        return layers.BatchNormalization(momentum=BN_MOMENTUM, name=f"{name}_bn")(x)

    inputs = keras.Input(shape=(SIZE, SIZE, 1), name=INPUT_NAME)
    x = layers.Conv2D(WIDTHS[0], 3, strides=2, padding="same", use_bias=False,
                      name="stem")(inputs)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM, name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    # entry flow: the shapes change, so the shortcut is a strided 1x1 conv + BN
    for block, width in enumerate(WIDTHS[1:], start=1):
        shortcut = layers.Conv2D(width, 1, strides=2, padding="same", use_bias=False,
                                 name=f"entry{block}_shortcut")(x)
        shortcut = layers.BatchNormalization(momentum=BN_MOMENTUM,
                                             name=f"entry{block}_shortcut_bn")(shortcut)
        y = x if block == 1 else layers.ReLU(name=f"entry{block}_relu0")(x)
        y = sep_bn(y, width, f"entry{block}_sep1")
        y = layers.ReLU(name=f"entry{block}_relu1")(y)
        y = sep_bn(y, width, f"entry{block}_sep2")
        y = layers.MaxPooling2D(3, strides=2, padding="same", name=f"entry{block}_pool")(y)
        x = layers.Add(name=f"entry{block}_add")([y, shortcut])
    # middle flow: same shapes, identity shortcut
    y = layers.ReLU(name="middle_relu0")(x)
    y = sep_bn(y, WIDTHS[-1], "middle_sep1")
    y = layers.ReLU(name="middle_relu1")(y)
    y = sep_bn(y, WIDTHS[-1], "middle_sep2")
    x = layers.Add(name="middle_add")([y, x])
    x = layers.ReLU(name="exit_relu")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = layers.Dense(10, activation="softmax", name=OUTPUT_NAME)(x)
    return keras.Model(inputs, outputs, name="mini_xception")


def make(out: Path, epochs: int = EPOCHS) -> dict[str, float]:
    """Train, then write out/model.keras and out/data.npz; returns accuracy, params and
    epochs."""
    import keras

    deterministic(SEED)  # seeds, op determinism, one thread: the same weights every run
    x_train, x_test, y_train, y_test = load_data()
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    fit(model, x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    rng = np.random.default_rng(SEED)
    calib = x_train[rng.permutation(len(x_train))[:CALIB_SAMPLES]]
    np.savez(out / "data.npz", x_calib=calib, x_test=x_test, y_test=y_test)
    return {"accuracy": float(accuracy), "params": float(model.count_params()),
            "epochs": epochs}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args()
    print(json.dumps(make(args.out, args.epochs)))
