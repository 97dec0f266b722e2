"""warm_up: a run with stages to compute starts TensorFlow's import, the stages' slow setup
and the processes that draw its pictures early; a run with everything cached does neither
(its pictures are drawn already: tests/test_plots.py).

Each case runs in a fresh interpreter, since this test process may have imported TF."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
warm_up.run(loaded, Path(sys.argv[3]), None, True)
print(json.dumps({"tensorflow": "tensorflow" in sys.modules,
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
    assert answer == {"tensorflow": True, "prepared": 6, "drawing": True}
    assert not (tmp_path / "store").exists()  # looking at the store writes nothing


@pytest.mark.usefixtures("digits_example")
def test_everything_cached_imports_no_tensorflow(tmp_path: Path) -> None:
    assert warm("cached", tmp_path / "store") == {"tensorflow": False, "prepared": 0,
                                                  "drawing": False, "matplotlib": False}
