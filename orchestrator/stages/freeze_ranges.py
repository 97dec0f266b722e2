"""Replace the dynamic RequantizationRange ops with constant ranges from the range log.

The classic `freeze_requantization_ranges(min_max_log_file=..., min_percentile=5,
max_percentile=5)`, run by TensorFlow's own transform on the log `log_ranges` left in the
model's metadata (`min_max_log`). For each node it sorts the logged minima and maxima and
takes the `min_percentile`-th lowest minimum and the `max_percentile`-th highest maximum,
so that rare outliers do not stretch the range. Constant ranges run faster and let
accelerators run the graph; accuracy must be measured afterwards on the user's own data.
The log's lines for the QuantizeV2 ops whose range a Min/Max computes at run time (the
float-to-8-bit boundaries, logged by log_ranges) are frozen here by the same rule, into
constants that replace the Min/Max: every sample then quantizes the same in any batch.
Every frozen range is then nudged, as TFLite nudges its ranges, so that zero falls exactly
on one of its 256 steps (its width kept): TF's Requantize computes round(x * s - min * s)
while every consumer reads the result on the grid whose zero is round(-min * s), so with
an arbitrary range each requantized tensor carries a constant offset of up to half a step,
set by the range's last bits, that the next layers multiply up. That made the outputs of
two candidate graphs with nearly the same ranges differ far more than their layers did.
Ranges the model trained (FakeQuant nodes: quantize_nodes made them the requantization
ranges, listed in the metadata's `fake_quant_ranges`) are kept as they are, and counted
(info `trained_ranges`); a graph with no other range has nothing to freeze. The log is
dropped from the metadata once its ranges are frozen (ranges.log, written by
log_ranges, keeps it).

Then, with `diagnostics` (default) and representative data in the recipe, each quantized
layer is compared with the lineage's float model (orchestrator.quant.layer_errors): RMSE over
the quantization scale (about 0.29 is pure rounding; above 0.7 is a diagnostic),
normalized MSE against float, the range and the share of float values clipped. Report
`layer_errors`, metrics `layer_error_max`, `layers_flagged`, `layer_nmse_max`, and
`layer_errors.tsv` (worst first).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from orchestrator.errors import DataError
from orchestrator.limits import bounded
from orchestrator.model.graph_rewrite import copy_graph, make_const, subgraph
from orchestrator.quant import ranges as q
from orchestrator.quant.fake_quant_ranges import GRAPH_TRAINED_RANGES, fake_quant_of
from orchestrator.quant.knobs import Candidate, with_params
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

    from orchestrator.model.artifact import ModelArtifact


class Params(StageParams):
    min_percentile: float = Field(
        5.0, ge=0, lt=50, description="Percent of the logged minima to ignore (lowest).")
    max_percentile: float = Field(
        5.0, ge=0, lt=50, description="Percent of the logged maxima to ignore (highest).")
    log_file: str | None = Field(
        None, description="A range log in the classic format (e.g. from an earlier run or "
        "TF's own tools), relative to the recipe; used instead of log_ranges' log.")
    diagnostics: bool = Field(
        True, description="Measure each quantized layer's error against the float model on "
        "representative data (when the recipe has it): layer_errors in the report, "
        "layer_errors.tsv, and a diagnostic naming layers above 0.7 RMSE/scale.")
    diagnostics_samples: bounded("samples") = Field(
        200, description="Representative samples the diagnostics run (bounds cost).")


def _short(names: list[str] | set[str], limit: int = 8) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def freeze_with_tf(graph_def: GraphDef, inputs: list[str], outputs: list[str], log: str,
                   min_percentile: float, max_percentile: float) -> GraphDef:
    """TF's own freeze_requantization_ranges on `log` (the adapter hands it to TF)."""
    from orchestrator.model import tf_adapter
    return tf_adapter.freeze_requantization_ranges(graph_def, inputs, outputs, log,
                                                   min_percentile, max_percentile)


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    trained = artifact.metadata.get(GRAPH_TRAINED_RANGES) or {}
    if trained and not any(n.op == "RequantizationRange" for n in artifact.graph_def.node) \
            and not q.run_time_quantizations(artifact.graph_def):
        result = _only_trained(artifact)
    elif params.log_file is not None:
        assert ctx.read_file is not None, "the runner reads files named by file_params"
        log = ctx.read_file(params.log_file).decode("utf-8", errors="replace")
        result = _freeze(artifact, params, log, user_log=params.log_file)
    else:
        log = artifact.metadata.get("min_max_log")
        if not log:
            raise ValueError("the model carries no range log (metadata 'min_max_log'): run "
                             "log_ranges before freeze_ranges")
        logged_on = artifact.metadata.get(q.LOGGED_GRAPH)
        if logged_on is not None and logged_on != q.graph_digest(artifact.graph_def):
            raise ValueError("the range log was taken on another graph (a stage between "
                             "log_ranges and freeze_ranges changed it): run log_ranges "
                             "right before freeze_ranges")
        result = _freeze(artifact, params, log, user_log=None)
    if trained:  # the model's own ranges, as quantize_nodes pinned them (nudged already)
        result.info["trained_ranges"] = len({fake_quant_of(n) for n in trained})
        result.artifact = dataclasses.replace(result.artifact, metadata={
            k: v for k, v in result.artifact.metadata.items() if k != GRAPH_TRAINED_RANGES})
    if params.diagnostics:
        _add_diagnostics(result, params, ctx)
    return result


