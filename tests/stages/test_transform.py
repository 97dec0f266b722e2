"""transform: any Graph Transform Tool string; TF failures become clear stage errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from support.helpers_graphs import assert_same_outputs, noisy_graph, ops, rand

from orchestrator.errors import StageError
from orchestrator.stages import StageContext, get_stage
from orchestrator.stages.transform import Params, run

CTX = StageContext(pipeline="test", stage="transform")


def test_runs_transforms() -> None:
    before = noisy_graph()
    params = Params(transforms="  fold_constants(ignore_errors=true)\n"
                               "  remove_nodes(op=CheckNumerics) ")
    assert params.transforms == ("fold_constants(ignore_errors=true) "
                                 "remove_nodes(op=CheckNumerics)")
    result = run(before, params, CTX)
    after = result.artifact
    names = {n.name for n in after.graph_def.node}
    assert "half" not in names and ops(after)["Mul"] == ops(before)["Mul"] - 1  # 0.5 * 3.0
    assert "CheckNumerics" not in ops(after) and "CheckNumerics" in ops(before)
    assert result.metrics["nodes_after"] < result.metrics["nodes_before"]
    assert_same_outputs(before, after, rand(4, 3))


def test_tf_errors_are_stage_errors() -> None:
    with pytest.raises(StageError, match="no_such_transform.*not recognized"):
        run(noisy_graph(), Params(transforms="no_such_transform"), CTX)
    with pytest.raises(StageError, match="remove_nodes expects"):
        run(noisy_graph(), Params(transforms="remove_nodes"), CTX)


def test_losing_an_output_is_an_error() -> None:
    with pytest.raises(StageError, match="removed or renamed.*out"):
        run(noisy_graph(), Params(transforms="rename_node(old_node_name=out, new_node_name=o2)"),
            CTX)


@pytest.mark.parametrize("bad", ["", "   ", "fold_constants(ignore_errors=true"])
def test_params_are_validated(bad: str) -> None:
    with pytest.raises(ValidationError):
        Params(transforms=bad)
    with pytest.raises(ValidationError):
        Params()  # transforms is required


def test_registered() -> None:
    assert get_stage("transform").run is run
