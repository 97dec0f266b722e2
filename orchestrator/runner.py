"""`orchestrator run` end to end: validate, pre-flight the model and data, run the Prefect
flow, track in MLflow, write report.json and the artifacts.

Everything a user can get wrong is found before the first stage runs and before anything is
written (exit 2); a stage that fails stops the run with exit 3 and writes no outputs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import DataError, ModelSourceError, OutputError, RecipeError
from orchestrator.executor import NodeOutcome, RunData
from orchestrator.kinds import facts as model_facts
from orchestrator.model import ModelArtifact, TensorSpec
from orchestrator.plan import Plan, build_plan
from orchestrator.recipe import LoadedRecipe
from orchestrator.store import Store, StoredResult

log = logging.getLogger("orchestrator")


@dataclass
class RunResult:
    report: dict[str, Any]
    out_dir: Path
    exit_code: int  # 0, or 1 when some target has no variant within its budgets


def default_store() -> Store:
    return Store(Path(os.path.abspath(os.environ.get("ORCHESTRATOR_HOME") or ".orchestrator")))


def output_dir(loaded: LoadedRecipe, requested: Path | None) -> Path:
    """`-o DIR` (default out/<recipe name>) as an absolute path, not resolved through
    symlinks (a loop is reported by the folder check)."""
    return Path(os.path.abspath(requested or Path("out") / loaded.recipe.name))


def check_folders(out_dir: Path, store: Store, tracking_uri: str | None) -> None:
    """Every folder the run will write to can be written: exit 2 naming it, before the
    run, rather than a failure after every stage has run."""
    from orchestrator.paths import writable_dir_problem
    from orchestrator.tracking import local_tracking_folder

    folders = [(out_dir, "the output folder (-o)"),
               (store.root, "the store (ORCHESTRATOR_HOME)")]
    tracking_folder = local_tracking_folder(tracking_uri)
    if tracking_folder is not None:
        named = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        folders.append((tracking_folder, "MLflow's folder" + (
            " (MLFLOW_TRACKING_URI)" if named else ", ./mlruns")))
    for folder, role in folders:
        problem = writable_dir_problem(folder)
        if problem:
            raise OutputError(f"cannot write to {role}: {problem}", file=str(folder))


def load_source(loaded: LoadedRecipe) -> ModelArtifact:
    """Load the recipe's model source; ModelSourceError located at `model.path`."""
    from orchestrator.sources import load_model

    model = loaded.recipe.model
    inputs = None if model.inputs is None else [
        TensorSpec(name=i.name, dtype=i.dtype,
                   shape=None if i.shape is None else tuple(
                       None if d in (None, -1) else d for d in i.shape))
        for i in model.inputs]
    try:
        artifact = load_model(loaded.resolve(model.path), model.format, inputs, model.outputs)
    except ModelSourceError as exc:
        raise loaded.relocate(exc, ("model", "path")) from exc
    return artifact


def preflight_data(loaded: LoadedRecipe, data: RunData) -> None:
    """Evaluation and representative data must fit the model input (exit 2, nothing run)."""
    recipe = loaded.recipe
    try:
        if recipe.data.evaluation is not None:
            data.evaluation_data  # noqa: B018  (loads and checks shapes)
        if recipe.data.representative is not None:
            from orchestrator.data import source_kind

            source = recipe.data.representative
            if source_kind(source, loaded.base_dir, "data.representative") == "npz":
                for _ in data.representative(None, 1024):  # memory-mapped: a cheap scan
                    pass  # NaN anywhere is found now, not after stages ran
            else:
                next(iter(data.representative(1, 1)), None)
    except DataError as exc:
        role = "evaluation" if "evaluation" in (exc.field or "") else (
            "representative" if "representative" in (exc.field or "") else None)
        loc = tuple((exc.field or f"data.{role}").split(".")) if role else ("data",)
        raise loaded.relocate(exc, loc) from exc


def resolve_devices(loaded: LoadedRecipe) -> dict[str, Any]:
    from orchestrator.devices import resolve_device

    devices = {}
    for index, target in enumerate(loaded.recipe.targets):
        try:
            devices[target.name] = resolve_device(target.device)
        except ValueError as exc:
            raise loaded.error(str(exc), ("targets", index, "device")) from exc
    return devices


