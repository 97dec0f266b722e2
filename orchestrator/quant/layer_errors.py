"""Per-layer 8-bit diagnostics: how far each quantized op's output is from float.

Like TFLite's quantization debugger. For each float op F that `quantize_nodes` converted
(its eight-bit op is `F/q8`, or `F/eightbit` without short names), the 8-bit output is F/q8
itself when it yields quint8, or the Requantize after it when it yields qint32. It is
dequantized exactly as TF's MIN_FIRST Dequantize does, and compared on representative
data with two float references:

- `rmse_over_scale`: the RMSE against F computed in float *on the 8-bit graph's own
  inputs to F* (with the float weights), over the output's quantization scale
  ((max - min) / 255). This is the error F itself adds, as TFLite's NumericVerify
  measures it: about 0.29 (1/sqrt(12)) is pure rounding, above 0.7 is flagged. Compared
  with the float model's F instead, every layer would also carry all the error made
  before it, and the deepest layers would always look worst.
- `nmse`: the MSE against the float model's own F output, over the mean square of that
  output: how far this tensor has drifted from float, all earlier layers included.

Also the range used (min, max over the batches), and the share of the float model's
values outside it (clipped). Each graph runs once per batch fetching every tensor at once;
only sums are kept across batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.model.artifact import node_name
from orchestrator.quant.numerics import dequantize

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.core.framework.graph_pb2 import GraphDef

    from orchestrator.model.artifact import ModelArtifact

IDEAL = 1 / math.sqrt(12)  # RMSE of rounding alone, in quantization steps (~0.29)
FLAG_ABOVE = 0.7
FIELDS = ("node", "op", "rmse_over_scale", "nmse", "range_min", "range_max", "scale",
          "clipped_share")
# Samples per session run: small, since every quantized layer's activations are fetched.
BATCH_SIZE = 16
_EIGHT_BIT_SUFFIXES = ("/q8", "/eightbit")


@dataclass(frozen=True)
class QuantizedLayer:
    """A float op F and where its 8-bit output lives in the 8-bit graph."""

    node: str       # F, in both graphs' naming
    op: str         # F's float op type
    output: str     # node whose outputs 0, 1, 2 are the quint8 tensor, its min and max
    # F's activation inputs, by input index, and where the 8-bit graph's value of each is:
    # (i, "layer", X) for quantized layer X's output, (i, "tensor", "X:k") for a float tensor
    feeds: tuple[tuple[int, str, str], ...] = ()
    # the float Conv2D/MatMul computed inside this layer (a bias added in its accumulator,
    # orchestrator.quant.integer_bias): `feeds` then index its inputs, and it is copied too
    fused: str | None = None


def _float_op_of(name: str) -> str | None:
    for suffix in _EIGHT_BIT_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def quantized_layers(float_graph: GraphDef, eight_bit: tf.Graph) -> list[QuantizedLayer]:
    """The quantized layers, in the float graph's execution order.

    A Quantized* op named `F/q8` or `F/eightbit` whose F is a float op of `float_graph`.
    Its 8-bit output: itself when it yields quint8, else the Requantize reading its
    qint32 output (none: the layer is left out, since no 8-bit tensor exists).
    """
    import tensorflow as tf

    float_nodes = {n.name: n for n in float_graph.node}
    outputs: dict[str, str] = {}
    for op in eight_bit.get_operations():
        f = _float_op_of(op.name)
        eight_bit_op = op.type.startswith("Quantized") or (  # integer_bias' add
            op.type == "Bitcast" and op.outputs[0].dtype == tf.qint32)
        if f is None or not eight_bit_op or f not in float_nodes:
            continue
        out = op.outputs[0]
        if out.dtype == tf.quint8:
            outputs[f] = op.name
        elif out.dtype == tf.qint32:
            requant = [c for c in out.consumers() if c.type == "Requantize"
                       and c.inputs[0] is out and c.outputs[0].dtype == tf.quint8]
            if requant:
                outputs[f] = requant[0].name
    names = {op.name for op in eight_bit.get_operations()}
    layers = []
    for name in execution_order(float_graph):
        if name not in outputs:
            continue
        feeds = []
        first = float_nodes.get(node_name(float_nodes[name].input[0])) \
            if float_nodes[name].input else None
        fused = first.name if (first is not None and first.op in ("Conv2D", "MatMul")
                               and first.name not in outputs and first.name not in names) \
            else None
        for index, inp in enumerate(float_nodes[fused or name].input):
            source = float_nodes.get(node_name(inp))
            if inp.startswith("^") or source is None or source.op in ("Const", "Placeholder"):
                continue  # float weights stay; the model inputs are the same in both
            port = int(inp.partition(":")[2] or 0)
            if source.name in outputs and port == 0:
                feeds.append((index, "layer", source.name))
            elif source.name in names and _same_dtype(eight_bit, source, port):
                feeds.append((index, "tensor", f"{source.name}:{port}"))
        layers.append(QuantizedLayer(name, float_nodes[name].op, outputs[name], tuple(feeds),
                                     fused))
    return layers


def _same_dtype(eight_bit: tf.Graph, float_node: Any, port: int) -> bool:
    """Whether the 8-bit graph's tensor of that name is still what the float one is."""
    op = eight_bit.get_operation_by_name(float_node.name)
    if port >= len(op.outputs):
        return False
    dtype = op.outputs[port].dtype
    attr = float_node.attr
    expected = next((attr[k].type for k in ("T", "dtype", "out_type") if k in attr), None)
    return expected is None or dtype.as_datatype_enum == expected


