"""`recipe_flow`: a whole recipe run as one Prefect flow, read top to bottom like a recipe.

    validate -> retrain (optional) -> open the session: model and data checked
    -> each pipeline's stages, parents first, one task each -> the accuracy guard
    -> report.json and the models -> MLflow, and the registry when the gates pass

`orchestrator run`, a deployment, a schedule and `orchestrator serve` all run this same
flow. Its tasks receive a node (which names its store keys) and a RunRef, and return small
results: a worker in any process that shares the store can run any of them.

Cache keys are ours (orchestrator/engine/plan.py), so Prefect's own caching is off everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from orchestrator.flow.prefect_settings import configure_prefect_defaults

configure_prefect_defaults()  # before Prefect reads its settings

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from orchestrator.engine.node_run import NodeOutcome, execute_node  # noqa: E402
from orchestrator.engine.plan import Node  # noqa: E402
from orchestrator.engine.prepared_run import RunRef, close_session, open_session  # noqa: E402
from orchestrator.errors import OrchestratorError  # noqa: E402
from orchestrator.flow.deployments import FLOW_NAME  # noqa: E402
from orchestrator.redaction import redact  # noqa: E402

log = logging.getLogger("orchestrator")

# Observers of the run in this process (the CLI's progress display): methods
# on_node_start(node), on_node_end(outcome), on_node_error(node, error), all optional.
_observers: ContextVar[tuple[Any, ...]] = ContextVar("orchestrator_observers", default=())


@contextmanager
def observed_by(*observers: Any) -> Iterator[None]:
    """Let `observers` watch the flows this thread runs inside the block."""
    token = _observers.set((*_observers.get(), *observers))
    try:
        yield
    finally:
        _observers.reset(token)


def current_observers() -> tuple[Any, ...]:
    """The observers of this thread's flows. (The flow's body reads them through this
    function: a Dask task runner pickles the flow's function by value, and a ContextVar it
    named directly cannot be pickled.)"""
    return _observers.get()


def _notify(hooks: Sequence[Any], method: str, *args: Any) -> None:
    for hook in hooks:
        fn = getattr(hook, method, None)
        if fn is not None:
            fn(*args)


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
    _worker_logs()
    outcome = execute_node(node, open_session(ref).data, use_cache=ref.use_cache)
    _log_outcome(outcome)
    return outcome


def _worker_logs() -> None:
    """In a process that did not start the flow (a Dask worker), our log lines go to the
    Prefect task run's logs only, as the flow process sends them, and not to the worker's
    console."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger("orchestrator")
    if not any(isinstance(h, APILogHandler) for h in logger.handlers) and logger.propagate:
        logger.addHandler(APILogHandler(level=logging.INFO))
        logger.setLevel(logging.INFO)
        logger.propagate = False


# A task of its own name, not a decorated function: a Dask worker unpickles the task by
# importing `run_stage` from this module, rather than by pickling the function and its
# module's state (contextvars cannot be pickled).
stage_task = task(name="stage", cache_policy=NO_CACHE, persist_result=False)(run_stage)


# The console shows these through the progress display already: Prefect's logs only.
NOT_ON_CONSOLE = {"console": False}


def _log_outcome(outcome: NodeOutcome) -> None:
    """The stage's lines in the task run's logs (the Prefect UI)."""
    stage_log = logging.getLogger(f"orchestrator.stage.{outcome.node.stage}")
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted(outcome.metrics.items())
                        if isinstance(v, int | float))
    stage_log.info("%s: %s %.3f s%s", outcome.node.id,
                   "cached result, computed in" if outcome.cached else "ran in",
                   outcome.seconds, f"; {metrics}" if metrics else "")
    for warning in outcome.warnings:
        stage_log.warning("%s: %s", outcome.node.id, warning, extra=NOT_ON_CONSOLE)