def _only_trained(artifact: ModelArtifact) -> StageResult:
    """Every range of the graph is the model's own (FakeQuant): nothing to freeze."""
    metadata = {k: v for k, v in artifact.metadata.items()
                if k not in ("min_max_log", q.LOGGED_GRAPH)}
    graph = copy_graph(artifact.graph_def)
    nudged = nudge_frozen_ranges(graph)
    return StageResult(artifact=dataclasses.replace(artifact, graph_def=graph,
                                                    metadata=metadata),
                       metrics={"frozen_ranges": 0.0, "ranges_nudged": float(nudged)})


def _add_diagnostics(result: StageResult, params: Params, ctx: StageContext) -> None:
    """Per-layer errors of the frozen graph against the float model, into `result`."""
    import tensorflow as tf

    from orchestrator.quant import layer_errors
    if ctx.float_model is None or ctx.representative is None:
        missing = "representative data" if ctx.float_model else "a float model before it"
        ctx.log.info("freeze_ranges: no layer diagnostics: the lineage has no %s", missing)
        return
    float_model = ctx.float_model()
    if float_model.kind != "graphdef":
        return
    batches = ctx.representative(params.diagnostics_samples, layer_errors.BATCH_SIZE)
    try:
        rows = layer_errors.measure(float_model, result.artifact, batches)
    except (ValueError, tf.errors.OpError) as exc:  # a diagnostic must not cost the model
        message = getattr(exc, "message", None) or str(exc)
        result.warnings.append(f"layer diagnostics skipped: {message}")
        return
    result.info["layer_errors"] = rows
    result.metrics.update(layer_errors.summary_metrics(rows))
    result.files["layer_errors.tsv"] = layer_errors.table_tsv(rows).encode()
    bad = layer_errors.flagged(rows)
    if bad:  # a diagnostic: the report turns it into advice where a budget breaks unguarded
        result.info.setdefault("diagnostics", []).append(
            _flag_diagnostic(bad, [r["node"] for r in rows]))


def _flag_diagnostic(bad: list[dict], names: list[str]) -> str:
    from orchestrator.formatting import layer_names
    from orchestrator.quant.layer_errors import FLAG_ABOVE, IDEAL

    short = layer_names(names)  # as the page names them: "<scope>/" says nothing

    def one(row: dict) -> str:
        clipped = row["clipped_share"] or 0.0
        return f"{short[row['node']]} {row['rmse_over_scale']:.2f}" + (
            f" ({clipped:.1%} clipped)" if clipped >= 0.001 else "")

    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return (f"{len(bad)} layer(s) above {FLAG_ABOVE} RMSE/scale (rounding alone: {IDEAL:.2f}): "
            f"{', '.join(one(r) for r in bad[:3])}{more}. Where a quality budget breaks, the "
            "guard (quantize_nodes: {guard: true}) takes such layers back from 8 bits")


