"""The run's MLflow hook: plain messages to the tracking worker (orchestrator.tracking.worker).

The worker starts with the hook, imports MLflow on the other core and logs as messages
arrive (this module never imports MLflow: the run's own process does not pay for it);
nothing here waits for it until `run_id` (for the report) and `finish`. A worker
that fails is reported as a TrackingError (exit 2) naming the tracking URI: before the flow
when its error is already there (`check`), else at those points, with the stage results of
the run cached for the next one.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import helper_process, zygote
from orchestrator.cache.project import project_root
from orchestrator.cache.project import tracking_uri as project_tracking_uri
from orchestrator.errors import OrchestratorError
from orchestrator.redaction import is_secret_key, redact, redacted
from orchestrator.tracking.common import PROBE_ENV
from orchestrator.tracking.worker import numeric_values

if TYPE_CHECKING:
    from orchestrator.engine.node_run import NodeOutcome
    from orchestrator.engine.plan import Node, Plan
    from orchestrator.spec.models import Budgets, Target


class TrackingError(OrchestratorError):
    """MLflow could not record the run (bad MLFLOW_TRACKING_URI, unreachable server...)."""


Worker = subprocess.Popen[bytes] | zygote.ForkedProcess
WORKER_MODULE = "orchestrator.tracking.worker"


def _spawn(tracking_uri: str) -> Worker:
    """The worker for a run: forked by the zygote the environment names (orchestrator/
    zygote.py), where one answers, else a process of its own. Either way in a process
    group of its own: Ctrl-C for the run must not hit its Python mid start-up (the run
    decides how tracking ends; a dead run ends its stdin)."""
    # MLflow prints "View run at <tracking URI>", credentials and all
    env = {**os.environ, "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
           PROBE_ENV: tracking_uri}
    return zygote.start_module(WORKER_MODULE, env)


# Workers started ahead of their run, by tracking URI (see prestart).
_prestarted: dict[str, Worker] = {}


def prestart(tracking_uri: str) -> None:
    """Start the tracking worker for `tracking_uri` now: the CLI does, before it imports
    Prefect (a second), so that MLflow's import (1.5 s) runs beside it on the other core.
    The run's TrackingClient for the same URI adopts it; `discard_prestarted` ends one
    that no run adopted."""
    if tracking_uri not in _prestarted:
        _prestarted[tracking_uri] = _spawn(tracking_uri)


def discard_prestarted() -> None:
    """End the workers no run adopted (the run failed before it tracked anything): their
    input ends, and a worker that was not asked to start exits without an MLflow run."""
    while _prestarted:
        _, process = _prestarted.popitem()
        # nothing to record: no need to wait for MLflow's import
        helper_process.stop(process, None)


class TrackingClient:
    """The MLflow hook. `start` before the flow, hooks during, `finish` after."""

    def __init__(self, tracking_uri: str | None = None, root: Path | None = None) -> None:
        """`tracking_uri`, else MLFLOW_TRACKING_URI, else sqlite in `mlruns/` at `root` (the
        recipe's project root; default: the one around the working directory)."""
        self.local_default = tracking_uri is None and not os.environ.get("MLFLOW_TRACKING_URI")
        self.tracking_uri = tracking_uri or project_tracking_uri(root or project_root())
        self.process = _prestarted.pop(self.tracking_uri, None) or _spawn(self.tracking_uri)
        self._channel = helper_process.Helper(self.process)
        self._started = False
        self._run_id: str | None = None
        self.run_name: str | None = None  # the parent run's, once started
        self.experiment_id: str | None = None
        self.registry: dict[str, Any] = {}  # the Model Registry's outcome, after finish
        self._error: str | None = None  # why the worker failed, once known
        self._broken = False  # it stopped reading: what it says last tells why
        self._finished = False
        self._closed = False
        self._lock = threading.Lock()

    # --- the protocol

    def _send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, default=str).encode() + b"\n"
        with self._lock:  # hooks may be called from Prefect's task threads
            if self._broken or self._closed:
                return
            try:
                self._channel.write(line)
            except helper_process.HelperError:
                self._broken = True

    def _expect(self, op: str) -> dict[str, Any]:
        """The worker's next reply, which must be `op`; TrackingError otherwise."""
        if self._error is None:
            try:  # no deadline: MLflow's own (a server's) decide how long it takes
                message = json.loads(self._channel.read_line())
            except helper_process.HelperEnded:
                message = None
            if message is None:
                self._error = f"the tracking worker exited with code {self.process.wait()}"
            elif message.get("op") == op:
                return message
            else:
                self._error = message.get("message") or f"unexpected reply {message!r}"
        raise self._failure()

    def _failure(self) -> TrackingError:
        # MLflow's messages may quote the URI, credentials and all
        return TrackingError(redact(f"MLflow tracking at {self.tracking_uri!r} failed: "
                                    f"{self._error}"), field="MLFLOW_TRACKING_URI")

    def check(self) -> None:
        """Raise now if the worker has failed to start the runs. For a tracking server,
        wait for its answer: a server that fails must fail before any stage runs, and a
        reachable one answers in a moment. A local store never fails that way: no wait,
        MLflow's import goes on beside the stages."""
        remote = self.tracking_uri.startswith(("http://", "https://"))
        if self._run_id is None and (remote or self._channel.ready()):
            self.run_id  # noqa: B018

    # --- the hook

    def start(self, plan: Plan, versions: Mapping[str, str],
              links: Mapping[str, str] | None = None, run_name: str | None = None,
              overrides: list[str] | None = None) -> None:
        """Ask for the parent run and one nested run per pipeline, with their params.

        `links` become tags of the parent run (the Prefect flow run's id and URL);
        `run_name` is the flow's own run name (run_names.run_name), so that both name the
        run alike (else the worker computes it); `overrides` are the --set items."""
        self._started = True
        loaded = plan.recipe
        self._send({
            "op": "start", "tracking_uri": self.tracking_uri,
            "recipe_name": loaded.recipe.name, "recipe_path": str(loaded.path),
            "description": loaded.recipe.description, "run_name": run_name,
            "params": run_params(plan, versions, overrides),
            "recipe_yaml": recipe_yaml(loaded.raw, loaded.path, overrides),
            "links": {k: redact(str(v)) for k, v in (links or {}).items()},
            "pipelines": [{"name": name, "from": loaded.recipe.pipelines[name].from_ or "model",
                           "stages": ", ".join(n.stage for n in nodes)}
                          for name, nodes in plan.pipelines.items()]})

    @property
    def run_id(self) -> str:
        """The parent run's id (waits for the worker, the first time)."""
        if self._run_id is None:
            started = self._expect("started")
            self.run_name, self.experiment_id = started["run_name"], started["experiment_id"]
            self._run_id = started["run_id"]
        return self._run_id

    def on_node_end(self, outcome: NodeOutcome) -> None:
        from orchestrator.stages import get_stage  # (the registry: not on the client's start)

        node = outcome.node
        if node.trial is not None:
            return  # guard trials are logged to their own nested runs (log_trial)
        # the worker is a process of its own: what it needs of the stage travels here
        self._send({"op": "node_end", "pipeline": node.pipeline, "stage": node.stage,
                    "variant_metrics": get_stage(node.stage).variant_metrics,
                    "index": node.index, "time_ms": int(time.time() * 1000),
                    "metrics": numeric_values(outcome.metrics), "seconds": outcome.seconds})

    def on_node_error(self, node: Node, error: BaseException) -> None:
        self._send({"op": "node_error", "pipeline": node.pipeline, "node_id": node.id})

    def log_trial(self, pipeline: str, trial: Mapping[str, Any]) -> None:
        """A nested run (under the pipeline's run) for one accuracy-guard trial."""
        self._send({"op": "trial", "pipeline": pipeline, "trial": dict(trial)})

    on_guard_trial = log_trial  # the flow's hook for each guard trial

    def finish(self, report: Mapping[str, Any] | None, out_dir: Path | None,
               recipe_path: Path, failed: bool = False, register: bool = False,
               interrupted: bool = False) -> dict[str, Any]:
        """Log variant metrics, models and report.json; with `register`, register the
        selection in the Model Registry when every target has a variant; close the runs;
        wait for the worker to be done (`failed`: as FAILED; `interrupted`: as KILLED, which
        `history` shows as interrupted). Returns the registry's outcome:
        {"registered": {"name", "version", "alias"}}, {"refused": why}, or {} when not asked.
        Once only: later calls repeat its outcome."""
        if self._closed:
            if self._error is not None:
                raise self._failure()
            return self.registry
        try:
            self._send({"op": "finish", "report": report, "recipe_path": str(recipe_path),
                        "out_dir": None if out_dir is None else str(out_dir),
                        "failed": failed or interrupted, "interrupted": interrupted,
                        "register": register})
            self.run_id  # noqa: B018  (its reply comes first)
            self.registry = self._expect("finished").get("registry") or {}
            self._finished = True
        finally:
            self.close()
        return self.registry

    def close(self) -> None:
        """Let the worker go: after `finish` it is done; before it, the end of its input
        makes it mark its runs FAILED, and we wait for that."""
        with self._lock:  # not while a task thread's hook is writing
            if self._closed:
                return
            self._closed = True
            helper_process.close_streams(self.process, stdout=False)
        helper_process.close_streams(self.process, stdin=False)
        if self._finished:
            return  # it exits on its own
        # not started: nothing to record, no need to wait for MLflow's import; a Ctrl-C
        # while it records leaves it to finish on its own
        helper_process.stop(self.process, 60 if self._started else None,
                            keep_on_interrupt=True)


