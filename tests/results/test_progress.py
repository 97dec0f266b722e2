"""The progress display: a stage's warnings once, beside it; its diagnostics not at all."""

from __future__ import annotations

import io

from rich.console import Console

from orchestrator.engine.node_run import NodeOutcome
from orchestrator.engine.plan import Node
from orchestrator.results.progress import ConsoleProgress

NODE = Node(id="int8/3:freeze_ranges", pipeline="int8", index=3, stage="freeze_ranges",
            params=None, kind="transform", key="k", input_model_key="i",
            output_model_key="k", depends_on=None)
ROWS = [{"node": f"StatefulPartitionedCall/net/conv{i}/BiasAdd", "op": "BiasAdd",
         "rmse_over_scale": i / 5, "nmse": i / 1e4, "range_min": -1.0, "range_max": 1.0,
         "scale": 2 / 255, "clipped_share": 0.001} for i in range(6)]


def _printed(*outcomes: NodeOutcome) -> list[str]:
    out = io.StringIO()
    with ConsoleProgress(len(outcomes), Console(file=out, width=100)) as progress:
        for outcome in outcomes:
            progress.on_node_end(outcome)
    return [line for line in out.getvalue().splitlines() if line.strip()]


def test_diagnostics_are_not_printed_beside_the_stage() -> None:
    lines = _printed(NodeOutcome(NODE, False, 0.5, info={
        "layer_errors": ROWS, "diagnostics": ["1 layer(s) above 0.7 RMSE/scale ..."]}))
    # the stage's line only: the per-layer table and the flag are in the report and page
    assert len(lines) == 1 and lines[0].strip().startswith("✓ int8 › freeze_ranges")


def test_a_warning_is_printed_once_beside_its_stage() -> None:
    lines = _printed(NodeOutcome(NODE, False, 0.5, warnings=["memory not measured: boom"]))
    assert lines[1].strip() == "warning: memory not measured: boom"
    assert len(lines) == 2


def _guard_lines(trials: list[dict], chosen: int, outcomes: list[NodeOutcome]) -> list[str]:
    from orchestrator.guard.trials import GuardResult

    out = io.StringIO()
    rows = [{"trial": n, "chosen": n == chosen} for n in range(len(trials) + 1)]
    with ConsoleProgress(1, Console(file=out, width=200)) as progress:
        for trial in trials:
            progress.on_guard_trial("int8", trial)
        progress.on_guard_end("int8", GuardResult([], {o.node.id + str(i): o for i, o in
                                                       enumerate(outcomes)}, rows))
    return [line.strip() for line in out.getvalue().splitlines() if line.strip()]


def _trial(n: int, cached: bool) -> dict:
    return {"trial": n, "of": 16, "change": "conv -> float", "quality": "accuracy drop 0.01",
            "meets_budgets": False, "best": "trial 0: accuracy drop 0.2", "cached": cached}


def test_a_guard_from_the_cache_says_so_once() -> None:
    lines = _guard_lines([_trial(n, True) for n in range(1, 17)], 9,
                         [NodeOutcome(NODE, True, 0.5)] * 3)
    assert lines == ["guard int8: 16 trials from the cache, chose trial 9"]


def test_trials_that_ran_say_their_lines_and_the_cache_share_of_the_chosen_one() -> None:
    lines = _guard_lines([_trial(1, True), _trial(2, False)], 2,
                         [NodeOutcome(NODE, True, 0.5), NodeOutcome(NODE, False, 0.5)])
    assert len(lines) == 2 and lines[0].startswith("guard int8: trial 2/16  conv -> float")
    assert lines[1] == ("guard int8: 2 trials (1 from the cache), chose trial 2: 1/2 of its "
                        "stages from the cache")