def nudged_range(lo: float, hi: float) -> tuple[float, float]:
    """(min, max) of the same width (at least including zero) whose zero is exactly one of
    the 256 steps: min = -zero_point * step."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not hi - lo > 0.0:
        return lo, hi
    step = (hi - lo) / 255.0
    zero_point = min(max(round(-lo / step), 0), 255)
    lo = -zero_point * step
    return float(np.float32(lo)), float(np.float32(lo + 255.0 * step))


def nudge_frozen_ranges(graph_def: GraphDef) -> int:
    """Nudge (nudged_range) the constant output ranges of every Requantize and QuantizeV2,
    in place; returns how many ranges."""
    import tensorflow as tf

    from orchestrator.model.graph_rewrite import GraphIndex, set_const_value

    index = GraphIndex.build(graph_def)
    pairs = {(n.input[3], n.input[4]) for n in graph_def.node
             if n.op == "Requantize" and len(n.input) >= 5}
    pairs |= {(n.input[1], n.input[2]) for n in graph_def.node
              if n.op == "QuantizeV2" and len(n.input) >= 3}
    count = 0
    for lo_name, hi_name in sorted(pairs):
        lo_node, hi_node = index.resolve_const(lo_name), index.resolve_const(hi_name)
        if lo_node is None or hi_node is None or lo_node is hi_node \
                or lo_node.attr["dtype"].type != tf.float32.as_datatype_enum:
            continue
        lo, hi = nudged_range(float(tf.make_ndarray(lo_node.attr["value"].tensor)),
                              float(tf.make_ndarray(hi_node.attr["value"].tensor)))
        set_const_value(lo_node, np.float32(lo))
        set_const_value(hi_node, np.float32(hi))
        count += 1
    return count


def freeze_quantize_ranges(graph_def: GraphDef,
                           grouped: dict[str, tuple[list[float], list[float]]],
                           min_percentile: float, max_percentile: float
                           ) -> tuple[GraphDef, int]:
    """The run-time-ranged QuantizeV2 nodes that have log lines get constant ranges (the
    percentile rule, widened to include zero so that zero stays exact); a new graph and
    how many. Their Min/Max are left for pruning."""
    graph = copy_graph(graph_def)
    targets = [name for name in q.run_time_quantizations(graph) if name in grouped]
    nodes = {n.name: n for n in graph.node}
    for name in targets:
        lo, hi = q.frozen_range(*grouped[name], min_percentile, max_percentile)
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        consts = [make_const(f"{name}/frozen_{end}", np.float32(value))
                  for end, value in (("min", lo), ("max", hi))]
        graph.node.extend(consts)
        nodes[name].input[1], nodes[name].input[2] = consts[0].name, consts[1].name
    return graph, len(targets)


def _freeze(artifact: ModelArtifact, params: Params, log: str, user_log: str | None
            ) -> StageResult:
    # A log the user supplied that does not fit is bad input (exit 2); our own log not
    # fitting is a bug in a stage (exit 3).
    mismatch: type[Exception] = ValueError if user_log is None else DataError
    graph_names = {n.name for n in artifact.graph_def.node}
    expected = [n.name for n in artifact.graph_def.node if n.op == "RequantizationRange"]
    if not expected:
        raise ValueError("the graph has no RequantizationRange ops to freeze (were its "
                         "ranges frozen already, or quantize_nodes given fallback ranges?)")
    records = q.parse_range_log(log)
    logged = {r.node for r in records}
    if not logged & set(expected):
        found = f"it names {_short(logged)}" if logged else "it has no range lines"
        which = f"the range log {user_log}" if user_log else "the range log"
        raise mismatch(f"{which} matches none of the graph's RequantizationRange nodes "
                       f"({found}); expected lines for: {_short(expected)}")
    if logged - graph_names:
        raise mismatch(f"the range log names nodes that are not in the graph: "
                         f"{_short(logged - graph_names)}; run log_ranges on this graph")
    missing = set(expected) - logged
    if missing:
        raise mismatch(f"the range log has no lines for RequantizationRange nodes "
                         f"{_short(missing)}; run log_ranges on this graph")

    # TF's transform takes only RequantizationRange lines; the QuantizeV2 ones are ours
    others = logged - set(expected)
    tf_log = log if not others else "\n".join(
        line for line in log.split("\n")
        if not any(r.node in others for r in q.parse_range_log(line)))
    result = freeze_with_tf(copy_graph(artifact.graph_def), artifact.input_names,
                            list(artifact.outputs), tf_log, params.min_percentile,
                            params.max_percentile)
    left = [n.name for n in result.node if n.op == "RequantizationRange"]
    if left:
        raise RuntimeError(f"freeze_requantization_ranges left {_short(left)} in the graph")
    grouped = q.group_ranges(records)
    result, inputs_frozen = freeze_quantize_ranges(result, grouped, params.min_percentile,
                                                   params.max_percentile)
    nudged = nudge_frozen_ranges(result)
    result = subgraph(result, [*artifact.input_names, *artifact.outputs])
    rows = q.range_table(grouped, params.min_percentile, params.max_percentile)
    # The log has served: drop it, so that it does not travel on with every later model.
    metadata = {k: v for k, v in artifact.metadata.items()
                if k not in ("min_max_log", q.LOGGED_GRAPH)}
    return StageResult(
        artifact=dataclasses.replace(artifact, graph_def=result, metadata=metadata),
        metrics={"frozen_ranges": float(len(expected)),
                 "frozen_input_ranges": float(inputs_frozen),
                 "ranges_nudged": float(nudged)},
        info={"ranges": rows})


def _candidate(params: Params, candidate: Candidate) -> Params | None:
    """A guard candidate's range percentile, for both ends; the fallback has no 8-bit ops,
    so no ranges to freeze (the stage is left out)."""
    if candidate.fallback:
        return None
    percentile = candidate.option(q.PERCENTILE_KNOB)
    return params if percentile is None else with_params(
        params, min_percentile=percentile, max_percentile=percentile)


STAGE = register(Stage(name="freeze_ranges", run=run, params=Params, doc=__doc__ or "",
                       requires=("log_ranges",), requires_unless="log_file",
                       optional_data=("representative",), file_params=("log_file",),
                       candidate=_candidate))
