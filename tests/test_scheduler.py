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
        worker = Worker(run=run, submit=lambda node, _wait_for: pool.submit(run, node))
        with pytest.raises(RuntimeError, match="the stage failed"):
            run_plan(plan, None, worker, lambda *_: None)  # type: ignore[arg-type]
        assert ended == [plan.pipelines["sibling"][0].id]