def execution_order(graph_def: GraphDef) -> list[str]:
    """Node names in an order where every node follows its inputs (ties: file order)."""
    nodes = {n.name: n for n in graph_def.node}
    done: set[str] = set()
    order: list[str] = []
    for root in nodes:
        stack = [(root, False)]
        while stack:  # iterative post-order: graphs can be deep
            name, expanded = stack.pop()
            if name in done or name not in nodes:
                continue
            if expanded:
                done.add(name)
                order.append(name)
                continue
            stack.append((name, True))
            stack.extend((node_name(i), False) for i in reversed(nodes[name].input)
                         if node_name(i) not in done)
    return order


@dataclass
class _Sums:
    """What one layer accumulates over the batches (float64 sums, never activations)."""

    count: int = 0
    scaled_count: int = 0        # elements of batches with a non-zero range
    local_sq_scaled: float = 0.0  # squared error against F on the 8-bit inputs, in steps
    drift_sq: float = 0.0        # squared error against the float model's F
    float_sq: float = 0.0
    clipped: int = 0
    scale_sum: float = 0.0       # scale weighted by elements
    range_min: float = math.inf
    range_max: float = -math.inf

    def add(self, q: np.ndarray, lo: float, hi: float, local: np.ndarray,
            reference: np.ndarray) -> None:
        values = dequantize(q, lo, hi).astype(np.float64)
        local = np.asarray(local, np.float64)
        reference = np.asarray(reference, np.float64)
        if values.shape != local.shape or values.shape != reference.shape:
            raise ValueError(f"shapes differ: 8-bit {values.shape}, float {reference.shape}")
        scale = (float(hi) - float(lo)) / 255.0
        self.count += values.size
        if scale > 0:
            self.scaled_count += values.size
            self.local_sq_scaled += float(np.sum((values - local) ** 2)) / scale ** 2
        self.drift_sq += float(np.sum((values - reference) ** 2))
        self.float_sq += float(np.sum(reference ** 2))
        self.clipped += int(np.count_nonzero((reference < lo) | (reference > hi)))
        self.scale_sum += scale * values.size
        self.range_min = min(self.range_min, float(lo))
        self.range_max = max(self.range_max, float(hi))

    def row(self, layer: QuantizedLayer) -> dict[str, Any]:
        def ratio(num: float, den: float) -> float | None:
            return _clean(num / den) if den > 0 else None

        over_scale = ratio(self.local_sq_scaled, self.scaled_count)
        return {"node": layer.node, "op": layer.op,
                "rmse_over_scale": None if over_scale is None else _clean(math.sqrt(over_scale)),
                "nmse": ratio(self.drift_sq, self.float_sq),
                "range_min": _clean(self.range_min), "range_max": _clean(self.range_max),
                "scale": ratio(self.scale_sum, self.count),
                "clipped_share": ratio(self.clipped, self.count)}


