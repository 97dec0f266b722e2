"""What `summarize_graph` prints, as data: inputs, outputs, parameters, op types.

Also the input/output detection heuristics shared by the model sources:
- inputs are Placeholders with no inputs;
- outputs are nodes that nothing consumes, ignoring junk (NoOp, Const, Assert, savers,
  initialisers, gradients) and, when that leaves something, nodes that no input reaches.

Pure functions over GraphDef protos; TensorFlow is imported inside functions.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.model.artifact import TensorSpec, node_name

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef

# Ops that are never a model's output even when nothing consumes them.
UNLIKELY_OUTPUT_OPS = frozenset({
    "Const", "NoOp", "Placeholder", "PlaceholderWithDefault",
    "Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp",
    "AssignSubVariableOp", "Variable", "VariableV2", "VarHandleOp", "ReadVariableOp",
    "VarIsInitializedOp", "IsVariableInitialized", "Assert", "Print", "PrintV2",
    "Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2", "RestoreSlice",
    "MergeV2Checkpoints", "ShardedFilename", "ShardedFilespec",
    "ScalarSummary", "HistogramSummary", "ImageSummary", "AudioSummary", "MergeSummary",
    "TensorSummary", "TensorSummaryV2", "WriteSummary",
})
# Scopes written by TF1 savers, initialisers and optimizers.
_JUNK_SCOPE = re.compile(r"^(save(_\d+)?|gradients(_\d+)?|report_uninitialized_\w*)(/|$)")

VARIABLE_OPS = frozenset({"Variable", "VariableV2", "VarHandleOp"})
FUNCTION_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def _dtype_name(enum: int) -> str:
    import tensorflow as tf

    try:
        return tf.as_dtype(enum).name
    except TypeError:
        return f"invalid({enum})"


def _shape(node: NodeDef, attr: str = "shape") -> tuple[int | None, ...] | None:
    """A node's shape attr as a tuple (None for unknown dims), or None if unknown rank."""
    if attr not in node.attr:
        return None
    proto = node.attr[attr].shape
    if proto.unknown_rank:
        return None
    return tuple(None if d.size < 0 else int(d.size) for d in proto.dim)


def _numeric(enum: int) -> bool:
    import tensorflow as tf

    try:
        dtype = tf.as_dtype(enum)
    except TypeError:
        return False
    return dtype.is_floating or dtype.is_integer or dtype.is_quantized or dtype.is_complex


def _elements(shape: Iterable[int | None] | None) -> int:
    if shape is None:
        return 0
    count = 1
    for dim in shape:
        if dim is None:
            return 0
        count *= dim
    return count


def consumers(graph_def: GraphDef) -> dict[str, list[str]]:
    """Node name -> names of the nodes that take it as an input (data or control)."""
    out: dict[str, list[str]] = {}
    for node in graph_def.node:
        for inp in node.input:
            out.setdefault(node_name(inp), []).append(node.name)
    return out


def input_spec(node: NodeDef) -> TensorSpec:
    """The TensorSpec of a Placeholder-like node (dtype and shape from its attrs)."""
    dtype = _dtype_name(node.attr["dtype"].type) if "dtype" in node.attr else "float32"
    return TensorSpec(name=node.name, dtype=dtype, shape=_shape(node))


def detect_inputs(graph_def: GraphDef) -> list[TensorSpec]:
    """Placeholders with no inputs, in graph order (what summarize_graph calls inputs)."""
    return [input_spec(n) for n in graph_def.node
            if n.op == "Placeholder" and not [i for i in n.input if not i.startswith("^")]]


def _reachable_from(graph_def: GraphDef, sources: Iterable[str]) -> set[str]:
    """Nodes that depend (through data or control edges) on any of `sources`."""
    users = consumers(graph_def)
    seen = set(sources)
    queue = deque(seen)
    while queue:
        for user in users.get(queue.popleft(), ()):
            if user not in seen:
                seen.add(user)
                queue.append(user)
    return seen


def detect_outputs(graph_def: GraphDef, inputs: Sequence[str] | None = None) -> list[str]:
    """Nodes nothing consumes, minus junk, in graph order.

    When `inputs` (node names; default: detected Placeholders) reach some candidates, only
    those are kept: a VarIsInitializedOp or a constant side branch is not an output.
    """
    used = consumers(graph_def)
    candidates = [n.name for n in graph_def.node
                  if n.name not in used and n.op not in UNLIKELY_OUTPUT_OPS
                  and not _JUNK_SCOPE.match(n.name)]
    names = [node_name(i) for i in inputs] if inputs is not None else [
        s.name for s in detect_inputs(graph_def)]
    if names:
        fed = _reachable_from(graph_def, names)
        reached = [c for c in candidates if c in fed]
        if reached:
            return reached
    return candidates


