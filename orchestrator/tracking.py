"""MLflow tracking, in a process of its own: the only module that imports mlflow.

Importing MLflow costs about 1.5 s of CPU, as much as a cached re-run has work. So each run
starts `python -m orchestrator.tracking` first thing (tracking_client.TrackingClient), which
imports MLflow on the other core while the run loads the model and runs its flow, and sends
it plain JSON lines, one per event. This worker logs one parent run per recipe run, one
nested run per pipeline and one per guard trial, through MlflowClient with explicit run ids.

Protocol (one JSON object per line): in on stdin, ops `start`, `node_end`, `node_error`,
`trial`, `finish`; out on the original stdout, `started` (with the run id), `finished`, or
`error` (after which the worker stops). Secret-looking keys are dropped before they leave
the run's process (tracking_client); a worker whose input ends before `finish` (the run
died) marks its runs FAILED.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Keys that look like secrets are never logged, whatever the recipe holds.
_SECRET = re.compile(r"(key|secret|password|passwd|token|credential)", re.IGNORECASE)
_MAX_PARAM = 6000
# The tracking URI the worker checks as soon as it starts (set by tracking_client).
PROBE_ENV = "ORCHESTRATOR_TRACKING_PROBE"


# How long the worker waits to reach an HTTP tracking server before it says it cannot.
PROBE_TIMEOUT_S = 5.0
# MLflow retries a failing request 7 times with doubling back-off (about 250 s against an
# unreachable server); a run says so within seconds instead. The environment still wins.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def local_tracking_folder(tracking_uri: str | None = None) -> Path | None:
    """The local folder a tracking URI writes to (sqlite, file store), else None."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
    if not uri:
        return Path.cwd() / "mlruns"
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///").split("?")[0]).parent
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    if "://" not in uri:
        return Path(uri)
    return None


def probe(tracking_uri: str) -> str | None:
    """Why an HTTP(S) tracking server cannot be reached (within PROBE_TIMEOUT_S), or None."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname, port), timeout=PROBE_TIMEOUT_S):
            return None
    except TimeoutError:
        return f"no answer from {parts.hostname}:{port} within {PROBE_TIMEOUT_S:.0f} s"
    except (OSError, ValueError) as exc:
        return f"cannot connect to {parts.hostname}: {exc}"


@contextmanager
def _store_lock(tracking_uri: str) -> Iterator[None]:
    """Runs that start together on a new sqlite store would each create MLflow's tables
    ("table already exists"): the first creates them while the others wait."""
    folder = local_tracking_folder(tracking_uri) if tracking_uri.startswith("sqlite:") else None
    if folder is None:
        yield
        return
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".orchestrator-init.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def default_tracking_uri(root: Path | None = None) -> str:
    """MLFLOW_TRACKING_URI, else sqlite under ./mlruns (created on demand)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    folder = (root or Path.cwd()) / "mlruns"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(folder / 'mlflow.db').resolve()}"


# user:password@, :token@ or token@ after a scheme; a password may hold '/' (cloud secret
# keys do)
_URL_CREDENTIALS = re.compile(r"(?<=://)(?:[^/@\s:]*:[^@\s]*|[^/@\s:]+)@")


def redact(value: str) -> str:
    """Credentials inside URLs (scheme://user:password@host) become '***@'."""
    return _URL_CREDENTIALS.sub("***@", value)


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """{'a': {'b': [1, 2]}} -> {'a.b.0': '1', 'a.b.1': '2'}; secret-looking keys dropped,
    URL credentials redacted."""
    flat: dict[str, str] = {}
    if isinstance(data, Mapping):
        for key, value in data.items():
            if _SECRET.search(str(key)):
                continue
            flat.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            flat.update(flatten(value, f"{prefix}{index}."))
    else:
        flat[prefix.rstrip(".")] = redact(str(data))[:_MAX_PARAM]
    return flat


def git_commit(path: Path) -> str | None:
    """The commit of the recipe file, with '-dirty' when it has uncommitted changes."""
    try:
        commit = subprocess.run(["git", "-C", str(path.parent), "log", "-n1", "--format=%H",
                                 "--", path.name], capture_output=True, text=True, timeout=10,
                                check=False).stdout.strip()
        if not commit:
            return None
        dirty = subprocess.run(["git", "-C", str(path.parent), "status", "--porcelain", "--",
                                path.name], capture_output=True, text=True, timeout=10,
                               check=False).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _metric_key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)


