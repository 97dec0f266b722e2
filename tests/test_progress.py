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
