"""MLflow tracking, in a process of its own. tracking/ is the only package that imports
MLflow (a contract in pyproject.toml holds it), and only inside functions: this worker,
registry.py (which it calls at the end of a run, and `promote` and `gate` call), history.py
and common.open_client (which read a store back).

Importing MLflow costs about 1.5 s of CPU, as much as a cached re-run has work. So each run
starts `python -m orchestrator.tracking.worker` first thing (client.TrackingClient), which
imports MLflow on the other core while the run loads the model and runs its flow, and sends
it plain JSON lines, one per event. This worker logs, through MlflowClient with explicit run
ids, into one experiment per recipe:

- a parent run `<recipe>@<commit>` (run_names.run_name; a re-run of the same commit
  `<recipe>@<commit> #2`, run_names.distinct_name) with a short set of params, the
  recipe's description as its note, every pipeline's headline metrics under prefixed keys
  (`int8.size_bytes`), the selection per target as tags (`selected.phone`) and its figures
  as metrics (`selected.phone.accuracy`), the recipe as loaded and report.json as
  artifacts, and, when asked, the Model Registry outcome;
- a nested run per pipeline, named by it: its stages' metrics as they end, its summary and
  model files at the end;
- a nested run per accuracy-guard trial, under its pipeline's run;
- on the experiment, a saved view of its runs table with those key metrics as columns
  (key_metrics_view), which links to the experiment open (experiment_url).

Protocol (one JSON object per line): in on stdin, ops `start`, `node_end`, `node_error`,
`trial`, `finish`; out on the original stdout, `started` (with the run id), `finished` (with
the registry outcome), or `error` (after which the worker stops). Secret-looking keys are
dropped before they leave the run's process (client.py); a worker whose input ends
before `finish` (the run died) marks its runs FAILED.
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.cache.project import local_tracking_folder
from orchestrator.engine.run_names import distinct_name, git_commit, run_name
from orchestrator.redaction import SECRET_WORDS, is_secret_key, redact, redacted
from orchestrator.tracking.common import (
    HTTP_DEFAULTS,
    KEY_METRICS_VIEW,
    KEY_METRICS_VIEW_NAME,
    PROBE_ENV,
    PROBE_TIMEOUT_S,
    REGISTRY_STATUS_TAG,
    SAVED_VIEW_TAG,
    VIEW_QUERY,
    probe,
)

# re-exported: older callers import them from here
__all__ = ["HTTP_DEFAULTS", "PROBE_ENV", "PROBE_TIMEOUT_S", "REGISTRY_STATUS_TAG",
           "git_commit", "is_secret_key", "probe", "redact", "redacted", "run_name"]

_MAX_PARAM = 6000
_MAX_TAG = 8000

# MLflow 3.17's UI shows an experiment as GenAI or classic ML. With its sidebar's workflow
# switch on (the default build), the view follows that switch, remembered per browser
# (localStorage `mlflow.workflowType`, default "genai"), and the URL parameter
# `workflowType=machine_learning` overrides it: links to our experiments carry it
# (experiment_url). Builds without the switch read this experiment tag instead, and MLflow's
# own "experiment type" selector writes it: we set it on every experiment we log to.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
CLASSIC_KIND = "custom_model_development"
CLASSIC_VIEW_QUERY = "workflowType=machine_learning"
NOTE_TAG = "mlflow.note.content"  # the run's (or experiment's) description in the UI

# Per pipeline on its own run, at the end (the report's figures, one column each)
PIPELINE_METRICS = ("size_bytes", "gzip_size_bytes", "params", "flops", "ram_bytes",
                    "accuracy", "accuracy_drop", "fidelity")
LATENCY_METRICS = ("p50", "p90", "mean")
# Per pipeline on the parent run, prefixed with its name: what runs are compared by
PARENT_METRICS = ("size_bytes", "gzip_size_bytes", "accuracy", "accuracy_drop", "fidelity",
                  "latency_p50_ms")
# Per target on the parent run, `selected.<target>.<figure>`: the selected variant's
# figures, the runs table's columns by default (key_metrics_view), whichever variant it is
SELECTED_PREFIX = "selected."
SELECTED_METRICS = ("size_bytes", "latency_p50_ms", "est_latency_ms")
RUN_NAME_COLUMN = "attributes.`Run Name`"  # MLflow 3.17's id of the runs table's column


def artifact_root(tracking_uri: str) -> str | None:
    """Where new experiments keep their artifacts: next to a sqlite database, in
    `<its folder>/artifacts` (`<root>/mlruns/artifacts` for the default store). Else None:
    the tracking server decides. MLflow's own default for sqlite, `./mlruns` under the
    working directory at the time, would scatter them."""
    folder = local_tracking_folder(tracking_uri) if tracking_uri.startswith("sqlite:") else None
    return None if folder is None else (folder / "artifacts").resolve().as_uri()


def experiment_url(ui_url: str, experiment_id: str, key_metrics: bool = True) -> str:
    """The MLflow UI page of an experiment, in the classic (machine learning) view: its runs
    table, with the key metrics as columns (the saved view key_metrics_view; only for an
    experiment that has it: MLflow reports a missing one as an error). Without the query,
    MLflow 3.17 opens the GenAI overview, whatever the tags."""
    view = f"&{VIEW_QUERY}={KEY_METRICS_VIEW}" if key_metrics else ""
    return (f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{CLASSIC_VIEW_QUERY}"
            f"{view}")


def run_url(ui_url: str, experiment_id: str, run_id: str) -> str:
    """The MLflow UI page of one run, in the classic view."""
    return (f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
            f"?{CLASSIC_VIEW_QUERY}")


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


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """{'a': {'b': [1, 2]}} -> {'a.b.0': '1', 'a.b.1': '2'}; secret-looking keys dropped,
    URL credentials redacted."""
    flat: dict[str, str] = {}
    if isinstance(data, Mapping):
        for key, value in data.items():
            if SECRET_WORDS.search(str(key)):
                continue
            flat.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            flat.update(flatten(value, f"{prefix}{index}."))
    else:
        flat[prefix.rstrip(".")] = redact(str(data))[:_MAX_PARAM]
    return flat


def _metric_key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)


def shown_metric(value: float) -> float:
    """A metric as MLflow's UI shows it as it is: 6 significant digits (0.993333, not
    0.9933333333333333); whole numbers (sizes in bytes, counts) exact."""
    value = float(value)
    return value if value.is_integer() or not math.isfinite(value) else float(f"{value:.6g}")


def numeric_values(values: Mapping[str, Any]) -> dict[str, float]:
    """The int and float values of a mapping (not bools, not None), as floats."""
    return {k: float(v) for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def variant_metrics(variant: Mapping[str, Any]) -> dict[str, float]:
    """A report variant's figures as its pipeline run logs them (one column each)."""
    values = numeric_values({k: variant.get(k) for k in PIPELINE_METRICS})
    latency = variant.get("latency_ms") or {}
    values.update(numeric_values({f"latency_{k}_ms": latency.get(k) for k in LATENCY_METRICS}))
    for target, result in (variant.get("targets") or {}).items():
        if result.get("est_latency_ms") is not None:
            values[f"est_latency_ms.{target}"] = float(result["est_latency_ms"])
        values[f"budgets_ok.{target}"] = float(bool(result.get("budgets_ok")))
    values.update(chosen_trial_device_metrics(variant))
    seconds = [s.get("seconds") for s in variant.get("stages") or []]
    values["seconds"] = float(sum(s for s in seconds if isinstance(s, int | float)))
    return values


