"""The Prefect flow built from a Plan: one task per node, hooks after each.

Nothing TensorFlow-specific lives here. Prefect sees node ids and cache keys, never graphs:
cache keys are ours (plan.py), so Prefect's own input hashing is switched off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from orchestrator.executor import NodeOutcome, RunData, execute_node
from orchestrator.plan import Node, Plan


class Hook(Protocol):
    """Observers of a run (progress display, MLflow). All methods are optional."""

    def on_node_start(self, node: Node) -> None: ...
    def on_node_end(self, outcome: NodeOutcome) -> None: ...
    def on_node_error(self, node: Node, error: BaseException) -> None: ...


def configure_prefect_defaults() -> None:
    """Offline-friendly defaults; an explicit environment always wins."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")


def _call(hooks: Sequence[Any], method: str, *args: Any) -> None:
    for hook in hooks:
        fn = getattr(hook, method, None)
        if fn is not None:
            fn(*args)


NodeRunner = Callable[[Node], NodeOutcome]


def import_prefect() -> None:
    """Import Prefect (about a second) with our defaults in place: callers do it while
    something else waits, such as the temporary server booting."""
    configure_prefect_defaults()
    import prefect.flow_engine  # noqa: F401
    import prefect.task_engine  # noqa: F401


def run_plan(plan: Plan, data: RunData, devices: dict[str, Any], hooks: Sequence[Any] = (),
             use_cache: bool = True,
             after_pipeline: Callable[[str, NodeRunner, dict[str, NodeOutcome]], Any]
             | None = None,
             heartbeats: bool = True) -> tuple[dict[str, NodeOutcome], dict[str, Any]]:
    """Run every node of `plan` as a Prefect task inside one flow run, pipeline by
    pipeline (parents first). After each pipeline, `after_pipeline` (the accuracy guard)
    may run more nodes, as tasks of the same flow, and swap the pipeline's model; its
    `from:` children are then re-planned from the new model before they run.
    Raises the first StageError (after the hooks saw it); completed nodes stay cached.

    `heartbeats=False` is for our own local server: it runs no background services, so
    nothing there would read them (a full Prefect server uses them to notice crashed
    runs), and stopping their thread at the end of the flow costs up to 1 s."""
    import_prefect()
    import logging

    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    # A failing stage is reported once, by the CLI, naming pipeline and stage; Prefect's
    # run loggers would print its traceback to the console too. The failure still reaches
    # the Prefect API as the task's Failed state with its message.
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect.task_engine",
                 "prefect.flow_engine"):
        logging.getLogger(name).setLevel(logging.CRITICAL)

    @task(cache_policy=NO_CACHE, persist_result=False)
    def run_node(node: Node) -> NodeOutcome:
        _call(hooks, "on_node_start", node)
        try:
            outcome = execute_node(node, data, devices, use_cache=use_cache)
        except BaseException as exc:
            _call(hooks, "on_node_error", node, exc)
            raise
        _call(hooks, "on_node_end", outcome)
        return outcome

    recipe_name = plan.recipe.recipe.name

    @flow(name=f"recipe-{recipe_name}", validate_parameters=False, persist_result=False,
          log_prints=False)
    def recipe_flow() -> tuple[dict[str, NodeOutcome], dict[str, Any]]:
        def submit(node: Node) -> NodeOutcome:
            return run_node.with_options(name=node.stage, task_run_name=node.id)(node)

        outcomes: dict[str, NodeOutcome] = {}
        extras: dict[str, Any] = {}
        # Nodes run one at a time, parents first: with TF already using every core,
        # running stages side by side on one machine would only add contention.
        for name in plan.pipelines:
            plan.replan(name)
            for node in plan.pipelines[name]:
                outcomes[node.id] = submit(node)
            if after_pipeline is not None:
                extras[name] = after_pipeline(name, submit, outcomes)
        return outcomes, extras

    if heartbeats:
        return recipe_flow()
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        return recipe_flow()