def _log_trial(pipeline: str, trial: dict[str, Any]) -> None:
    """A guard trial's line in the flow run's logs (the console has its own)."""
    logging.getLogger("orchestrator.engine.guard").info(
        "%s: guard trial %s/%s: %s: %s; %s", pipeline, trial["trial"], trial["of"],
        trial["change"], trial["quality"],
        "meets budgets" if trial["meets_budgets"] else f"best so far {trial['best']}",
        extra=NOT_ON_CONSOLE)


def _task_run_name(node: Node) -> str:
    return f"{node.pipeline}.{node.stage}" + (
        "" if node.trial is None else f" (guard trial {node.trial})")


@flow(name=FLOW_NAME, flow_run_name=flow_run_name, persist_result=False,
      log_prints=False, validate_parameters=True)
def recipe_flow(recipe: str, overrides: list[str] | None = None,
                variants: list[str] | None = None, no_cache: bool = False,
                output: str | None = None, force: bool = False) -> dict[str, Any]:
    """Run the recipe at `recipe` (with `--set` style `overrides`) and return its report.

    Raises OrchestratorError subclasses: exit 2 for bad input (before anything is written),
    3 for a failing stage (outputs of the failed run removed). `output` defaults to
    out/<recipe name> under the recipe's project root; it is this recipe's folder, whose
    contents the run replaces whole (another recipe's only with `force`: output_folder)."""
    from orchestrator.cache import project
    from orchestrator.engine.guard import GuardResult, apply_guard, guarded_pipelines
    from orchestrator.engine.scheduler import run_by_dependencies
    from orchestrator.flow.task_runners import explain_failure
    from orchestrator.recipe.checks import check_variants
    from orchestrator.recipe.loading import load_recipe
    from orchestrator.results import output_folder
    from orchestrator.results.report import build_report, write_outputs
    from orchestrator.tracking.client import TrackingClient, TrackingError

    overrides = list(overrides or [])
    loaded = load_recipe(recipe, overrides)
    root = project.project_root(loaded.path)
    store_root = project.store_dir(root)
    check_variants(loaded, variants)
    out_dir = project.output_dir(root, loaded.recipe.name, output)
    project.check_folders(out_dir, store_root, root)
    output_folder.check_output_owner(out_dir, loaded.recipe.name, loaded.path, root, force)
    owner = output_folder.owner_of(loaded.recipe.name, loaded.path)
    # first: the tracking worker imports MLflow on the other core while the model loads
    tracker = TrackingClient(root=root)
    api_logs = _ApiLogs()
    parallel = _runs_in_parallel()
    own_runner = None  # started here: a run Prefect started, for a recipe that asks for Dask
    try:
        if not parallel and not _executor_chosen():
            own_runner = _recipe_task_runner(loaded)
            parallel = own_runner is not None
        if loaded.recipe.retrain is not None:
            model_path = retrain_task(str(loaded.path), overrides, str(project.local_home(root)))
            overrides = [*overrides, f"model.path={model_path}"]
            loaded = load_recipe(loaded.path, overrides)
        ref = RunRef(recipe=str(loaded.path), overrides=tuple(overrides),
                     variants=tuple(variants) if variants else None, store=str(store_root),
                     use_cache=not no_cache, scratch=_scratch_folder(store_root, parallel))
        session = open_session(ref, loaded)  # exit 2 here: nothing run, nothing written
    except BaseException:
        tracker.close()  # before `start`: it ends without creating any MLflow run
        api_logs.close()
        _remove_scratch(locals().get("ref"))
        _stop(own_runner)
        raise
    plan, hooks = session.plan, [*current_observers(), tracker]

    def submit(node: Node, wait_for: list[Any] | None = None) -> Any:
        task = stage_task.with_options(task_run_name=_task_run_name(node))
        if own_runner is not None:  # not the flow's runner: submitted to it directly
            return own_runner.submit(task, {"node": node, "ref": ref}, wait_for=wait_for)
        return task.submit(node, ref, wait_for=wait_for)

    def run_node(node: Node) -> NodeOutcome:
        _notify(hooks, "on_node_start", node)
        try:
            # on a parallel task runner (Dask) a guard trial runs on a worker too
            outcome = (submit(node).result() if parallel else
                       stage_task.with_options(task_run_name=_task_run_name(node))(node, ref))
        except BaseException as exc:
            error = explain_failure(node, exc)  # a worker that died: the stage's error
            _notify(hooks, "on_node_error", node, error)
            if error is exc:
                raise
            raise error from exc
        _notify(hooks, "on_node_end", outcome)
        return outcome

    def guard(name: str, done: dict[str, NodeOutcome]) -> GuardResult | None:
        return apply_guard(name, plan, session.data, done, run_node,
                           on_trial=lambda *trial: (_log_trial(*trial), _notify(
                               hooks, "on_guard_trial", *trial)))

    try:
        from prefect.runtime import flow_run

        tracker.start(plan, _versions(), links=_prefect_links(), run_name=flow_run.name,
                      overrides=overrides)
        tracker.check()  # a tracking URI that fails fails before the stages, when it can
        outcomes: dict[str, NodeOutcome] = {}
        trials: dict[str, GuardResult] = {}
        if parallel:  # each node as soon as its input is ready, on the runner's workers
            outcomes, trials = run_by_dependencies(
                plan, submit, lambda method, *args: _notify(hooks, method, *args),
                guard, guarded_pipelines(plan), explain=explain_failure)
        # local: nodes run one at a time, parents first: TF already uses every core.
        for name in () if parallel else plan.pipelines:
            plan.replan(name)  # its `from:` parent may end elsewhere after the guard
            for node in plan.pipelines[name]:
                outcomes[node.id] = run_node(node)
            guarded = guard(name, outcomes)
            if guarded is not None:
                plan.pipelines[name] = guarded.nodes
                outcomes.update(guarded.outcomes)
                trials[name] = guarded
        report = build_report(plan, session.data, outcomes, session.devices,
                              list(variants or loaded.recipe.pipelines), tracker.run_id)
        for name, guarded in trials.items():
            if name in report["variants"]:
                report["variants"][name]["trials"] = guarded.trials
                report["variants"][name]["guard_decisions"] = guarded.decisions
                if guarded.verdict:  # the search's answer, where the console shows warnings
                    report["variants"][name]["guard_verdict"] = guarded.verdict
                    report["variants"][name].setdefault("warnings", []).append(
                        guarded.verdict)
                    logging.getLogger("orchestrator.engine.guard").warning(
                        guarded.verdict, extra=NOT_ON_CONSOLE)
        with output_folder.replacing(out_dir, owner) as built:  # whole, or not at all
            write_outputs(built, out_dir, plan, session.data, outcomes, report)
        registry = tracker.finish(report, out_dir, loaded.path,
                                  register=loaded.recipe.register_candidate)
    except BaseException as exc:
        # first: a report from an earlier run must not pass for this failed one (CI gates
        # read it), even if recording the failure is interrupted too
        output_folder.discard(out_dir, owner)
        try:
            tracker.finish(None, None, loaded.path, failed=True)
        except Exception as tracking_exc:  # noqa: BLE001  (the run's own error is reported)
            if not isinstance(exc, TrackingError):  # else it is that same failure
                log.warning("MLflow could not record the failed run either: %s", tracking_exc)
        raise
    finally:
        close_session(ref)
        api_logs.close()
        _remove_scratch(ref)
        _stop(own_runner)
    _link_mlflow_run(report, root)
    return {**report, "out_dir": str(out_dir), "registry": registry, "locations": {
        "store": redact(str(store_root)), "tracking": redact(project.tracking_uri(root)),
        "project_root": str(root)}}


