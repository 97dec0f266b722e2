"""What one run of `recipe_flow` holds besides its stages: the recipe and its folders, the
tracking worker, the Prefect run's logs, the task runner, the session, and how a run that
fails is cleaned up. The flow reads like the recipe; the plumbing is here.

Prefect-aware (pipelines/ sits above flow/ and tracking/): the engine below runs the plan
through a `Worker` built here from the flow's stage task.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.cache import project
from orchestrator.engine.node_run import NodeOutcome
from orchestrator.engine.plan import Node
from orchestrator.engine.prepared_run import RunRef, Session, close_session, open_session
from orchestrator.engine.scheduler import Worker
from orchestrator.formatting import NOT_ON_CONSOLE
from orchestrator.recipe.checks import check_variants
from orchestrator.recipe.loading import LoadedRecipe, load_recipe
from orchestrator.redaction import redact
from orchestrator.results import output_folder

log = logging.getLogger("orchestrator")

# Observers of the runs in this thread (the CLI's progress display): methods
# on_node_start(node), on_node_end(outcome), on_node_error(node, error),
# on_guard_trial(pipeline, trial), on_guard_end(pipeline, guard result), all optional.
_observers: ContextVar[tuple[Any, ...]] = ContextVar("orchestrator_observers", default=())
# Set by `recipe_flow.run()`, which has already chosen the flow's task runner (the command
# line over the recipe's block); unset when Prefect starts the flow (a deployment, `serve`).
_executor_chosen: ContextVar[bool] = ContextVar("executor_chosen", default=False)


@contextmanager
def observed_by(*observers: Any) -> Iterator[None]:
    """Let `observers` watch the flows this thread runs inside the block."""
    token = _observers.set((*_observers.get(), *observers))
    try:
        yield
    finally:
        _observers.reset(token)


@contextmanager
def executor_chosen() -> Iterator[None]:
    """The flows run inside the block have their task runner chosen already."""
    token = _executor_chosen.set(True)
    try:
        yield
    finally:
        _executor_chosen.reset(token)


@dataclass
class RecipeRun:
    """One run of a recipe: prepared (everything a user can get wrong checked, nothing
    written), then its session opened, tracked, recorded or cleaned up."""

    loaded: LoadedRecipe
    overrides: list[str]
    variants: list[str] | None
    root: Path
    store_root: Path | str  # a local folder, or an object store URL
    out_dir: Path
    owner: Any
    tracker: Any = None
    ref: RunRef | None = None
    parallel: bool = False
    own_runner: Any = None  # started here: for a Prefect-started run whose recipe asks Dask
    hooks: list[Any] = field(default_factory=list)
    started: bool = False
    registry: Any = None  # the Model Registry's answer, once recorded

    @classmethod
    def prepare(cls, recipe: str, overrides: Sequence[str], variants: Sequence[str] | None,
                output: str | None, force: bool) -> RecipeRun:
        """The recipe loaded and its variants, output folder and store checked (exit 2
        before anything is written)."""
        loaded = load_recipe(recipe, list(overrides))
        root = project.project_root(loaded.path)
        store_root = project.store_dir(root)
        check_variants(loaded, variants)
        out_dir = project.output_dir(root, loaded.recipe.name, output)
        project.check_folders(out_dir, store_root, root)
        output_folder.check_output_owner(out_dir, loaded.recipe.name, loaded.path, root, force)
        return cls(loaded, list(overrides), list(variants) if variants else None, root,
                   store_root, out_dir, output_folder.owner_of(loaded.recipe.name, loaded.path))

    @property
    def shown_variants(self) -> list[str]:
        return list(self.variants or self.loaded.recipe.pipelines)

    @property
    def picture_cache(self) -> Path | None:
        """Where the pictures of earlier reports are kept, for a report drawn before (a
        cached re-run's): plots.report_plots. Beside a local store only: a run whose store
        is an object store keeps nothing on this machine, and draws its pictures."""
        return None if not isinstance(self.store_root, Path) else self.store_root / "pictures"

    @contextmanager
    def session(self, no_cache: bool, retrain: Any) -> Iterator[Session]:
        """The run's session (the model and data checked: exit 2 before anything runs),
        with the tracking worker, the Prefect logs and the task runner around it. A run
        that fails after tracking started leaves a failed (or interrupted) MLflow run, and
        the output folder as it was."""
        from orchestrator.tracking.client import TrackingClient

        # first: the tracking worker imports MLflow on the other core while the model loads
        self.tracker = TrackingClient(root=self.root)
        flow_logs = _FlowLogs()
        self.hooks = [*_observers.get(), self.tracker, flow_logs]
        try:
            self.parallel = _runs_in_parallel()
            if not self.parallel and not _executor_chosen.get():
                self.own_runner = _recipe_task_runner(self.loaded)
                self.parallel = self.own_runner is not None
            if self.loaded.recipe.retrain is not None:
                model_path = retrain(str(self.loaded.path), self.overrides,
                                     str(project.local_home(self.root)))
                self.overrides = [*self.overrides, f"model.path={model_path}"]
                self.loaded = load_recipe(self.loaded.path, self.overrides)
            self.ref = RunRef(recipe=str(self.loaded.path), overrides=tuple(self.overrides),
                              variants=tuple(self.variants) if self.variants else None,
                              store=str(self.store_root), use_cache=not no_cache,
                              scratch=_scratch_folder(self.store_root, self.parallel))
            yield open_session(self.ref, self.loaded)
        except BaseException as exc:
            if self.started:
                self._failed(exc)
            else:
                self.tracker.close()  # before `start`: it ends without creating any run
            raise
        finally:
            if self.ref is not None:
                close_session(self.ref)
            flow_logs.close()
            _remove_scratch(self.ref)
            if self.own_runner is not None:
                self.own_runner.__exit__(None, None, None)

    def start_tracking(self, session: Session) -> None:
        """The MLflow parent run, linked to this flow run; a tracking URI that fails fails
        here, before the stages, when it can."""
        from prefect.runtime import flow_run

        self.started = True  # from here a failure is recorded as a failed run
        # what a run of this folder killed mid-way left (its staging folders), once the run
        # is checked; a run still writing there keeps its own
        output_folder.remove_leftovers(self.out_dir)
        self.tracker.start(session.plan, _versions(), links=_prefect_links(),
                           run_name=flow_run.name, overrides=self.overrides)
        self.tracker.check()

    def worker(self, stage_task: Any) -> Worker:
        """The engine's worker: the flow's stage task, called here (local) or submitted to
        the task runner (parallel), each task run named after its node."""
        ref = self.ref

        def named(node: Node) -> Any:
            return stage_task.with_options(task_run_name=task_run_name(node))

        def run(node: Node) -> NodeOutcome:
            return named(node)(node, ref)

        def submit(node: Node) -> Any:
            if self.own_runner is not None:  # not the flow's runner: submitted to it directly
                return self.own_runner.submit(named(node), {"node": node, "ref": ref})
            return named(node).submit(node, ref)

        from orchestrator.flow.task_runners import explain_failure

        return Worker(run=run, submit=submit if self.parallel else None,
                      explain=explain_failure)

    def notify(self, method: str, *args: Any) -> None:
        for hook in self.hooks:
            fn = getattr(hook, method, None)
            if fn is not None:
                fn(*args)

    def record(self, report: dict[str, Any], built: Path) -> Any:
        """The run in MLflow (and the Model Registry's candidate, when asked), its files
        read from `built`, the folder about to replace the output folder (called right
        before the swap: output_folder.replacing); the registry's answer (`registry`)."""
        self.registry = self.tracker.finish(report, built, self.loaded.path,
                                            register=self.loaded.recipe.register_candidate)
        return self.registry

    def summary(self, report: dict[str, Any], registry: Any) -> dict[str, Any]:
        """The report, with where the run put things (credentials redacted)."""
        _link_mlflow_run(report, self.root)
        return {**report, "out_dir": str(self.out_dir), "registry": registry, "locations": {
            "store": redact(str(self.store_root)),
            "tracking": redact(project.tracking_uri(self.root)),
            "project_root": str(self.root)}}

    def _failed(self, exc: BaseException) -> None:
        """The MLflow run closed as failed, or as interrupted (KILLED). The output folder
        is left as it was (output_folder.replacing): the previous run's outputs stay, and
        the command says so."""
        from orchestrator.tracking.client import TrackingError

        try:
            self.tracker.finish(None, None, self.loaded.path, failed=True,
                                interrupted=was_interrupted(exc))
        except Exception as tracking_exc:  # noqa: BLE001  (the run's own error is reported)
            if not isinstance(exc, TrackingError):  # else it is that same failure
                log.warning("MLflow could not record the failed run either: %s", tracking_exc)


def was_interrupted(exc: BaseException) -> bool:
    """Whether `exc` ended a run because it was interrupted: Ctrl-C (KeyboardInterrupt,
    also when a library wrapped it into an error of its own: in its chain, or a Ctrl-C the
    command noted, `interrupts_seen`) or SIGTERM (Prefect's TerminationSignal), rather than
    failed."""
    from prefect.exceptions import TerminationSignal

    from orchestrator.errors import interrupts_seen

    if interrupts_seen:  # the library's error may not chain our KeyboardInterrupt
        return True
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt | TerminationSignal):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def task_run_name(node: Node) -> str:
    return f"{node.pipeline}.{node.stage}" + (
        "" if node.trial is None else f" (guard trial {node.trial})")


def log_outcome(outcome: NodeOutcome) -> None:
    """The stage's lines in the task run's logs (the Prefect UI)."""
    stage_log = logging.getLogger(f"orchestrator.stage.{outcome.node.stage}")
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted(outcome.metrics.items())
                        if isinstance(v, int | float))
    stage_log.info("%s: %s %.3f s%s", outcome.node.id,
                   "cached result, computed in" if outcome.cached else "ran in",
                   outcome.seconds, f"; {metrics}" if metrics else "")
    for warning in outcome.warnings:
        stage_log.warning("%s: %s", outcome.node.id, warning, extra=NOT_ON_CONSOLE)


