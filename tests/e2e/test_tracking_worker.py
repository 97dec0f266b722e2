"""MLflow in its own process (orchestrator.tracking.worker), as runs use it: failures are clear
errors, and runs that fail or die are marked FAILED in MLflow; the same for a worker forked
by a zygote (orchestrator.zygote), which the rest of the suite's runs use."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.engine.plan import build_plan
from orchestrator.recipe.loading import load_recipe
from orchestrator.tracking.client import TrackingClient, TrackingError

pytestmark = pytest.mark.slow


def mlflow_client(workspace: Path):  # noqa: ANN201
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{workspace / 'mlruns' / 'mlflow.db'}")


def test_bad_tracking_uri_exits_2_and_writes_nothing(
        digits_example: Path, workspace: Path, prefect_server: None,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    good_uri = f"sqlite:///{workspace / 'mlruns' / 'mlflow.db'}"
    recipe = workspace / "recipe.yaml"
    recipe.write_text(f"version: 1\nname: tracked\nmodel:\n  path: "
                      f"{digits_example / 'saved_model'}\npipelines:\n  fp32:\n"
                      "    stages: [freeze, strip]\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://user:pa55word@nowhere")
    code = main(["run", str(recipe), "-o", str(workspace / "out")])
    err = capfd.readouterr().err  # the worker's stderr too
    assert code == 2
    assert "MLFLOW_TRACKING_URI" in err and "bogus://***@nowhere" in err
    assert "pa55word" not in err and "Traceback" not in err
    assert not (workspace / "out").exists()

    monkeypatch.setenv("MLFLOW_TRACKING_URI", good_uri)
    # the same run, with a good URI, goes through
    assert main(["run", str(recipe), "-o", str(workspace / "out")]) == 0
    # (stages the failed run got to, before its worker's error arrived, are cache hits now)
    report = json.loads((workspace / "out" / "report.json").read_text())
    assert mlflow_client(workspace).get_run(report["mlflow_run_id"]).info.status == "FINISHED"


def test_failed_stage_marks_the_mlflow_runs_failed(
        digits_example: Path, workspace: Path, prefect_server: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    recipe = workspace / "recipe.yaml"
    recipe.write_text(
        f"version: 1\nname: fails\nmodel:\n  path: {digits_example / 'saved_model'}\n"
        "pipelines:\n  fp32:\n    stages: [freeze, {transform: {transforms: 'no_such'}}]\n")
    assert main(["run", str(recipe), "-o", str(workspace / "out")]) == 3
    client = mlflow_client(workspace)
    experiment = client.get_experiment_by_name("fails")
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    (parent,) = (name for name in runs if name != "fp32")
    assert re.fullmatch(r"fails@\d{8}-\d{6}", parent)  # <recipe>@<UTC time>: not in git
    assert set(runs) == {parent, "fp32"}
    assert {run.info.status for run in runs.values()} == {"FAILED"}
    assert runs["fp32"].data.tags["orchestrator.failed_stage"] == "fp32/1:transform"
    assert runs[parent].data.params["pipeline.fp32"] == "freeze, transform"


def small_plan(digits_example: Path, workspace: Path):  # noqa: ANN201
    recipe = workspace / "recipe.yaml"
    recipe.write_text(f"version: 1\nname: direct\nmodel:\n  path: "
                      f"{digits_example / 'saved_model'}\npipelines:\n  fp32:\n"
                      "    stages: [freeze]\n")
    return build_plan(load_recipe(recipe), None, {})


def _is_forked(client: TrackingClient) -> bool:
    from orchestrator.zygote import ForkedProcess

    return isinstance(client.process, ForkedProcess)


def test_a_worker_that_dies_is_a_tracking_error(digits_example: Path, workspace: Path,
                                                helper_kind: str) -> None:
    client = TrackingClient()
    assert _is_forked(client) == (helper_kind == "forked")
    client.process.send_signal(signal.SIGKILL)  # while it still imports MLflow
    client.start(small_plan(digits_example, workspace), {"orchestrator": "test"})
    with pytest.raises(TrackingError, match="exited with code -9") as caught:
        client.run_id  # noqa: B018
    assert caught.value.exit_code == 2
    with pytest.raises(TrackingError):
        client.finish(None, None, workspace / "recipe.yaml", failed=True)
    assert client.process.poll() is not None


def test_a_run_that_ends_without_finish_leaves_failed_runs(digits_example: Path,
                                                           workspace: Path,
                                                           helper_kind: str) -> None:
    client = TrackingClient()
    assert _is_forked(client) == (helper_kind == "forked")
    client.start(small_plan(digits_example, workspace), {"orchestrator": "test"})
    run_id = client.run_id
    client.close()  # as when the run's process dies: the worker's input ends
    assert client.process.returncode == 0
    mlflow = mlflow_client(workspace)
    parent = mlflow.get_run(run_id)
    assert parent.info.status == "FAILED"
    assert parent.data.params["version.orchestrator"] == "test"
    children = mlflow.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{run_id}'")
    assert [run.info.status for run in children] == ["FAILED"]


def test_a_run_that_fails_before_start_does_not_wait_for_mlflow(workspace: Path,
                                                                helper_kind: str) -> None:
    client = TrackingClient()
    assert _is_forked(client) == (helper_kind == "forked")
    client.close()  # e.g. the model did not load: nothing to record
    assert client.process.returncode == -signal.SIGKILL


def test_a_recipe_that_fails_to_load_ends_the_worker_started_for_it(
        workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.tracking import client as tracking_client

    spawned = []
    spawn = tracking_client._spawn

    def counted(uri: str):  # noqa: ANN202
        spawned.append(spawn(uri))
        return spawned[-1]

    monkeypatch.setattr(tracking_client, "_spawn", counted)
    recipe = workspace / "bad.yaml"
    recipe.write_text("version: 1\nname: bad\nmodel: {path: nowhere}\n")
    database = workspace / "mlruns" / "mlflow.db"  # the workspace's, empty
    before = database.read_bytes()
    assert main(["run", str(recipe)]) == 2
    # started before the recipe was read (MLflow's import beside the rest), then ended
    assert len(spawned) == 1 and spawned[0].poll() is not None
    assert not tracking_client._prestarted
    assert database.read_bytes() == before  # nothing recorded


def test_a_forked_worker_has_the_runs_environment_folder_and_a_group_of_its_own(
        digits_example: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch,
        helper_zygote: str) -> None:
    """What `python -m orchestrator.tracking.worker` would have had: the run's environment
    (not the zygote's, started long before), its working folder, and its own process
    group (a Ctrl-C at the run's terminal is not for it); and it records the run."""
    import os
    import time

    from orchestrator import zygote

    # the worker probes the URI its environment names (PROBE_ENV) before anything else:
    # a closed port, set long after the zygote started, must be the one it reports
    unreachable = TrackingClient(tracking_uri="http://127.0.0.1:9")
    assert _is_forked(unreachable)
    with pytest.raises(TrackingError, match="127.0.0.1:9"):
        unreachable.check()
    unreachable.close()
    client = TrackingClient()
    assert _is_forked(client)
    pid = client.process.pid
    deadline = time.monotonic() + 10
    while os.getpgid(pid) != pid and time.monotonic() < deadline:  # set just after the fork
        time.sleep(0.01)
    assert os.getpgid(pid) == pid != os.getpgid(0)
    client.start(small_plan(digits_example, workspace), {"orchestrator": "test"})
    run_id = client.run_id  # answered: it has taken the run's folder by now
    assert os.readlink(f"/proc/{pid}/cwd") == str(workspace)
    assert client.finish(None, None, workspace / "recipe.yaml") == {}
    assert client.process.wait(timeout=60) == 0  # its status, from the zygote
    assert mlflow_client(workspace).get_run(run_id).info.status == "FINISHED"
    # a socket where no zygote answers: the run starts its worker itself
    monkeypatch.setenv(zygote.SOCKET_ENV, str(workspace / "no-zygote.sock"))
    own = TrackingClient()
    assert not _is_forked(own)
    own.close()


def test_a_finished_forked_worker_left_to_exit_leaks_no_socket(
        digits_example: Path, workspace: Path, helper_zygote: str) -> None:
    """After `finish` the run does not wait for its worker (it exits on its own, and the
    zygote reaps it): dropping the client then closes the connection to the zygote. Its
    ResourceWarning ("unclosed <socket ... helpers.sock>") once surfaced, at a garbage
    collection, inside whichever test ran next."""
    import gc
    import warnings

    client = TrackingClient()
    assert _is_forked(client)
    client.start(small_plan(digits_example, workspace), {"orchestrator": "test"})
    client.finish(None, None, workspace / "recipe.yaml")
    assert client.process.returncode is None  # not waited for
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del client
        gc.collect()
    assert [str(w.message) for w in seen if w.category is ResourceWarning] == []
