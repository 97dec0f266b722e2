"""Small GraphDef helpers for stages that rewrite graphs themselves.

Generic on purpose: name parsing, producer/consumer lookups, reading and writing `Const`
values, and removing nodes. Rewrites mutate a GraphDef in place, so a stage works on a
`copy_graph` of its input and never on the input itself. After a rewrite that adds, removes
or renames nodes, build a fresh `GraphIndex`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.errors import StageError
from orchestrator.model.artifact import ModelArtifact, node_name

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef


def copy_graph(graph_def: GraphDef) -> GraphDef:
    """A deep copy, so that rewriting it leaves the caller's GraphDef untouched."""
    from tensorflow.core.framework import graph_pb2

    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph_def)
    return copy


def is_control_input(name: str) -> bool:
    return name.startswith("^")


def data_inputs(node: NodeDef) -> list[str]:
    """The node's data inputs (control inputs `^name` left out), in order."""
    return [name for name in node.input if not is_control_input(name)]


def control_inputs(node: NodeDef) -> list[str]:
    return [name for name in node.input if is_control_input(name)]


def output_index(name: str) -> int:
    """'node' / 'node:0' -> 0, 'node:2' -> 2."""
    _, _, index = name.lstrip("^").partition(":")
    return int(index) if index else 0


def op_counts(graph_def: GraphDef) -> dict[str, int]:
    """Op type -> number of nodes, by op name (as summarize_graph and LiteRT facts list them:
    the order is stable, whatever the graph's node order)."""
    return dict(sorted(Counter(node.op for node in graph_def.node).items()))


def is_nhwc(node: NodeDef) -> bool:
    """Whether the op works channels last: `data_format` NHWC, or not given (TF's default;
    an empty value is how protobuf reads an attribute that was never set). Under NCHW,
    channels are on axis 1, where a [C] constant does not broadcast per channel."""
    fmt = node.attr["data_format"].s if "data_format" in node.attr else b"NHWC"
    return fmt in (b"NHWC", b"")


@dataclass
class GraphIndex:
    """Name -> node and name -> consumers (data and control) of one GraphDef.

    A snapshot: rebuild it after changing the graph's structure.
    """

    graph_def: GraphDef
    nodes: dict[str, NodeDef]
    consumers: dict[str, list[NodeDef]]

    @classmethod
    def build(cls, graph_def: GraphDef) -> GraphIndex:
        nodes = {node.name: node for node in graph_def.node}
        consumers: dict[str, list[NodeDef]] = {name: [] for name in nodes}
        for node in graph_def.node:
            for name in node.input:
                consumers.setdefault(node_name(name), []).append(node)
        return cls(graph_def, nodes, consumers)

    def producer(self, input_name: str) -> NodeDef | None:
        """The node behind an input reference such as 'conv:0' or '^init'."""
        return self.nodes.get(node_name(input_name))

    def only_consumer_is(self, name: str, consumer: NodeDef) -> bool:
        """Whether `consumer` is the one node that reads `name` (data or control)."""
        readers = self.consumers.get(name, [])
        return len(readers) == 1 and readers[0] is consumer

    def resolve_const(self, input_name: str) -> NodeDef | None:
        """The `Const` behind an input, looking through `Identity` chains; else None."""
        node = self.producer(input_name)
        seen: set[str] = set()
        while node is not None and node.op == "Identity" and node.name not in seen:
            seen.add(node.name)
            node = self.producer(data_inputs(node)[0]) if data_inputs(node) else None
        if node is None or node.op != "Const" or output_index(input_name) != 0:
            return None
        return node

    def const_input(self, input_name: str) -> np.ndarray | None:
        """The value of a constant input, or None when the input is not constant."""
        const = self.resolve_const(input_name)
        return None if const is None else const_value(const)


def const_value(node: NodeDef) -> np.ndarray:
    """The value of a `Const` node as a numpy array."""
    import tensorflow as tf

    return tf.make_ndarray(node.attr["value"].tensor)


def set_const_value(node: NodeDef, value: np.ndarray, dtype: Any = None) -> None:
    """Overwrite a `Const` node's value (and dtype) in place.

    The dtype is the array's (a Python float is a float64 array: pass np.float32 values),
    unless `dtype` (a tf.DType) names one numpy has no array type for, such as tf.quint8.
    """
    import tensorflow as tf

    tensor = tf.make_tensor_proto(np.asarray(value), dtype=dtype)
    node.attr["value"].tensor.CopyFrom(tensor)
    node.attr["dtype"].type = tensor.dtype


def make_const(name: str, value: np.ndarray, dtype: Any = None) -> NodeDef:
    """A new `Const` node holding `value`, its dtype as set_const_value gives it."""
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name=name, op="Const")
    set_const_value(node, value, dtype)
    return node


