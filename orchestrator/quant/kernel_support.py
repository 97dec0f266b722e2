"""Which float ops TensorFlow's eight-bit kernels can run once GTT's quantize_nodes converts
them, and why the others stay float.

GTT converts every float Conv2D, MatMul, MaxPool, ... it finds, copying only a few attributes
(strides and padding for Conv2D; ksize, strides and padding for pooling; align_corners for
ResizeBilinear). The kernels (tensorflow/core/kernels/quantized_*.cc) then accept less than
the float ops do. Each rule below was checked by converting and running the op in TF 2.21
(tests/stages/test_quantize_nodes.py runs every one of them):

- QuantizedConv2D: equal row/column strides, else it refuses to run ("only supports equal
  length strides"); GTT drops `dilations` and `data_format`, so a dilated or NCHW conv would
  compute the wrong thing or fail to build; padding SAME or VALID only (no EXPLICIT).
- QuantizedMaxPool/AvgPool: NHWC, SAME or VALID padding, and no pooling across channels
  (ksize/strides on depth 1): MaxPool's fails with oneDNN on (AvgPool's float kernel
  refuses it too).
- QuantizedBiasAdd: NHWC (GTT drops data_format).
- QuantizedAdd/QuantizedMul: broadcasting only of a scalar, or of a tensor over leading axes
  ([C] onto [N, H, W, C]); [N, H, W, 1] onto [N, H, W, C] silently gives wrong values, and
  other patterns fail at run time.
- QuantizedResizeBilinear: GTT drops half_pixel_centers (what tf.image.resize and Keras use),
  which changes the sampling grid.
- QuantizedReshape: int32 shapes only.
- Conv2DBackpropInput: TF has no QuantizedConv2DTranspose kernel, and GTT leaves it float.

A Conv1D lowers to a Conv2D on [N, 1, W, C] with strides [1, 1, s, 1]; with one input row and
a one-row filter, the row stride changes nothing, so `equalize_unit_row_strides` sets it to s
and the conv runs in eight bits instead of staying float.

TensorFlow is imported only inside functions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef

DT_FLOAT = 1
DT_INT32 = 3
Shape = list[int | None] | None  # None: unknown rank; None dims: unknown size

# Float ops that only move, reshape or pick values: no arithmetic worth naming when float.
MOVEMENT_OPS = frozenset({
    "BatchToSpaceND", "BroadcastTo", "Cast", "ConcatV2", "Const", "DepthToSpace",
    "ExpandDims", "Fill", "Gather", "GatherV2", "Identity", "IdentityN", "MirrorPad",
    "NoOp", "OnesLike", "Pack", "Pad", "PadV2", "Placeholder", "PlaceholderWithDefault",
    "Rank", "Reshape", "ReverseV2", "Shape", "ShapeN", "Size", "Slice", "Snapshot",
    "SpaceToBatchND", "SpaceToDepth", "Split", "SplitV", "Squeeze", "StopGradient",
    "StridedSlice", "Tile", "Transpose", "Unpack", "ZerosLike"})
NO_KERNEL = "no eight-bit kernel"
# Float ops whose eight-bit version GTT does not use, though TF has a kernel for it.
_OTHER_OP_REASONS = {"AddV2": "quantize_nodes converts only Add"}
# Ops GTT lists as convertible that TF 2.21 cannot run in eight bits.
_NO_KERNEL_REASONS = {
    "Conv2DBackpropInput": "no eight-bit kernel (TensorFlow has no QuantizedConv2DTranspose)",
}


@dataclass(frozen=True)
class FloatNode:
    """A node that stays float: `rule` groups nodes in warnings, `detail` is this node's case."""

    node: str
    op: str
    rule: str
    detail: str = ""

    @property
    def reason(self) -> str:
        return f"{self.rule}, has {self.detail}" if self.detail else self.rule

    def record(self) -> dict[str, str]:
        """{node, op, reason} for the stage's info (report.json, the guard)."""
        return {"node": self.node, "op": self.op, "reason": self.reason}


# --- static shapes -------------------------------------------------------------------------

def input_shapes(graph_def: GraphDef, names: Iterable[str]) -> dict[str, list[Shape]]:
    """Static shapes of the data inputs of the named nodes, from TF's shape inference.

    A graph TF cannot import (it would not run either) gives no shapes: the rules that need
    them then keep their nodes float.
    """
    import tensorflow as tf

    wanted = set(names)
    if not wanted:
        return {}
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError):
        return {}
    shapes: dict[str, list[Shape]] = {}
    for name in wanted:
        op = graph.get_operation_by_name(name)
        shapes[name] = [None if t.shape.rank is None else t.shape.as_list() for t in op.inputs]
    return shapes


