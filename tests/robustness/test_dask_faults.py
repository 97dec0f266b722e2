"""Faults of a Dask run: `kill -9` of a worker process in the middle of a stage.

The test starts its own LocalCluster (2 worker processes of 1 thread, as `execution: dask`
does) and passes its scheduler's address as `--dask-address`, so that it knows the
workers' PIDs. The int8 pipeline reads its representative data from a `module:function`
of the test's recipe folder (quantize_nodes for its bias correction, then log_ranges); on a
Dask worker, the first time, that
function writes its worker's PID to a marker file and waits: the test kills that PID (the
stage is then in the middle of its work, with no timing guessed). Dask then either runs the
stage again on the other worker (the function no longer waits) and the run completes, or
gives up on it: exit 3 naming the stage, no traceback. Either way the re-run succeeds,
computes only what the first run had not stored, and every store entry and every shipped
model loads and gives the float model's answers.

Only the int8 pipeline evaluates (a stage after the killed one): the other variants keep
the other worker busy, and the test runs every shipped model itself (_models_answer).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import dask
import numpy as np
import pytest
from support.project_env import in_project
from support.robust_helpers import ROOT, cache_entries, partial_cache_entries

from orchestrator.cli.main import main

pytestmark = pytest.mark.slow

CALIBRATION = '''"""Representative data that waits, once, inside a Dask worker's stage."""
import os
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def batches():
    x = np.load(HERE.parent / "examples" / "digits" / "data.npz")["x_calib"][:64]
    for start in range(0, len(x), 8):
        if start == 16 and _on_a_dask_worker() and not (HERE / "stage.pid").exists():
            (HERE / "stage.tmp").write_text(str(os.getpid()))
            (HERE / "stage.tmp").rename(HERE / "stage.pid")  # whole, or not there
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:  # until the test kills this process
                time.sleep(0.05)
        yield x[start:start + 8]