def chosen_trial_device_metrics(variant: Mapping[str, Any]) -> dict[str, float]:
    """A guarded pipeline's board figures (`device_<figure>.<target>`, as measure_on_device
    made them): where the guard chose a trial, the boards measured its model as a trial's
    stage, which the stage hook does not log (node_end logged the recipe's own model's).
    An unguarded pipeline's were logged as its stage ended: none here."""
    if not variant.get("trials"):
        return {}
    return numeric_values({k: v for k, v in (variant.get("metrics") or {}).items()
                           if k.startswith("device_")})


def parent_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """Every pipeline's headline figures for the parent run: `<pipeline>.<metric>`, and
    `<pipeline>.est_latency_ms.<target>`; per target, its selected variant's figures:
    `selected.<target>.<metric>` (none for a target that selected nothing)."""
    values: dict[str, float] = {}
    variants = report.get("variants") or {}
    for name, variant in variants.items():
        own = variant_metrics(variant)
        for key in PARENT_METRICS:
            if key in own:
                values[f"{name}.{key}"] = own[key]
        for target, result in (variant.get("targets") or {}).items():
            if result.get("est_latency_ms") is not None:
                values[f"{name}.est_latency_ms.{target}"] = float(result["est_latency_ms"])
    quality = _quality_key(report)
    for target, chosen in (report.get("selected") or {}).items():
        if chosen not in variants:
            continue
        own = variant_metrics(variants[chosen])
        for key in (quality, *SELECTED_METRICS):
            figure = own.get(f"est_latency_ms.{target}" if key == "est_latency_ms" else key)
            if figure is not None:
                values[f"{SELECTED_PREFIX}{target}.{key}"] = figure
    return values


