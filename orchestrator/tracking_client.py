"""The run's MLflow hook: plain messages to the tracking worker (orchestrator.tracking).

The worker starts with the hook, imports MLflow on the other core and logs as messages
arrive; nothing here waits for it until `run_id` (for the report) and `finish`. A worker
that fails is reported as a TrackingError (exit 2) naming the tracking URI: before the flow
when its error is already there (`check`), else at those points, with the stage results of
the run cached for the next one.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError
from orchestrator.tracking import (
    PROBE_ENV,
    default_tracking_uri,
    flatten,
    numeric_values,
    redact,
)

if TYPE_CHECKING:
    from orchestrator.executor import NodeOutcome
    from orchestrator.plan import Node, Plan


class TrackingError(OrchestratorError):
    """MLflow could not record the run (bad MLFLOW_TRACKING_URI, unreachable server...)."""


class TrackingClient:
    """The MLflow hook. `start` before the flow, hooks during, `finish` after."""

    def __init__(self, tracking_uri: str | None = None, root: Path | None = None) -> None:
        self.local_default = tracking_uri is None and not os.environ.get("MLFLOW_TRACKING_URI")
        self.tracking_uri = tracking_uri or default_tracking_uri(root)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.tracking"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, encoding="utf-8",
            # MLflow prints "View run at <tracking URI>", credentials and all
            # its own process group: Ctrl-C for the run must not hit its Python mid start-up
            # (the run decides how tracking ends; a dead run ends its stdin)
            process_group=0,
            env={**os.environ, "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
                 PROBE_ENV: self.tracking_uri})
        self._started = False
        self._run_id: str | None = None
        self._error: str | None = None  # why the worker failed, once known
        self._broken = False  # it stopped reading: what it says last tells why
        self._finished = False
        self._closed = False
        self._lock = threading.Lock()

    # --- the protocol

    def _send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, default=str) + "\n"
        with self._lock:  # hooks may be called from Prefect's task threads
            if self._broken or self._closed or self.process.stdin is None:
                return
            try:
                self.process.stdin.write(line)
                self.process.stdin.flush()
            except OSError:
                self._broken = True

    def _expect(self, op: str) -> dict[str, Any]:
        """The worker's next reply, which must be `op`; TrackingError otherwise."""
        if self._error is None:
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            message = json.loads(line) if line else None
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
        """Raise now if the worker has already failed to start the runs; never waits."""
        assert self.process.stdout is not None
        if self._run_id is None and select.select([self.process.stdout], [], [], 0)[0]:
            self.run_id  # noqa: B018

    # --- the hook

    def start(self, plan: Plan, versions: Mapping[str, str],
              links: Mapping[str, str] | None = None) -> None:
        """Ask for the parent run and one nested run per pipeline, with params."""
        self._started = True
        loaded = plan.recipe
        params = {f"recipe.{k}": v for k, v in flatten(loaded.raw).items()}
        params.update({f"version.{k}": v for k, v in versions.items()})
        self._send({
            "op": "start", "tracking_uri": self.tracking_uri,
            "local_default": self.local_default, "recipe_name": loaded.recipe.name,
            "recipe_path": str(loaded.path), "params": params,
            "pipelines": [{"name": name, "from": loaded.recipe.pipelines[name].from_ or "model",
                           "stages": ", ".join(n.stage for n in nodes)}
                          for name, nodes in plan.pipelines.items()]})

    @property
    def run_id(self) -> str:
        """The parent run's id (waits for the worker, the first time)."""
        if self._run_id is None:
            self._run_id = self._expect("started")["run_id"]
        return self._run_id

    def on_node_end(self, outcome: NodeOutcome) -> None:
        node = outcome.node
        if node.trial is not None:
            return  # guard trials are logged to their own nested runs (log_trial)
        self._send({"op": "node_end", "pipeline": node.pipeline, "stage": node.stage,
                    "index": node.index, "time_ms": int(time.time() * 1000),
                    "metrics": numeric_values(outcome.metrics), "seconds": outcome.seconds})

    def on_node_error(self, node: Node, error: BaseException) -> None:
        self._send({"op": "node_error", "pipeline": node.pipeline, "node_id": node.id})

    def log_trial(self, pipeline: str, trial: Mapping[str, Any]) -> None:
        """A nested run (under the pipeline's run) for one accuracy-guard trial."""
        self._send({"op": "trial", "pipeline": pipeline, "trial": dict(trial)})

    def finish(self, report: Mapping[str, Any] | None, out_dir: Path | None,
               recipe_path: Path, failed: bool = False, register: bool = False) -> None:
        """Log variant metrics, models, the recipe and report.json; close the runs; wait
        for the worker to be done. Once only: later calls repeat its outcome."""
        if self._closed:
            if self._error is not None:
                raise self._failure()
            return
        try:
            self._send({"op": "finish", "report": report, "recipe_path": str(recipe_path),
                        "out_dir": None if out_dir is None else str(out_dir),
                        "failed": failed})
            self.run_id  # noqa: B018  (its reply comes first)
            self._expect("finished")
            self._finished = True
        finally:
            self.close()

    def close(self) -> None:
        """Let the worker go: after `finish` it is done; before it, the end of its input
        makes it mark its runs FAILED, and we wait for that."""
        with self._lock:  # not while a task thread's hook is writing
            if self._closed:
                return
            self._closed = True
            if self.process.stdin is not None and not self.process.stdin.closed:
                try:
                    self.process.stdin.close()
                except OSError:
                    pass
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self._finished:
            return  # it exits on its own
        if not self._started:
            self.process.kill()  # nothing to record: no need to wait for MLflow's import
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
