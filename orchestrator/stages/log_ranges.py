"""Log the activation ranges of an eight-bit graph on representative data.

The classic step (SPEC section 5): `insert_logging(op=RequantizationRange, show_name=true,
message="__requant_min_max:")`, then run representative inputs through the graph. Here all
samples run in one session, batched where the graph's input allows, and the range tensors
are fetched directly instead of being read back from a console (the Print ops are added
with first_n=0, so they stay silent). The log keeps the classic line format,
`;<node>__print__;__requant_min_max:[<min>][<max>]`, which TF's own
`freeze_requantization_ranges` reads.

With `per_sample` (the default) there is one line per node per sample, as the classic
batch-1 runs gave, even when samples run in batches: each sample's range is taken from
the same 32-bit tensor RequantizationRange reads, converted exactly as that op converts it.
So `freeze_ranges`' percentiles mean "percent of samples" whatever the batch size. (Earlier
layers still quantize with the batch's range, so values differ slightly from true batch-1
runs: under 1% of the frozen range on the digits model; batch_size=1 is the classic run.)
Without it there is one line per node per run (per batch).

The activations quantize_nodes quantizes from float (the model input, what a float op such
as a depthwise conv or a layer kept in float hands to an eight-bit one) get their range at
run time too: a QuantizeV2 fed by a Min and a Max over the whole tensor, that is over the
whole batch. Those are logged the same way, one line per sample under the QuantizeV2's
name, so that `freeze_ranges` freezes them as well: the 8-bit graph then computes each
sample the same whatever batch it runs in, as a phone's batch of one does, and every
boundary between float and eight bits gets a calibrated range.

Ranges the model trained (its FakeQuant nodes, which quantize_nodes made constant: the
metadata's `fake_quant_ranges`) are not measured; a graph with no other range passes on
unchanged.

Files: `ranges.log` (the log) and `ranges.csv` (per node: count, min, max and the range
`freeze_ranges` would freeze at `min_percentile`/`max_percentile`). The log also travels
in the model's metadata (`min_max_log`) to `freeze_ranges`. The model is passed on
unchanged. A NaN or infinite range is an error naming the node and the sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from orchestrator.limits import bounded
from orchestrator.model.artifact import tensor_name
from orchestrator.model.graph_rewrite import copy_graph, make_const
from orchestrator.quant import ranges as q
from orchestrator.quant.fake_quant_ranges import GRAPH_TRAINED_RANGES, fake_quant_of
from orchestrator.quant.numerics import qint32_to_float
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

    from orchestrator.measure.tf_runtime import GraphRunner
    from orchestrator.model.artifact import ModelArtifact
    from orchestrator.quant.knobs import Candidate


class Params(StageParams):
    samples: bounded("samples") | None = Field(
        200, description="Representative samples to run (null: all of them).")
    batch_size: bounded("batch") = Field(
        100, description="Samples per session run (a graph with a fixed batch "
        "dimension runs its own size).")
    per_sample: bool = Field(
        True, description="One log line per node per sample (as classic batch-1 runs); "
        "false: one line per node per batch run.")
    min_percentile: float = Field(
        5.0, ge=0, lt=50, description="For ranges.csv: the min percentile freeze_ranges "
        "will use.")
    max_percentile: float = Field(
        5.0, ge=0, lt=50, description="For ranges.csv: the max percentile freeze_ranges "
        "will use.")


@dataclass
class _Probe:
    """What is fetched for one RequantizationRange node, and what it gathered."""

    node: str
    index: int                  # its (min, max) are ranges[2 * index], ranges[2 * index + 1]
    fetches: list[str]          # per sample: input_min, input_max, sample mins, sample maxs
    prefix: str                 # the Print node's message: ";<node>__print__;__requant_min_max:"
    per_sample: bool
    quantize: bool = False      # a QuantizeV2's run-time range (else a RequantizationRange)
    fallback_reason: str | None = None
    mins: list[np.ndarray] = field(default_factory=list)
    maxs: list[np.ndarray] = field(default_factory=list)


def _with_probes(logged: GraphDef, names: list[str], per_sample: bool,
                 quantize_nodes: frozenset[str] = frozenset()
                 ) -> tuple[GraphDef, str, list[_Probe]]:
    """The logged graph plus what to fetch: every range in one tensor, and per sample.

    All RequantizationRange outputs (scalars) are packed into one tensor, so a run is one
    fetch, not two per node. Per sample: RequantizationRange reduces its qint32 input over
    the whole batch; reading that input as int32 (Bitcast) and reducing over all but the
    first axis gives the same reduction per sample. Added as NodeDefs: import stays in C++.
    """
    from tensorflow.core.framework import node_def_pb2, types_pb2

    graph = copy_graph(logged)
    nodes = {n.name: n for n in graph.node}
    scope = "log_ranges"
    while any(n == scope or n.startswith(scope + "/") for n in nodes):
        scope += "_"
    if per_sample:
        graph.node.append(make_const(f"{scope}/one", np.int32(1)))

    def add(name: str, op: str, inputs: list[str], **types: int) -> str:
        node = node_def_pb2.NodeDef(name=name, op=op, input=inputs)
        for key, value in types.items():
            node.attr[key].type = value
        graph.node.append(node)
        return name

    def per_sample_min_max(base: str, data: str, dtype: int) -> list[str]:
        """Min and Max of `data` over every axis but the first (the batch)."""
        rank = add(f"{base}/rank", "Rank", [data], T=dtype)
        axes = add(f"{base}/axes", "Range", [f"{scope}/one", rank, f"{scope}/one"],
                   Tidx=types_pb2.DT_INT32)
        for reduce in ("Min", "Max"):
            node = node_def_pb2.NodeDef(name=f"{base}/{reduce.lower()}", op=reduce,
                                        input=[data, axes])
            node.attr["T"].type = dtype
            node.attr["Tidx"].type = types_pb2.DT_INT32
            node.attr["keep_dims"].b = False
            graph.node.append(node)
        return [f"{base}/min", f"{base}/max"]

    probes, packed = [], []
    for k, name in enumerate(names):
        if name in quantize_nodes:  # a run-time QuantizeV2 range: Min/Max of a float tensor
            data, in_min, in_max = nodes[name].input[:3]
            packed += [in_min, in_max]
            fetches = []
            if per_sample:
                fetches = per_sample_min_max(f"{scope}/{k}", data, types_pb2.DT_FLOAT)
            probes.append(_Probe(name, k, [tensor_name(f) for f in fetches],
                                 f";{name}{q.PRINT_SUFFIX};{q.LOG_MESSAGE}", per_sample,
                                 quantize=True))
            continue
        prnt = nodes.get(f"{name}{q.PRINT_SUFFIX}")
        prefix = prnt.attr["message"].s.decode() if prnt is not None else \
            f";{name}{q.PRINT_SUFFIX};{q.LOG_MESSAGE}"
        # The min through the Print node, as the classic graph's consumers read it.
        packed += [f"{name}{q.PRINT_SUFFIX}:0" if prnt is not None else f"{name}:0",
                   f"{name}:1"]
        fetches: list[str] = []
        if per_sample:
            data, in_min, in_max = nodes[name].input[:3]
            ints = add(f"{scope}/{k}/ints", "Bitcast", [data], T=types_pb2.DT_QINT32,
                       type=types_pb2.DT_INT32)
            fetches += [in_min, in_max,
                        *per_sample_min_max(f"{scope}/{k}", ints, types_pb2.DT_INT32)]
        probes.append(_Probe(name, k, [tensor_name(f) for f in fetches], prefix, per_sample))
    pack = node_def_pb2.NodeDef(name=f"{scope}/ranges", op="Pack", input=packed)
    pack.attr["T"].type = types_pb2.DT_FLOAT
    pack.attr["N"].i = len(packed)
    pack.attr["axis"].i = 0
    graph.node.append(pack)
    return graph, f"{scope}/ranges:0", probes


def _fixed_batch_size(artifact: ModelArtifact) -> int | None:
    """The input Placeholder's batch dimension when the graph fixes it."""
    for node in artifact.graph_def.node:
        if node.name == artifact.input_names[0] and node.op == "Placeholder":
            if "shape" not in node.attr:  # (indexing would insert one into the input)
                return None
            dims = node.attr["shape"].shape.dim
            return dims[0].size if dims and dims[0].size > 0 else None
    return None


