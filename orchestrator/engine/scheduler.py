"""Run a plan: every pipeline's nodes by their dependencies, and each pipeline's guard.

One scheduler for every run; what differs is the `Worker` that runs a node:
- local: one node at a time, in this thread, in the order a reader expects (pipelines in
  recipe order, stages in pipeline order; TensorFlow already uses every core);
- parallel: each node handed to a task runner's workers (Dask) once the nodes it waits for
  have finished. Not earlier, with their futures to wait for: Dask places a task where its
  dependencies' results are, so two siblings waiting for one parent queued on the parent's
  worker, one after the other, while the other worker stood idle.

A node waits for the node that made its input model: the node before it in its pipeline,
or, for the first node of a `from:` pipeline, its parent's last transform (the parent's
measuring stages are no one's input). A node with the same cache key as one submitted
before waits for that one, and then finds its result in the store. A guarded pipeline's
`from:` children are planned only once its guard has chosen its final model (Plan.replan).
The guard's trials run through the same worker, one after another. The guard is the
caller's (orchestrator/guard/: quantization policy, not scheduling): this module only runs
the trials it asks for.

Nothing here knows Prefect or Dask: a parallel worker's `submit(node)` returns a future
with `add_done_callback(fn)` and `result()`, and only node ids and small outcomes pass
through here.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.engine.node_run import NodeOutcome, RunData
from orchestrator.engine.plan import Node, Plan

# notify(method, *args): the run's observers (progress display, tracking): on_node_start,
# on_node_end, on_node_error, on_guard_trial, on_guard_end(pipeline, GuardResult)
Notify = Callable[..., None]


class GuardedPipeline(Protocol):
    """What a guard hands back for a pipeline: the nodes it chose and their outcomes."""

    nodes: list[Node]
    outcomes: dict[str, NodeOutcome]


class Guard(Protocol):
    """A search over a pipeline's variants run after its nodes (the accuracy guard)."""

    def pipelines(self, plan: Plan) -> list[str]: ...

    def apply(self, name: str, plan: Plan, data: RunData, outcomes: dict[str, NodeOutcome],
              submit: Callable[[Node], NodeOutcome],
              on_trial: Callable[..., Any] | None = None) -> GuardedPipeline | None: ...


def _unchanged(_node: Node, error: BaseException) -> BaseException:
    return error


@dataclass
class Worker:
    """Where a node runs. `run(node)` runs it in this thread and returns its outcome;
    `submit(node)`, when given, hands it to parallel workers instead and returns a future.
    `explain(node, error)` turns the task runner's own failures (a worker that died) into
    the stage's error and leaves any other error as it is."""

    run: Callable[[Node], NodeOutcome]
    submit: Callable[[Node], Any] | None = None
    explain: Callable[[Node, BaseException], BaseException] = _unchanged

    @property
    def parallel(self) -> bool:
        return self.submit is not None


@dataclass
class PlanResult:
    """Every node's outcome, in the order a sequential run gives them (a guarded pipeline's
    chosen trial in place of its first run), and the guard's result per guarded pipeline."""

    outcomes: dict[str, NodeOutcome]
    guarded: dict[str, GuardedPipeline] = field(default_factory=dict)


def run_plan(plan: Plan, data: RunData, worker: Worker, notify: Notify, *,
             guard: Guard | None) -> PlanResult:
    """Run every pipeline of `plan` and, with `guard`, its guard (None: no pipeline is
    guarded). The first stage to fail raises its
    error (after on_node_error), once the stages already handed to parallel workers have
    ended: when the run reports, nothing of it still runs or writes to the store (on a
    scheduler of the user's own, they would go on after the run's exit; the stages that
    wait for the failed one end at once). An interrupt (Ctrl-C) does not wait."""
    from orchestrator.boards.session import close_sessions

    try:
        return _Run(plan, data, worker, notify, guard).run()
    finally:  # the boards' connections end with the run (a long-lived worker holds none)
        close_sessions()


class _Finished:
    """A node run in this thread, as a future that is already done."""

    def __init__(self, run: Callable[[], NodeOutcome]) -> None:
        self.outcome: NodeOutcome | None = None
        self.error: BaseException | None = None
        try:
            self.outcome = run()
        except BaseException as exc:  # noqa: BLE001  (raised again by result())
            self.error = exc

    def result(self) -> NodeOutcome:
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome


