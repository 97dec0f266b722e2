"""Fold constants and batch norms into the conv/matmul weights before them.

Runs TF's `fold_constants(ignore_errors=true) fold_batch_norms fold_old_batch_norms`,
then folds what those transforms miss, so that a frozen Keras BatchNormalization ends up
inside the weights:

- a per-channel `Mul` by a constant after Conv2D, DepthwiseConv2dNative or MatMul, also
  through a BiasAdd or the BatchToSpaceND of a dilated conv (TF only folds a Mul directly
  after the weight op, and gives up on the whole graph over a scalar, a non-per-channel
  constant or a MatMul with transpose_b);
- FusedBatchNormV2/V3 in inference mode, which TF does not fold at all, and FusedBatchNorm
  after a BiasAdd;
- the `Add`/`AddV2`/`Sub` of a per-channel constant that follows, which becomes a BiasAdd
  (or is merged into the existing one).

A Conv1D's batch norm folds too: the scale and offset pass through the ExpandDims/Squeeze
around its Conv2D (ExpandDims -> Conv2D -> Squeeze -> [BiasAdd] -> [ExpandDims] -> batch
norm), since those leave the channel axis alone.

A pattern is folded only when its constant broadcasts per output channel and no other node
reads the tensors it changes. Batch norms that remain (e.g. after a Relu, or after the Add
of a residual block) are named in one warning, and listed in the info. Outputs match to
about 1e-5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from orchestrator.errors import StageError
from orchestrator.model.artifact import ModelArtifact, node_name
from orchestrator.model.graph_rewrite import (
    GraphIndex,
    control_inputs,
    copy_graph,
    data_inputs,
    is_nhwc,
    make_const,
    output_index,
    prune_orphans,
    remove_nodes,
    reset_node,
    set_const_value,
    unique_name,
)
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef


class Params(StageParams):
    """Which folds to run; all are on by default."""

    fold_constants: bool = Field(
        True, description="Run TF's fold_constants(ignore_errors=true) first; the folds below "
        "need batch-norm parameters computed into constants.")
    fold_batch_norms: bool = Field(
        True, description="Run TF's fold_batch_norms (a Mul directly after Conv2D/MatMul).")
    fold_old_batch_norms: bool = Field(
        True, description="Run TF's fold_old_batch_norms (FusedBatchNorm V1 and "
        "BatchNormWithGlobalNormalization directly after a conv).")
    fold_remaining: bool = Field(
        True, description="Fold what TF's transforms miss: FusedBatchNormV2/V3, batch norms "
        "after a BiasAdd, and the per-channel Add that follows a fold (into a BiasAdd).")


# The ops a batch norm after them folds into (their weights are scaled per channel).
BN_FOLD_OPS = frozenset({"Conv2D", "DepthwiseConv2dNative", "MatMul"})
FUSED_BATCH_NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
BATCH_NORM_OPS = FUSED_BATCH_NORMS | {"BatchNormWithGlobalNormalization"}
ADD_OPS = frozenset({"Add", "AddV2", "Sub"})
# Ops that only move values across batch and space, so a per-channel scale commutes with
# them: BatchToSpaceND closes the SpaceToBatchND/conv/BatchToSpaceND of a dilated conv, and
# a Conv1D is a Conv2D between ExpandDims and Squeeze (checked not to touch the channels).
PASS_THROUGH_OPS = frozenset({"BatchToSpaceND", "ExpandDims", "Identity", "Squeeze"})
FLOAT_DTYPES = (np.float16, np.float32, np.float64)


@dataclass(frozen=True)
class Target:
    """Where a per-channel scale or offset can go: a weight op and its optional BiasAdd.

    `chain` runs from the weight op to the node whose output is scaled, through any
    pass-through ops and the BiasAdd; folding a scale changes every tensor along it.
    """

    chain: tuple[NodeDef, ...]
    bias_add: NodeDef | None
    weights: np.ndarray
    channels: int
    rank: int  # rank of the last node's output, which bounds a broadcastable constant's rank

    @property
    def weight_op(self) -> NodeDef:
        return self.chain[0]

    @property
    def last(self) -> NodeDef:
        """The node whose output the scale or offset is applied to."""
        return self.chain[-1]


def out_channels(op: NodeDef, weights: np.ndarray) -> int | None:
    """Output channels of a weight op, from its weights' shape; None if not a known layout."""
    if op.op == "Conv2D" and weights.ndim == 4:
        return weights.shape[3]
    if op.op == "DepthwiseConv2dNative" and weights.ndim == 4:
        return weights.shape[2] * weights.shape[3]  # channel c*multiplier + m
    if op.op == "MatMul" and weights.ndim == 2:
        return weights.shape[0] if op.attr["transpose_b"].b else weights.shape[1]
    return None