def _scratch_folder(store_root: Path | str, parallel: bool) -> str | None:
    """A parallel run's own folder for models kept out of the cache (see UnstoredModels):
    in the store, a local folder or the bucket, so that every worker sees it."""
    if not parallel:
        return None
    import uuid

    return f"{str(store_root).rstrip('/')}/scratch/{uuid.uuid4().hex}"


def _remove_scratch(ref: RunRef | None) -> None:
    if ref is not None and ref.scratch is not None:
        from orchestrator.cache.store import open_store

        open_store(ref.scratch).remove_all()  # a folder, or the bucket's objects and mirror


# Set by `run()`, which has already chosen the flow's task runner (the command line over the
# recipe's block); unset when Prefect starts the flow (a deployment, `serve`, a worker).
_EXECUTOR_CHOSEN: ContextVar[bool] = ContextVar("executor_chosen", default=False)


def _executor_chosen() -> bool:
    return _EXECUTOR_CHOSEN.get()  # through a function: see current_observers


def _recipe_task_runner(loaded: Any) -> Any | None:
    """For a run Prefect started, whose flow has the default runner: a started Dask task
    runner when the recipe's `execution:` block asks for one (as `run()` would pick), else
    None. An address nothing answers at is exit 2 before anything is written."""
    from orchestrator.flow import task_runners
    chosen = task_runners.resolve(loaded)
    if not chosen.parallel:
        return None
    task_runners.check_address(chosen)
    runner = task_runners.task_runner(chosen)
    runner.__enter__()
    return runner


