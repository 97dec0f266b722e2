"""Tracking: run names, the chosen params and metrics, secrets never logged, and a run
in a real MLflow store as a person reads it."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from support.registry_helpers import report, write_outputs, write_project

from orchestrator.cache.project import local_tracking_folder
from orchestrator.engine.node_run import NodeOutcome
from orchestrator.engine.plan import build_plan
from orchestrator.engine.run_names import distinct_name, git_commit, run_name, short_commit
from orchestrator.recipe.loading import load_recipe
from orchestrator.tracking.client import TrackingClient, recipe_yaml, run_params
from orchestrator.tracking.worker import (
    MlflowLogger,
    artifact_root,
    experiment_url,
    flatten,
    key_metrics_view,
    parent_metrics,
    redacted,
    run_url,
    variant_metrics,
)


def test_flatten_nests_dicts_and_lists() -> None:
    flat = flatten({"model": {"path": "m", "inputs": [{"name": "image", "shape": [1, 8]}]},
                    "version": 1})
    assert flat == {"model.path": "m", "model.inputs.0.name": "image",
                    "model.inputs.0.shape.0": "1", "model.inputs.0.shape.1": "8",
                    "version": "1"}


def test_flatten_drops_secret_looking_keys() -> None:
    flat = flatten({"encrypt": {"key": "s3cret", "key_env": "MODEL_KEY", "password": "p"},
                    "api_token": "t", "name": "ok"})
    assert flat == {"name": "ok"}
    assert "s3cret" not in str(flat)


def test_url_credentials_are_redacted() -> None:
    flat = flatten({"model": {"path": "s3://AKIA123:wJalr/xyz@bucket/models/v7"},
                    "data": "https://user:pa55@host/x.npz", "plain": "https://host/x"})
    assert flat["model.path"] == "s3://***@bucket/models/v7"
    assert flat["data"] == "https://***@host/x.npz"
    assert flat["plain"] == "https://host/x"


def test_token_only_url_credentials_are_redacted() -> None:
    from orchestrator.tracking.worker import redact

    assert redact("https://ghp_tok3n@host/x") == "https://***@host/x"
    assert redact("https://:tok3n@host/x") == "https://***@host/x"
    assert redact("postgresql://u:p@db:5432/prefect") == "postgresql://***@db:5432/prefect"
    assert redact("https://host:8080/x") == "https://host:8080/x"


# --- run names


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


def test_run_name_is_the_recipes_short_commit_or_a_utc_timestamp(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\n")
    before = datetime.now(UTC).replace(microsecond=0)
    outside = run_name("digits", recipe)  # not in git
    stamp = datetime.strptime(outside.removeprefix("digits@"), "%Y%m%d-%H%M%S")
    assert before <= stamp.replace(tzinfo=UTC) <= datetime.now(UTC)
    _git(tmp_path, "init", "-q")
    assert run_name("digits", recipe).startswith("digits@2")  # untracked: still no commit
    _git(tmp_path, "add", "r.yaml")
    _git(tmp_path, "commit", "-qm", "recipe")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], text=True,
                          capture_output=True, check=True).stdout.strip()
    assert git_commit(recipe) == head
    assert run_name("digits", recipe) == f"digits@{head[:7]}"
    recipe.write_text("name: r2\n")
    assert run_name("digits", recipe) == f"digits@{head[:7]}-dirty"
    assert short_commit(f"{head}-dirty") == f"{head[:7]}-dirty"
    assert run_name("digits", recipe, commit="0123456789") == "digits@0123456"


def test_a_rerun_gets_the_next_number() -> None:
    assert distinct_name("d@0123456", []) == "d@0123456"
    assert distinct_name("d@0123456", ["d@0123456", "other"]) == "d@0123456 #2"
    # one more than the highest, not the count: a deleted #2 is not given out again
    assert distinct_name("d@0123456", ["d@0123456", "d@0123456 #3"]) == "d@0123456 #4"
    # names that only start alike are not the same run's
    assert distinct_name("d@0123456", ["d@0123456-dirty", "d@01234567", "d@0123456 #x"]
                         ) == "d@0123456"


# --- what a run records: chosen params, the recipe artifact, metrics


def test_params_are_a_chosen_few_and_the_recipe_is_an_artifact(tmp_path: Path,
                                                               digits_example: Path) -> None:
    recipe = write_project(tmp_path, digits_example)
    overrides = ["targets.0.budgets.max_size_mb=0.5", "retrain.params.api_token=0verr1de"]
    loaded = load_recipe(recipe, overrides)
    plan = build_plan(loaded, None, {"representative": "ab" * 32, "evaluation": "cd" * 32})
    params = run_params(plan, {"orchestrator": "0.1.0", "mlflow": "3.17.2"}, overrides)
    assert 12 <= len(params) <= 30
    assert params["recipe.name"] == "digits-test"
    assert params["target.phone"] == (
        "phone-2016: max_size_mb=0.5, max_accuracy_drop=0.01, max_latency_ms=50")
    # compact_names is added by default after the 8-bit stages, and the params say so
    assert params["pipeline.int8"] == ("from fp32: quantize_nodes, log_ranges, freeze_ranges, "
                                       "compact_names, benchmark, evaluate")
    assert params["data.representative"].endswith(
        "data.npz (x_calib, 200 samples, fingerprint abababababab)")
    assert params["retrain"] == "trainer:train" and params["register"] == "true"
    assert params["overrides"] == ("targets.0.budgets.max_size_mb=0.5; "
                                   "retrain.params.api_token=***")
    assert params["version.mlflow"] == "3.17.2"
    assert not any(secret in json.dumps(params) for secret in ("s3cr3t", "0verr1de"))

    text = recipe_yaml(loaded.raw, loaded.path, overrides)
    assert "s3cr3t" not in text and "0verr1de" not in text
    assert "# with --set targets.0.budgets.max_size_mb=0.5 --set " in text
    as_loaded = yaml.safe_load(text)
    assert as_loaded["targets"][0]["budgets"]["max_size_mb"] == 0.5
    assert as_loaded["retrain"]["params"] == {"seed": 7, "api_token": "***"}
    assert as_loaded["pipelines"]["int8"]["from"] == "fp32"


def test_redacted_keeps_key_references_and_hides_secrets() -> None:
    data = {"encrypt": {"key_env": "MODEL_KEY", "key_file": "k.bin", "key": "raw"},
            "password": "p", "url": "https://u:pw@host/x", "list": [{"token": "t"}]}
    assert redacted(data) == {"encrypt": {"key_env": "MODEL_KEY", "key_file": "k.bin",
                                          "key": "***"},
                              "password": "***", "url": "https://***@host/x",
                              "list": [{"token": "***"}]}


def test_metrics_per_pipeline_and_prefixed_on_the_parent() -> None:
    run_report = report()
    int8 = variant_metrics(run_report["variants"]["int8"])
    assert int8["size_bytes"] == 283539 and int8["latency_p50_ms"] == 2.06
    assert int8["est_latency_ms.phone"] == 0.0296 and int8["budgets_ok.phone"] == 1.0
    assert int8["seconds"] == pytest.approx(0.76)
    parent = parent_metrics(run_report)
    assert parent["int8.size_bytes"] == 283539 and parent["fp32.accuracy"] == 0.9933
    assert parent["int8.latency_p50_ms"] == 2.06 and parent["fp32.est_latency_ms.pi"] == 0.2275
    # per target, the selected variant's figures: the runs table's columns
    assert run_report["selected"] == {"phone": "int8", "pi": "int8"}
    for target in ("phone", "pi"):
        assert parent[f"selected.{target}.accuracy"] == int8["accuracy"]
        assert parent[f"selected.{target}.size_bytes"] == 283539
        assert parent[f"selected.{target}.latency_p50_ms"] == 2.06
        assert parent[f"selected.{target}.est_latency_ms"] == int8[f"est_latency_ms.{target}"]
    assert len(parent) == 2 * (6 + 2) + 2 * 4
    # a target that selected nothing has no such figures
    nothing = {**run_report, "selected": {"phone": None, "pi": "int8"}}
    assert not any(key.startswith("selected.phone.") for key in parent_metrics(nothing))


def test_tracking_defaults_to_the_project_root(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "project"
    assert local_tracking_folder(None, root) == root / "mlruns"
    assert artifact_root(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}") == (
        root / "mlruns" / "artifacts").as_uri()
    assert artifact_root("http://tracking:5000") is None
    assert experiment_url("http://127.0.0.1:5000/", "3") == (
        "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning"
        "&viewStateShareKey=orchestrator-key-metrics")
    assert experiment_url("http://127.0.0.1:5000/", "3", key_metrics=False) == (
        "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning")
    # `orchestrator ui` links to the same view (where a run has saved it)
    from orchestrator.cli.ui import mlflow_url

    assert mlflow_url("http://127.0.0.1:5000", "3", key_metrics=True) == (
        experiment_url("http://127.0.0.1:5000/", "3"))
    assert run_url("http://127.0.0.1:5000", "3", "ab12") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/ab12?workflowType=machine_learning")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere' / 'm.db'}")
    assert local_tracking_folder(None, root) == tmp_path / "elsewhere"


# --- the worker, on a real MLflow store


def test_an_mlflow_run_a_person_can_read(tmp_path: Path, digits_example: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # not the project: nothing may land here
    root = tmp_path / "project"
    recipe = write_project(root, digits_example)
    mlruns = root / "mlruns"
    mlruns.mkdir()
    store = MlflowClient(f"sqlite:///{mlruns / 'mlflow.db'}")
    # an experiment from before: created without the kind tag
    store.create_experiment("digits-test", artifact_location=(mlruns / "artifacts").as_uri())

    loaded = load_recipe(recipe, ["targets.0.budgets.max_size_mb=0.5"])
    plan = build_plan(loaded, None, {"representative": "ab" * 32})
    client = TrackingClient(root=root)
    links = {"prefect.flow_run_id": "f-123", "prefect.flow_run_url": "http://x:4200/runs/f-123"}
    client.start(plan, {"orchestrator": "test"}, links=links,
                 overrides=["targets.0.budgets.max_size_mb=0.5"])
    stage_metrics = {"quantize_nodes": {"quantized_ops": 12.0, "quantized_share": 2 / 3},
                     "benchmark": {"latency_p50_ms": 2.0, "flops": 1138364.0},
                     "evaluate": {"accuracy": 0.99, "fidelity": 1.0}}
    for node in plan.nodes:
        client.on_node_end(NodeOutcome(node, False, 0.01,
                                       metrics=stage_metrics.get(node.stage, {})))
    client.log_trial("int8", {"trial": 1, "settings": {"exclude_ops": ["MatMul"],
                                                       "percentile": 1.0},
                              "violations": ["accuracy drop 0.02 > 0.01"],
                              "metrics": {"accuracy": 0.97, "accuracy_drop": 0.02}})
    out = tmp_path / "out"
    written = write_outputs(out, {**report(), "mlflow_run_id": client.run_id})
    assert client.finish(written, out, recipe) == {}
    assert sorted(tmp_path.iterdir()) == [out, root]  # nothing in the working directory

    experiment = store.get_experiment_by_name("digits-test")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert experiment.tags["mlflow.note.content"].startswith("The digits CNN")
    parent = store.get_run(client.run_id)
    assert parent.info.run_name == client.run_name
    assert re.fullmatch(r"digits-test@\d{8}-\d{6}", parent.info.run_name)  # not in git
    assert parent.info.artifact_uri.startswith((mlruns / "artifacts").as_uri())
    tags = parent.data.tags
    assert tags["mlflow.note.content"] == loaded.recipe.description
    assert tags["prefect.flow_run_url"] == "http://x:4200/runs/f-123"
    assert tags["selected.phone"] == "int8" and tags["selected.pi"] == "int8"
    assert len(parent.data.params) <= 30
    assert parent.data.params["recipe.git_commit"] == "none"
    assert not any(k.startswith("recipe.pipelines.") for k in parent.data.params)
    assert set(parent.data.metrics) == set(parent_metrics(written))
    assert parent.data.metrics["int8.size_bytes"] == 283539

    children = store.search_runs([experiment.experiment_id],
                                 f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_name = {run.info.run_name: run for run in children}
    assert set(by_name) == {"fp32", "int8"}
    int8 = by_name["int8"].data
    assert int8.params == {"pipeline": "int8", "from": "fp32", "stages": (
        "quantize_nodes, log_ranges, freeze_ranges, compact_names, benchmark, evaluate")}
    assert int8.metrics["quantize_nodes.quantized_ops"] == 12.0  # a stage's own figure
    # as the UI shows it as stored: 6 significant digits, not 0.6666666666666666
    assert int8.metrics["quantize_nodes.quantized_share"] == 0.666667
    assert int8.metrics["size_bytes"] == 283539 and int8.metrics["latency_p50_ms"] == 2.06
    assert "benchmark.latency_p50_ms" not in int8.metrics  # measured: the pipeline's own
    (trial,) = store.search_runs([experiment.experiment_id],
                                 f"tags.mlflow.parentRunId = '{by_name['int8'].info.run_id}'")
    assert trial.info.run_name == "int8.trial-1"
    assert trial.data.params == {"guard.exclude_ops": '["MatMul"]', "guard.percentile": "1.0"}
    assert trial.data.tags["violations"] == "accuracy drop 0.02 > 0.01"
    assert {a.path for a in store.list_artifacts(by_name["int8"].info.run_id, "model")} == {
        "model/model.pb", "model/signature.json", "model/ops"}

    assert {a.path for a in store.list_artifacts(parent.info.run_id)} == {
        "recipe", "report.json"}
    local = Path(store.download_artifacts(parent.info.run_id, "recipe/recipe.yaml",
                                          str(tmp_path / "dl")))
    text = local.read_text()
    assert "s3cr3t" not in text
    assert yaml.safe_load(text)["targets"][0]["budgets"]["max_size_mb"] == 0.5
    for run in [parent, *children, trial]:
        assert "s3cr3t" not in json.dumps([run.data.params, run.data.tags])


def _view_columns(tags: dict[str, str]) -> list[str]:
    """The columns MLflow's saved view `orchestrator-key-metrics` shows, read as MLflow
    3.17's UI reads a saved view: an envelope with a name, a createdAt number and a state
    string, the state holding selectedColumns."""
    envelope = json.loads(tags["mlflow.sharedViewState.orchestrator-key-metrics"])
    assert isinstance(envelope["name"], str) and envelope["name"]
    assert isinstance(envelope["createdAt"], int) and isinstance(envelope["state"], str)
    state = json.loads(envelope["state"])
    assert state["orderByKey"] == "attributes.start_time" and state["orderByAsc"] is False
    # each column wide enough for its name, the run's name (with its #N) first
    assert state["columnOrder"] == ["attributes.`Run Name`", *state["selectedColumns"]]
    for column in state["columnOrder"]:
        assert state["columnWidths"][column] >= 7 * len(column.split("`")[1]), column
    return state["selectedColumns"]


def test_reruns_get_distinct_names_and_the_table_shows_key_metrics(tmp_path: Path) -> None:
    """Two runs of one recipe at one commit in a real MLflow store: named apart; the
    experiment's saved view names columns the parent runs have."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    message = {"recipe_name": "digits-test", "recipe_path": str(tmp_path / "r.yaml"),
               "run_name": "digits-test@0123456", "params": {"recipe.name": "digits-test"},
               "pipelines": [{"name": "fp32", "from": "model", "stages": "freeze, benchmark"},
                             {"name": "int8", "from": "fp32", "stages": "quantize_nodes"}]}
    names, parents = [], []
    for _ in range(3):
        logger = MlflowLogger(uri)
        parents.append(logger.start(message))
        names.append(logger.run_name)
        logger.finish({"report": report()})
    assert names == ["digits-test@0123456", "digits-test@0123456 #2",
                     "digits-test@0123456 #3"]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("digits-test")
    columns = _view_columns(experiment.tags)
    # a column added in the UI (and saved over the view) stays
    view = "mlflow.sharedViewState.orchestrator-key-metrics"
    edited = json.loads(experiment.tags[view])
    edited["state"] = json.dumps({"selectedColumns": [*columns, "metrics.`int8.accuracy`"],
                                  "orderByKey": "attributes.start_time", "orderByAsc": False})
    client.set_experiment_tag(experiment.experiment_id, view, json.dumps(edited))
    client.delete_run(parents[2])  # deleted, restorable: its number stays taken
    logger = MlflowLogger(uri)
    logger.start(message)
    assert logger.run_name == "digits-test@0123456 #4"
    logger.finish({"report": report()})
    assert client.get_experiment_by_name("digits-test").tags[view] == json.dumps(edited)

    parent = client.get_run(parents[1])
    assert columns == [f"{kind}.`selected.{target}{key}`" for target in ("phone", "pi")
                       for kind, key in [("tags", ""), ("metrics", ".accuracy"),
                                         ("metrics", ".size_bytes"),
                                         ("metrics", ".latency_p50_ms"),
                                         ("metrics", ".est_latency_ms")]]
    for column in columns:  # each column is a figure every finished parent run has
        kind, key = column.split(".", 1)
        assert key.strip("`") in getattr(parent.data, kind), column
    assert parent.data.metrics["selected.phone.size_bytes"] == 283539