def _clean(value: float) -> float | None:
    """6 significant digits; NaN and infinities become None (null in JSON)."""
    return float(f"{value:.6g}") if math.isfinite(value) else None


def measure(float_model: ModelArtifact, eight_bit: ModelArtifact,
            batches: Iterable[np.ndarray]) -> list[dict[str, Any]]:
    """One row per quantized layer (see FIELDS), in execution order.

    `batches`: representative inputs of the single model input. A graph with a fixed batch
    size gets a short batch padded by repeating its last sample; the padding is not counted.
    """
    from orchestrator.measure.tf_runtime import GraphRunner

    if len(eight_bit.inputs) != 1:
        raise ValueError(f"layer diagnostics feed one input; the model has "
                         f"{eight_bit.input_names}")
    with GraphRunner.for_artifact(eight_bit) as q8:
        layers = quantized_layers(float_model.graph_def, q8.graph)
        if not layers:
            return []
        graph_def, local, sources = _with_local_copies(float_model.graph_def, layers,
                                                       q8.graph)
        with GraphRunner(graph_def, float_model.input_names, float_model.outputs) as fp:
            sums = {layer.node: _Sums() for layer in layers}
            q8_fetches = [f"{layer.output}:{k}" for layer in layers for k in range(3)]
            tensors = sorted({src for kind, src in sources if kind == "tensor"})
            fp_fetches = [f"{layer.node}:0" for layer in layers] + local
            fixed = q8.fixed_batch_size()
            for batch, count in _batches(batches, fixed):
                values = q8.run(batch, fetches=q8_fetches + tensors)
                eight = {layer.node: values[3 * i: 3 * i + 3] for i, layer in enumerate(layers)}
                floats = dict(zip(tensors, values[3 * len(layers):], strict=True))
                feed = {fp.input_tensors[0]: batch}
                for (kind, src), placeholder in sources.items():
                    feed[placeholder] = (floats[src] if kind == "tensor" else
                                         dequantize(*eight[src]))
                out = fp.session.run(fp_fetches, feed_dict=feed)
                trim = _trimmer(fixed, count)
                for i, layer in enumerate(layers):
                    q, lo, hi = eight[layer.node]
                    try:
                        sums[layer.node].add(trim(q), float(lo), float(hi),
                                             trim(out[len(layers) + i]), trim(out[i]))
                    except ValueError as exc:
                        raise ValueError(f"layer {layer.node!r}: {exc}") from exc
    return [sums[layer.node].row(layer) for layer in layers]


