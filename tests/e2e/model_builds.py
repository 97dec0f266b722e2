"""Train a test model (tests/e2e/models_*.py) seeded in a fresh Python process: its seeds,
op determinism and Keras state stay out of the test session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def build(module: str, folder: Path, timeout: float = 600) -> dict[str, Any]:
    """`<module>.make(folder)` in a subprocess; returns the facts it prints as JSON."""
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        sys.path.insert(0, {str(HERE)!r})
        import {module}
        print(json.dumps({module}.make(Path({str(folder)!r}))))
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0",
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_recipe(work: Path, recipe: str) -> tuple[int, dict[str, Any]]:
    """`orchestrator run` of `recipe` (YAML text, written to work/recipe.yaml) in `work`,
    with its own store and MLflow database as the workspace fixture gives a test, for a
    module-scoped fixture; returns the exit code and report.json."""
    import pytest

    from orchestrator.cli import main

    (work / "recipe.yaml").write_text(recipe)
    (work / "mlruns").mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as env:
        env.chdir(work)
        env.setenv("ORCHESTRATOR_HOME", str(work / ".orchestrator"))
        env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlruns' / 'mlflow.db'}")
        code = main(["run", str(work / "recipe.yaml"), "-o", str(work / "out")])
    return code, json.loads((work / "out" / "report.json").read_text())
