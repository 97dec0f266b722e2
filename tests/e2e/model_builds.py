"""Train a test model (tests/e2e/models_*.py) seeded in a fresh Python process: its seeds,
op determinism, thread counts and Keras state stay out of the test session.

A build is deterministic: the same weights, bit for bit, on every run (`deterministic`
below; tests/e2e/test_model_builds.py checks it), and with one thread and no oneDNN they do
not depend on the machine's core count either. A test that trains a model therefore sees
one outcome, not a draw.
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


def weights_digest(model_file: Path) -> str:
    """sha256 over a saved .keras model's weight arrays (names, dtypes, shapes, bytes), in
    name order: equal exactly when the weights are (the zip's timestamps do not count)."""
    import zipfile

    import h5py
    import numpy as np

    digest = hashlib.sha256()
    with zipfile.ZipFile(model_file) as archive, \
            h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as weights:
        arrays: list[tuple[str, np.ndarray]] = []
        weights.visititems(lambda name, item: arrays.append((name, item[()]))
                           if isinstance(item, h5py.Dataset) else None)
        for name, array in sorted(arrays, key=lambda pair: pair[0]):
            array = np.ascontiguousarray(array)
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def build(module: str, folder: Path, timeout: float = 600, **make_args: Any
          ) -> dict[str, Any]:
    """`<module>.make(folder, **make_args)` in a subprocess (make_args: Python literals);
    returns the facts it prints as JSON, with `weights_sha256` (weights_digest of the
    model.keras it wrote)."""
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        sys.path.insert(0, {str(HERE)!r})
        import model_builds, {module}
        folder = Path({str(folder)!r})
        facts = {module}.make(folder, **{make_args!r})
        facts["weights_sha256"] = model_builds.weights_digest(folder / "model.keras")
        print(json.dumps(facts))
    """)
    env = {**os.environ, **SINGLE_THREAD_ENV, "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_recipe(work: Path, recipe: str) -> tuple[int, dict[str, Any]]:
    """`orchestrator run` of `recipe` (YAML text, written to work/recipe.yaml) in `work`,
    with its own store and MLflow database as the workspace fixture gives a test, for a
    module-scoped fixture; returns the exit code and report.json."""
    import pytest

    from orchestrator.cli.main import main

    (work / "recipe.yaml").write_text(recipe)
    (work / "mlruns").mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as env:
        env.chdir(work)
        env.setenv("ORCHESTRATOR_HOME", str(work / ".orchestrator"))
        env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlruns' / 'mlflow.db'}")
        code = main(["run", str(work / "recipe.yaml"), "-o", str(work / "out")])
    return code, json.loads((work / "out" / "report.json").read_text())