def reset_node(node: NodeDef, op: str, inputs: list[str]) -> None:
    """Turn `node` into another op in place (name kept), with `inputs` and no attributes yet."""
    node.op = op
    del node.input[:]
    node.input.extend(inputs)
    node.attr.clear()


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`... (as tf.Graph names a clash), whichever is not in
    `taken`; the name returned joins `taken`, so that names made one after another never
    clash with each other either."""
    name, suffix = base, 0
    while name in taken:
        suffix += 1
        name = f"{base}_{suffix}"
    taken.add(name)
    return name


def remove_nodes(graph_def: GraphDef, names: Iterable[str]) -> None:
    """Delete the named nodes in place. References to them are the caller's business."""
    names = set(names)
    for position in reversed(range(len(graph_def.node))):
        if graph_def.node[position].name in names:
            del graph_def.node[position]


def prune_orphans(graph_def: GraphDef, candidates: Iterable[str],
                  keep: Iterable[str] = ()) -> set[str]:
    """Remove candidates that nothing reads any more, then their inputs that become unread.

    Only nodes a rewrite left behind are candidates, so unrelated dangling nodes (which
    summarize_graph would report as outputs) stay. Placeholders and `keep` are never removed.
    Returns the removed names.
    """
    keep = set(keep)
    index = GraphIndex.build(graph_def)
    removed: set[str] = set()
    pending = list(candidates)
    while pending:
        name = pending.pop()
        node = index.nodes.get(name)
        if node is None or name in removed or name in keep or node.op == "Placeholder":
            continue
        if any(reader.name not in removed for reader in index.consumers.get(name, [])):
            continue
        removed.add(name)
        pending.extend(node_name(inp) for inp in node.input)
    remove_nodes(graph_def, removed)
    return removed


def subgraph(graph_def: GraphDef, keep: Iterable[str]) -> GraphDef:
    """A copy holding only `keep` (node or tensor names: a model's outputs, and its inputs
    so that they stay even when no output needs one) and what they depend on, through data
    and control edges.

    Like tf.compat.v1.graph_util.extract_sub_graph, without its deprecation noise. Keeps
    graph order, versions and the function library; `graph_def` is untouched. KeyError
    naming the nodes of `keep` the graph lacks: a rewrite that lost an input or output must
    not pass unnoticed.
    """
    from tensorflow.core.framework import graph_pb2

    by_name = {n.name: n for n in graph_def.node}
    wanted = [node_name(k) for k in keep]
    missing = [k for k in wanted if k not in by_name]
    if missing:
        raise KeyError(f"nodes not in graph: {', '.join(missing)}")
    seen = set(wanted)
    queue = deque(wanted)
    while queue:
        for inp in by_name[queue.popleft()].input:
            name = node_name(inp)
            if name not in seen and name in by_name:
                seen.add(name)
                queue.append(name)
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    out.node.extend(n for n in graph_def.node if n.name in seen)
    return out


def rename_nodes(graph_def: GraphDef, mapping: dict[str, str]) -> None:
    """Rename nodes and every reference to them, in place; `x:0` inputs become `x`."""
    for node in graph_def.node:
        node.name = mapping.get(node.name, node.name)
        for i, inp in enumerate(node.input):
            hat = "^" if inp.startswith("^") else ""
            name, _, port = inp.lstrip("^").partition(":")
            name = mapping.get(name, name)
            node.input[i] = f"{hat}{name}" if port in ("", "0") else f"{name}:{port}"


def constant_nodes(graph_def: GraphDef) -> set[str]:
    """Names of the nodes whose value does not depend on any input (pure ops on Consts)."""
    from orchestrator.model import tf_adapter
    nodes = {n.name: n for n in graph_def.node}
    state: dict[str, bool] = {}
    for root in nodes:
        stack = [(root, False)]
        while stack:  # iterative post-order: graphs can be deep
            name, expanded = stack.pop()
            if name in state:
                continue
            node = nodes.get(name)
            if node is None:
                state[name] = False
                continue
            deps = [node_name(i) for i in node.input]
            if not expanded:
                stack.append((name, True))
                stack.extend((d, False) for d in deps if d not in state)
                continue
            op_def = tf_adapter.op_def(node.op)
            pure = op_def is not None and not op_def.is_stateful and node.op != "Placeholder"
            state[name] = pure and (node.op == "Const" or (
                bool(deps) and all(state.get(d, False) for d in deps)))
    return {name for name, value in state.items() if value}


def missing_io(graph_def: GraphDef, artifact: ModelArtifact) -> list[str]:
    """The artifact's input and output nodes that `graph_def` lacks."""
    names = {n.name for n in graph_def.node}
    wanted = [*artifact.input_names, *artifact.outputs]
    return [w for w in wanted if node_name(w) not in names]


def apply_transforms(artifact: ModelArtifact, transforms: str) -> GraphDef:
    """TF's TransformGraph on the artifact's graph (a copy), with its inputs and outputs.

    Raises StageError naming the transforms on TF failures and on lost input/output nodes
    (the runner adds the pipeline and stage).
    """
    from orchestrator.model import tf_adapter
    outputs = sorted({node_name(o) for o in artifact.outputs})
    try:
        graph_def = tf_adapter.transform_graph(artifact.graph_def, artifact.input_names,
                                               outputs, transforms)
    except (ValueError, RuntimeError) as exc:  # TF's status errors surface as these
        raise StageError(f"transforms {transforms!r} failed: {exc}") from exc
    lost = missing_io(graph_def, artifact)
    if lost:
        raise StageError(f"transforms {transforms!r} removed or renamed the model's "
                         f"input/output nodes: {', '.join(lost)}")
    return graph_def