def _stop(runner: Any | None) -> None:
    if runner is not None:
        runner.__exit__(None, None, None)


def _runs_in_parallel() -> bool:
    """Whether this flow run's task runner is a parallel one (Dask), not the default
    thread pool: `orchestrator run --executor dask` or `execution: {executor: dask}`."""
    from prefect.context import FlowRunContext
    from prefect.task_runners import ThreadPoolTaskRunner

    context = FlowRunContext.get()
    return context is not None and not isinstance(context.task_runner, ThreadPoolTaskRunner)


class _ApiLogs:
    """Our log lines (stages, guard, warnings) in the Prefect run's logs, for this run."""

    def __init__(self) -> None:
        from prefect.logging.handlers import APILogHandler

        self.logger = logging.getLogger("orchestrator")
        self.handler = APILogHandler(level=logging.INFO)
        self.previous_level = self.logger.level
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)  # the console handler still shows warnings only

    def close(self) -> None:
        if self.handler in self.logger.handlers:
            self.logger.removeHandler(self.handler)
            self.logger.setLevel(self.previous_level)


def _prefect_links() -> dict[str, str]:
    """The flow run's id and UI page, as tags for the MLflow parent run."""
    from prefect.runtime import flow_run

    links = {"prefect.flow_run_id": str(flow_run.id), "prefect.flow_run_name": flow_run.name}
    if flow_run.ui_url:
        links["prefect.flow_run_url"] = flow_run.ui_url
    return links


def _link_mlflow_run(report: dict[str, Any], root: Path) -> None:
    """A Markdown artifact on the flow run: the MLflow run and how to open it. The run's
    outputs are written by now: a Prefect API that fails here costs the link only."""
    from prefect.artifacts import create_markdown_artifact

    from orchestrator.formatting import command_hint

    selected = ", ".join(f"{t}: {v or 'none within budgets'}"
                         for t, v in report["selected"].items()) or "no targets"
    try:
        create_markdown_artifact(
            key="mlflow-run", description="The MLflow run of this flow run",
            markdown=f"MLflow run `{report['mlflow_run_id']}` in experiment "
                     f"`{report['recipe']}`.\n\nSelected: {selected}.\n\nOpen the "
                     f"dashboards: `{command_hint('ui', report.get('recipe_path', ''))}` "
                     f"(project {root}).")
    except Exception as exc:  # noqa: BLE001  (a missing link is no failed run)
        log.warning("could not link the MLflow run in Prefect: %s", exc)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("orchestrator", "tensorflow-cpu", "prefect", "mlflow"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


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
    chosen_here = _EXECUTOR_CHOSEN.set(True)
    try:
        if heartbeats:
            return the_flow(recipe, **parameters)
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            return the_flow(recipe, **parameters)
    finally:
        _EXECUTOR_CHOSEN.reset(chosen_here)