def _int_list(node: NodeDef, attr: str) -> list[int]:
    # `in` first: indexing a proto map inserts an empty value.
    return list(node.attr[attr].list.i) if attr in node.attr else []


def _string(node: NodeDef, attr: str, default: bytes) -> str:
    value = node.attr[attr].s if attr in node.attr else b""
    return (value or default).decode()


# --- the rules -----------------------------------------------------------------------------

def _padding(node: NodeDef, kernel: str) -> tuple[str, str] | None:
    padding = _string(node, "padding", b"VALID")
    if padding not in ("SAME", "VALID"):
        return f"{kernel} needs SAME or VALID padding", padding
    return None


def _nhwc(node: NodeDef, kernel: str) -> tuple[str, str] | None:
    layout = _string(node, "data_format", b"NHWC")
    if layout != "NHWC":
        return f"{kernel} needs NHWC", layout
    return None


def _conv2d(node: NodeDef, shapes: list[Shape]) -> tuple[str, str] | None:
    kernel = "QuantizedConv2D"
    strides = _int_list(node, "strides") or [1, 1, 1, 1]
    if strides[1] != strides[2]:
        return f"{kernel} needs equal strides", str(strides)
    dilations = _int_list(node, "dilations") or [1, 1, 1, 1]
    if any(d != 1 for d in dilations):
        return f"{kernel} cannot dilate", f"dilations {dilations}"
    return _padding(node, kernel) or _nhwc(node, kernel)


def _pool(node: NodeDef, shapes: list[Shape]) -> tuple[str, str] | None:
    kernel = f"Quantized{node.op}"
    ksize, strides = _int_list(node, "ksize"), _int_list(node, "strides")
    if len(ksize) == 4 and len(strides) == 4 and (ksize[3] != 1 or strides[3] != 1):
        return f"{kernel} pools only spatially", f"ksize {ksize}"
    return _padding(node, kernel) or _nhwc(node, kernel)


def _bias_add(node: NodeDef, shapes: list[Shape]) -> tuple[str, str] | None:
    return _nhwc(node, "QuantizedBiasAdd")


def _resize(node: NodeDef, shapes: list[Shape]) -> tuple[str, str] | None:
    if "half_pixel_centers" in node.attr and node.attr["half_pixel_centers"].b:
        return "QuantizedResizeBilinear drops half_pixel_centers", "half_pixel_centers=true"
    return None


def _reshape(node: NodeDef, shapes: list[Shape]) -> tuple[str, str] | None:
    if "Tshape" in node.attr and node.attr["Tshape"].type != DT_INT32:
        from tensorflow.core.framework import types_pb2

        name = types_pb2.DataType.Name(node.attr["Tshape"].type).removeprefix("DT_").lower()
        return "QuantizedReshape needs an int32 shape", name
    return None


def broadcast_supported(a: Shape, b: Shape) -> bool:
    """Whether QuantizedAdd/QuantizedMul compute `a op b` right (quantized_add_op.cc).

    They handle equal shapes, a one-element operand, or the smaller operand repeated over
    the leading axes of the other (TF's BCast then has two dimensions, and the kernel indexes
    the smaller one by `i % size`): its broadcast axes must all come before the shared ones.
    Unknown sizes count as equal to each other; an unknown size against 1 may broadcast.
    """
    if a is None or b is None:
        return False
    rank = max(len(a), len(b))
    a = [1] * (rank - len(a)) + list(a)
    b = [1] * (rank - len(b)) + list(b)
    pattern = []  # per axis: "a" or "b" (that side repeats), "=" (same size)
    for x, y in zip(a, b, strict=True):
        if x == y:
            if x != 1:
                pattern.append("=")
        elif x == 1:
            pattern.append("a")
        elif y == 1:
            pattern.append("b")
        elif x is None or y is None:
            pattern.append("=")  # a valid graph: the unknown size equals the known one
        else:
            return False
    sides = {p for p in pattern if p != "="}
    if len(sides) > 1:
        return False
    if not sides:
        return True
    side = sides.pop()
    last_broadcast = max(i for i, p in enumerate(pattern) if p == side)
    return all(p == side for p in pattern[:last_broadcast])


def _binary(node: NodeDef, shapes: list[Shape]) -> tuple[str, str] | None:
    kernel = f"Quantized{node.op}"
    if len(shapes) == 2 and broadcast_supported(shapes[0], shapes[1]):
        return None
    shown = " and ".join("unknown" if s is None else
                         "[" + ", ".join("?" if d is None else str(d) for d in s) + "]"
                         for s in shapes)
    return f"{kernel} cannot broadcast these shapes", shown