def _quality_key(report: Mapping[str, Any]) -> str:
    """accuracy for a recipe with labels, else fidelity (the figure its budgets use)."""
    variants = (report.get("variants") or {}).values()
    return "accuracy" if any(v.get("accuracy") is not None for v in variants) else "fidelity"


def key_metrics_view(report: Mapping[str, Any], created_ms: int, now_ms: int
                     ) -> tuple[str, str]:
    """The experiment tag (key, value) of MLflow's saved view of the runs table that shows,
    per target, the variant selected and its figures (quality, size, estimated and measured
    latency), newest run first. Its format is MLflow 3.17's own (the UI's "Save view"
    writes the same: an envelope whose `state` is the table's settings as JSON; columns
    named `metrics.`<key>``)."""
    quality = _quality_key(report)
    columns: list[str] = []
    for target in report.get("selected") or report.get("targets") or {}:
        columns.append(f"tags.`{SELECTED_PREFIX}{target}`")
        columns += [f"metrics.`{SELECTED_PREFIX}{target}.{key}`"
                    for key in (quality, *SELECTED_METRICS)]
    # wide enough for the whole name (MLflow's 100 px cut them all to "selected.phone…"):
    # the widths apply to the columns the order names, the run's name (and its #N) first
    widths = {RUN_NAME_COLUMN: 240, **{c: 7 * len(c.split("`")[1]) + 30 for c in columns}}
    state = {"selectedColumns": columns, "columnOrder": [RUN_NAME_COLUMN, *columns],
             "columnWidths": widths, "orderByKey": "attributes.start_time",
             "orderByAsc": False}
    envelope = {"name": KEY_METRICS_VIEW_NAME, "createdAt": created_ms, "updatedAt": now_ms,
                "state": json.dumps(state)}
    return f"{SAVED_VIEW_TAG}{KEY_METRICS_VIEW}", json.dumps(envelope)


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class MlflowLogger:
    """Turns the protocol's messages into MLflow calls."""

    def __init__(self, tracking_uri: str) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        with _store_lock(tracking_uri):  # a new store's tables are created on first use
            self.client = MlflowClient(tracking_uri)
            self.client.search_experiments(max_results=1)
        self.parent_run_id: str | None = None
        self.pipeline_runs: dict[str, str] = {}
        self.pipeline_steps: dict[str, int] = {}  # stages per pipeline
        self.experiment_id: str | None = None
        self.commit: str | None = None
        self.run_name: str | None = None

    def _log(self, run_id: str, metrics: Mapping[str, float] | None = None,
             params: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
             step: int = 0, time_ms: int = 0) -> None:
        """log_batch within MLflow's limits per call (1000 metrics, 100 params, 100 tags)."""
        from mlflow.entities import Metric, Param, RunTag

        metric_items = [Metric(_metric_key(k)[:250], shown_metric(v), time_ms, step)
                        for k, v in (metrics or {}).items()]
        param_items = [Param(k[:250], str(v)[:_MAX_PARAM]) for k, v in (params or {}).items()]
        tag_items = [RunTag(k[:250], str(v)[:_MAX_TAG]) for k, v in (tags or {}).items()]
        while metric_items or param_items or tag_items:
            self.client.log_batch(run_id, metrics=metric_items[:1000],
                                  params=param_items[:100], tags=tag_items[:100])
            metric_items, param_items, tag_items = (
                metric_items[1000:], param_items[100:], tag_items[100:])

    def _experiment(self, name: str, description: str | None) -> str:
        """The recipe's experiment, created on first use; shown in the classic view."""
        tags = {EXPERIMENT_KIND_TAG: CLASSIC_KIND}
        if description:
            tags[NOTE_TAG] = description[:_MAX_TAG]
        existing = self.client.get_experiment_by_name(name)
        if existing is None:
            # artifacts next to a sqlite store (else the server decides)
            return self.client.create_experiment(
                name, artifact_location=artifact_root(self.tracking_uri), tags=tags)
        # An experiment keeps the artifact location it was created with (MLflow cannot move
        # it): one created by an older version, or under another project folder, keeps
        # storing there. Delete it (or rename the recipe) to start over under mlruns/.
        for key, value in tags.items():
            if existing.tags.get(key) != value:
                self.client.set_experiment_tag(existing.experiment_id, key, value)
        return existing.experiment_id

    def start(self, message: Mapping[str, Any]) -> str:
        """Create the parent run and one nested run per pipeline; log their params."""
        name = message["recipe_name"]
        recipe_path = Path(message["recipe_path"])
        self.commit = git_commit(recipe_path)
        base = message.get("run_name") or run_name(name, recipe_path, self.commit)
        # the store's tables, the experiment, and a name no other run has: one run at a time
        with _store_lock(self.tracking_uri):
            self.experiment_id = self._experiment(name, message.get("description"))
            self.run_name = distinct_name(base, self._names_like(base))
            parent = self.client.create_run(self.experiment_id, run_name=self.run_name)
        tags = {"orchestrator.recipe": str(recipe_path), "orchestrator.recipe_name": name,
                "mlflow.source.name": str(recipe_path)}
        if self.commit:
            tags["mlflow.source.git.commit"] = self.commit.removesuffix("-dirty")
        if message.get("description"):
            tags[NOTE_TAG] = message["description"]
        for key, value in (message.get("links") or {}).items():
            tags[_metric_key(str(key))] = redact(str(value))  # MLflow's rule for tag names
        self.parent_run_id = parent.info.run_id
        params = {**message["params"], "recipe.git_commit": self.commit or "none"}
        self._log(self.parent_run_id, params=dict(sorted(params.items())), tags=tags)
        for pipeline in message["pipelines"]:
            run = self.client.create_run(
                self.experiment_id, run_name=pipeline["name"],
                tags={"mlflow.parentRunId": self.parent_run_id,
                      "orchestrator.pipeline": pipeline["name"],
                      "orchestrator.recipe_name": name})
            self.pipeline_runs[pipeline["name"]] = run.info.run_id
            self.pipeline_steps[pipeline["name"]] = len(pipeline["stages"].split(", "))
            self._log(run.info.run_id, params={"pipeline": pipeline["name"],
                                               "from": pipeline["from"],
                                               "stages": pipeline["stages"]})
        return self.parent_run_id

    def _names_like(self, base: str) -> list[str]:
        """The names of the experiment's runs that start like `base` (deleted ones too:
        MLflow can restore them)."""
        from mlflow.entities import ViewType

        pattern = base.replace("\\", "\\\\").replace("'", "\\'")
        runs = self.client.search_runs([self.experiment_id],
                                       f"attributes.run_name LIKE '{pattern}%'",
                                       run_view_type=ViewType.ALL, max_results=50000)
        return [run.info.run_name for run in runs]

    def _key_metrics_view(self, report: Mapping[str, Any], now_ms: int) -> None:
        """The experiment's saved view with the key metrics as columns, for the targets and
        quality measure of this run's recipe (created once, then kept up to date)."""
        experiment = self.client.get_experiment(self.experiment_id)
        key = f"{SAVED_VIEW_TAG}{KEY_METRICS_VIEW}"
        try:  # the view as it is (someone may have added columns in the UI: kept)
            existing = json.loads(experiment.tags[key])
            created = int(existing["createdAt"])
            shown = set(json.loads(existing["state"])["selectedColumns"])
        except (KeyError, ValueError, TypeError):  # none yet, or not ours to read
            created, shown = now_ms, set()
        key, value = key_metrics_view(report, created, now_ms)
        if not set(json.loads(json.loads(value)["state"])["selectedColumns"]) <= shown:
            self.client.set_experiment_tag(self.experiment_id, key, value)

    def log_recipe(self, message: Mapping[str, Any]) -> None:
        """The recipe as loaded (--set overrides applied, secrets redacted), as an artifact:
        the params hold only a chosen few of its fields."""
        if self.parent_run_id is None or message.get("recipe_yaml") is None:
            return
        with tempfile.TemporaryDirectory(prefix="orchestrator-recipe-") as folder:
            path = Path(folder) / "recipe.yaml"
            path.write_text(message["recipe_yaml"], encoding="utf-8")
            self.client.log_artifact(self.parent_run_id, str(path), "recipe")

    def node_end(self, message: Mapping[str, Any]) -> None:
        """A stage's metrics on its pipeline's run, stepped by the stage's index."""
        run_id = self.pipeline_runs.get(message["pipeline"])
        if run_id is None:
            return
        stage = message["stage"]
        # a measuring stage's metrics are the pipeline's own (unprefixed, as the report has
        # them; a board's are `device_<figure>.<target>` already); the others are prefixed
        # with their stage (`<stage>.<metric>`)
        prefix = "" if message.get("variant_metrics") else f"{stage}."
        metrics = {f"{prefix}{k}": v for k, v in numeric_values(message["metrics"]).items()}
        self._log(run_id, metrics=metrics, step=message["index"], time_ms=message["time_ms"])

    def node_error(self, message: Mapping[str, Any]) -> None:
        run_id = self.pipeline_runs.get(message["pipeline"])
        if run_id is not None:
            self.client.set_tag(run_id, "orchestrator.failed_stage", message["node_id"])

    def trial(self, message: Mapping[str, Any]) -> None:
        """A nested run (under the pipeline's run) for one accuracy-guard trial."""
        pipeline, trial = message["pipeline"], message["trial"]
        parent = self.pipeline_runs.get(pipeline, self.parent_run_id)
        run = self.client.create_run(
            self.experiment_id, run_name=f"{pipeline}.trial-{trial.get('trial')}",
            tags={"mlflow.parentRunId": parent, "orchestrator.trial": "true",
                  "orchestrator.pipeline": pipeline})
        # one param per setting (a list as one value), not one per list item
        settings = {f"guard.{k}": redact(json.dumps(v, default=str))
                    for k, v in (trial.get("settings") or {}).items()
                    if not SECRET_WORDS.search(str(k))}
        tags = {f"guard.{k}": str(trial[k]) for k in ("change", "quality", "worst_layer")
                if trial.get(k)}  # what the trial changed, and what it measured
        if trial.get("violations"):
            tags["violations"] = "; ".join(map(str, trial["violations"]))
        self._log(run.info.run_id, params=settings, tags=tags,
                  metrics=numeric_values(trial.get("metrics") or {}))
        self.client.set_terminated(run.info.run_id, "FINISHED")

    def finish(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Log the pipelines' figures and model files, the parent's prefixed metrics and
        selection tags, report.json; register the selection when asked; close the runs.
        Returns the registry's outcome ({} when not asked)."""
        if self.parent_run_id is None:
            return {}
        report = message.get("report")
        out_dir = Path(message["out_dir"]) if message.get("out_dir") else None
        failed = bool(message.get("failed"))
        outcome: dict[str, Any] = {}
        now = int(time.time() * 1000)
        if report is not None:
            for name, variant in report.get("variants", {}).items():
                run_id = self.pipeline_runs.get(name)
                if run_id is None:
                    continue
                # a step after the stages': the table shows these (the guard's chosen
                # trial), not the recipe's own benchmark and evaluate logged before
                self._log(run_id, metrics=variant_metrics(variant),
                          step=self.pipeline_steps.get(name, 0), time_ms=now)
                if out_dir is not None and (out_dir / name).is_dir():
                    self.client.log_artifacts(run_id, str(out_dir / name), "model")
            selected = {f"selected.{target}": str(variant or "none")
                        for target, variant in (report.get("selected") or {}).items()}
            self._log(self.parent_run_id, metrics=parent_metrics(report), tags=selected,
                      time_ms=now)
            self._key_metrics_view(report, now)
            if out_dir is not None and (out_dir / "report.json").is_file():
                self.client.log_artifact(self.parent_run_id, str(out_dir / "report.json"))
                for name in report.get("page_files") or []:  # report.html and its PNGs
                    if (out_dir / name).is_file():
                        self.client.log_artifact(self.parent_run_id, str(out_dir / name))
        if message.get("register") and not failed:
            from orchestrator.tracking import registry
            outcome = registry.register(self.client, self.parent_run_id, report, out_dir,
                                        self.commit)
        # an interrupted run (Ctrl-C, SIGTERM) is MLflow's KILLED, not a failure
        self.close("KILLED" if message.get("interrupted") else
                   "FAILED" if failed else "FINISHED")
        return outcome

    def close(self, status: str) -> None:
        for run_id in self.pipeline_runs.values():
            self.client.set_terminated(run_id, status)
        if self.parent_run_id is not None:
            self.client.set_terminated(self.parent_run_id, status)
        self.parent_run_id = None


def handle_messages(inbox: Any, outbox: Any) -> int:
    """The worker loop: one message per line of `inbox`, replies on `outbox`; returns the
    process's exit code."""

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
                logger = MlflowLogger(message["tracking_uri"])
                reply({"op": "started", "run_id": logger.start(message),
                       "run_name": logger.run_name, "experiment_id": logger.experiment_id})
                logger.log_recipe(message)  # while the run works: nothing waits for it
            elif logger is None:
                raise RuntimeError(f"{op!r} before 'start'")
            elif op == "node_end":
                logger.node_end(message)
            elif op == "node_error":
                logger.node_error(message)
            elif op == "trial":
                logger.trial(message)
            elif op == "finish":
                reply({"op": "finished", "registry": logger.finish(message)})
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


def preload() -> None:
    """What a zygote (orchestrator/zygote.py) imports once before it forks workers: MLflow,
    set up as main() sets it up before its import (the logging level is read then)."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    import mlflow.artifacts  # noqa: F401
    import mlflow.entities  # noqa: F401
    import mlflow.tracking  # noqa: F401
    from mlflow.store.tracking import sqlalchemy_store  # noqa: F401

    from orchestrator.tracking import registry  # noqa: F401  (a run's end)


def main() -> int:
    # Ctrl-C reaches the whole process group; the run decides how its tracking ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # MLflow's INFO lines ("Creating initial MLflow database tables...") would land in
    # the middle of the run's progress display: warnings and errors only (MLflow reads
    # this when it is imported; the environment still wins)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # the run and a booting Prefect server come first: MLflow has until the flow ends
    os.nice(10)
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # replies go to the original stdout; anything MLflow prints goes to stderr instead
    outbox = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return handle_messages(sys.stdin, outbox)


if __name__ == "__main__":
    code = main()
    gc.freeze()  # no collector passes over MLflow's heap at exit (see cli.console_main)
    raise SystemExit(code)
