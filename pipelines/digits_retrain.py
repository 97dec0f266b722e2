"""The example's retrain step: train the digits CNN again with a new seed.

`recipes/digits_nightly.yaml` names it as `retrain.callable`; the recipe flow calls it
first and runs the pipelines on the SavedModel it returns. The data split is the example's
own (examples/digits/make_model.py), so the evaluation data stays unseen.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits" / "make_model.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("digits_make_model", EXAMPLE)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"the digits example is missing: {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def retrain(output_dir: str, seed: int = 1, epochs: int = 15) -> str:
    """Train the digits CNN with `seed` for `epochs`; the SavedModel's path."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    example = _example()
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    x_train, _, y_train, _ = example.load_data()
    model = example.build_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0,
              validation_split=0.1)
    path = Path(output_dir) / "saved_model"
    model.export(str(path), verbose=False)
    return str(path)
