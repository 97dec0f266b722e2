"""A mini-Xception on real photo crops, 64x64 grayscale, 7 classes: the shape of the
emotion classifiers people ship (issue 17's reproduction model).

The network follows the well-known "mini_XCEPTION" layout: two valid 3x3 Conv2D + BN + ReLU,
then four residual modules (SeparableConv2D + BN + ReLU, SeparableConv2D + BN, MaxPool /2,
added to a strided 1x1 Conv2D + BN shortcut) of 16, 32, 64 and 128 channels, a 3x3 Conv2D to
the classes, global average pooling and a softmax: about 58k params. Inputs are scaled to
[-1, 1] as that family's preprocessing does.

The data are real photos shipped by scikit-image and scikit-learn, one photo a class; each
sample is a random square window (side 48-192 px) resized to 64x64, grayscale, randomly
mirrored, with contrast and brightness jitter. Train, calibration and test crops come from
separate random streams. Trained briefly, seeded and deterministic (about a minute on 2
cores). `make(out)` writes `model.keras` and `data.npz` (x_calib, x_test, y_test).

    cd benchmarks && python -m testbed.models_photo_xception OUT_DIR [--epochs N]
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

from testbed.model_builds import deterministic, fit  # noqa: E402

SEED = 2017
SIZE = 64
WIDTHS = (16, 32, 64, 128)
CLASSES = ("astronaut", "camera", "coffee", "chelsea", "rocket", "china", "flower")
INPUT_NAME = "image"
OUTPUT_NAME = "probs"
EPOCHS = 6
TRAIN_PER_CLASS, CALIB_PER_CLASS, TEST_PER_CLASS = 300, 40, 60


def photos(colour: bool = False) -> list[np.ndarray]:
    """The class photos as float32 in [0, 1], in CLASSES order: grayscale, or RGB (a
    grayscale photo repeated on three channels)."""
    from skimage import data
    from skimage.color import rgb2gray
    from sklearn.datasets import load_sample_images

    sample = dict(zip(("china", "flower"), load_sample_images().images, strict=True))
    images = []
    for name in CLASSES:
        image = sample[name] if name in sample else getattr(data, name)()
        if colour:
            image = image.astype(np.float32) / 255.0
            image = np.repeat(image[..., None], 3, axis=-1) if image.ndim == 2 \
                else image[..., :3]
        else:
            image = rgb2gray(image) if image.ndim == 3 else image.astype(np.float64) / 255.0
        images.append(image.astype(np.float32))
    return images


def crops(images: list[np.ndarray], per_class: int, seed: int, size: int = SIZE,
          sides: tuple[int, int] = (48, 192)) -> tuple[np.ndarray, np.ndarray]:
    """(N, size, size, channels) float32 in [-1, 1] (grayscale photos get one channel) and
    (N,) int64 labels, from one random stream: random squares of `sides` pixels, resized,
    flipped half the time, brightness and contrast jittered."""
    from skimage.transform import resize

    rng = np.random.default_rng(seed)
    x, y = [], []
    for label, image in enumerate(images):
        height, width = image.shape[:2]
        for _ in range(per_class):
            side = int(rng.integers(sides[0], min(sides[1], height, width) + 1))
            top, left = rng.integers(0, height - side + 1), rng.integers(0, width - side + 1)
            window = resize(image[top:top + side, left:left + side], (size, size),
                            anti_aliasing=True)
            if rng.random() < 0.5:
                window = window[:, ::-1]
            window = np.clip(window * rng.uniform(0.7, 1.3) + rng.uniform(-0.15, 0.15), 0, 1)
            x.append(window)
            y.append(label)
    made = np.asarray(x, np.float32)
    if made.ndim == 3:  # grayscale: one channel
        made = made[..., None]
    return (made - 0.5) * 2.0, np.asarray(y, np.int64)


def build_model():  # noqa: ANN201
    """The mini_XCEPTION layout (Keras functional model, input `image`, output `probs`)."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=(SIZE, SIZE, 1), name=INPUT_NAME)
    x = inputs
    for i in (1, 2):
        x = layers.Conv2D(8, 3, use_bias=False, name=f"base_conv{i}")(x)
        x = layers.BatchNormalization(name=f"base_bn{i}")(x)
        x = layers.ReLU(name=f"base_relu{i}")(x)
    for block, width in enumerate(WIDTHS, start=1):
        shortcut = layers.Conv2D(width, 1, strides=2, padding="same", use_bias=False,
                                 name=f"block{block}_shortcut")(x)
        shortcut = layers.BatchNormalization(name=f"block{block}_shortcut_bn")(shortcut)
        x = layers.SeparableConv2D(width, 3, padding="same", use_bias=False,
                                   name=f"block{block}_sep1")(x)
        x = layers.BatchNormalization(name=f"block{block}_sep1_bn")(x)
        x = layers.ReLU(name=f"block{block}_relu")(x)
        x = layers.SeparableConv2D(width, 3, padding="same", use_bias=False,
                                   name=f"block{block}_sep2")(x)
        x = layers.BatchNormalization(name=f"block{block}_sep2_bn")(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same", name=f"block{block}_pool")(x)
        x = layers.Add(name=f"block{block}_add")([x, shortcut])
    x = layers.Conv2D(len(CLASSES), 3, padding="same", name="classes")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = layers.Softmax(name=OUTPUT_NAME)(x)
    return keras.Model(inputs, outputs, name="photo_mini_xception")


def make(out: Path, epochs: int = EPOCHS) -> dict[str, float]:
    """Train, then write out/model.keras and out/data.npz; returns accuracy, params and
    epochs."""
    return train_on_crops(out, build_model, photos, crops, SEED,
                          (TRAIN_PER_CLASS, CALIB_PER_CLASS, TEST_PER_CLASS), epochs, 3e-3)


def train_on_crops(out: Path, build: Callable[[], Any],
                   load_photos: Callable[[], list[np.ndarray]], make_crops: Callable[..., Any],
                   seed: int, per_class: tuple[int, int, int], epochs: int,
                   learning_rate: float) -> dict[str, float]:
    """Train the model `build` makes on `make_crops` of the photos (train, calibration and
    test crops from seeds seed, seed + 1, seed + 2), then write out/model.keras and
    out/data.npz; returns accuracy, params and epochs. Shared by the testbed's photo models;
    everything is made after seeding, in this order, so the weights are the same every
    run."""
    import keras

    deterministic(seed)  # seeds, op determinism, one thread: the same weights every run
    images = load_photos()
    x_train, y_train = make_crops(images, per_class[0], seed)
    x_calib, _ = make_crops(images, per_class[1], seed + 1)
    x_test, y_test = make_crops(images, per_class[2], seed + 2)
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    fit(model, x_train, y_train, epochs=epochs, batch_size=32, shuffle=True, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    np.savez(out / "data.npz", x_calib=x_calib, x_test=x_test, y_test=y_test)
    return {"accuracy": float(accuracy), "params": float(model.count_params()),
            "epochs": epochs}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args()
    print(json.dumps(make(args.out, args.epochs)))
