"""Train a test model (testbed/models_*.py) seeded in a fresh Python process: its seeds,
op determinism, thread counts and Keras state stay out of the test session.

A build is deterministic: the same weights, bit for bit, on every run (`deterministic`
below; tests/e2e/test_model_builds.py checks it), and with one thread and no oneDNN they do
not depend on the machine's core count either. A test that trains a model therefore sees
one outcome, not a draw.

Since it is one outcome, it is kept: the trained weights of each build the suite makes are
committed under benchmarks/testbed/trained/, named by what determines them (the untrained
weights, the training data, the loss, the optimizer and the fit's arguments; `fit` below).
A build whose inputs match loads them instead of training (minutes of one-thread training
saved per model); a changed builder trains, and

    cd benchmarks && python -m testbed.model_builds MODULE [MODULE ...]

trains each module's default build again and commits its weights (delete the file the old
build made). test_model_builds.py still trains, twice, to check determinism.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAINED_ENV = "ORCHESTRATOR_TEST_TRAINED"  # another folder of committed weights (tests)
TRAINED = Path(os.environ.get(TRAINED_ENV) or HERE / "trained")
RECORD_ENV = "ORCHESTRATOR_TEST_RECORD_WEIGHTS"  # set: train, and commit the weights
# One thread for every pool: how TF splits a reduction (a matmul's or a conv's gradient)
# follows its thread count, so the float sums, and so the trained weights, would follow the
# machine's core count. OMP/MKL: numpy's BLAS and anything linked to OpenMP alike.
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                     "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}


def deterministic(seed: int) -> None:
    """What every models_*.make calls first, in a fresh process: Python's, numpy's and TF's
    seeds, op determinism, one intra-op and one inter-op thread, no oneDNN (its kernels
    pick code paths by CPU)."""
    for name, value in {**SINGLE_THREAD_ENV, "TF_ENABLE_ONEDNN_OPTS": "0"}.items():
        os.environ.setdefault(name, value)
    import keras
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError as exc:  # TF already ran ops in this process with its own pools
        raise RuntimeError("build test models in a fresh process (model_builds.build): "
                           f"{exc}") from exc
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def _training_key(model: Any, x: Any, y: Any, fit_args: dict[str, Any]) -> str:
    """sha256 of everything a seeded, deterministic fit's outcome follows from."""
    import numpy as np

    digest = hashlib.sha256()

    def add(value: Any) -> None:
        if isinstance(value, dict):
            for name in sorted(value):
                digest.update(f"{name}:".encode())
                add(value[name])
        elif isinstance(value, (list, tuple)):
            for item in value:
                add(item)
        else:
            array = np.ascontiguousarray(value)
            digest.update(f"{array.dtype.str}|{array.shape}|".encode())
            digest.update(array.tobytes())

    add(model.get_weights())  # the seed and the architecture, as the first step sees them
    add(x)
    add(y)
    digest.update(json.dumps({"loss": str(model.loss), "fit": fit_args,
                              "optimizer": model.optimizer.get_config()},
                             sort_keys=True, default=str).encode())
    return digest.hexdigest()


def fit(model: Any, x: Any, y: Any, **fit_args: Any) -> None:
    """`model.fit(x, y, **fit_args)`, or the weights that fit gave before, where they are
    committed in TRAINED (the module docstring). Every models_*.make trains through it."""
    key = _training_key(model, x, y, fit_args)
    committed = TRAINED / f"{key[:24]}.weights.h5"
    if committed.is_file() and not os.environ.get(RECORD_ENV):
        model.load_weights(committed)
        print(f"model_builds: trained weights from {committed}", file=sys.stderr)
        return
    model.fit(x, y, **fit_args)
    if os.environ.get(RECORD_ENV):
        TRAINED.mkdir(parents=True, exist_ok=True)
        model.save_weights(committed)
        print(f"model_builds: committed {committed.name}", file=sys.stderr)


def weights_digest(model_file: Path) -> str:
    """sha256 over a saved .keras model's weight arrays (names, dtypes, shapes, bytes), in
    name order: equal exactly when the weights are (the zip's timestamps do not count, nor
    the optimizer's state, which a model loaded from committed weights does not have)."""
    import zipfile

    import h5py
    import numpy as np

    digest = hashlib.sha256()
    with zipfile.ZipFile(model_file) as archive, \
            h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as weights:
        arrays: list[tuple[str, np.ndarray]] = []
        weights.visititems(lambda name, item: arrays.append((name, item[()]))
                           if isinstance(item, h5py.Dataset)
                           and not name.startswith("optimizer/") else None)
        for name, array in sorted(arrays, key=lambda pair: pair[0]):
            array = np.ascontiguousarray(array)
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def build(module: str, folder: Path, timeout: float = 600, record: bool = False,
          trained: Path | None = None, **make_args: Any) -> dict[str, Any]:
    """`<module>.make(folder, **make_args)` in a subprocess (make_args: Python literals);
    returns the facts it prints as JSON, with `weights_sha256` (weights_digest of the
    model.keras it wrote) and `weights` ("committed" or "trained"). `record`: train even
    where weights are committed, and commit the new ones (in `trained`, if given, instead
    of TRAINED)."""
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        sys.path.insert(0, {str(HERE.parent)!r})
        from testbed import model_builds, {module}
        folder = Path({str(folder)!r})
        facts = {module}.make(folder, **{make_args!r})
        facts["weights_sha256"] = model_builds.weights_digest(folder / "model.keras")
        print(json.dumps(facts))
    """)
    env = {**os.environ, **SINGLE_THREAD_ENV, "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"}
    env.pop(RECORD_ENV, None)
    env.pop(TRAINED_ENV, None)
    if trained is not None:
        env[TRAINED_ENV] = str(trained)
    if record:
        env[RECORD_ENV] = "1"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    # where the weights came from, for the test's log: a stale commit trains (slowly)
    facts["weights"] = ("committed" if "model_builds: trained weights from" in done.stderr
                        else "trained")
    return dict(facts)


if __name__ == "__main__":
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="Train the default build of each MODULE "
                                     "(models_*.py) and commit its weights in " + str(TRAINED))
    parser.add_argument("modules", nargs="+")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.modules:
            print(name, build(name, Path(scratch) / name, timeout=3600, record=True))