class _Run:
    def __init__(self, plan: Plan, data: RunData, worker: Worker, notify: Notify,
                 guard: Guard | None) -> None:
        self.plan, self.data, self.worker, self.notify = plan, data, worker, notify
        self.guard = guard
        self.guarded = set(guard.pipelines(plan)) if guard is not None else set()
        self.futures: dict[str, Any] = {}  # node id -> future
        self.queued: list[tuple[Node, list[str]]] = []  # local: (node, its dependencies)
        self.first_with_key: dict[str, str] = {}  # cache key -> first node id submitted
        self.producer: dict[str, str] = {}  # model key -> transform node id that makes it
        self.blocked_by: dict[str, set[str]] = {}  # parallel node id -> unfinished dependencies
        self.dependents: dict[str, list[Node]] = {}
        self.left: dict[str, int] = {}  # pipeline -> nodes not finished
        self.finished: set[str] = set()
        self.done: queue.SimpleQueue[Node] = queue.SimpleQueue()
        self.outcomes: dict[str, NodeOutcome] = {}
        self.order: dict[str, list[str]] = {}  # pipeline -> its outcome ids, sequential order
        self.results: dict[str, GuardedPipeline] = {}
        self.submitted: set[str] = set()
        self.settled: set[str] = set()

    def run(self) -> PlanResult:
        try:
            self.run_all()
        except Exception:
            self.settle_submitted()
            raise
        ordered = {i: self.outcomes[i] for name in self.plan.pipelines
                   for i in self.order.get(name, [])}
        return PlanResult(ordered, self.results)

    def run_all(self) -> None:
        self.launch_ready()
        while len(self.settled) < len(self.plan.pipelines):
            if not self.worker.parallel and self.done.empty():
                self.run_next_queued()
            node = self.done.get()
            try:
                outcome = self.futures[node.id].result()
            except BaseException as exc:
                error = self.failed(node, exc)
                if error is exc:
                    raise
                raise error from exc
            self.node_finished(node, outcome)

    def settle_submitted(self) -> None:
        """After a failure: wait for every node handed to parallel workers to end, its
        outcome dropped (the run fails with the first error)."""
        if not self.worker.parallel:
            return
        for node_id, future in self.futures.items():
            if node_id not in self.finished:
                try:
                    future.result()
                except Exception:  # noqa: BLE001, S112  (the run reports its first error)
                    continue

    def failed(self, node: Node, exc: BaseException) -> BaseException:
        """The error to raise for `node` (the worker's own failure explained as the
        stage's), its observers told."""
        error = self.worker.explain(node, exc)
        self.notify("on_node_error", node, error)
        return error

    def run_now(self, node: Node) -> NodeOutcome:
        """One node run to its end, its observers told: a guard trial."""
        self.notify("on_node_start", node)
        try:
            outcome = (self.worker.submit(node).result() if self.worker.submit is not None
                       else self.worker.run(node))
        except BaseException as exc:
            error = self.failed(node, exc)
            if error is exc:
                raise
            raise error from exc
        self.notify("on_node_end", outcome)
        return outcome

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
        if not self.worker.parallel:  # runs when nothing else does, its dependencies done
            self.queued.append((node, deps))
            return
        waiting = {d for d in deps if d in self.blocked_by and d not in self.finished}
        self.blocked_by[node.id] = waiting
        for dep in waiting:
            self.dependents.setdefault(dep, []).append(node)
        if not waiting:
            self.hand_over(node)

    def hand_over(self, node: Node) -> None:
        """Parallel: `node`, whose dependencies have finished, to the workers."""
        self.notify("on_node_start", node)
        future = self.worker.submit(node)
        self.futures[node.id] = future
        future.add_done_callback(lambda _future, node=node: self.done.put(node))

    def run_next_queued(self) -> None:
        """Local: the first queued node whose dependencies have finished, run here."""
        index = next(i for i, (_, deps) in enumerate(self.queued)
                     if all(d in self.finished for d in deps))
        node, _ = self.queued.pop(index)
        self.notify("on_node_start", node)
        self.futures[node.id] = _Finished(lambda: self.worker.run(node))
        self.done.put(node)

    def node_finished(self, node: Node, outcome: NodeOutcome) -> None:
        self.finished.add(node.id)
        self.outcomes[node.id] = outcome
        self.notify("on_node_end", outcome)
        for dependent in self.dependents.pop(node.id, []):
            blocked = self.blocked_by[dependent.id]
            blocked.discard(node.id)
            if not blocked:
                self.hand_over(dependent)
        self.left[node.pipeline] -= 1
        if self.left[node.pipeline] == 0:
            self.pipeline_finished(node.pipeline)

    def pipeline_finished(self, name: str) -> None:
        """Its guard (trials run one after another, while the other pipelines go on where
        the worker is parallel), then the children it held back."""
        guarded = None if self.guard is None else self.guard.apply(
            name, self.plan, self.data, self.outcomes, self.run_now,
            on_trial=lambda *trial: self.notify("on_guard_trial", *trial))
        if guarded is not None:
            self.notify("on_guard_end", name, guarded)
            self.plan.pipelines[name] = guarded.nodes
            self.outcomes.update(guarded.outcomes)
            self.order[name] += [i for i in guarded.outcomes if i not in self.order[name]]
            self.results[name] = guarded
        self.settled.add(name)
        self.launch_ready()