def data_fingerprints(loaded: LoadedRecipe) -> dict[str, str]:
    from orchestrator.data import fingerprint

    result = {}
    for role in ("representative", "evaluation"):
        source = getattr(loaded.recipe.data, role)
        if source is not None:
            result[role] = fingerprint(source, loaded.base_dir)
    return result


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("orchestrator", "tensorflow-cpu", "prefect", "mlflow"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def prepare(loaded: LoadedRecipe, variants: list[str] | None, store: Store,
            use_cache: bool = True) -> tuple[Plan, RunData, dict[str, Any]]:
    """Everything that can fail on bad input, before anything is written."""
    for name in variants or []:
        if name not in loaded.recipe.pipelines:
            raise RecipeError(f"--variant {name!r} is not a pipeline of the recipe; pipelines: "
                              f"{', '.join(loaded.recipe.pipelines)}", file=str(loaded.path),
                              field="pipelines")
    devices = resolve_devices(loaded)
    plan = build_plan(loaded, variants, data_fingerprints(loaded))
    key = plan.source_key
    if use_cache and store.has_model(key):  # this exact model file was loaded before
        data = RunData(plan, store, lambda: store.get_model(key))
    else:
        source = load_source(loaded)
        data = RunData(plan, store, lambda: source)
        data.source  # noqa: B018  (resolve it now: a bad model must fail before any write)
    preflight_data(loaded, data)
    return plan, data, devices


def run_recipe(loaded: LoadedRecipe, out_dir: Path | None = None,
               variants: list[str] | None = None, use_cache: bool = True,
               store: Store | None = None, hooks: list[Any] | None = None,
               tracking_uri: str | None = None,
               before_flow: Callable[[], None] | None = None,
               flow_heartbeats: bool = True) -> RunResult:
    """Run a validated recipe. Raises OrchestratorError subclasses for exit codes 2 and 3.

    `before_flow` runs just before the flow starts (the CLI waits there for the Prefect
    server it started); `flow_heartbeats=False` with that server (see flows.run_plan)."""
    from orchestrator import flows
    from orchestrator.report import build_report, discard_outputs, write_outputs
    from orchestrator.tracking_client import TrackingClient, TrackingError

    store = store or default_store()
    out_dir = output_dir(loaded, out_dir)
    check_folders(out_dir, store, tracking_uri)
    # first: the tracking worker imports MLflow on the other core while we load the model
    tracker = TrackingClient(tracking_uri)
    try:
        plan, data, devices = prepare(loaded, variants, store, use_cache)
        if not store.has_model(plan.source_key) or not use_cache:
            store.put(plan.source_key, StoredResult(facts=model_facts(data.source)),
                      data.source, {}, replace=not use_cache)
    except BaseException:
        tracker.close()  # before `start`: it ends without creating any MLflow run
        raise
    try:
        tracker.start(plan, versions())
        all_hooks = [*(hooks or []), tracker]
        from orchestrator.guard import apply_guard

        def guard(name: str, submit: Any, outcomes: dict[str, NodeOutcome]) -> Any:
            return apply_guard(name, plan, data, outcomes, submit, on_trial=tracker.log_trial)

        flows.import_prefect()  # while the CLI's server may still be booting
        if before_flow is not None:
            before_flow()
        tracker.check()  # a tracking URI that fails fails before the flow, when it can
        outcomes, trials = flows.run_plan(plan, data, devices, all_hooks, use_cache=use_cache,
                                          after_pipeline=guard, heartbeats=flow_heartbeats)
        wanted = variants or list(loaded.recipe.pipelines)
        report = build_report(plan, data, outcomes, devices, wanted, tracker.run_id)
        for name, table in trials.items():
            if table is not None and name in report["variants"]:
                report["variants"][name]["trials"] = table
        write_outputs(out_dir, plan, data, outcomes, report)
        tracker.finish(report, out_dir, loaded.path)
    except BaseException as exc:
        # first: a report from an earlier run must not pass for this failed one (CI gates
        # read it), even if recording the failure is interrupted too; its models go with it
        discard_outputs(out_dir)
        try:
            tracker.finish(None, None, loaded.path, failed=True)
        except Exception as tracking_exc:  # noqa: BLE001  (the run's own error is reported)
            if not isinstance(exc, TrackingError):  # else it is that same failure
                log.warning("MLflow could not record the failed run either: %s", tracking_exc)
        raise
    missing = [t for t, v in report["selected"].items() if v is None]
    return RunResult(report=report, out_dir=out_dir, exit_code=1 if missing else 0)
