"""Store float weights as 8-bit: about a quarter of the file size.

Runs the Graph Transform Tool's `quantize_weights`: each float constant with at least
`minimum_size` elements becomes a quint8 constant plus its float min/max, expanded back
to float by a Dequantize op that keeps the original node name. The range always includes
zero. Computation stays in float; `quantize_nodes` afterwards uses the 8-bit weights
directly.

Each quantized tensor adds three small nodes, so tiny tensors (biases, per-channel scales)
are left in float by default: they are a negligible share of the bytes, and quantizing
them would make the file larger, not smaller.

An all-zero tensor (e.g. the folded bias of an untrained batch norm) gets a degenerate range
from TF's transform, [0, 1.2e-38] (it starts its maximum at FLT_MIN, so its min == max guard
never fires), which Dequantize and the 8-bit ops turn into NaN. Such ranges are widened here
to [min, min + 0.01], as QuantizeV2 widens them at run time; the values stay exact zeros.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from orchestrator.limits import bounded
from orchestrator.model.graph_rewrite import GraphIndex, const_value, copy_graph, set_const_value
from orchestrator.quant import ranges as q
from orchestrator.quant.knobs import FLOAT, Candidate, with_params
from orchestrator.quant.numerics import float_to_quint8
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

    from orchestrator.model.artifact import ModelArtifact

# Warn when less than this share of the weight bytes ends up at 8 bits.
MIN_QUANTIZED_FRACTION = 0.9
# A range narrower than this holds only zeros, to within the tolerance TF's quantize_weights
# itself uses for zero in its min == max case ...
DEGENERATE_RANGE = 1e-6
# ... and is widened to this width: QuantizeV2's ensure_minimum_range, which is what
# quantize_nodes gives such a constant without quantize_weights before it.
MINIMUM_RANGE = 0.01


class Params(StageParams):
    minimum_size: bounded("elements") = Field(
        128, description="Quantize float constants with at least this many elements. "
        "128 takes every conv, depthwise/separable and dense kernel from a 3x3 kernel over "
        "16 channels (144 values) up, well over 90% of the weight bytes of common models, "
        "and leaves biases of small layers in float, where 8 bits would cost more bytes "
        "(three extra nodes) than they save.")
    exclude_nodes: list[str] = Field(
        [], description="Names of ops whose constant weight inputs stay in float (the "
        "accuracy guard reverts a layer to float this way).")


_DT_FLOAT = 1
# GTT's quantize_weights converts only float Consts and has no exclusion: an excluded
# weight is marked half-precision while it runs, then restored (its bytes stay float32).
_DT_HALF = 19


def hide_weights(graph_def: GraphDef, ops: list[str]) -> set[str]:
    """Mark the float Const inputs of the named ops half-precision, in place; returns
    their names. ValueError for a name that is not in the graph."""
    nodes = {n.name: n for n in graph_def.node}
    missing = sorted(set(ops) - set(nodes))
    if missing:
        raise ValueError(f"exclude_nodes names nodes that are not in the graph: {missing}")
    hidden = set()
    for op in ops:
        for inp in nodes[op].input:
            const = nodes.get(inp.split(":")[0].lstrip("^"))
            if const is not None and const.op == "Const" and \
                    const.attr["dtype"].type == _DT_FLOAT:
                const.attr["dtype"].type = _DT_HALF
                hidden.add(const.name)
    return hidden


def widen_degenerate_ranges(graph_def: GraphDef, original: GraphDef) -> list[str]:
    """Give each weight TF's quantize_weights stored with a degenerate range a usable one.

    In place on quantize_weights' output (`original` is its input); returns the names of the
    tensors changed. The values are quantized again, exactly as TF does, in the new range.
    """
    import tensorflow as tf

    index = GraphIndex.build(graph_def)
    floats = {n.name: n for n in original.node if n.op == "Const"}
    widened = []
    for node in graph_def.node:
        if node.op != "Dequantize" or node.name not in floats or list(node.input) != [
                f"{node.name}_quantized_{part}" for part in ("const", "min", "max")]:
            continue
        data, lo_node, hi_node = (index.nodes.get(name) for name in node.input)
        if data is None or lo_node is None or hi_node is None:
            continue
        lo, hi = float(const_value(lo_node)), float(const_value(hi_node))
        if not hi - lo < DEGENERATE_RANGE:
            continue
        hi = lo + MINIMUM_RANGE  # lo is in (-1e-6, 0]: TF's ranges always include zero
        quantized = float_to_quint8(const_value(floats[node.name]), lo, hi)
        data.attr["value"].tensor.CopyFrom(
            tf.make_tensor_proto(quantized, dtype=tf.quint8, shape=quantized.shape))
        set_const_value(hi_node, np.float32(hi))
        widened.append(node.name)
    return widened


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.model import tf_adapter
    before = q.weight_stats(artifact.graph_def)
    graph = copy_graph(artifact.graph_def)
    hidden = hide_weights(graph, params.exclude_nodes)
    result = tf_adapter.transform_graph(
        graph, artifact.input_names, list(artifact.outputs),
        f"quantize_weights(minimum_size={params.minimum_size})")
    for node in result.node:
        if node.name in hidden:
            node.attr["dtype"].type = _DT_FLOAT
    widened = widen_degenerate_ranges(result, artifact.graph_def)
    after = q.weight_stats(result)
    quantized_tensors = sum(1 for n in result.node if n.op == "Dequantize"
                            and list(n.input[:1]) == [f"{n.name}_quantized_const"])
    fraction = after.quantized_fraction
    warnings = []
    if before.float_elements and fraction < MIN_QUANTIZED_FRACTION:
        warnings.append(
            f"only {fraction:.1%} of the weight bytes were quantized (minimum_size="
            f"{params.minimum_size}); lower minimum_size to reach "
            f"{MIN_QUANTIZED_FRACTION:.0%}")
    size_before = artifact.graph_def.ByteSize()
    size_after = result.ByteSize()
    return StageResult(
        artifact=artifact.replace(graph_def=result),
        metrics={"weight_bytes_quantized_fraction": fraction,
                 "quantized_tensors": float(quantized_tensors),
                 "float_weight_bytes": float(after.float_bytes),
                 "degenerate_ranges_widened": float(len(widened)),
                 "size_ratio": size_after / size_before if size_before else 1.0},
        info={"weights": {"quantized_elements": after.quantized_elements,
                          "float_elements": after.float_elements},
              "degenerate_ranges_widened": widened, "float_weights_kept": sorted(hidden)},
        warnings=warnings)


def _candidate(params: Params, candidate: Candidate) -> Params:
    """A guard candidate's float layers keep float weights (weights-only ones keep 8-bit
    weights: that is what they are)."""
    moved = candidate.nodes_in(FLOAT.name)
    return with_params(params, exclude_nodes=sorted({*params.exclude_nodes, *moved})) \
        if moved else params


STAGE = register(Stage(name="quantize_weights", run=run, params=Params, doc=__doc__ or "",
                       candidate=_candidate, eight_bit=True))
