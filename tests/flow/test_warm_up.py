"""warm_up: a run with stages to compute starts TensorFlow's import, the stages' slow setup
and the processes that draw its pictures early; a run with everything cached does neither
(its pictures are drawn already: tests/results/test_plots.py).

Each case runs in a fresh interpreter, since this test process may have imported TF."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from pathlib import Path
from orchestrator.measure import load_probe
from orchestrator.flow import warm_up
from orchestrator.recipe.loading import load_recipe
from orchestrator.cache.store import Store
from orchestrator.results import plots

started = []
load_probe.start = lambda: started.append("probe")  # count the hooks, start no process
plots.start_drawing = lambda: started.append("drawing")  # likewise
if sys.argv[2] == "cached":
    Store.has = Store.has_model = lambda self, key: True
loaded = load_recipe(sys.argv[1])
warm_up.run(warm_up.plan_first(loaded, None), Path(sys.argv[3]), True)
print(json.dumps({"tensorflow": "tensorflow" in sys.modules,
                  "keras": "keras.src.optimizers" in sys.modules,
                  "prepared": started.count("probe"), "drawing": "drawing" in started,
                  "matplotlib": "matplotlib" in sys.modules}))
"""


def warm(case: str, store: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "recipes" / "digits.yaml"),
                           case, str(store)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.usefixtures("digits_example")
def test_stages_to_compute_import_tensorflow_and_prepare(tmp_path: Path) -> None:
    answer = warm("empty", tmp_path / "store")
    # the digits recipe: 5 benchmarks measure memory and the mobile memmap its loads
    # and the process that draws half the pictures (matplotlib: TF's Keras imports it)
    answer.pop("matplotlib")
    # TensorFlow without the Keras it loads eagerly (tf_adapter.import_tensorflow)
    assert answer == {"tensorflow": True, "keras": False, "prepared": 6, "drawing": True}
    assert not (tmp_path / "store").exists()  # looking at the store writes nothing


@pytest.mark.usefixtures("digits_example")
def test_everything_cached_imports_no_tensorflow(tmp_path: Path) -> None:
    assert warm("cached", tmp_path / "store") == {"tensorflow": False, "keras": False,
                                                  "prepared": 0, "drawing": False,
                                                  "matplotlib": False}


BAD_KEY = """
import sys
from orchestrator.cli.main import main
code = main(["run", sys.argv[1], "-o", sys.argv[2]])
print("tensorflow" in sys.modules, "prefect" in sys.modules, code)
"""


@pytest.mark.usefixtures("digits_example")
def test_a_missing_model_key_is_exit_2_before_any_import_or_server(tmp_path: Path) -> None:
    """The plan is built before the Prefect server and TensorFlow: a recipe whose encrypt
    stage finds no key gets its error (file, line, stage) without their seconds of start."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORCHESTRATOR_MODEL_KEY", "PREFECT_API_URL")}
    env.update(PYTHONPATH=str(ROOT), ORCHESTRATOR_HOME=str(tmp_path / "home"),
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    done = subprocess.run([sys.executable, "-c", BAD_KEY, str(ROOT / "recipes" / "digits.yaml"),
                           str(tmp_path / "out")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert done.stdout.split() == ["False", "False", "2"], done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[0]
    assert line.startswith(f"error: {ROOT / 'recipes' / 'digits.yaml'}:") and \
        "[pipelines.mobile.stages." in line and "no model key" in line, done.stderr
    assert "Traceback" not in done.stderr and "Prefect server" not in done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "home" / "prefect").exists()


KERAS_AFTER = """
import sys
import numpy as np
if sys.argv[3] == "ours":
    from orchestrator.model.tf_adapter import import_tensorflow
    import_tensorflow()
else:
    import tensorflow
before = "keras.src.optimizers" in sys.modules
import keras
model = keras.saving.load_model(sys.argv[1])
with np.load(sys.argv[2]) as data:
    probs = model.predict(data["x_test"][:64], verbose=0)
print(before, "keras.src.optimizers" in sys.modules, probs.astype(np.float64).sum())
"""


def test_tensorflow_without_its_eager_keras_still_loads_keras_models(
        digits_example: Path) -> None:
    """import_tensorflow leaves out the Keras modules TensorFlow loads eagerly (half its
    import); a Keras model loaded after it loads them itself and predicts as in a process
    that imported TensorFlow plainly."""
    answers = {}
    for how in ("ours", "plain"):
        done = subprocess.run([sys.executable, "-c", KERAS_AFTER,
                               str(digits_example / "model.keras"),
                               str(digits_example / "data.npz"), how],
                              capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, "PYTHONPATH": str(ROOT),
                                   "TF_CPP_MIN_LOG_LEVEL": "2"}, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-2000:]
        answers[how] = done.stdout.split()
    assert answers["ours"][:2] == ["False", "True"]
    assert answers["plain"][:2] == ["True", "True"]
    assert float(answers["ours"][2]) == pytest.approx(float(answers["plain"][2]), abs=1e-9)
