"""Replace float ops with eight-bit ones (QuantizedConv2D, QuantizedMatMul, ...).

Runs the Graph Transform Tool's `quantize_nodes`, then tidies its output:

- an `Add`/`AddV2` of a per-channel constant right after a Conv2D/MatMul becomes a
  `BiasAdd`, so that it runs in eight bits too (`bias_add`);
- Quantize/Dequantize pairs that cancel out are removed (GTT does this, including the
  weights `quantize_weights` stored as quint8 + Dequantize, which are then used directly);
- the quantization of constant inputs (float weights and biases) is computed once, here,
  and stored as quint8 constants, so the file holds 8-bit weights even without
  `quantize_weights`;
- a Shape/Size/Rank of a dequantized tensor reads the 8-bit tensor instead;
- nodes nothing needs any more are dropped, and the added nodes get short names
  (`<op>/q8`, `<op>/q8/range`, ...; `short_names`) instead of GTT's longer ones. The
  model's own names stay: on small models with long traced names they can be a third of
  the file, which the `compact_names` stage removes.

Activation ranges are computed at run time by RequantizationRange ops, unless
`fallback_min`/`fallback_max` fix them; `log_ranges` then `freeze_ranges` replace them with
constants measured on representative data. `ops` and `exclude_nodes` keep chosen op types
or nodes in float (an accuracy guard uses them).

Only what TF's eight-bit kernels can run is converted (orchestrator.quant.kernel_support): a
Conv2D with unequal strides, a dilated one, an unsupported broadcast, ... stays float, named
in a warning with the reason; a Conv1D's strided Conv2D on one row gets equal strides. Ops
with no eight-bit kernel at all (Sigmoid, Mean, DepthwiseConv2dNative, ...) are named in one
diagnostic (report.json and the page: no recipe setting changes it). Every float-kept node
is in the info's `float_nodes` ({node, op, reason}).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from orchestrator.model.artifact import node_name
from orchestrator.model.graph_rewrite import (
    constant_nodes,
    copy_graph,
    make_const,
    op_counts,
    rename_nodes,
    reset_node,
    subgraph,
    unique_name,
)
from orchestrator.quant import fake_quant_ranges, integer_bias
from orchestrator.quant import kernel_support as ks
from orchestrator.quant import ranges as q
from orchestrator.quant.knobs import (
    FLOAT,
    WEIGHTS_ONLY,
    Alternative,
    Candidate,
    Fallback,
    FoundLayers,
    Knobs,
    LayerSource,
    with_params,
)
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

    from orchestrator.model.artifact import ModelArtifact
    from orchestrator.spec.models import Tune

_DT_FLOAT = 1
# GTT converts only ops whose inputs and outputs are all float, and has no per-node
# exclusion: an excluded node is marked half-precision while GTT runs, then restored.
_DT_HALF = 19
_LINEAR_OPS = ("Conv2D", "MatMul", "DepthwiseConv2dNative")


class Params(StageParams):
    # the guard is applied by the runner around this stage; the 8-bit graph is the same
    NOT_IN_KEY = frozenset({"guard"})
    ops: list[str] | None = Field(
        None, description="Op types to convert to eight bits (default: every type "
        "quantize_nodes supports: " + ", ".join(q.QUANTIZABLE_OPS) + ").")
    exclude_nodes: list[str] = Field(
        [], description="Names of nodes to leave in float.")
    fallback_min: float | None = Field(
        None, description="Fixed minimum for every 32-to-8-bit requantization, instead of "
        "dynamic RequantizationRange ops (give fallback_max too).")
    fallback_max: float | None = Field(
        None, description="Fixed maximum for every 32-to-8-bit requantization.")
    bias_add: bool = Field(
        True, description="Rewrite Add/AddV2 of a per-channel constant after "
        "Conv2D/MatMul/DepthwiseConv2dNative as BiasAdd, so it runs in eight bits.")
    short_names: bool = Field(
        True, description="Name the nodes quantize_nodes adds <op>/q8, <op>/q8/range, "
        "<op>/q8/requant, <op>/q8/in<k>/... instead of GTT's longer <op>/eightbit/..., "
        "<op>_eightbit/<input>/...: a smaller file. Inputs and outputs keep their names.")
    bias_correction: bool = Field(
        True, description="Subtract from each bias after a Conv2D/MatMul/DepthwiseConv2dNative "
        "the mean shift its 8-bit weights cause, measured on the representative data against "
        "the lineage's float model (orchestrator.quant.bias_correction); skipped without them.")
    guard: bool = Field(
        False, description="Accuracy guard: measure on evaluation data and keep harmful ops "
        "in float (through `ops`/`exclude_nodes`); applied by the runner.")

    @model_validator(mode="after")
    def _check(self) -> Params:
        if (self.fallback_min is None) != (self.fallback_max is None):
            raise ValueError("give both fallback_min and fallback_max, or neither")
        if self.fallback_min is not None and not self.fallback_min < self.fallback_max:
            raise ValueError("fallback_min must be below fallback_max")
        unknown = sorted(set(self.ops or ()) - set(q.QUANTIZABLE_OPS))
        if unknown:
            raise ValueError(f"ops {unknown} have no eight-bit version in quantize_nodes; "
                             f"choose from {list(q.QUANTIZABLE_OPS)}")
        return self


def _transform_string(params: Params) -> str:
    args = []
    if params.ops is not None:
        args += [f"ignore_op={op}" for op in q.QUANTIZABLE_OPS if op not in params.ops]
    if params.fallback_min is not None:
        args += [f"fallback_min={params.fallback_min!r}", f"fallback_max={params.fallback_max!r}"]
    return f"quantize_nodes({', '.join(args)})" if args else "quantize_nodes"


def _const_input(nodes: dict, inp: str):  # noqa: ANN202
    """The Const node behind a data input (port 0), else None."""
    name, _, port = inp.partition(":")
    node = nodes.get(name)
    if inp.startswith("^") or port not in ("", "0") or node is None or node.op != "Const":
        return None
    return node


def _shape(node) -> list[int]:  # noqa: ANN001
    return [d.size for d in node.attr["value"].tensor.tensor_shape.dim]


def _output_channels(linear, weights) -> int:  # noqa: ANN001
    # Read attrs with `in` first: indexing a proto map inserts an empty value.
    w_shape = _shape(weights)
    if linear.op == "MatMul":
        transposed = "transpose_b" in linear.attr and linear.attr["transpose_b"].b
        return w_shape[0] if transposed else w_shape[-1]
    layout = linear.attr["data_format"].s if "data_format" in linear.attr else b"NHWC"
    if layout != b"NHWC" or len(w_shape) != 4:
        return -1
    if linear.op == "DepthwiseConv2dNative":
        return w_shape[2] * w_shape[3]
    return w_shape[3]


def rewrite_bias_adds(graph_def: GraphDef) -> int:
    """Turn `Add[V2](linear, const[C])` into `BiasAdd` in place; returns how many.

    Only when the constant is 1-D with as many values as the linear op (with const
    weights) has output channels, so broadcasting is exactly BiasAdd's.
    """
    nodes = {n.name: n for n in graph_def.node}
    count = 0
    for node in graph_def.node:
        if node.op not in ("Add", "AddV2") or len(node.input) != 2 \
                or "T" not in node.attr or node.attr["T"].type != _DT_FLOAT:
            continue
        for data, bias in ((0, 1), (1, 0)):
            name, _, port = node.input[data].partition(":")
            linear, bias_node = nodes.get(name), _const_input(nodes, node.input[bias])
            if linear is None or bias_node is None or port not in ("", "0") \
                    or linear.op not in _LINEAR_OPS or len(linear.input) < 2:
                continue
            weights = _const_input(nodes, linear.input[1])
            shape = _shape(bias_node)
            if weights is None or len(shape) != 1 or shape[0] != _output_channels(linear,
                                                                                  weights):
                continue
            reset_node(node, "BiasAdd", [node.input[data], node.input[bias]])
            node.attr["T"].type = _DT_FLOAT
            count += 1
            break
    return count


def fold_constant_quantizations(graph_def: GraphDef) -> tuple[GraphDef, int]:
    """Replace every QuantizeV2 whose inputs are all constant by three Const nodes.

    The values come from running the graph's own QuantizeV2 ops once, so the result is
    numerically identical to what the graph computed at every run.
    """
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    constant = constant_nodes(graph_def)
    targets = [n for n in graph_def.node if n.op == "QuantizeV2" and n.name in constant]
    if not targets:
        return graph_def, 0
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    fetches = [[f"{t.name}:{k}" for k in range(3)] for t in targets]
    with tf.compat.v1.Session(graph=graph) as session:
        values = session.run(fetches)

    nodes = {n.name: n for n in graph_def.node}
    taken = set(nodes)
    renames: dict[str, str] = {}
    new_consts = []
    for target, (data, lo, hi) in zip(targets, values, strict=True):
        source = _const_input(nodes, target.input[0])
        base = source.name if source is not None else target.name
        names = [unique_name(base + suffix, taken) for suffix in
                 ("_quantized_const", "_quantized_min", "_quantized_max")]
        new_consts += [make_const(names[0], data, dtype=tf.quint8),
                       make_const(names[1], lo, dtype=tf.float32),
                       make_const(names[2], hi, dtype=tf.float32)]
        renames.update({target.name: names[0], f"{target.name}:0": names[0],
                        f"{target.name}:1": names[1], f"{target.name}:2": names[2]})

    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    folded = {t.name for t in targets}
    out.node.extend(new_consts)
    for node in graph_def.node:
        if node.name in folded:
            continue
        new = out.node.add()
        new.CopyFrom(node)
        for i, inp in enumerate(new.input):
            if inp.startswith("^"):
                new.input[i] = "^" + renames.get(inp[1:], inp[1:])
            else:
                new.input[i] = renames.get(inp, inp)
    return out, len(targets)


def read_shapes_from_quantized(graph_def: GraphDef) -> int:
    """Shape/Size/Rank of a Dequantize output read the 8-bit tensor instead, in place.

    The shape is the same, and the Dequantize is then often not needed any more.
    """
    nodes = {n.name: n for n in graph_def.node}
    count = 0
    for node in graph_def.node:
        if node.op not in ("Shape", "Size", "Rank") or not node.input:
            continue
        name, _, port = node.input[0].partition(":")
        source = nodes.get(name)
        if source is None or source.op != "Dequantize" or port not in ("", "0"):
            continue
        node.input[0] = source.input[0]
        node.attr["T"].type = source.attr["T"].type
        count += 1
    return count


_SUFFIXES = {"requant_range": "range", "requantize": "requant", "fallback_min": "min",
             "fallback_max": "max",
             # orchestrator.quant.integer_bias' accumulator add
             **{part: part for part in ("bias", "span", "steps", "steps_int", "acc", "sum")}}
_INPUT_KINDS = {"reshape_dims": "dims", "reduction_dims": "axis", "reshape": "flat",
                "min": "min", "max": "max", "quantize": "quantize"}


def short_names(graph_def: GraphDef, protected: set[str]) -> dict[str, str]:
    """New names for the nodes GTT's quantize_nodes added (old -> new).

    Found from structure, not by parsing arbitrary names: each Quantized* op `F/eightbit`
    names its float op F; its helpers are `F/eightbit/<suffix>` and `F_eightbit/<input>/
    <kind>`, which become `F/q8/<short suffix>` and `F/q8/in<k>/<short kind>`.
    """
    names = [n.name for n in graph_def.node]
    floats = [n.name[: -len("/eightbit")] for n in graph_def.node
              if (n.op.startswith("Quantized") or n.op == "Bitcast")
              and n.name.endswith("/eightbit")]
    taken = set(names)
    mapping: dict[str, str] = {}

    def assign(old: str, new: str) -> None:
        if old not in protected and old not in mapping:
            taken.discard(old)
            mapping[old] = unique_name(new, taken)

    by_prefix: dict[str, list[str]] = {}
    for f in floats:
        assign(f + "/eightbit", f + "/q8")
        for suffix, short in _SUFFIXES.items():
            if f"{f}/eightbit/{suffix}" in taken:
                assign(f"{f}/eightbit/{suffix}", f"{f}/q8/{short}")
        by_prefix[f + "_eightbit/"] = []
    for name in names:
        for prefix, inputs in by_prefix.items():
            if not name.startswith(prefix):
                continue
            unique_input, _, kind = name[len(prefix):].rpartition("/")
            if kind not in _INPUT_KINDS or not unique_input:
                continue
            if unique_input not in inputs:
                inputs.append(unique_input)
            f = prefix[: -len("_eightbit/")]
            assign(name, f"{f}/q8/in{inputs.index(unique_input)}/{_INPUT_KINDS[kind]}")
            break
    return mapping


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.model import tf_adapter
    graph = copy_graph(artifact.graph_def)
    names = {n.name for n in graph.node}
    missing = [n for n in params.exclude_nodes if n not in names]
    if missing:
        raise ValueError(f"exclude_nodes names nodes that are not in the graph: {missing}")

    rewritten = rewrite_bias_adds(graph) if params.bias_add else 0
    equalized = ks.equalize_unit_row_strides(graph)
    plan = ks.plan(graph, params.exclude_nodes, params.ops, q.QUANTIZABLE_OPS)
    convertible = q.QUANTIZABLE_OPS if params.ops is None else params.ops
    converts = {n.name: n.op in convertible and n.name not in plan.hidden for n in graph.node}
    corrected: tuple[dict, dict] = ({}, {})
    if params.bias_correction:  # only for the ops that will compute with 8-bit weights
        from orchestrator.quant.bias_correction import correct_for_stage

        corrected = correct_for_stage(graph, artifact, ctx,
                                      lambda node: converts.get(node.name, False))
    # the (corrected) biases go into the accumulator, not QuantizedBiasAdd: integer_bias
    biases = integer_bias.constant_values(graph, integer_bias.biases_to_fuse(graph, converts))
    hidden = []  # the user's exclusions (the kernel-limited nodes are in plan.limited)
    for node in graph.node:
        if node.name in plan.hidden:
            node.attr["T"].type = _DT_HALF
            hidden += [node.name] if node.name in params.exclude_nodes else []

    outputs = list(artifact.outputs)
    result = tf_adapter.transform_graph(graph, artifact.input_names, outputs,
                                        _transform_string(params))
    for node in result.node:
        if node.name in plan.hidden:
            node.attr["T"].type = _DT_FLOAT
    result, folded = fold_constant_quantizations(result)
    # the model's FakeQuant nodes: GTT made their ranges the requantization ranges
    result, trained = fake_quant_ranges.pin_hoisted_ranges(result, graph)
    fused = integer_bias.fuse(result, biases)
    read_shapes_from_quantized(result)
    result = subgraph(result, [*artifact.input_names, *outputs])
    if params.short_names:
        protected = set(artifact.input_names) | {node_name(o) for o in outputs}
        rename_nodes(result, short_names(result, protected))

    counts = op_counts(result)
    converted = sum(v for k, v in counts.items() if k.startswith("Quantized"))
    original = {n.name for n in artifact.graph_def.node}
    left_float: dict[str, int] = {}
    for node in result.node:  # the model's own ops still in float (not GTT's helpers)
        if node.op in q.QUANTIZABLE_OPS and node.name in original:
            left_float[node.op] = left_float.get(node.op, 0) + 1
    plan.note_unconverted(result)
    unfused = sorted(set(biases) - set(fused))  # GTT's pattern was not the expected one
    # ops no eight-bit kernel covers (Softmax...) stay float whatever the recipe says: a
    # diagnostic for the report, not a warning to act on
    no_kernel = ks.no_kernel_warning(plan.no_kernel)
    warnings = [w for w in plan.warnings(converted) if w != no_kernel] + ([
        f"{len(unfused)} bias(es) go through TF's QuantizedBiasAdd, which shifts a layer by up "
        f"to 4 steps (not added in their conv's accumulator): {', '.join(unfused[:3])}"
    ] if unfused else [])
    stats = q.weight_stats(result)
    metadata = {fake_quant_ranges.GRAPH_TRAINED_RANGES: trained} if trained else {}
    return StageResult(
        artifact=artifact.replace(graph_def=result, metadata=metadata),
        metrics={"quantized_ops": float(converted),
                 "quantizable_ops": float(len(plan.candidates)),
                 "float_quantizable_ops": float(sum(left_float.values())),
                 "kernel_limited_ops": float(len(plan.limited)),
                 "no_kernel_ops": float(len(plan.no_kernel)),
                 "requantization_ranges": float(counts.get("RequantizationRange", 0)),
                 "weight_bytes_quantized_fraction": stats.quantized_fraction, **corrected[0]},
        info={"ops": counts, "float_quantizable_ops": left_float,
              "bias_adds_rewritten": rewritten, "constant_quantizations_folded": folded,
              "biases_in_accumulator": len(fused),
              "excluded_nodes": hidden, "float_nodes": ks.records(plan.float_nodes()),
              "strides_equalized": equalized, **corrected[1],
              # activations whose range the model's FakeQuant nodes gave
              **({"trained_ranges": len({fake_quant_ranges.fake_quant_of(n)
                                         for n in trained})} if trained else {}),
              **({"diagnostics": [no_kernel]} if no_kernel else {})},
        warnings=warnings)


def _layers(source: LayerSource) -> FoundLayers:
    """The ops this entry converts (its `ops`, less `exclude_nodes` and the nodes it left
    float for their kernels), as layers of the float graph it was given."""
    from orchestrator.quant.layer_groups import inputs_by_node, layers_of

    graph = source.input_model().graph_def
    allowed = source.params.ops or q.QUANTIZABLE_OPS
    excluded = set(source.params.exclude_nodes)
    excluded |= {row["node"] for row in source.info.get("float_nodes") or []}
    convertible = {n.name for n in graph.node if n.op in allowed and n.name not in excluded}
    return FoundLayers(layers_of(graph, convertible), inputs_by_node(graph))


def _candidate(params: Params, candidate: Candidate) -> Params | None:
    """Moved layers (weights-only or float) are not converted; the fallback converts
    nothing (the stage is left out)."""
    if candidate.fallback:
        return None
    update: dict[str, object] = {}
    moved = {*candidate.nodes_in(WEIGHTS_ONLY.name), *candidate.nodes_in(FLOAT.name)}
    if moved:
        update["exclude_nodes"] = sorted({*params.exclude_nodes, *moved})
    if candidate.option(BIAS_CORRECTION) is False:
        update["bias_correction"] = False
    return with_params(params, **update) if update else params


def _clipping_percentiles(_params: Params, tune: Tune, errors: list[dict]) -> tuple[float, ...]:
    """Other range percentiles, when a layer's activations clip on more than
    CLIPPING_WORTH_PERCENTILES of its values."""
    clipping = max((row.get("clipped_share") or 0.0 for row in errors), default=1.0)
    return tuple(tune.percentiles) if clipping > CLIPPING_WORTH_PERCENTILES else ()


# A layer whose activations clip on more than this share of values makes range percentiles
# worth trying.
CLIPPING_WORTH_PERCENTILES = 0.01
BIAS_CORRECTION = "bias_correction"
KNOBS = Knobs(
    layers=_layers,
    # weights-only keeps most of the size gain; it needs the stage that makes 8-bit weights
    ladder=(WEIGHTS_ONLY, FLOAT),
    needs={WEIGHTS_ONLY.name: "quantize_weights"},
    kernels="the GraphDef eight-bit kernels",
    guard_setting="quantize_nodes: {guard: true}",
    fallback=Fallback("weights-only 8-bit", "weights-only 8-bit (8-bit weights, float "
                      "compute)", "8-bit variant", change="every layer -> weights-only 8-bit",
                      needs="quantize_weights"),
    alternatives=(
        # bias correction shifts biases by a mean measured on float activations; where
        # activation rounding dominates it can cost more than it saves: measure it off
        Alternative(BIAS_CORRECTION,
                    lambda params, _tune, _errors: (False,) if params.bias_correction else (),
                    lambda _value: "bias correction off", lambda _value: "bias correction off"),
        # freeze_ranges reads the percentile (its `candidate`)
        Alternative(q.PERCENTILE_KNOB, _clipping_percentiles,
                    lambda value: f"range percentile {value:g}",
                    lambda value: f"percentile {value:g}")))

STAGE = register(Stage(name="quantize_nodes", run=run, params=Params, doc=__doc__ or "",
                       optional_data=("representative",), knobs=KNOBS,
                       candidate=_candidate, eight_bit=True, ships_compact_names=True))
