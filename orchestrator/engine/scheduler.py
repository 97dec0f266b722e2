"""Run a plan's nodes by their dependencies, each as soon as its input model is ready.

A node waits for the node that made its input model: the node before it in its pipeline,
or, for the first node of a `from:` pipeline, its parent's last transform (the parent's
measuring stages are no one's input). A node with the same cache key as one submitted
before waits for that one, and then finds its result in the store. A `from:` child of a
guarded pipeline is planned only after the guard has chosen its parent's final model
(Plan.replan), as in a sequential run.

Nothing here knows Prefect or Dask: `submit(node, wait_for)` returns a future with
`add_done_callback(fn)` and `result()` (a Prefect future on any task runner), and only
node ids and small outcomes pass through here.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.engine.node_run import NodeOutcome
from orchestrator.engine.plan import Node, Plan

Submit = Callable[[Node, list[Any]], Any]
Notify = Callable[..., None]
# guard(pipeline, outcomes so far) -> a GuardResult (nodes, outcomes) or None
Guard = Callable[[str, dict[str, NodeOutcome]], Any]
# explain(node, error) -> the error to report: the task runner's own failures (a worker
# that died) as the stage's error, anything else unchanged
Explain = Callable[[Node, BaseException], BaseException]


def run_by_dependencies(plan: Plan, submit: Submit, notify: Notify, guard: Guard,
                        guarded: Sequence[str], explain: Explain | None = None
                        ) -> tuple[dict[str, NodeOutcome], dict[str, Any]]:
    """Every pipeline of `plan` and its guard; (outcomes by node id in the order a
    sequential run gives them, guard results by pipeline). The first stage to fail raises
    its error, as `explain` gives it (after on_node_error); stages still running are left
    to the task runner."""
    return _Run(plan, submit, notify, guard, set(guarded),
                explain or (lambda _node, error: error)).run()


class _Run:
    def __init__(self, plan: Plan, submit: Submit, notify: Notify, guard: Guard,
                 guarded: set[str], explain: Explain) -> None:
        self.plan, self.submit, self.notify, self.guard = plan, submit, notify, guard
        self.explain = explain
        self.guarded = guarded
        self.futures: dict[str, Any] = {}  # node id -> future
        self.first_with_key: dict[str, str] = {}  # cache key -> first node id submitted
        self.producer: dict[str, str] = {}  # model key -> transform node id that makes it
        self.blocked_by: dict[str, set[str]] = {}  # node id -> unfinished dependencies
        self.dependents: dict[str, list[Node]] = {}
        self.left: dict[str, int] = {}  # pipeline -> nodes not finished
        self.finished: set[str] = set()
        self.done: queue.SimpleQueue[Node] = queue.SimpleQueue()
        self.outcomes: dict[str, NodeOutcome] = {}
        self.order: dict[str, list[str]] = {}  # pipeline -> its outcome ids, sequential order
        self.trials: dict[str, Any] = {}
        self.submitted: set[str] = set()
        self.settled: set[str] = set()

    def run(self) -> tuple[dict[str, NodeOutcome], dict[str, Any]]:
        self.launch_ready()
        while len(self.settled) < len(self.plan.pipelines):
            node = self.done.get()
            try:
                outcome = self.futures[node.id].result()
            except BaseException as exc:
                error = self.explain(node, exc)
                self.notify("on_node_error", node, error)
                if error is exc:
                    raise
                raise error from exc
            self.node_finished(node, outcome)
        ordered = {i: self.outcomes[i] for name in self.plan.pipelines
                   for i in self.order.get(name, [])}
        return ordered, self.trials

    def launch_ready(self) -> None:
        """Submit each pipeline whose parent's final model is known: no parent, a parent
        submitted and unguarded, or a guarded parent whose guard has run."""
        pipelines = self.plan.recipe.recipe.pipelines
        for name in self.plan.pipelines:
            if name in self.submitted:
                continue
            parent = pipelines[name].from_
            if parent is None or parent in self.settled or (
                    parent in self.submitted and parent not in self.guarded):
                self.submit_pipeline(name)

    def submit_pipeline(self, name: str) -> None:
        self.plan.replan(name)  # its `from:` parent may end elsewhere after the guard
        nodes = self.plan.pipelines[name]
        self.submitted.add(name)
        self.order[name] = [node.id for node in nodes]
        self.left[name] = len(nodes)
        for node in nodes:
            self.submit_node(node)
        if not nodes:
            self.pipeline_finished(name)

    def submit_node(self, node: Node) -> None:
        deps = [node.depends_on] if node.index > 0 and node.depends_on else []
        if node.index == 0 and node.input_model_key in self.producer:
            deps.append(self.producer[node.input_model_key])
        twin = self.first_with_key.setdefault(node.key, node.id)
        if twin != node.id and twin not in deps:
            deps.append(twin)  # the same computation: a cache hit once that one is stored
        if node.kind == "transform":
            self.producer.setdefault(node.output_model_key, node.id)
        waiting = {d for d in deps if d in self.futures and d not in self.finished}
        self.blocked_by[node.id] = waiting
        for dep in waiting:
            self.dependents.setdefault(dep, []).append(node)
        future = self.submit(node, [self.futures[d] for d in deps if d in self.futures])
        self.futures[node.id] = future
        if not waiting:
            self.notify("on_node_start", node)
        future.add_done_callback(lambda _future, node=node: self.done.put(node))

    def node_finished(self, node: Node, outcome: NodeOutcome) -> None:
        self.finished.add(node.id)
        self.outcomes[node.id] = outcome
        self.notify("on_node_end", outcome)
        for dependent in self.dependents.pop(node.id, []):
            blocked = self.blocked_by[dependent.id]
            blocked.discard(node.id)
            if not blocked:
                self.notify("on_node_start", dependent)
        self.left[node.pipeline] -= 1
        if self.left[node.pipeline] == 0:
            self.pipeline_finished(node.pipeline)

    def pipeline_finished(self, name: str) -> None:
        """Its guard (trials run through the same task runner, one after another, while
        the other pipelines go on), then the children it held back."""
        guarded = self.guard(name, self.outcomes)
        if guarded is not None:
            self.plan.pipelines[name] = guarded.nodes
            self.outcomes.update(guarded.outcomes)
            self.order[name] += [i for i in guarded.outcomes if i not in self.order[name]]
            self.trials[name] = guarded
        self.settled.add(name)
        self.launch_ready()