def scale_weights(op: NodeDef, weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Weights multiplied by a per-output-channel `scale` (computed in float64)."""
    w = weights.astype(np.float64)
    if op.op == "DepthwiseConv2dNative":  # [H, W, in, multiplier]
        scaled = w * scale.reshape(w.shape[2], w.shape[3])
    elif op.op == "MatMul" and op.attr["transpose_b"].b:  # [out, in]
        scaled = w * scale[:, None]
    else:  # Conv2D HWIO, MatMul [in, out]
        scaled = w * scale
    return scaled.astype(weights.dtype)


def channel_vector(value: np.ndarray, target: Target) -> np.ndarray | None:
    """`value` as a [C] vector when it broadcasts per output channel ([C], [1,1,1,C], scalar)."""
    if value.dtype.type not in FLOAT_DTYPES or value.ndim > target.rank:
        return None
    if any(dim != 1 for dim in value.shape[:-1]):
        return None
    if value.size not in (1, target.channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (target.channels,))


def _output_rank(node: NodeDef, index: GraphIndex, rank: int) -> int | None:
    """Rank of a pass-through node's output from its input's, or None when the node touches
    the channel (last) axis, so that a per-channel scale would not commute with it."""
    if node.op == "Squeeze":
        dims = {d % rank for d in node.attr["squeeze_dims"].list.i}
        # No squeeze_dims drops every size-1 axis, maybe the channels: not known here.
        return None if not dims or rank - 1 in dims else rank - len(dims)
    if node.op == "ExpandDims":
        axis = index.const_input(data_inputs(node)[1])
        if axis is None or axis.size != 1:
            return None
        return None if int(axis.reshape(-1)[0]) % (rank + 1) == rank else rank + 1
    return rank  # BiasAdd, Identity, BatchToSpaceND keep the rank and the channel axis


def find_target(index: GraphIndex, input_name: str) -> Target | None:
    """The weight op (with constant weights) behind `input_name`.

    Looks through pass-through ops and at most one BiasAdd with a constant bias: a Conv1D is
    ExpandDims -> Conv2D -> Squeeze -> BiasAdd, and a batch norm may follow after another
    ExpandDims.
    """
    node = index.producer(input_name)
    chain: list[NodeDef] = []
    bias_add = None
    while node is not None:
        if node.op == "BiasAdd" and bias_add is None and is_nhwc(node):
            if index.const_input(data_inputs(node)[1]) is None:
                return None
            bias_add = node
        elif node.op not in PASS_THROUGH_OPS:
            break
        chain.append(node)
        node = index.producer(data_inputs(node)[0])
    if node is None or node.op not in BN_FOLD_OPS or not is_nhwc(node):
        return None
    weights = index.const_input(data_inputs(node)[1])
    if weights is None or weights.dtype.type not in FLOAT_DTYPES:
        return None
    channels = out_channels(node, weights)
    if channels is None:
        return None
    rank: int | None = 2 if node.op == "MatMul" else 4
    for step in reversed(chain):
        rank = _output_rank(step, index, rank)
        if rank is None:
            return None
    return Target((node, *reversed(chain)), bias_add, weights, channels, rank=rank)


def _split_const(index: GraphIndex, node: NodeDef) -> tuple[str, np.ndarray, int] | None:
    """For a binary op with one constant operand: (other input, constant, constant's slot)."""
    inputs = data_inputs(node)
    if len(inputs) != 2:
        return None
    for slot in (1, 0):
        value = index.const_input(inputs[slot])
        if value is not None and index.const_input(inputs[1 - slot]) is None:
            return inputs[1 - slot], value, slot
    return None


def _exclusive(index: GraphIndex, node: NodeDef, reader: NodeDef, protected: set[str]) -> bool:
    """Whether `reader` alone sees `node`'s output, so that changing it is safe."""
    return node.name not in protected and index.only_consumer_is(node.name, reader)


class Rewriter:
    """Applies the folds to a GraphDef in place, one at a time, until none applies."""

    def __init__(self, graph_def: GraphDef, protected: set[str]) -> None:
        self.graph_def = graph_def
        self.protected = protected  # graph outputs: their names and values must survive
        self.orphans: set[str] = set()
        self.index = GraphIndex.build(graph_def)
        self.scales_folded = 0
        self.biases_folded = 0

    def run(self) -> None:
        """Fold until nothing changes, then drop the constants the folds left unused."""
        rules = {"Mul": self.fold_mul, **dict.fromkeys(ADD_OPS, self.fold_add),
                 **dict.fromkeys(FUSED_BATCH_NORMS, self.split_fused_batch_norm)}
        changed = True
        while changed:
            changed = False
            for node in list(self.graph_def.node):
                rule = rules.get(node.op)
                if rule is not None and rule(node):
                    self.index = GraphIndex.build(self.graph_def)
                    changed = True
                    break
        prune_orphans(self.graph_def, self.orphans, keep=self.protected)

    def fold_mul(self, mul: NodeDef) -> bool:
        """`target * scale` -> target with scaled weights (and bias), under the Mul's name."""
        split = _split_const(self.index, mul)
        if split is None:
            return False
        x, value, slot = split
        target = find_target(self.index, x)
        if target is None or not self._rewritable(target, mul):
            return False
        scale = channel_vector(value, target)
        if scale is None:
            return False
        self._write_const(target.weight_op, 1,
                          scale_weights(target.weight_op, target.weights, scale), "weights")
        if target.bias_add is not None:
            bias = self.index.const_input(data_inputs(target.bias_add)[1])
            self._write_const(target.bias_add, 1, _as(bias.astype(np.float64) * scale, bias),
                              "bias")
        self._replace(mul, target.last, dropped=data_inputs(mul)[slot])
        self.scales_folded += 1
        return True

    def fold_add(self, add: NodeDef) -> bool:
        """`target + offset` -> a BiasAdd (a new one, or the existing one's bias updated)."""
        split = _split_const(self.index, add)
        if split is None or (add.op == "Sub" and split[2] == 0):
            return False  # c - x flips the sign of x: not a bias
        x, value, slot = split
        target = find_target(self.index, x)
        offset = None if target is None else channel_vector(value, target)
        if offset is None:
            return False
        if add.op == "Sub":
            offset = -offset
        bias_add = target.bias_add
        if bias_add is None:
            self._to_bias_add(add, x, offset.astype(target.weights.dtype))
        elif self._rewritable(target, add, start=bias_add):
            bias = self.index.const_input(data_inputs(bias_add)[1])
            self._write_const(bias_add, 1, _as(bias.astype(np.float64) + offset, bias), "bias")
            self._replace(add, target.last, dropped=data_inputs(add)[slot])
        else:
            return False
        self.biases_folded += 1
        return True

    def split_fused_batch_norm(self, bn: NodeDef) -> bool:
        """FusedBatchNorm* (inference) -> `x * scale + offset`, when folding will absorb it."""
        inputs = data_inputs(bn)
        if bn.attr["is_training"].b or not is_nhwc(bn) or len(inputs) != 5:
            return False
        params = [self.index.const_input(name) for name in inputs[1:]]
        if any(p is None for p in params) or self._side_outputs_used(bn):
            return False
        target = find_target(self.index, inputs[0])
        if (target is None or params[0].size != target.channels
                or not self._rewritable(target, bn)):
            return False
        gamma, beta, mean, variance = (p.astype(np.float64) for p in params)
        scale = gamma / np.sqrt(variance + bn.attr["epsilon"].f)
        offset = beta - mean * scale
        dtype = target.weights.dtype
        taken = set(self.index.nodes)
        scale_name = unique_name(f"{bn.name}/folded_scale", taken)
        offset_name = unique_name(f"{bn.name}/folded_offset", taken)
        mul_name = unique_name(f"{bn.name}/mul", taken)
        self.graph_def.node.extend([make_const(scale_name, scale.astype(dtype)),
                                    make_const(offset_name, offset.astype(dtype))])
        mul = self.graph_def.node.add(name=mul_name, op="Mul", input=[inputs[0], scale_name])
        mul.attr["T"].type = bn.attr["T"].type
        self.orphans.update(node_name(name) for name in inputs[1:])
        reset_node(bn, "AddV2", [mul_name, offset_name, *control_inputs(bn)])
        bn.attr["T"].type = mul.attr["T"].type
        return True

    def _rewritable(self, target: Target, reader: NodeDef, start: NodeDef | None = None
                    ) -> bool:
        """Scaling weights changes every tensor from the weight op (or `start`, for a bias) to
        `reader`: none of them may have other readers."""
        chain = target.chain[target.chain.index(start):] if start is not None else target.chain
        links = zip(chain, (*chain[1:], reader), strict=True)
        return all(_exclusive(self.index, node, nxt, self.protected) for node, nxt in links)

    def _side_outputs_used(self, node: NodeDef) -> bool:
        """Whether anything reads an output other than :0 (e.g. a batch norm's batch mean)."""
        return any(node_name(name) == node.name and output_index(name) > 0
                   for reader in self.index.consumers.get(node.name, [])
                   for name in data_inputs(reader))

    def _write_const(self, node: NodeDef, slot: int, value: np.ndarray, suffix: str) -> None:
        """Give `node`'s input `slot` a new value, in place when no one else reads the Const."""
        position = list(node.input).index(data_inputs(node)[slot])
        current = self.index.producer(node.input[position])
        if (current is not None and current.op == "Const" and current.name not in self.protected
                and self.index.only_consumer_is(current.name, node)):
            set_const_value(current, value)
            return
        name = unique_name(f"{node.name}/folded_{suffix}", set(self.index.nodes))
        self.graph_def.node.append(make_const(name, value))
        self.index.nodes[name] = self.graph_def.node[-1]
        if current is not None:
            self.orphans.add(current.name)
        node.input[position] = name

    def _replace(self, old: NodeDef, new: NodeDef, dropped: str) -> None:
        """Remove `old`; `new` takes its name, so readers and graph outputs keep working."""
        new.input.extend(name for name in control_inputs(old) if name not in new.input)
        self.orphans.add(node_name(dropped))
        name = old.name
        remove_nodes(self.graph_def, [name])
        new.name = name

    def _to_bias_add(self, add: NodeDef, x: str, bias: np.ndarray) -> None:
        const_name = unique_name(f"{add.name}/bias", set(self.index.nodes))
        self.orphans.update(node_name(name) for name in data_inputs(add) if name != x)
        dtype = add.attr["T"].type
        reset_node(add, "BiasAdd", [x, const_name, *control_inputs(add)])
        add.attr["T"].type = dtype
        add.attr["data_format"].s = b"NHWC"
        self.graph_def.node.append(make_const(const_name, bias))


def _as(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    return np.asarray(value).astype(like.dtype).reshape(like.shape)


def count_batch_norm_sites(graph_def: GraphDef) -> int:
    """Batch-norm ops, plus constant Muls right after a weight op (what TF's folds remove)."""
    index = GraphIndex.build(graph_def)
    count = 0
    for node in graph_def.node:
        if node.op in BATCH_NORM_OPS:
            count += 1
        elif node.op == "Mul" and (split := _split_const(index, node)) is not None:
            producer = index.producer(split[0])
            count += int(producer is not None and producer.op in BN_FOLD_OPS)
    return count


def _is_channel_vector(value: np.ndarray) -> bool:
    """More than one value, all along the last axis ([C], [1, 1, 1, C]): a batch norm's shape."""
    return value.size > 1 and all(dim == 1 for dim in value.shape[:-1])


def _unfolded_scale(index: GraphIndex, mul: NodeDef) -> str | None:
    """Why `mul` was left, when it looks like a batch norm's scale: a per-channel constant
    that either follows a weight op or is followed by a per-channel offset."""
    split = _split_const(index, mul)
    if split is None or not _is_channel_vector(split[1]):
        return None
    readers = index.consumers.get(mul.name, [])
    offset = _split_const(index, readers[0]) if len(readers) == 1 else None
    has_offset = (offset is not None and readers[0].op in ADD_OPS
                  and node_name(offset[0]) == mul.name)
    after_weights = find_target(index, split[0]) is not None
    if not (after_weights or has_offset):
        return None
    source = index.producer(split[0])
    after = f"scale after {source.op}" if source is not None else "scale"
    why = "its input has other readers" if after_weights else "no conv or matmul before it"
    return f"{after}, {why}"


def unfolded_batch_norms(graph_def: GraphDef) -> list[dict[str, str]]:
    """Batch norms still left, fused ops or Keras' `x * scale + offset`: {node, reason}."""
    index = GraphIndex.build(graph_def)
    left = []
    for node in graph_def.node:
        if node.op in BATCH_NORM_OPS:
            source = index.producer(data_inputs(node)[0])
            after = f" after {source.op}" if source is not None else ""
            left.append({"node": node.name, "reason": f"{node.op}{after}"})
        elif node.op == "Mul" and (why := _unfolded_scale(index, node)) is not None:
            left.append({"node": node.name, "reason": why})
    return left


def unfolded_warning(left: list[dict[str, str]], shown: int = 3) -> str | None:
    """One line naming the batch norms left (a few, and how many more)."""
    if not left:
        return None
    noun = "batch norm" if len(left) == 1 else f"{len(left)} batch norms"
    named = ", ".join(f"{n['node']} ({n['reason']})" for n in left[:shown])
    more = f" and {len(left) - shown} more" if len(left) > shown else ""
    return f"{noun} not folded into weights: {named}{more}"


def _tf_transforms(params: Params) -> list[str]:
    return [name for name, on in (("fold_batch_norms", params.fold_batch_norms),
                                  ("fold_old_batch_norms", params.fold_old_batch_norms)) if on]


def _transform(graph: GraphDef, artifact: ModelArtifact, transforms: str) -> GraphDef:
    from orchestrator.model import tf_adapter
    outputs = [node_name(name) for name in artifact.outputs]
    return tf_adapter.transform_graph(graph, artifact.input_names, outputs, transforms)


def _run_tf_batch_norm_folds(graph: GraphDef, artifact: ModelArtifact, params: Params,
                             ctx: StageContext) -> tuple[GraphDef, dict[str, str]]:
    """TF's batch-norm transforms, one at a time; returns the graph and those that failed.

    fold_batch_norms rejects a whole graph over one Mul it cannot handle (a scalar, a
    non-per-channel constant, MatMul with transpose_b: "Mul constant input to batch norm has
    bad shape"). The graph is still valid then, and our own folds cover what it would do.
    Both are tried together first: each call serializes the whole graph.
    """
    transforms = _tf_transforms(params)
    if not transforms:
        return graph, {}
    try:
        return _transform(graph, artifact, " ".join(transforms)), {}
    except ValueError:
        pass
    skipped = {}
    for transform in transforms:
        try:
            graph = _transform(graph, artifact, transform)
        except ValueError as exc:
            skipped[transform] = str(exc)
            ctx.log.info("fold: TF's %s skipped (%s); folding without it", transform, exc)
    return graph, skipped


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    """Fold constants and batch norms; the input artifact is left untouched."""
    graph = copy_graph(artifact.graph_def)
    nodes_before = len(graph.node)
    if params.fold_constants:
        try:
            graph = _transform(graph, artifact, "fold_constants(ignore_errors=true)")
        except ValueError as exc:
            raise StageError(f"fold_constants: {exc}", pipeline=ctx.pipeline,
                             stage=ctx.stage) from exc
    sites_before = count_batch_norm_sites(graph)
    graph, skipped = _run_tf_batch_norm_folds(graph, artifact, params, ctx)
    folded_by_tf = sites_before - count_batch_norm_sites(graph)
    rewriter = Rewriter(graph, protected={node_name(name) for name in artifact.outputs})
    if params.fold_remaining:
        rewriter.run()
    left = unfolded_batch_norms(graph)
    warning = unfolded_warning(left)
    metrics = {
        "nodes_before": float(nodes_before),
        "nodes_after": float(len(graph.node)),
        "batch_norms_folded": float(folded_by_tf + rewriter.scales_folded),
        "batch_norms_folded_by_tf": float(folded_by_tf),
        "biases_folded": float(rewriter.biases_folded),
        "batch_norms_unfolded": float(len(left)),
    }
    info: dict[str, object] = {"batch_norms_unfolded": left} if left else {}
    if skipped:
        info["tf_transforms_skipped"] = skipped
    return StageResult(artifact=artifact.replace(graph_def=graph), metrics=metrics, info=info,
                       warnings=[warning] if warning else [])


STAGE = register(Stage(name="fold", run=run, params=Params, doc=__doc__))
