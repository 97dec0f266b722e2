"""Train the example model: a small CNN on scikit-learn's 8x8 handwritten digits.

Writes, next to this file (or to --out):
- saved_model/  (TF2 SavedModel, signature serving_default: image -> probs)
- model.keras   (the same model, Keras v3 format)
- data.npz      x_calib (representative, from the training split), x_test, y_test

Seeded and fast: about 20 s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# Keras' training input pipeline makes TF's C++ log a harmless error (an attribute its op
# registry lacks, "use_unbounded_threadpool") on every run: the example shows none of it
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

SEED = 1234


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0)[..., None]  # (1797, 8, 8, 1) in [0, 1]
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.25, random_state=SEED, stratify=labels)
    return x_train, x_test, y_train, y_test


def build_model():  # noqa: ANN201
    import keras
    from keras import layers

    inputs = keras.Input(shape=(8, 8, 1), name="image")
    x = layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv1")(inputs)
    x = layers.BatchNormalization(name="bn1")(x)
    x = layers.ReLU(name="relu1")(x)
    x = layers.Conv2D(32, 3, padding="same", name="conv2")(x)
    x = layers.BatchNormalization(name="bn2")(x)
    x = layers.ReLU(name="relu2")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(128, name="dense1")(x)
    x = layers.BatchNormalization(name="bn3")(x)
    x = layers.ReLU(name="relu3")(x)
    outputs = layers.Dense(10, activation="softmax", name="probs")(x)
    return keras.Model(inputs, outputs, name="digits_cnn")


def params_text(model) -> str:  # noqa: ANN001
    """What Keras counts, said as such: count_params() includes batch norm's moving mean
    and variance (not trained) and counts before freezing; orchestrator's `params` counts
    the constants of the shipped file, after `fold` merges batch norm into the weights."""
    total = model.count_params()
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    return (f"{total:,} Keras parameters ({trainable:,} trainable + {total - trainable:,} "
            "batch-norm moving statistics; the report's params count the shipped file's "
            "constants after batch norm is folded)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--epochs", type=int, default=15)
    args = parser.parse_args(argv)

    import keras
    import tensorflow as tf

    # the same weights on every machine: seeds, deterministic kernels, and one thread (TF's
    # reductions split by thread count, so 2 and 4 cores would train different models)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    x_train, x_test, y_train, y_test = load_data()
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=args.epochs, batch_size=32, verbose=0,
              validation_split=0.1)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)

    args.out.mkdir(parents=True, exist_ok=True)
    model.save(args.out / "model.keras")
    model.export(str(args.out / "saved_model"), verbose=False)
    rng = np.random.default_rng(SEED)
    calib = x_train[rng.permutation(len(x_train))[:1000]]
    np.savez(args.out / "data.npz", x_calib=calib, x_test=x_test, y_test=y_test)
    print(f"digits CNN: test accuracy {accuracy:.4f}, {params_text(model)}; "
          f"wrote {args.out}/saved_model, model.keras, data.npz")


if __name__ == "__main__":
    main()
