"""The engine's one scheduler (orchestrator.engine.scheduler), driven directly with a
parallel worker of threads: what only its ordering decides."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.engine.node_run import NodeOutcome
from orchestrator.engine.plan import Node, build_plan
from orchestrator.engine.scheduler import Worker, run_plan
from orchestrator.recipe.loading import load_recipe


def test_a_failed_stage_is_reported_once_the_stages_already_running_have_ended(
        digits_example: Path, tmp_path: Path) -> None:
    """On parallel workers, the first failure is raised only after the stages already
    handed to them have ended: nothing of a failed run still runs, or writes to the store,
    once it has reported (tests/robustness/test_dask_faults.py saw a sibling stage store
    its result after the run had exited 3)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"version: 1\nname: siblings\nmodel:\n  path: "
                      f"{digits_example / 'saved_model'}\npipelines:\n"
                      "  failing: {stages: [freeze]}\n  sibling: {stages: [strip]}\n")
    plan = build_plan(load_recipe(recipe), None, {})
    failed = threading.Event()
    ended: list[str] = []

    def run(node: Node) -> NodeOutcome:
        if node.pipeline == "failing":
            failed.set()
            raise RuntimeError("the stage failed")
        failed.wait(timeout=30)  # still running when the failure comes back
        time.sleep(0.5)
        ended.append(node.id)
        return NodeOutcome(node=node, cached=False, seconds=0.5)

    with ThreadPoolExecutor(max_workers=2) as pool:
        worker = Worker(run=run, submit=lambda node: pool.submit(run, node))
        with pytest.raises(RuntimeError, match="the stage failed"):
            run_plan(plan, None, worker, lambda *_: None, guard=None)  # type: ignore[arg-type]
        assert ended == [plan.pipelines["sibling"][0].id]


def test_a_node_is_handed_over_only_once_the_nodes_it_waits_for_have_ended(
        digits_example: Path, tmp_path: Path) -> None:
    """Not before, with their futures to wait for: Dask places such a task on the worker
    that holds its dependencies' results, so two siblings of one parent queued there one
    after the other (tests/e2e/test_dask.py saw them run in turn on a 2-worker cluster).
    Handed over together once the parent has ended, the siblings run side by side."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"version: 1\nname: siblings\nmodel:\n  path: "
                      f"{digits_example / 'saved_model'}\npipelines:\n"
                      "  base: {stages: [freeze, strip]}\n"
                      "  left: {from: base, stages: [fold, strip]}\n"
                      "  right: {from: base, stages: [strip]}\n")
    plan = build_plan(load_recipe(recipe), None, {})
    siblings = {plan.pipelines["left"][0].id, plan.pipelines["right"][0].id}
    both_running = threading.Barrier(2, timeout=30)  # broken if they ran one after the other
    ended: list[str] = []
    lock = threading.Lock()
    unfinished_at_hand_over: dict[str, set[str]] = {}
    waits_for = {node.id: {node.depends_on} if node.depends_on else set()
                 for nodes in plan.pipelines.values() for node in nodes}

    def run(node: Node) -> NodeOutcome:
        if node.id in siblings:
            both_running.wait()
        with lock:
            ended.append(node.id)
        return NodeOutcome(node=node, cached=False, seconds=0.0)

    with ThreadPoolExecutor(max_workers=2) as pool:
        def submit(node: Node) -> object:
            with lock:
                unfinished_at_hand_over[node.id] = waits_for[node.id] - set(ended)
            return pool.submit(run, node)

        result = run_plan(plan, None, Worker(run=run, submit=submit),  # type: ignore[arg-type]
                          lambda *_: None, guard=None)
    assert set(result.outcomes) == set(waits_for) == set(ended)
    assert all(not unfinished for unfinished in unfinished_at_hand_over.values()), (
        unfinished_at_hand_over)