def _with_local_copies(float_graph: GraphDef, layers: Sequence[QuantizedLayer],
                       eight_bit: tf.Graph
                       ) -> tuple[GraphDef, list[str], dict[tuple[str, str], str]]:
    """The float graph plus, per layer, a copy of F whose activation inputs are
    Placeholders (fed with the 8-bit graph's values). Copies, not feeds into F's own
    inputs: feeding a tensor replaces it everywhere, also where it is itself a layer's
    output that we fetch. Returns the graph, the copies' tensors (in layer order) and
    (kind, source) -> placeholder tensor."""
    from tensorflow.core.framework import node_def_pb2, types_pb2

    from orchestrator.model.graph_rewrite import copy_graph

    graph = copy_graph(float_graph)
    nodes = {n.name: n for n in graph.node}
    scope = "layer_errors"
    while any(n == scope or n.startswith(scope + "/") for n in nodes):
        scope += "_"
    sources: dict[tuple[str, str], str] = {}
    local = []
    for i, layer in enumerate(layers):
        fed = layer.fused or layer.node  # the node whose activation inputs are fed
        copy = node_def_pb2.NodeDef()
        copy.CopyFrom(nodes[fed])
        copy.name = f"{scope}/{i}" if layer.fused is None else f"{scope}/{i}/linear"
        copy.ClearField("device")
        del copy.input[:]
        for index, inp in enumerate(nodes[fed].input):
            if inp.startswith("^"):
                continue
            feed = next(((k, s) for j, k, s in layer.feeds if j == index), None)
            if feed is None:
                copy.input.append(inp)
                continue
            if feed not in sources:
                placeholder = node_def_pb2.NodeDef(name=f"{scope}/in{len(sources)}",
                                                   op="Placeholder")
                # a layer's value is dequantized (float32); a tensor's has the 8-bit graph's
                # dtype, which quantized_layers checked is the float graph's
                placeholder.attr["dtype"].type = (
                    types_pb2.DT_FLOAT if feed[0] == "layer" else
                    eight_bit.get_tensor_by_name(feed[1]).dtype.as_datatype_enum)
                graph.node.append(placeholder)
                sources[feed] = f"{placeholder.name}:0"
            copy.input.append(sources[feed])
        graph.node.append(copy)
        if layer.fused is not None:  # F itself, on the copied linear op
            linear, copy = copy, node_def_pb2.NodeDef()
            copy.CopyFrom(nodes[layer.node])
            copy.name = f"{scope}/{i}"
            copy.ClearField("device")
            copy.input[0] = linear.name
            graph.node.append(copy)
        local.append(f"{copy.name}:0")
    return graph, local, sources


def _batches(batches: Iterable[np.ndarray], fixed: int | None
             ) -> Iterable[tuple[np.ndarray, int]]:
    """(batch as fed, real samples in it): at most BATCH_SIZE samples, or the fixed size."""
    size = fixed or BATCH_SIZE
    for chunk in batches:
        chunk = np.asarray(chunk)
        for start in range(0, len(chunk), size):
            batch = chunk[start:start + size]
            yield _pad(batch, fixed), len(batch)


def _pad(batch: np.ndarray, fixed: int | None) -> np.ndarray:
    if fixed is None or len(batch) >= fixed:
        return batch
    return np.concatenate([batch, np.repeat(batch[-1:], fixed - len(batch), axis=0)])


def _trimmer(fixed: int | None, count: int):  # noqa: ANN202
    """Drops the padding rows of tensors whose first dimension is the fixed batch."""
    if fixed is None or count >= fixed:
        return lambda a: a
    return lambda a: a[:count] if np.ndim(a) and np.shape(a)[0] == fixed else a


# --- reading the rows (no TensorFlow: the console and reports use these) ------------------

def worst_first(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows by rmse_over_scale, highest first (unknown or unmeasured values last)."""
    return sorted(rows, key=lambda r: (r.get("rmse_over_scale") is None,
                                       -(r.get("rmse_over_scale") or 0.0)))


def flagged(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows above FLAG_ABOVE, worst first."""
    return [r for r in worst_first(rows) if (r.get("rmse_over_scale") or 0.0) > FLAG_ABOVE]


def summary_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """layer_error_max, layers_flagged, layer_nmse_max (maxima only where known)."""
    metrics = {"layers_flagged": float(len(flagged(rows)))}
    for name, key in (("layer_error_max", "rmse_over_scale"), ("layer_nmse_max", "nmse")):
        known = [r[key] for r in rows if r[key] is not None]
        if known:
            metrics[name] = float(max(known))
    return metrics


def table_tsv(rows: Sequence[dict[str, Any]], fields: Sequence[str] = FIELDS) -> str:
    """The rows as TSV, worst first, header row first; unknown values left empty."""
    def cell(value: Any) -> str:
        if value is None:
            return ""
        return f"{value:.6g}" if isinstance(value, float) else str(value)

    lines = ["\t".join(fields)]
    lines += ["\t".join(cell(row.get(f)) for f in fields) for row in worst_first(rows)]
    return "\n".join(lines) + "\n"