_RULES = {"Conv2D": _conv2d, "MaxPool": _pool, "AvgPool": _pool, "BiasAdd": _bias_add,
          "ResizeBilinear": _resize, "Reshape": _reshape, "Add": _binary, "Mul": _binary}
_NEEDS_SHAPES = frozenset({"Add", "Mul"})


def is_float(node: NodeDef) -> bool:
    """Whether GTT would see the node as float (its `T` is float32)."""
    return "T" in node.attr and node.attr["T"].type == DT_FLOAT


def unsupported(graph_def: GraphDef, candidates: Sequence[NodeDef]) -> list[FloatNode]:
    """The candidates (float nodes GTT would convert) that the eight-bit kernels cannot run."""
    shapes = input_shapes(graph_def, [n.name for n in candidates if n.op in _NEEDS_SHAPES])
    found = []
    for node in candidates:
        if node.op in _NO_KERNEL_REASONS:
            found.append(FloatNode(node.name, node.op, _NO_KERNEL_REASONS[node.op]))
            continue
        rule = _RULES.get(node.op)
        limit = rule(node, shapes.get(node.name, [None, None])) if rule else None
        if limit is not None:
            found.append(FloatNode(node.name, node.op, *limit))
    return found


def without_kernel(graph_def: GraphDef, quantizable: Iterable[str]) -> list[FloatNode]:
    """Float nodes doing arithmetic that no eight-bit kernel covers (Sigmoid, Mean, ...)."""
    skip = set(quantizable) | MOVEMENT_OPS
    return [FloatNode(n.name, n.op, _OTHER_OP_REASONS.get(n.op, NO_KERNEL))
            for n in graph_def.node
            if is_float(n) and n.op not in skip and not n.op.startswith("Quantize")]


# --- a safe rewrite ------------------------------------------------------------------------

def equalize_unit_row_strides(graph_def: GraphDef) -> list[str]:
    """Conv2D with strides [1, 1, s, 1] on a one-row input with a one-row filter (a Conv1D)
    gets strides [1, s, s, 1], in place: the output is the same (one row either way, no
    padding added), and QuantizedConv2D can run it. Returns the names changed."""
    convs = [n for n in graph_def.node if n.op == "Conv2D" and is_float(n)
             and _nhwc(n, "") is None and _padding(n, "") is None
             and all(d == 1 for d in _int_list(n, "dilations") or [1])]
    convs = [n for n in convs if (s := _int_list(n, "strides")) and len(s) == 4
             and s[1] == 1 and s[2] != 1 and s[0] == s[3] == 1]
    shapes = input_shapes(graph_def, [n.name for n in convs])
    changed = []
    for node in convs:
        image, filters = (shapes.get(node.name) or [None, None])[:2]
        if image is None or filters is None or len(image) != 4 or len(filters) != 4:
            continue
        if image[1] == 1 and filters[0] == 1:
            stride = node.attr["strides"].list.i[2]
            node.attr["strides"].list.i[1] = stride
            changed.append(node.name)
    return changed


UNFUSED_BIAS = ("QuantizedBiasAdd is off by up to 4 steps (TF's float32 total space); a "
                "BiasAdd runs in eight bits only inside a converted Conv2D/MatMul")


def unfused_bias_adds(graph: GraphDef, candidates: Sequence[NodeDef], hidden: set[str],
                      ops: Sequence[str] | None) -> list[FloatNode]:
    """BiasAdds that would become a QuantizedBiasAdd of their own: those not right after a
    Conv2D/MatMul that converts (orchestrator.quant.integer_bias adds those biases in the
    accumulator instead). TF's kernel shifts a layer by a range-dependent offset of up to
    about 4 steps, so they stay float."""
    nodes = {n.name: n for n in graph.node}

    def converts(node: NodeDef | None) -> bool:
        return (node is not None and node.op in ("Conv2D", "MatMul") and is_float(node)
                and node.name not in hidden and (ops is None or node.op in ops))

    found = []
    for node in candidates:
        if node.op != "BiasAdd" or node.name in hidden or not node.input:
            continue
        source, _, port = node.input[0].partition(":")
        if port not in ("", "0") or not converts(nodes.get(source)):
            producer = nodes.get(source)
            found.append(FloatNode(node.name, node.op, UNFUSED_BIAS,
                                   f"input {producer.op if producer else source}"))
    return found


# --- the plan for one quantize_nodes run -------------------------------------------------