def summarize(graph_def: GraphDef, inputs: Sequence[str] | None = None,
              outputs: Sequence[str] | None = None) -> dict[str, Any]:
    """summarize_graph as a JSON-friendly dict.

    `inputs`/`outputs` (node or tensor names) are reported as given when known, else detected.
    Keys: nodes, functions, inputs [{name, dtype, shape}], outputs [{name, op}], variables,
    params (const + variable), const_params, variable_params, control_edges, devices,
    invalid_inputs, op_counts (sorted by op name; counts include ops inside library
    functions, as summarize_graph does).
    """
    by_name = {n.name: n for n in graph_def.node}
    if inputs is None:
        input_specs = detect_inputs(graph_def)
    else:
        input_specs = [input_spec(by_name[node_name(i)]) if node_name(i) in by_name
                       else TensorSpec(name=i, dtype="unknown") for i in inputs]
    output_names = list(outputs) if outputs is not None else detect_outputs(graph_def)

    const_params = variable_params = control_edges = 0
    devices: Counter[str] = Counter()
    invalid: list[dict[str, str]] = []
    variables: list[dict[str, Any]] = []
    for node in graph_def.node:
        for inp in node.input:
            if inp.startswith("^"):
                control_edges += 1
            if node_name(inp) not in by_name:
                invalid.append({"node": node.name, "input": inp})
        if node.device:
            devices[node.device] += 1
        if node.op == "Const" and _numeric(node.attr["dtype"].type):
            dims = node.attr["value"].tensor.tensor_shape.dim
            const_params += _elements(d.size for d in dims)
        elif node.op == "ImmutableConst" and _numeric(node.attr["dtype"].type):
            const_params += _elements(_shape(node))
        elif node.op in VARIABLE_OPS:
            shape = _shape(node)
            variable_params += _elements(shape)
            variables.append({"name": node.name,
                              "dtype": _dtype_name(node.attr["dtype"].type),
                              "shape": None if shape is None else list(shape)})

    op_counts: Counter[str] = Counter(n.op for n in graph_def.node)
    for function in graph_def.library.function:
        op_counts.update(n.op for n in function.node_def)

    return {
        "nodes": len(graph_def.node),
        "functions": len(graph_def.library.function),
        "inputs": [s.to_json() for s in input_specs],
        "outputs": [{"name": o, "op": by_name[node_name(o)].op if node_name(o) in by_name
                     else "missing"} for o in output_names],
        "variables": variables,
        "params": const_params + variable_params,
        "const_params": const_params,
        "variable_params": variable_params,
        "control_edges": control_edges,
        "devices": dict(sorted(devices.items())),
        "invalid_inputs": invalid,
        "op_counts": dict(sorted(op_counts.items())),
    }


# What `params` counts, said where it is printed: a training script's count (Keras'
# count_params: weights and batch norm's statistics, before freezing) differs from it
PARAMS_COUNTED = ("params: {params:,}, the elements of the graph's numeric constant tensors "
                  "and variables: weights, biases, batch norm's parameters until `fold` "
                  "merges them into the weights, and small constants (shapes, 8-bit ranges); "
                  "report.json's `params` counts the same in the shipped file")


def _human(count: int) -> str:
    """12345 -> '12.35k', as summarize_graph's HumanReadableNum."""
    for limit, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "k")):
        if abs(count) >= limit:
            return f"{count / limit:.2f}{suffix}"
    return str(count)


def _shape_text(shape: Sequence[int | None] | None) -> str:
    if shape is None:
        return "<unknown>"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _tensor_text(spec: dict[str, Any]) -> str:
    return f"name={spec['name']}, type={spec['dtype']}, shape={_shape_text(spec['shape'])}"


def _found(noun: str, items: Sequence[dict[str, Any]],
           describe: Callable[[dict[str, Any]], str], possible: bool = False) -> str:
    """summarize_graph's `Found N [possible ]<noun>: (...) (...)`, or `No <noun> spotted.`"""
    if not items:
        return f"No {noun} spotted."
    qualifier = "possible " if possible else ""
    return f"Found {len(items)} {qualifier}{noun}: " + " ".join(
        f"({describe(item)})" for item in items)


def format_summary(summary: dict[str, Any]) -> str:
    """Human-readable text in summarize_graph's layout (for `orchestrator inspect`)."""
    lines = [
        _found("inputs", summary["inputs"], _tensor_text, possible=True),
        _found("variables", summary["variables"], _tensor_text),
        _found("outputs", summary["outputs"], lambda o: f"name={o['name']}, op={o['op']}",
               possible=True),
    ]
    const, var = summary["const_params"], summary["variable_params"]
    lines.append(f"Found {const} ({_human(const)}) const parameters, {var} ({_human(var)}) "
                 f"variable parameters, and {summary['control_edges']} control_edges")
    lines.append(PARAMS_COUNTED.format(params=summary["params"]))
    for device, count in summary["devices"].items():
        lines.append(f"{count} nodes assigned to device '{device}'")
    for bad in summary["invalid_inputs"]:
        lines.append(f"Invalid input {bad['input']} for node {bad['node']}")
    ops = sorted(summary["op_counts"].items(), key=lambda kv: (-kv[1], kv[0]))
    lines.append("Op types used: " + ", ".join(f"{count} {op}" for op, count in ops))
    lines.append(f"{summary['nodes']} nodes, {summary['functions']} library functions")
    return "\n".join(lines)