def _check_finite(node: str, lo: np.ndarray, hi: np.ndarray, first_sample: int, batch: int,
                  per_sample: bool) -> None:
    bad = np.flatnonzero(~(np.isfinite(lo) & np.isfinite(hi)))
    if bad.size:
        i = int(bad[0])
        where = (f"sample {first_sample + i} (batch {batch})" if per_sample else
                 f"batch {batch} (samples {first_sample}-{first_sample + len(lo) - 1})")
        raise ValueError(
            f"RequantizationRange node {node!r} gave a non-finite range "
            f"[{lo[i]}, {hi[i]}] on {where}; {_NON_FINITE_HINT}")


# the input was checked finite before the run, so the graph itself may be to blame
_NON_FINITE_HINT = ("the sample's values may be far outside what the model saw in training, "
                    "or the 8-bit graph is broken upstream (put an evaluate before "
                    "log_ranges to check its outputs)")


def _diagnose(runner: GraphRunner, names: list[str], batch: np.ndarray, first_sample: int,
              batch_index: int, exc: Exception) -> ValueError:
    """Why a batch failed: the first range node that gives a non-finite range, per sample.

    A NaN range makes the Requantize after it fail, so the failing run names no range
    node; running the batch's samples one by one, range node by range node, finds it.
    """
    import tensorflow as tf

    fixed = runner.fixed_batch_size()
    units = ([(first_sample + j, batch[j:j + 1]) for j in range(len(batch))]
             if fixed in (None, 1) else [(None, batch)])
    where_batch = f"batch {batch_index} (samples {first_sample}-{first_sample + len(batch) - 1})"
    for sample, unit in units:
        where = f"sample {sample} (batch {batch_index})" if sample is not None else where_batch
        for name in names:
            op = runner.graph.get_operation_by_name(name)
            try:
                lo, hi = runner.run(unit, fetches=list(op.outputs))
            except tf.errors.OpError:
                continue  # fails upstream: an earlier node or the input is to blame
            if not (np.isfinite(lo) and np.isfinite(hi)):
                return ValueError(
                    f"RequantizationRange node {name!r} gave a non-finite range [{lo}, {hi}] "
                    f"on {where}; {_NON_FINITE_HINT}")
        try:
            runner.run(unit)
        except tf.errors.OpError as error:
            bad = "" if np.isfinite(unit).all() else " (it contains NaN or infinite values)"
            return ValueError(f"running {where} failed{bad}: {error.message}")
    return ValueError(f"running {where_batch} failed: {getattr(exc, 'message', exc)}")


