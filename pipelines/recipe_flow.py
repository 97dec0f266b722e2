"""`recipe_flow`: a whole recipe run as one Prefect flow, read top to bottom like a recipe.

    validate -> retrain (optional) -> open the session: model and data checked
    -> each pipeline's stages, parents first, one task each -> the accuracy guard
    -> report.json and the models -> MLflow, and the registry when the gates pass

`orchestrator run`, a deployment, a schedule and `orchestrator serve` all run this same
flow. Its tasks receive a node (which names its store keys) and a RunRef, and return small
results: a worker in any process that shares the store can run any of them. The engine
schedules them (orchestrator/engine/scheduler.py); the run's plumbing is in recipe_run.py.

Cache keys are ours (orchestrator/engine/plan.py), so Prefect's own caching is off everywhere.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from orchestrator.flow.prefect_settings import configure_prefect_defaults

configure_prefect_defaults()  # before Prefect reads its settings

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from orchestrator.engine.node_run import NodeOutcome, execute_node  # noqa: E402
from orchestrator.engine.plan import Node  # noqa: E402
from orchestrator.engine.prepared_run import RunRef, open_session  # noqa: E402
from orchestrator.errors import OrchestratorError  # noqa: E402
from orchestrator.flow.deployments import FLOW_NAME  # noqa: E402
from pipelines.recipe_run import (  # noqa: E402
    RecipeRun,
    executor_chosen,
    log_outcome,
    observed_by,
    worker_logs,
)

__all__ = ["recipe_flow", "run", "observed_by"]


def flow_run_name() -> str:
    """`<recipe>@<short commit>` like the MLflow parent run; the file name if the recipe
    cannot be read (the flow then fails with the recipe's own error)."""
    from prefect.runtime import flow_run

    from orchestrator.engine.run_names import run_name
    from orchestrator.recipe.loading import load_recipe

    parameters = flow_run.parameters
    try:
        loaded = load_recipe(parameters["recipe"], parameters.get("overrides") or [])
    except OrchestratorError:
        return Path(str(parameters.get("recipe", "recipe"))).stem
    return run_name(loaded.recipe.name, loaded.path)


@task(name="retrain", cache_policy=NO_CACHE, persist_result=False)
def retrain_task(recipe: str, overrides: list[str], store: str) -> str:
    """The recipe's training function; the new model's path."""
    from orchestrator.engine.retrain import retrain
    from orchestrator.recipe.loading import load_recipe

    return str(retrain(load_recipe(recipe, overrides), Path(store)))


def run_stage(node: Node, ref: RunRef) -> NodeOutcome:
    """One stage: its input model from the store by key, its result to the store."""
    worker_logs()
    outcome = execute_node(node, open_session(ref).data, use_cache=ref.use_cache)
    log_outcome(outcome)
    return outcome


# A task of its own name, not a decorated function: a Dask worker unpickles the task by
# importing `run_stage` from this module, rather than by pickling the function and its
# module's state (contextvars cannot be pickled).
stage_task = task(name="stage", cache_policy=NO_CACHE, persist_result=False)(run_stage)


@flow(name=FLOW_NAME, flow_run_name=flow_run_name, persist_result=False,
      log_prints=False, validate_parameters=True)
def recipe_flow(recipe: str, overrides: list[str] | None = None,
                variants: list[str] | None = None, no_cache: bool = False,
                output: str | None = None, force: bool = False) -> dict[str, Any]:
    """Run the recipe at `recipe` (with `--set` style `overrides`) and return its report.

    Raises OrchestratorError subclasses: exit 2 for bad input (before anything is written),
    3 for a failing stage (the output folder left as it was). `output` defaults to
    out/<recipe name> under the recipe's project root; it is this recipe's folder, whose
    contents the run replaces whole (another recipe's only with `force`: output_folder)."""
    from orchestrator.engine.scheduler import run_plan
    from orchestrator.guard.accuracy_guard import GUARD
    from orchestrator.results import output_folder
    from orchestrator.results.report import build_report

    run = RecipeRun.prepare(recipe, overrides or [], variants, output, force)
    with run.session(no_cache, retrain=retrain_task) as session:
        run.start_tracking(session)
        done = run_plan(session.plan, session.data, run.worker(stage_task), run.notify,
                        guard=GUARD)
        report = build_report(session.plan, session.data, done.outcomes, session.devices,
                              run.shown_variants, run.tracker.run_id, done.guarded)
        # whole, or not at all: written to a hidden folder, recorded in MLflow from there
        # and swapped in (Ctrl-C held from the record to the swap), so that a run that
        # fails or is interrupted (or killed) leaves the folder as it was, and MLflow says
        # it finished only when the folder holds it
        with output_folder.replacing(run.out_dir, run.owner,
                                     record=lambda built: run.record(report, built)) as built:
            output_folder.write_outputs(built, run.out_dir, session.plan, session.data,
                                        done.outcomes, report, picture_cache=run.picture_cache)
    return run.summary(report, run.registry)


def run(recipe: str, *, heartbeats: bool = True, executor: str | None = None,
        dask_address: str | None = None, **parameters: Any) -> dict[str, Any]:
    """Call the flow in this process. `heartbeats=False` for our own local server: it runs
    no background services, so nothing there reads them, and stopping their thread at the
    end of the flow costs up to 1 s. `executor` (local|dask) and `dask_address` win over
    the recipe's `execution:` block; an address nothing answers at is exit 2 before the
    flow starts."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from orchestrator.flow import task_runners
    from orchestrator.recipe.loading import load_recipe

    try:
        loaded = load_recipe(recipe, list(parameters.get("overrides") or []))
    except OrchestratorError:
        loaded = None  # the flow reports it, as for any run
    chosen = task_runners.resolve(loaded, executor, dask_address)
    task_runners.check_address(chosen)
    runner = task_runners.task_runner(chosen)
    the_flow = recipe_flow if runner is None else recipe_flow.with_options(task_runner=runner)

    # A failing stage is reported once, by the CLI, naming pipeline and stage; Prefect's run
    # loggers would print its traceback to the console too. The failure still reaches the
    # Prefect API as the task's Failed state with its message.
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect.task_engine",
                 "prefect.flow_engine"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    with executor_chosen():
        if heartbeats:
            return the_flow(recipe, **parameters)
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            return the_flow(recipe, **parameters)
