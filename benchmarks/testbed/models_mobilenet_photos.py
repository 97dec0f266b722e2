"""Keras's MobileNetV2 (alpha 0.35, 96x96 RGB, 7 classes) trained here on real photo crops:
a model of the architecture people ship, that nobody here designed (issue 41's fifth model).

`keras.applications.MobileNetV2(alpha=0.35, weights=None)`: nothing is downloaded, the
layers are the package's own (inverted residuals, depthwise 3x3 convolutions, ReLU6, batch
norm, a softmax classifier; about 0.4M params). One change for a short training: batch
norm's moving averages follow each batch with momentum 0.9, not the package's 0.999, which
after a few hundred steps would still hold mostly their initial values (the trained
classifier would answer at chance at inference).

The data are the photo mini-Xception's (models_photo_xception.py: one photo a class, shipped
by scikit-image and scikit-learn), here in colour: each sample a random square window (side
64-256 px) resized to 96x96 RGB, randomly mirrored, with contrast and brightness jitter,
scaled to [-1, 1] as MobileNetV2's preprocessing does. The camera photo is grayscale: its
channel repeated. Train, calibration and test crops come from separate random streams.
Trained briefly, seeded and deterministic (model_builds.deterministic: one thread; a few
minutes on this machine). `make(out)` writes `model.keras` and `data.npz` (x_calib, x_test,
y_test).

    cd benchmarks && python -m testbed.models_mobilenet_photos OUT_DIR [--epochs N]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

from testbed import models_photo_xception as photo_xception  # noqa: E402
from testbed.models_photo_xception import CLASSES  # noqa: E402

SEED = 2041
SIZE = 96
ALPHA = 0.35
BN_MOMENTUM = 0.9
INPUT_NAME = "image"
EPOCHS = 5
TRAIN_PER_CLASS, CALIB_PER_CLASS, TEST_PER_CLASS = 200, 40, 60


def photos() -> list[np.ndarray]:
    """The class photos as float32 RGB in [0, 1], in CLASSES order."""
    return photo_xception.photos(colour=True)


def crops(images: list[np.ndarray], per_class: int, seed: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """(N, 96, 96, 3) float32 in [-1, 1] and (N,) int64 labels, from one random stream."""
    return photo_xception.crops(images, per_class, seed, size=SIZE, sides=(64, 256))


def build_model():  # noqa: ANN201
    """Keras's MobileNetV2 (input `image`, softmax over the classes), batch norm momentum
    BN_MOMENTUM."""
    import keras

    inputs = keras.Input((SIZE, SIZE, 3), name=INPUT_NAME)
    model = keras.applications.MobileNetV2(input_shape=(SIZE, SIZE, 3), alpha=ALPHA,
                                           weights=None, classes=len(CLASSES),
                                           input_tensor=inputs)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = BN_MOMENTUM
    return model


def make(out: Path, epochs: int = EPOCHS) -> dict[str, float]:
    """Train, then write out/model.keras and out/data.npz; returns accuracy, params and
    epochs."""
    made = photo_xception.train_on_crops(
        out, build_model, photos, crops, SEED,
        (TRAIN_PER_CLASS, CALIB_PER_CLASS, TEST_PER_CLASS), epochs, 2e-3)
    return {**made, "chance": 1.0 / len(CLASSES)}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args()
    print(json.dumps(make(args.out, args.epochs)))