@dataclass
class FloatPlan:
    """Which quantizable nodes stay float, and why: asked by the user, or beyond a kernel."""

    quantizable: Sequence[str]            # the op types GTT converts
    candidates: list[str]                 # float nodes of those types
    user: list[FloatNode]              # exclude_nodes, or a type left out of `ops`
    limited: list[FloatNode]           # what the eight-bit kernels cannot run
    no_kernel: list[FloatNode]         # float arithmetic with no eight-bit kernel at all
    hidden: set[str] = field(default_factory=set)  # marked half while GTT runs
    unconverted: list[FloatNode] = field(default_factory=list)

    def note_unconverted(self, result: GraphDef) -> None:
        """Candidates GTT left float although nothing asked it to (it skips some inputs)."""
        known = {n.node for n in (*self.user, *self.limited)}
        still = {n.name: n.op for n in result.node if n.op in self.quantizable}
        self.unconverted = [FloatNode(name, still[name], "quantize_nodes left it float")
                            for name in self.candidates if name in still and name not in known]

    def float_nodes(self) -> list[FloatNode]:
        return [*self.user, *self.limited, *self.unconverted, *self.no_kernel]

    def warnings(self, converted: int) -> list[str]:
        """Kernel limits grouped by rule, one line for ops without a kernel, and a note when
        nothing was converted."""
        lines = limit_warnings([*self.limited, *self.unconverted])
        no_kernel = no_kernel_warning(self.no_kernel)
        if no_kernel:
            lines.append(no_kernel)
        if converted == 0 and not self.candidates:
            lines.append("quantize_nodes converted no op to eight bits: the graph has none of "
                         f"{list(self.quantizable)} in float")
        elif converted == 0:
            lines.append(f"quantize_nodes converted no op to eight bits: all "
                         f"{len(self.candidates)} quantizable ops stay float")
        return lines


def plan(graph: GraphDef, exclude_nodes: Iterable[str], ops: Sequence[str] | None,
         quantizable: Sequence[str]) -> FloatPlan:
    """What stays float in `graph` and why: `exclude_nodes`, types not in `ops` (None: all
    `quantizable` types GTT converts), and what the kernels cannot run."""
    candidates = [n for n in graph.node if n.op in quantizable and is_float(n)]
    excluded = set(exclude_nodes)
    user = [FloatNode(n.name, n.op, "exclude_nodes") for n in graph.node
            if n.name in excluded and is_float(n)]
    user += [FloatNode(n.name, n.op, f"ops leaves out {n.op}") for n in candidates
             if ops is not None and n.op not in ops and n.name not in excluded]
    asked = {n.node for n in user}
    limited = unsupported(graph, [n for n in candidates if n.name not in asked])
    no_kernel = without_kernel(graph, quantizable)
    hidden = {n.name for n in graph.node if n.name in excluded and is_float(n)}
    hidden |= {n.node for n in limited}
    limited += unfused_bias_adds(graph, candidates, hidden, ops)
    hidden |= {n.node for n in limited}
    return FloatPlan(quantizable, [n.name for n in candidates], user, limited, no_kernel, hidden)


# --- warnings ------------------------------------------------------------------------------

def _names(nodes: Sequence[FloatNode], shown: int) -> str:
    names = ", ".join(n.node for n in nodes[:shown])
    rest = len(nodes) - shown
    return f"{names} and {rest} more" if rest > 0 else names


def limit_warnings(nodes: Sequence[FloatNode], shown: int = 3) -> list[str]:
    """One line per rule: the node (and its case), or a few of many and a count."""
    by_rule: dict[str, list[FloatNode]] = defaultdict(list)
    for node in nodes:
        by_rule[node.rule].append(node)
    lines = []
    for rule, group in by_rule.items():
        if len(group) == 1:
            lines.append(f"{group[0].node} stays float: {group[0].reason}")
            continue
        details = sorted({n.detail for n in group if n.detail})
        case = f" ({', '.join(details)})" if 0 < len(details) <= 2 else ""
        lines.append(f"{len(group)} nodes stay float, {rule}{case}: {_names(group, shown)}")
    return lines


def no_kernel_warning(nodes: Sequence[FloatNode], shown: int = 2) -> str | None:
    """The one line naming the ops with no eight-bit kernel, by type, with a few names each."""
    if not nodes:
        return None
    by_op: dict[str, list[FloatNode]] = defaultdict(list)
    for node in nodes:
        by_op[node.op].append(node)
    parts = []
    for op, group in by_op.items():
        why = "" if group[0].rule == NO_KERNEL else f"; {group[0].rule}"
        parts.append(f"{op} x{len(group)} ({_names(group, shown)}{why})")
    return f"stay float, {NO_KERNEL}: " + ", ".join(parts)


def records(nodes: Iterable[FloatNode]) -> list[dict[str, Any]]:
    """The float-kept nodes as JSON-ready dicts {node, op, reason}."""
    return [node.record() for node in nodes]