def test_the_saved_view_follows_the_recipes_quality_measure() -> None:
    key, value = key_metrics_view(report(), 1000, 2000)
    assert key == "mlflow.sharedViewState.orchestrator-key-metrics"
    envelope = json.loads(value)
    assert (envelope["createdAt"], envelope["updatedAt"]) == (1000, 2000)
    unlabelled = report()
    for variant in unlabelled["variants"].values():
        variant["accuracy"] = None
    columns = _view_columns({key: key_metrics_view(unlabelled, 1, 1)[1]})
    assert "metrics.`selected.phone.fidelity`" in columns
    assert not any("accuracy" in column for column in columns)


def test_one_open_client_for_history_and_registry(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """tracking.common.open_client, which history and the registry both call with their own
    error: a missing local store is that caller's message and is not created; an
    unreachable server names the URI, credentials hidden; a reachable store gets a client
    with MLflow's retries bounded and its progress bars off, the environment winning."""
    import socket

    from orchestrator.errors import OrchestratorError
    from orchestrator.tracking.common import open_client
    from orchestrator.tracking.history import HistoryError
    from orchestrator.tracking.registry import RegistryError

    database = tmp_path / "mlruns" / "mlflow.db"
    with pytest.raises(OrchestratorError, match=re.escape(f"none at {database}")):
        open_client(f"sqlite:///{database}", HistoryError,
                    lambda path: OrchestratorError(f"none at {path}"))
    assert not database.parent.exists()
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(RegistryError, match=re.escape(
            f"MLflow tracking at 'http://***@127.0.0.1:{port}' is unreachable")) as caught:
        open_client(f"http://user:pa55@127.0.0.1:{port}", RegistryError, RegistryError)
    assert caught.value.exit_code == 2 and "pa55" not in str(caught.value)
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR",
                 "MLFLOW_LOGGING_LEVEL"):  # unset, and unset again after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")
    database.parent.mkdir()
    database.touch()
    client = open_client(f"sqlite:///{database}", HistoryError, HistoryError)
    assert client.tracking_uri == f"sqlite:///{database}"
    import os

    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