# --- what the parent run records of the recipe


def _budgets(budgets: Budgets) -> str:
    set_ = budgets.model_dump(exclude_none=True)
    outputs = set_.pop("outputs", {})  # per output: outputs.<name>.<budget>=<value>
    set_.update({f"outputs.{o}.{k}": v for o, b in outputs.items() for k, v in b.items()})
    return ", ".join(f"{k}={v:g}" for k, v in set_.items()) or "none"


def _device(target: Target) -> str:
    return target.device if isinstance(target.device, str) else f"{target.device.name} (inline)"


def run_params(plan: Plan, versions: Mapping[str, str],
               overrides: list[str] | None = None) -> dict[str, str]:
    """The parent run's params: a chosen few that tell runs apart (the recipe, its model,
    data, targets and budgets, the pipelines' stages, versions), a dozen or two rather than
    every field of the recipe: the whole recipe is an artifact (recipe/recipe.yaml)."""
    loaded = plan.recipe
    recipe = loaded.recipe
    params = {"recipe.name": recipe.name, "recipe.path": str(loaded.path),
              "model.path": recipe.model.path, "model.format": recipe.model.format}
    for role in ("representative", "evaluation"):
        source = getattr(recipe.data, role)
        if source is None:
            continue
        details = [source.array or source.inputs, source.labels and f"labels {source.labels}",
                   source.samples and f"{source.samples} samples",
                   plan.fingerprints.get(role) and f"fingerprint {plan.fingerprints[role][:12]}"]
        params[f"data.{role}"] = source.source + (
            f" ({', '.join(d for d in details if d)})" if any(details) else "")
    params["targets"] = ", ".join(t.name for t in recipe.targets) or "none"
    for target in recipe.targets:
        params[f"target.{target.name}"] = f"{_device(target)}: {_budgets(target.budgets)}"
    params["pipelines"] = ", ".join(plan.pipelines)
    for name, nodes in plan.pipelines.items():
        parent = recipe.pipelines[name].from_
        params[f"pipeline.{name}"] = (f"from {parent}: " if parent else "") + ", ".join(
            n.stage for n in nodes)
    if recipe.tune is not None:
        params["tune"] = (f"enabled={recipe.tune.enabled}, max_trials={recipe.tune.max_trials}, "
                          f"percentiles={'/'.join(f'{p:g}' for p in recipe.tune.percentiles)}")
    if recipe.retrain is not None:
        params["retrain"] = recipe.retrain.callable
    if recipe.schedule is not None:
        params["schedule"] = f"{recipe.schedule.cron} ({recipe.schedule.timezone})"
    params["register"] = str(recipe.register_candidate).lower()
    if overrides:
        params["overrides"] = "; ".join(_redacted_override(o) for o in overrides)
    params.update({f"version.{k}": v for k, v in versions.items()})
    return {k: redact(str(v)) for k, v in params.items()}


def _redacted_override(item: str) -> str:
    key, sep, value = item.partition("=")
    secret = any(is_secret_key(part) for part in key.split("."))
    return f"{key}{sep}***" if secret and sep else item


def recipe_yaml(raw: Mapping[str, Any], path: Path, overrides: list[str] | None = None) -> str:
    """The recipe as loaded (--set overrides applied), secret-looking values redacted."""
    import yaml

    header = [f"# {path}, as loaded", "# secret-looking values are replaced by ***"]
    if overrides:
        header.insert(1, "# with --set " + " --set ".join(_redacted_override(o)
                                                         for o in overrides))
    body = yaml.safe_dump(redacted(dict(raw)), sort_keys=False, allow_unicode=True)
    return "\n".join(header) + "\n" + body