def worker_logs() -> None:
    """In a process that did not start the flow (a Dask worker), our log lines go to the
    Prefect task run's logs only, as the flow process sends them, and not to the worker's
    console."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger("orchestrator")
    if not any(isinstance(h, APILogHandler) for h in logger.handlers) and logger.propagate:
        logger.addHandler(APILogHandler(level=logging.INFO))
        logger.setLevel(logging.INFO)
        logger.propagate = False


class _FlowLogs:
    """Our log lines (stages, guard, warnings) in the Prefect run's logs, for this run."""

    def __init__(self) -> None:
        from prefect.logging.handlers import APILogHandler

        self.logger = logging.getLogger("orchestrator")
        self.handler = APILogHandler(level=logging.INFO)
        self.previous_level = self.logger.level
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)  # the console handler still shows warnings only

    def on_guard_trial(self, pipeline: str, trial: dict[str, Any]) -> None:
        """A guard trial's line in the flow run's logs (the console has its own)."""
        logging.getLogger("orchestrator.guard.accuracy_guard").info(
            "%s: guard trial %s/%s: %s: %s; %s", pipeline, trial["trial"], trial["of"],
            trial["change"], trial["quality"],
            "meets budgets" if trial["meets_budgets"] else f"best so far {trial['best']}",
            extra=NOT_ON_CONSOLE)

    def close(self) -> None:
        if self.handler in self.logger.handlers:
            self.logger.removeHandler(self.handler)
            self.logger.setLevel(self.previous_level)


def _scratch_folder(store_root: Path | str, parallel: bool) -> str | None:
    """A parallel run's own folder for models kept out of the cache (see UnstoredModels):
    in the store, a local folder or the bucket, so that every worker sees it."""
    if not parallel:
        return None
    import uuid

    return f"{str(store_root).rstrip('/')}/scratch/{uuid.uuid4().hex}"


def _remove_scratch(ref: RunRef | None) -> None:
    if ref is not None and ref.scratch is not None:
        from orchestrator.cache.project import open_store

        open_store(ref.scratch).remove_all()  # a folder, or the bucket's objects and mirror


def _recipe_task_runner(loaded: LoadedRecipe) -> Any | None:
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


def _runs_in_parallel() -> bool:
    """Whether this flow run's task runner is a parallel one (Dask), not the default
    thread pool: `orchestrator run --executor dask` or `execution: {executor: dask}`."""
    from prefect.context import FlowRunContext
    from prefect.task_runners import ThreadPoolTaskRunner

    context = FlowRunContext.get()
    return context is not None and not isinstance(context.task_runner, ThreadPoolTaskRunner)


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
