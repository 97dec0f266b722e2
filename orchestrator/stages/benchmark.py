"""Benchmark the model like benchmark_model: latency over N runs, FLOPs and peak memory.

The session runs ops serially (inter-op threads 1) with `threads` intra-op threads, as on
a phone. The input is a batch of the recipe's evaluation data, else of its representative
data, else random data of the input's shape (unknown dimensions taken as 1).

- `latency_ms`: count, first, curr, mean, std, cv, min, p50, p90, p99, max, in ms (cv:
  std / mean, no unit). `first` is the first (cold) run and `curr` the last timed one, as
  benchmark_model names them; the others are over the `runs` timed runs that follow the
  `warmup` runs.
- `host`: the machine measured on (CPU model, cores, OS, TensorFlow version).
- `flops`: the v1 profiler's float-operation count (2 per multiply-add) with the input's
  batch fixed to 1, so one inference. Quantized ops (QuantizedConv2D, QuantizedMatMul,
  ...) are counted like their float twins: an 8-bit graph does the same arithmetic.
- `est_latency_ms`: per target, an estimate, not a measurement: the file's operators
  priced one by one on the target's cores for the threads it runs with (each op's work
  at its kind's fitted rate, or its bytes at the DRAM's bandwidth), plus the runtime's own
  cost per op (see orchestrator.measure.estimates and cost_model). `estimate` says per
  target how it was made, its 5 costliest ops and its expected error; `estimate_basis`
  keeps the operators (one compact row each), the runtime, this host's measured FLOP/s
  and the runtime's probed cost per run and per op (a TF session's is scaled to the
  device), and this file's timings here.
- `memory`: `load_ms`, `rss_growth_mb` and `anon_growth_mb` of a fresh process that reads
  the shipped file (decrypting it, mapping memmapped weights), loads it and runs it once:
  measured, see orchestrator.measure.load_probe. RssAnon is the heap a phone's OS counts.
- `peak_memory_bytes` (one extra traced run): weights held in RAM (Const; memory-mapped
  ImmutableConst weights are not counted) plus the fed inputs plus the peak of live
  intermediate tensors, each buffer freed after its last consumer ran. TF's allocator
  may reuse buffers more cleverly, so this is an upper estimate of the model's own RAM
  (the runtime's code and overhead are not included).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from orchestrator.limits import MAX_THREAD_SETTINGS, bounded
from orchestrator.measure.estimates import basis, estimate
from orchestrator.measure.flops import count_flops
from orchestrator.measure.graph_operators import graph_operators
from orchestrator.measure.host import describe, speed
from orchestrator.measure.tf_runtime import random_input
from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.kinds import runnable
from orchestrator.spec.devices import precision_of
from orchestrator.stages import register
from orchestrator.stages.base import ANY_KIND, Stage, StageContext, StageParams, StageResult

LATENCY_KEYS = ("count", "first", "curr", "mean", "std", "cv", "min", "p50", "p90", "p99",
                "max")
# Weights that live in the memory-mapped file, not on the heap (see the memmap stage).
_MAPPED_CONST_OPS = {"ImmutableConst"}


class Params(StageParams):
    warmup: bounded("warmup") = Field(5, description="Untimed runs first (caches, allocations).")
    runs: bounded("runs") = Field(50, description="Timed runs.")
    batch_size: bounded("batch") = Field(
        1, description="Samples per run (a model with a fixed batch size uses its own).")
    threads: bounded("threads") | Annotated[list[bounded("threads")], Field(
        min_length=1, max_length=MAX_THREAD_SETTINGS)] | None = Field(
        None, description="Intra-op threads, or a list of settings, e.g. [1, 2, 4], each "
        "timed and reported (`threads_matrix`); `latency_ms` is the first. Default: this "
        "machine's core count, as a phone app uses all its cores. Inter-op threads are "
        "always 1 (ops run serially).")
    memory: bool = Field(
        True, description="Measure memory: the resident-memory growth of a fresh process "
        "that loads and runs the model once (`memory`), and the peak of live tensors from "
        "one extra traced run (`peak_memory_bytes`, an estimate).")
    profile_runs: bounded("profile_runs") = Field(
        20, description="Extra traced runs for the per-node profile (profile_top.tsv, "
        "profile_by_type.tsv), at the first threads setting; 0: none. Not in the timings.")


def run(given: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.measure.tf_runtime import open_runner
    from orchestrator.model.kinds import unwrapped

    settings = (params.threads if isinstance(params.threads, list)
                else [params.threads or os.cpu_count() or 1])
    threads = settings[0]
    warnings: list[str] = []
    matrix: list[dict[str, Any]] = []
    files: dict[str, bytes] = {}
    profile: dict[str, Any] | None = None
    peak = None
    # a memmapped or encrypted model runs as the graph rebuilt from it (decrypted in
    # memory), a tflite model in LiteRT's interpreter
    for index, setting in enumerate(settings):
        with open_runner(given, ctx.model_key, intra_op_threads=setting) as runner:
            batch = runner.fixed_batch_size() or params.batch_size
            feeds = _inputs(runner, ctx, batch)
            runs_ms = _timed_runs(runner, feeds, params.warmup + params.runs)
            matrix.append({"threads": setting,
                           "latency_ms": latency_stats(runs_ms[0], runs_ms[params.warmup:])})
            if index > 0:  # the first setting is `latency_ms`, profiled and traced
                continue
            times_ms = runs_ms
            runtime = "litert" if hasattr(runner, "invoke") else "tensorflow"
            graph_nodes = None if runtime == "litert" else len(runner.graph.get_operations())
            if params.memory and hasattr(runner, "session"):
                peak = _traced_peak_memory(runner, feeds)
            if params.profile_runs:
                profile, files = _profile(runner, feeds, params.profile_runs)

    latency = latency_stats(times_ms[0], times_ms[params.warmup:])
    opened = unwrapped(given, ctx.model_key)
    ops = graph_nodes if runtime == "tensorflow" else _operators(opened)
    flops: int | None
    operators = None  # what the device estimates price, op by op
    if opened.kind == "tflite":  # no graph to profile: the graph it was converted from
        from orchestrator.model.litert_model import operators as litert_operators

        operators = litert_operators(opened.payload) if opened.payload else None
        tflite = opened.metadata.get("tflite") or {}
        flops = tflite.get("flops")
        precision = "int8" if tflite.get("mode") == "int8" else "float32"
        if flops is None:
            warnings.append("FLOPs not counted: the .tflite does not record the FLOPs of "
                            "the graph it was converted from")
    else:
        artifact = runnable(given, ctx.model_key)
        op_counts = Counter(node.op for node in artifact.graph_def.node)
        precision = precision_of(op_counts)
        one_sample = {name: (1, *feed.shape[1:]) for name, feed in
                      zip(artifact.input_names, feeds, strict=True) if feed.ndim > 0}
        try:
            flops = count_flops(artifact.graph_def, one_sample, warnings)
        except (ValueError, TypeError) as exc:  # shapes the profiler cannot resolve
            flops = None
            warnings.append(f"FLOPs not counted: {exc}")
        try:
            operators = graph_operators(artifact.graph_def, one_sample)
        except (ValueError, TypeError) as exc:  # the estimates fall back to FLOPs only
            warnings.append(f"operators not read, the estimates are FLOPs only: {exc}")

    info: dict[str, Any] = {"latency_ms": latency, "batch_size": batch, "threads": threads,
                            "threads_matrix": matrix, "precision": precision, "flops": flops,
                            "host": describe(),
                            "latency_runs_ms": [round(t, 4) for t in
                                                times_ms[params.warmup:]],
                            "profile": profile}
    metrics: dict[str, float] = {"latency_p50_ms": latency["p50"],
                                 "latency_mean_ms": latency["mean"]}
    if flops is not None:
        metrics["flops"] = float(flops)
        host = speed(threads, runtime)
        info["estimate_basis"] = basis(latency["p50"], host["flops_per_second"],
                                       host["core_flops_per_second"], host["fixed_ms"], ops,
                                       runtime, min_ms=latency["min"],
                                       per_op_ms=host["per_op_ms"], cv=latency["cv"],
                                       operators=operators)
        estimates = {target: estimate(flops, device, precision, info["estimate_basis"])
                     for target, device in ctx.devices.items()}
        info["est_latency_ms"] = {target: round(e.latency_ms, 4)
                                  for target, e in estimates.items() if e is not None}
        info["estimate"] = {target: e.to_json() for target, e in estimates.items()
                            if e is not None}
        metrics.update({f"est_latency_ms.{t}": v for t, v in info["est_latency_ms"].items()})
    if params.memory:
        info["memory"] = _fresh_process_memory(given, ctx, warnings)
        if info["memory"]:
            metrics.update({f"memory_{k}": float(v) for k, v in info["memory"].items()
                            if isinstance(v, int | float)})
    if peak is not None:
        info["peak_memory_bytes"] = peak
        metrics["peak_memory_bytes"] = float(peak)
    return StageResult(artifact=given, metrics=metrics, info=info, warnings=warnings,
                       files=files)


def _fresh_process_memory(given: ModelArtifact, ctx: StageContext, warnings: list[str]
                          ) -> dict[str, Any] | None:
    """Load time and resident-memory growth of a fresh process that loads the shipped file
    and runs it once (orchestrator.measure.load_probe); None, with a warning, where it cannot."""
    from orchestrator.measure.load_probe import ProbeError, measure_artifact

    try:
        answer = measure_artifact(given, ctx.model_key, [s.to_json() for s in given.inputs],
                                  list(given.outputs))
    except (ProbeError, OSError, ValueError) as exc:
        warnings.append(f"memory of a fresh process not measured: {exc}")
        return None
    return {"load_ms": answer["load_ms"], "rss_growth_mb": answer["rss_growth_mb"],
            "anon_growth_mb": answer["anon_growth_mb"]}


def _operators(opened: ModelArtifact) -> int | None:
    """The operators one LiteRT run executes, as `inspect` counts them: the .tflite's
    operators, each run once per Invoke (in its own kernel or inside a delegate's). A TF
    session's count is its graph's nodes, Const included: the executor runs them too."""
    from orchestrator.model.litert_model import describe

    if opened.payload is None:
        return None
    return sum(describe(opened.payload).op_counts.values())


def _timed_runs(runner: Any, feeds: list[np.ndarray], count: int) -> list[float]:
    """Wall time of each of `count` runs, in ms: what benchmark_model times. A TF session
    run takes its feeds and returns its outputs (Session::Run); a LiteRT run is Invoke()
    alone, its inputs set once before, as TFLite's benchmark_model does."""
    if hasattr(runner, "invoke"):
        runner.set_inputs(*feeds)
        step = runner.invoke
    else:
        def step() -> None:
            runner.run(*feeds)
    times_ms = []
    clock = time.perf_counter
    for _ in range(count):
        start = clock()
        step()
        times_ms.append((clock() - start) * 1000.0)
    return times_ms


def _profile(runner: Any, feeds: list[np.ndarray], runs: int
             ) -> tuple[dict[str, Any], dict[str, bytes]]:
    """report.json's `profile` and the two TSVs, from the runner's own per-node timing."""
    from orchestrator.measure import profiling
    timings = runner.node_timings(feeds, runs)
    if timings is None:  # LiteRT's Python interpreter has no op profiler
        from orchestrator.measure.litert_runtime import NO_PROFILE_NOTE

        return {"source": None, "note": NO_PROFILE_NOTE}, {}
    top, by_type = profiling.top_rows(timings), profiling.by_type_rows(timings)
    files = {profiling.TOP_FILE: profiling.tsv(top, profiling.TOP_COLUMNS),
             profiling.BY_TYPE_FILE: profiling.tsv(by_type, profiling.BY_TYPE_COLUMNS)}
    return {"source": "step_stats", "runs": runs, "by_node_type": by_type,
            "top_nodes": top[:10]}, files


def latency_stats(first_ms: float, timed_ms: Sequence[float]) -> dict[str, float]:
    """report.json's latency_ms: `first` (cold run) plus statistics of the timed runs."""
    values = np.asarray(timed_ms, dtype=np.float64)
    mean = values.mean()
    stats = {"count": len(values), "first": first_ms, "curr": values[-1], "mean": mean,
             "std": values.std(), "cv": values.std() / mean if mean > 0 else 0.0,
             "min": values.min(), "p50": np.percentile(values, 50),
             "p90": np.percentile(values, 90), "p99": np.percentile(values, 99),
             "max": values.max()}
    return {key: (int(v) if key == "count" else round(float(v), 4)) for key, v in stats.items()}


def _inputs(runner: Any, ctx: StageContext, batch: int) -> list[np.ndarray]:
    """One array per model input: the first from the recipe's data when it has some."""
    feeds = [random_input(shape, dtype, batch, seed=i) for i, (shape, dtype) in
             enumerate(runner.input_specs())]
    data = None
    if ctx.evaluation is not None:
        data = ctx.evaluation().inputs
    elif ctx.representative is not None:
        data = next(iter(ctx.representative(batch, batch)), None)
    if data is not None and len(data):
        reps = -(-batch // len(data))  # fewer samples than a batch: repeat them
        feeds[0] = np.concatenate([data] * reps)[:batch] if reps > 1 else data[:batch]
    return feeds


# --------------------------------------------------------------------------- FLOPs


# --------------------------------------------------------------------------- memory


def _traced_peak_memory(runner: Any, feeds: Sequence[np.ndarray]) -> int | None:
    import tensorflow as tf

    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    runner.run(*feeds, options=options, run_metadata=metadata)
    if not metadata.step_stats.dev_stats:
        return None
    return peak_memory_bytes(runner.graph, metadata.step_stats)


def peak_memory_bytes(graph: Any, step_stats: Any) -> int:
    """Weights + feeds + the peak of live intermediate buffers, from one traced run.

    Ops run serially (inter-op 1), so the order of their start times is the execution
    order. A buffer (by address, so that forwarded outputs such as Identity or in-place
    Relu are not counted twice) is live from its producer until its last consumer ran.
    """
    stats = sorted((ns for dev in step_stats.dev_stats for ns in dev.node_stats),
                   key=lambda ns: ns.all_start_micros)
    order = {ns.node_name: i for i, ns in enumerate(stats)}
    end = len(stats)  # fetched outputs stay live to the end
    resident = 0
    resident_ptrs: set[int] = set()
    buffers: dict[int, list[int]] = {}  # ptr -> [size, start, last use]
    intervals: list[list[int]] = []
    for i, ns in enumerate(stats):
        try:
            op = graph.get_operation_by_name(ns.node_name)
        except (KeyError, ValueError):
            op = None  # _SOURCE, _arg_* (feeds), _retval_* (fetches)
        for out in ns.output:
            alloc = out.tensor_description.allocation_description
            size = int(alloc.requested_bytes)
            if alloc.ptr and alloc.ptr in resident_ptrs:
                continue  # an Identity of a weight or feed: no new buffer
            if op is None or op.type in ("Const", "HostConst"):
                resident += size  # feeds and weights: held for the whole run
                resident_ptrs.add(alloc.ptr)
                continue
            if op.type in _MAPPED_CONST_OPS:
                continue
            consumers = op.outputs[out.slot].consumers() if out.slot < len(op.outputs) else []
            last = max((order.get(c.name, end) for c in consumers), default=end)
            live = buffers.get(alloc.ptr) if alloc.ptr else None
            if live is not None and live[2] >= i:  # forwarded: same buffer, still live
                live[0] = max(live[0], size)
                live[2] = max(live[2], last)
                continue
            interval = [size, i, last]
            intervals.append(interval)
            if alloc.ptr:
                buffers[alloc.ptr] = interval
    events = sorted([(start, 0, size) for size, start, _ in intervals]
                    + [(stop, 1, -size) for size, _, stop in intervals])
    live_bytes = peak = 0
    for _, _, delta in events:  # at each step: allocate, take the peak, then free
        live_bytes += delta
        peak = max(peak, live_bytes)
    return resident + peak


def _prepare(params: Params) -> None:
    if params.memory:
        from orchestrator.measure.load_probe import start

        start()  # the probe's process imports TensorFlow while earlier stages run


STAGE = register(Stage(name="benchmark", run=run, prepare=_prepare, params=Params,
                       doc=__doc__, kind="measure", accepts=ANY_KIND, variant_metrics=True))