def _sample_ranges(probe: _Probe, run_min: np.float32, run_max: np.float32,
                   values: list[Any], count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-sample (min, max) as RequantizationRange computes them, or None if impossible."""
    if probe.quantize:
        s_min, s_max = values
    else:
        in_min, in_max, s_min, s_max = values
    if np.ndim(s_min) != 1 or len(s_min) != count:
        probe.fallback_reason = "its first dimension is not the batch"
        return None
    if probe.quantize:  # the float tensor's own values, as its Min/Max reduce them
        lo, hi = np.asarray(s_min, np.float32), np.asarray(s_max, np.float32)
    else:
        lo = np.minimum(np.float32(0), qint32_to_float(s_min, in_min, in_max))
        hi = qint32_to_float(s_max, in_min, in_max)
    finite = np.isfinite(run_min) and np.isfinite(run_max)
    if finite and (lo.min() != run_min or hi.max() != run_max):
        probe.fallback_reason = "per-sample ranges disagree with the batch range"
        return None
    return lo, hi


def _pad(batch: np.ndarray, fixed: int | None) -> np.ndarray:
    """Fill a short last batch up to a fixed batch size by repeating its last sample.

    Repeats change no batch-wide min/max, so the real samples' ranges stay exact.
    """
    if fixed is None or len(batch) >= fixed:
        return batch
    return np.concatenate([batch, np.repeat(batch[-1:], fixed - len(batch), axis=0)])


def _check_batch(batch: np.ndarray, seen: int, batch_index: int) -> None:
    if np.issubdtype(batch.dtype, np.floating) and not np.isfinite(batch).all():
        bad = int(np.flatnonzero(~np.isfinite(batch.reshape(len(batch), -1)).all(1))[0])
        raise ValueError(f"representative sample {seen + bad} (batch {batch_index}) contains "
                         "NaN or infinite values, so its ranges would be meaningless")


def _lines(probes: list[_Probe], lows: list[np.ndarray], highs: list[np.ndarray]) -> list[str]:
    """Classic order: each run (sample) logs every node, then the next run."""
    fmt = q.LOG_VALUE_FORMAT  # as q.format_range_line, inlined: thousands of lines
    texts = [(p.prefix, [f"[{v:{fmt}}]" for v in lo.tolist()],
              [f"[{v:{fmt}}]" for v in hi.tolist()])
             for p, lo, hi in zip(probes, lows, highs, strict=True)]
    width = max(len(lo) for lo in lows)
    return [prefix + lo[i] + hi[i] for i in range(width) for prefix, lo, hi in texts
            if i < len(lo)]


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    import tensorflow as tf

    from orchestrator.measure.tf_runtime import GraphRunner
    from orchestrator.model import tf_adapter

    names = [n.name for n in artifact.graph_def.node if n.op == "RequantizationRange"]
    trained = artifact.metadata.get(GRAPH_TRAINED_RANGES) or {}
    if not names and trained and not q.run_time_quantizations(artifact.graph_def):
        # every range came from the model's FakeQuant nodes: nothing left to measure
        return StageResult(artifact=artifact, metrics={"ranges_nodes": 0.0},
                           info={"trained_ranges": len({fake_quant_of(n) for n in trained})})
    if not names:
        raise ValueError("the graph has no RequantizationRange ops, so there is no range to "
                         "log: run quantize_nodes first (without fallback_min/fallback_max)")
    if ctx.representative is None:
        raise ValueError("log_ranges needs representative data (data.representative)")
    if len(artifact.inputs) != 1:
        raise ValueError(f"log_ranges feeds one input; the model has {artifact.input_names}")

    logged = tf_adapter.transform_graph(artifact.graph_def, artifact.input_names,
                                        list(artifact.outputs), q.INSERT_LOGGING)
    lines: list[str] = []
    seen = batch_index = 0
    # Per-sample reductions only pay when a run holds several samples.
    fixed = _fixed_batch_size(artifact)
    per_sample = params.per_sample and (fixed or params.batch_size) > 1
    quantizations = q.run_time_quantizations(logged)
    graph, packed, probes = _with_probes(logged, names + quantizations, per_sample,
                                         frozenset(quantizations))
    with GraphRunner(graph, artifact.input_names, artifact.outputs) as runner:
        fetches = [packed] + [t for p in probes for t in p.fetches]
        for chunk in ctx.representative(params.samples, params.batch_size):
            chunk = np.asarray(chunk)
            size = fixed or params.batch_size
            # sliced here, not by runner.batches: the real (unpadded) count matters
            for batch in (chunk[i:i + size] for i in range(0, len(chunk), size)):
                _check_batch(batch, seen, batch_index)
                count = len(batch)
                fed = _pad(batch, fixed)
                try:
                    values = runner.run(fed, fetches=fetches)
                except tf.errors.OpError as exc:
                    raise _diagnose(runner, names, fed, seen, batch_index, exc) from exc
                lows, highs, offset = [], [], 1
                for probe in probes:
                    run_min, run_max = values[0][2 * probe.index: 2 * probe.index + 2]
                    vals = values[offset: offset + len(probe.fetches)]
                    offset += len(probe.fetches)
                    ranges = (_sample_ranges(probe, run_min, run_max, vals, len(fed))
                              if per_sample else None)
                    if ranges is None:
                        ranges = (np.asarray([run_min], np.float32),
                                  np.asarray([run_max], np.float32))
                    else:
                        ranges = (ranges[0][:count], ranges[1][:count])
                    _check_finite(probe.node, *ranges, seen, batch_index,
                                  len(ranges[0]) == count)
                    probe.mins.append(ranges[0])
                    probe.maxs.append(ranges[1])
                    lows.append(ranges[0])
                    highs.append(ranges[1])
                lines += _lines(probes, lows, highs)
                seen += count
                batch_index += 1
    if seen == 0:
        raise ValueError("the representative data yielded no samples")

    warnings = [f"log_ranges: {p.node}: one line per batch, not per sample "
                f"({p.fallback_reason})" for p in probes if p.fallback_reason]
    text = "\n".join(lines) + "\n"
    rows = q.range_table({p.node: (np.concatenate(p.mins), np.concatenate(p.maxs))
                          for p in probes}, params.min_percentile, params.max_percentile)
    return StageResult(
        artifact=artifact.replace(graph_def=copy_graph(artifact.graph_def),
                                  metadata={"min_max_log": text,
                                            q.LOGGED_GRAPH: q.graph_digest(artifact.graph_def)}),
        metrics={"ranges_nodes": float(len(names)),
                 "input_ranges_nodes": float(len(quantizations)), "ranges_samples": float(seen),
                 "ranges_records": float(len(lines))},
        info={"ranges": rows, "samples": seen},
        files={"ranges.log": text.encode(), "ranges.csv": q.table_csv(rows).encode()},
        warnings=warnings)


def _candidate(params: Params, candidate: Candidate) -> Params | None:
    """The guard's fallback has no 8-bit ops, so no ranges to log (the stage is left out)."""
    return None if candidate.fallback else params


STAGE = register(Stage(name="log_ranges", run=run, params=Params, doc=__doc__ or "",
                       uses_data=("representative",), candidate=_candidate))
