"""Freezing: one plain GraphDef, without functions or variables, holding only what the
outputs need. The freeze stage runs it in a recipe; `inspect` and `benchmark` run it on a
model opened outside one. The freeze stage's docstring says what it does, step by step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.errors import StageError
from orchestrator.model import graph_info
from orchestrator.model.artifact import ModelArtifact, node_name, tensor_name
from orchestrator.model.graph_rewrite import subgraph

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

CONTROL_FLOW_OPS = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case",
                              "StatelessCase"})
NOISE_ATTRS = ("_output_shapes", "_class")
_MAX_PASSES = 3
_PASS_THROUGH_OPS = frozenset({"Identity", "IdentityN", "NoOp", "Snapshot"})


def function_calls(graph_def: GraphDef) -> list[str]:
    """Nodes that still call a function: call ops, functional control flow, direct calls."""
    library = {f.signature.name for f in graph_def.library.function}
    return [n.name for n in graph_def.node
            if n.op in graph_info.FUNCTION_CALL_OPS or n.op in CONTROL_FLOW_OPS
            or n.op in library]


def _force_lowering(graph_def: GraphDef) -> None:
    """Ask grappler to lower every If/While/Case, in the graph and inside functions."""
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    for node in nodes:
        if node.op in CONTROL_FLOW_OPS:
            node.attr["_lower_using_switch_merge"].b = True
    # A function with a second implementation (e.g. CuDNN) is not inlined; TF's own
    # convert_variables_to_constants_v2 drops the attr for the same reason.
    for function in graph_def.library.function:
        if "api_implements" in function.attr:
            del function.attr["api_implements"]


def inline_functions(graph_def: GraphDef, fetch: list[str]) -> GraphDef:
    """One pass of grappler with only the function optimizer (aggressive), which inlines
    calls and lowers control flow. `fetch` (tensor names) are kept, under their names."""
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2

    from orchestrator.model import tf_adapter
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(graph_def)
    _force_lowering(meta_graph.graph_def)
    # Grappler keeps (and never renames) the nodes in the 'train_op' collection.
    meta_graph.collection_def["train_op"].node_list.value.extend(fetch)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.min_graph_nodes = -1  # small graphs too
    rewrite.optimizers.append("function")  # this list replaces grappler's default set
    rewrite.function_optimization = rewriter_config_pb2.RewriterConfig.AGGRESSIVE
    return tf_adapter.optimize_graph(config, meta_graph)


def _identity_n_to_identity(graph_def: GraphDef) -> None:
    """Grappler leaves an inlined call as IdentityN; with one output it is a plain Identity,
    which every later transform (and remove_nodes) understands."""
    for node in graph_def.node:
        if node.op != "IdentityN":
            continue
        if len([i for i in node.input if not i.startswith("^")]) != 1:
            continue
        dtype = node.attr["T"].list.type[0]
        node.op = "Identity"
        del node.attr["T"]
        node.attr["T"].type = dtype


def _idle_nodes(graph_def: GraphDef) -> set[str]:
    """Consts, and Identity/NoOp nodes that depend only on idle nodes: nothing to wait for."""
    idle: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in graph_def.node:
            if node.name in idle:
                continue
            if node.op == "Const" or (node.op in _PASS_THROUGH_OPS and all(
                    node_name(i) in idle for i in node.input)):
                idle.add(node.name)
                changed = True
    return idle


def _drop_idle_control_edges(graph_def: GraphDef) -> None:
    """Remove control edges from idle nodes (see _idle_nodes).

    After freezing, NoOps that once ordered variable reads wait on Consts only; the edges
    order nothing, and pruning then drops the NoOps themselves.
    """
    idle = _idle_nodes(graph_def)
    for node in graph_def.node:
        kept = [i for i in node.input if not (i.startswith("^") and node_name(i) in idle)]
        if len(kept) != len(node.input):
            del node.input[:]
            node.input.extend(kept)


def _clean(graph_def: GraphDef, clear_devices: bool) -> None:
    for node in graph_def.node:
        for attr in NOISE_ATTRS:
            if attr in node.attr:
                del node.attr[attr]
        if clear_devices:
            node.device = ""


def freeze(artifact: ModelArtifact, clear_devices: bool = True
           ) -> tuple[ModelArtifact, dict[str, Any]]:
    """`artifact` frozen (its functions inlined, pruned to its outputs, its noise dropped),
    with the node counts before and after and the functions inlined."""
    from tensorflow.core.framework import graph_pb2

    variables = sorted({n.op for n in artifact.graph_def.node
                        if n.op in graph_info.VARIABLE_OPS})
    if variables:
        raise StageError(f"the graph still holds variables ({', '.join(variables)}); load "
                         "the model through its checkpoint or SavedModel so the weights can "
                         "be read")

    graph_def = graph_pb2.GraphDef()
    graph_def.CopyFrom(artifact.graph_def)
    keep = [*artifact.input_names, *artifact.outputs]
    functions = len(graph_def.library.function)
    passes = 0
    while function_calls(graph_def) and passes < _MAX_PASSES:
        try:
            graph_def = inline_functions(graph_def, [tensor_name(k) for k in keep])
        except Exception as exc:  # grappler reports bad graphs as various TF errors
            raise StageError(f"grappler could not inline the graph's functions: {exc}") from exc
        passes += 1
    left = function_calls(graph_def)
    if left:
        raise StageError(f"{len(left)} function calls are left after inlining, e.g. "
                         f"{', '.join(left[:5])}")
    graph_def.ClearField("library")

    _identity_n_to_identity(graph_def)
    _drop_idle_control_edges(graph_def)
    try:
        graph_def = subgraph(graph_def, keep)
    except KeyError as exc:
        raise StageError(f"inlining lost the model's input/output nodes: {exc}") from exc
    _clean(graph_def, clear_devices)
    return artifact.replace(graph_def=graph_def), {
        "nodes_before": len(artifact.graph_def.node), "nodes_after": len(graph_def.node),
        "functions_inlined": functions}