def numeric_values(values: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


class MlflowLogger:
    """Turns the protocol's messages into MLflow calls."""

    def __init__(self, tracking_uri: str, local_default: bool) -> None:
        from mlflow.tracking import MlflowClient

        # our own default store (not a shared server): artifacts go under mlruns/artifacts
        self.local_default = local_default
        self.tracking_uri = tracking_uri
        with _store_lock(tracking_uri):  # a new store's tables are created on first use
            self.client = MlflowClient(tracking_uri)
            self.client.search_experiments(max_results=1)
        self.parent_run_id: str | None = None
        self.pipeline_runs: dict[str, str] = {}
        self.experiment_id: str | None = None

    def _experiment(self, name: str) -> str:
        existing = self.client.get_experiment_by_name(name)
        if existing is not None:
            return existing.experiment_id
        location = None
        if self.local_default:
            db = Path(self.tracking_uri.removeprefix("sqlite:///"))
            location = (db.parent / "artifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=location)

    def start(self, message: Mapping[str, Any]) -> str:
        """Create the parent run and one nested run per pipeline; log params."""
        from mlflow.entities import Param, RunTag

        name = message["recipe_name"]
        with _store_lock(self.tracking_uri):  # the store's tables and the experiment
            self.experiment_id = self._experiment(name)
        parent = self.client.create_run(self.experiment_id, run_name=name,
                                        tags={"orchestrator.recipe": message["recipe_path"]})
        self.parent_run_id = parent.info.run_id
        params = dict(message["params"])
        commit = git_commit(Path(message["recipe_path"]))
        params["recipe_git_commit"] = commit or "none"
        items = [Param(k[:250], v) for k, v in sorted(params.items())]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.parent_run_id, params=items[start:start + 100])
        for pipeline in message["pipelines"]:
            run = self.client.create_run(
                self.experiment_id, run_name=pipeline["name"],
                tags={"mlflow.parentRunId": self.parent_run_id,
                      "orchestrator.pipeline": pipeline["name"]})
            self.pipeline_runs[pipeline["name"]] = run.info.run_id
            self.client.log_batch(run.info.run_id, params=[
                Param("pipeline", pipeline["name"]), Param("from", pipeline["from"]),
                Param("stages", pipeline["stages"][:_MAX_PARAM])],
                tags=[RunTag("orchestrator.recipe_name", name)])
        return self.parent_run_id

    def node_end(self, message: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        run_id = self.pipeline_runs.get(message["pipeline"])
        if run_id is None:
            return
        stage, step, at = message["stage"], message["index"], message["time_ms"]
        metrics = [Metric(_metric_key(f"{stage}.{k}"), v, at, step)
                   for k, v in numeric_values(message["metrics"]).items()]
        metrics.append(Metric(_metric_key(f"seconds.{stage}"), message["seconds"], at, step))
        self.client.log_batch(run_id, metrics=metrics)

    def node_error(self, message: Mapping[str, Any]) -> None:
        run_id = self.pipeline_runs.get(message["pipeline"])
        if run_id is not None:
            self.client.set_tag(run_id, "orchestrator.failed_stage", message["node_id"])

    def trial(self, message: Mapping[str, Any]) -> None:
        """A nested run (under the pipeline's run) for one accuracy-guard trial."""
        from mlflow.entities import Metric, Param

        pipeline, trial = message["pipeline"], message["trial"]
        parent = self.pipeline_runs.get(pipeline, self.parent_run_id)
        run = self.client.create_run(
            self.experiment_id, run_name=f"{pipeline}-trial-{trial.get('trial')}",
            tags={"mlflow.parentRunId": parent, "orchestrator.trial": "true"})
        settings = flatten(trial.get("settings", {}))
        metrics = numeric_values(trial.get("metrics", {}))
        self.client.log_batch(run.info.run_id,
                              params=[Param(k, v) for k, v in settings.items()],
                              metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()])
        self.client.set_terminated(run.info.run_id, "FINISHED")

    def finish(self, message: Mapping[str, Any]) -> None:
        """Log variant metrics, models, the recipe and report.json; close the runs."""
        from mlflow.entities import Metric

        if self.parent_run_id is None:
            return
        report = message.get("report")
        out_dir = Path(message["out_dir"]) if message.get("out_dir") else None
        status = "FAILED" if message.get("failed") else "FINISHED"
        self.client.log_artifact(self.parent_run_id, message["recipe_path"], "recipe")
        if report is not None:
            for name, variant in report.get("variants", {}).items():
                run_id = self.pipeline_runs.get(name)
                if run_id is None:
                    continue
                values = numeric_values({k: variant.get(k) for k in (
                    "size_bytes", "gzip_size_bytes", "params", "flops", "accuracy",
                    "accuracy_drop", "fidelity")})
                latency = numeric_values(variant.get("latency_ms") or {})
                values.update({f"latency_{k}_ms": v for k, v in latency.items() if k != "count"})
                for target, result in (variant.get("targets") or {}).items():
                    if result.get("est_latency_ms") is not None:
                        values[f"est_latency_ms.{target}"] = float(result["est_latency_ms"])
                    values[f"budgets_ok.{target}"] = float(bool(result.get("budgets_ok")))
                self.client.log_batch(run_id, metrics=[Metric(_metric_key(k), v, 0, 0)
                                                       for k, v in values.items()])
                if out_dir is not None and (out_dir / name).is_dir():
                    self.client.log_artifacts(run_id, str(out_dir / name), "model")
            for target, variant in (report.get("selected") or {}).items():
                self.client.set_tag(self.parent_run_id, f"selected.{target}", str(variant))
            if out_dir is not None and (out_dir / "report.json").is_file():
                self.client.log_artifact(self.parent_run_id, str(out_dir / "report.json"))
        self.close(status)

    def close(self, status: str) -> None:
        for run_id in self.pipeline_runs.values():
            self.client.set_terminated(run_id, status)
        if self.parent_run_id is not None:
            self.client.set_terminated(self.parent_run_id, status)
        self.parent_run_id = None


def serve(inbox: Any, outbox: Any) -> int:
    """The worker loop: one message per line of `inbox`, replies on `outbox`."""

    def reply(message: dict[str, Any]) -> None:
        try:
            outbox.write(json.dumps(message) + "\n")
            outbox.flush()
        except OSError:  # the run is gone and no longer listens
            pass

    logger: MlflowLogger | None = None
    try:
        unreachable = probe(os.environ.get(PROBE_ENV, ""))
        if unreachable:  # say so now: MLflow itself would retry for minutes
            raise ConnectionError(unreachable)
        # now, not at `start`: the run sends that only once its model is loaded
        import mlflow.tracking  # noqa: F401
        from mlflow.store.tracking import sqlalchemy_store  # noqa: F401  (the default store)

        for line in inbox:
            message = json.loads(line)
            op = message["op"]
            if op == "start":
                logger = MlflowLogger(message["tracking_uri"], message["local_default"])
                reply({"op": "started", "run_id": logger.start(message)})
            elif logger is None:
                raise RuntimeError(f"{op!r} before 'start'")
            elif op == "node_end":
                logger.node_end(message)
            elif op == "node_error":
                logger.node_error(message)
            elif op == "trial":
                logger.trial(message)
            elif op == "finish":
                logger.finish(message)
                reply({"op": "finished"})
                return 0
            else:
                raise RuntimeError(f"unknown op {op!r}")
    except Exception as exc:  # noqa: BLE001  (reported to the run, which decides)
        reply({"op": "error", "message": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()})
        if logger is not None:  # runs must not stay RUNNING; this may fail the same way
            try:
                logger.close("FAILED")
            except Exception:  # noqa: BLE001, S110
                pass
        return 1
    if logger is not None:  # the run ended without `finish`: it died
        logger.close("FAILED")
    return 0


def main() -> int:
    # Ctrl-C reaches the whole process group; the run decides how its tracking ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the run and a booting Prefect server come first: MLflow has until the flow ends
    os.nice(10)
    for name, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # replies go to the original stdout; anything MLflow prints goes to stderr instead
    outbox = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin, outbox)


if __name__ == "__main__":
    code = main()
    gc.freeze()  # no collector passes over MLflow's heap at exit (see cli.console_main)
    raise SystemExit(code)