def _on_a_dask_worker():
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True
'''

RECIPE = """version: 1
name: killed-worker
model:
  path: ../examples/digits/saved_model
  inputs: [{name: image, dtype: float32, shape: [1, 8, 8, 1]}]
  outputs: [probs]
data:
  representative: {source: "calibration:batches", samples: 64}
  evaluation: {source: ../examples/digits/data.npz, inputs: x_test, labels: y_test}
pipelines:
  float: {stages: [freeze, strip, fold]}
  rounded: {from: float, stages: [{round_weights: {num_steps: 16}}]}
  weights8: {from: float, stages: [quantize_weights]}
  int8:
    from: float
    stages: [quantize_nodes, {log_ranges: {samples: 64}}, freeze_ranges, evaluate]
"""


@pytest.fixture(params=[None, 0], ids=["retried", "no-retry"])
def cluster(request: pytest.FixtureRequest, prefect_api_url: str, tmp_path: Path):  # noqa: ANN201
    """A LocalCluster of 2 worker processes, as `execution: {executor: dask}` starts; with
    Dask's own `allowed-failures` (a stage whose worker died runs again elsewhere), or 0
    (it fails at once: Dask's KilledWorker reaches the run)."""
    import logging

    import dask
    from distributed import Client, LocalCluster

    from orchestrator.flow.task_runners import fork_workers_from_a_warm_server

    fork_workers_from_a_warm_server()  # as the run's task runner does
    settings = {} if request.param is None else {
        "distributed.scheduler.allowed-failures": request.param}

    logging.getLogger("distributed").setLevel(logging.ERROR)  # the kill's noise
    env = {"PREFECT_API_URL": prefect_api_url, "TF_CPP_MIN_LOG_LEVEL": "2",
           "ORCHESTRATOR_MODEL_KEY": os.environ["ORCHESTRATOR_MODEL_KEY"]}
    with dask.config.set(settings), LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},  # as a run's (task_runners.py)
            silence_logs=logging.ERROR, env=env, preload=["orchestrator.flow.dask_preload"]
            ) as local, Client(local) as client:
        yield local, client


def worker_pids(client) -> set[int]:  # noqa: ANN001
    return set(client.run(os.getpid).values())


def kill_when_marked(marker: Path, pids: set[int], killed: list[int]) -> None:
    """Wait for the stage's marker; SIGKILL the worker it names (one of `pids`)."""
    deadline = time.monotonic() + 600
    while not marker.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    pid = int(marker.read_text())
    if pid in pids:
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)


def stages(report: dict) -> dict[str, bool]:
    """`pipeline/stage` -> cached, for every stage of the report."""
    return {f"{name}/{s['name']}": s["cached"] for name, variant in report["variants"].items()
            for s in variant["stages"]}


def test_kill_9_of_a_worker_mid_stage(digits_example: Path, prefect_server: None,
                                      tmp_path: Path, cluster: tuple,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    local, client = cluster
    retried = dask.config.get("distributed.scheduler.allowed-failures") > 0
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "calibration.py").write_text(CALIBRATION)
    recipe = recipes / "killed.yaml"
    recipe.write_text(RECIPE)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    home = tmp_path / ".orchestrator"
    env = {"ORCHESTRATOR_HOME": str(home),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    pids = worker_pids(client)
    assert len(pids) == 2
    # forked by the warm fork server: TensorFlow is there before any stage asks for it
    forked = client.run(lambda: ("tensorflow" in sys.modules, Path(
        f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()))
    assert all(has_tf and "forkserver" in parent for has_tf, parent in forked.values()), forked
    killed: list[int] = []
    killer = threading.Thread(target=kill_when_marked,
                              args=(recipes / "stage.pid", pids, killed), daemon=True)
    killer.start()
    address = local.scheduler_address
    with in_project(tmp_path, env):
        first = main(["run", str(recipe), "-o", str(tmp_path / "first"),
                      "--dask-address", address])
        killer.join(timeout=5)
        first_err = capsys.readouterr().err
        stored_after_first = {e.name for e in cache_entries(home)}
        second = main(["run", str(recipe), "-o", str(tmp_path / "second"),
                       "--dask-address", address])
        second_err = capsys.readouterr().err
    assert killed, f"the stage never reached its marker (exit {first}):\n{first_err[-3000:]}"
    assert killed[0] not in worker_pids(client)  # that process is gone (the nanny replaced it)
    # retried: the stage runs again on the other worker; no retry: it fails, named
    assert first == (0 if retried else 3), first_err[-3000:]
    assert "Traceback" not in first_err, first_err[-3000:]
    if first == 3:  # Dask gave up on the stage: its name, and the worker's death, said
        assert re.search(r"stage int8/(quantize_nodes|log_ranges) failed: the Dask worker "
                         "running it died", first_err), first_err[-3000:]
        assert "distributed.scheduler - " not in first_err  # its log lines: not the news
        assert "worker" in first_err.lower(), first_err[-3000:]
        assert not (tmp_path / "first").exists()  # nothing written
    else:  # completed on the other worker
        report = json.loads((tmp_path / "first" / "report.json").read_text())
        assert not any(stages(report).values())
    print(f"\nkill -9 of worker {killed[0]} mid-stage: first run exit {first}")

    assert second == 0, second_err[-3000:]
    report = json.loads((tmp_path / "second" / "report.json").read_text())
    cached = stages(report)
    store = _store(home)
    # every stage the first run stored is reused, and only those
    reused = {node for node, was_cached in cached.items() if was_cached}
    keys = _stage_keys(recipe)
    assert reused == {node for node, key in keys.items() if key in stored_after_first}
    if first == 0:
        assert all(cached.values()), cached
    print(f"re-run: {len(reused)} of {len(cached)} stages from the cache")

    # nothing corrupt: no partial entry, every entry loads, every shipped model answers
    assert not partial_cache_entries(home)
    for entry in cache_entries(home):
        store.get_result(entry.name)
        if store.has_model(entry.name):
            store.get_model(entry.name)
    _models_answer(tmp_path / "second", report)


def _stage_keys(recipe: Path) -> dict[str, str]:
    """`pipeline/stage` -> its cache key, as the run plans it."""
    from orchestrator.engine.plan import build_plan
    from orchestrator.engine.prepared_run import data_fingerprints
    from orchestrator.recipe.loading import load_recipe

    loaded = load_recipe(recipe)
    plan = build_plan(loaded, None, data_fingerprints(loaded))
    return {f"{node.pipeline}/{node.stage}": node.key for node in plan.nodes}


def _store(home: Path):  # noqa: ANN202
    from orchestrator.cache.store import Store

    return Store(home)


def _models_answer(out: Path, report: dict) -> None:
    """Each variant's shipped graph runs and agrees with the float model on most digits."""
    import tensorflow as tf

    from orchestrator.model.artifact import ModelArtifact

    data = np.load(ROOT / "examples" / "digits" / "data.npz")
    x, y = data["x_test"][:100].astype(np.float32), data["y_test"][:100]
    for name, variant in report["variants"].items():
        model = ModelArtifact.from_bytes((out / variant["artifact"]).read_bytes(),
                                         (out / name / "signature.json").read_text())
        fetch, feed = f"{model.outputs[0]}:0", f"{model.input_names[0]}:0"
        with tf.Graph().as_default() as graph:
            tf.import_graph_def(model.graph_def, name="")
            with tf.compat.v1.Session(graph=graph) as session:
                probs = np.concatenate([session.run(fetch, {feed: x[i:i + 1]})
                                        for i in range(len(x))])
        accuracy = float(np.mean(np.argmax(probs, axis=1) == y))
        assert accuracy > 0.8, (name, accuracy)
