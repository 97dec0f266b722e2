"""The machine a timing was measured on: CPU model, cores, OS and the runtime's version.

A latency means little without its host: report.json keeps this beside every measured
timing (a cached result keeps the host that measured it).
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@lru_cache(maxsize=1)
def describe() -> dict[str, Any]:
    """{cpu, cores, machine, system, python, tensorflow}: this process's host."""
    import tensorflow as tf

    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "machine": platform.machine(),
            "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "tensorflow": tf.__version__}


# --------------------------------------------------------------------------- speed probes
# What the latency estimates calibrate on (orchestrator.measure.estimates): this host's measured
# float32 speed, and what its runtimes cost per run and per op with (next to) no work.
# Each is measured once per process: the figures do not change while a run lasts.

PROBE_SIZE = 256  # matmul side: 34 MFLOP a run, under a ms: many runs fit between the
# other processes of a busy host, so the fastest is clean (at 512, best-of-20 ranged 35-88
# GFLOP/s on a loaded 2-core host; at 256, best-of-100 ranged 79-87)
PROBE_RUNS = 100
# The runtime's own cost: a one-op model against a chain of CHAIN_STEPS cheap steps, each
# timed OVERHEAD_RUNS times, interleaved so that a busy spell slows both alike
CHAIN_STEPS = 64
OVERHEAD_RUNS = 300
OVERHEAD_WIDTH = 8  # elements per tensor: real kernels, next to no arithmetic


@lru_cache(maxsize=8)
def matmul_flops_per_second(threads: int) -> float:
    """This host's float32 FLOP/s (2 per multiply-add): the fastest of PROBE_RUNS runs of a
    PROBE_SIZE square matmul in a TF session with `threads` intra-op threads, the kernels
    and threading of the benchmark's own sessions. The fastest, not the median: other
    processes can only slow a run down, never speed it up."""
    import time

    import numpy as np
    import tensorflow as tf

    n = PROBE_SIZE
    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.constant(rng.standard_normal((n, n)).astype(np.float32))
        x = tf.compat.v1.placeholder(tf.float32, (n, n))
        product = tf.matmul(x, weights)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                      inter_op_parallelism_threads=1)
    feed = {x: rng.standard_normal((n, n)).astype(np.float32)}
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        session.run(product.op, feed)  # warm up: allocation, thread pool
        best = float("inf")
        for _ in range(PROBE_RUNS):
            start = time.perf_counter()
            session.run(product.op, feed)
            best = min(best, time.perf_counter() - start)
    return 2.0 * n ** 3 / best


@lru_cache(maxsize=8)
def runtime_costs(runtime: str, threads: int) -> tuple[float, float]:
    """(fixed ms per run, ms per op) of `runtime` on this host, with `threads` threads:
    the fastest of OVERHEAD_RUNS runs of a one-op model and of a chain of CHAIN_STEPS
    cheap steps (an add of a constant in a TF session; a multiply and an add with ReLU in
    LiteRT), timed as the benchmark stage times a file. Per op: the chain's extra time over
    its extra ops; per run: the one-op model's time less its ops. Ops are counted as the
    benchmark counts a file's: a session's graph nodes (Const included: the executor runs
    them too), LiteRT's operators. The graphs run as built (grappler is off in the
    benchmark's sessions, so no add is folded away)."""
    import time

    one, one_ops = _overhead_model(runtime, threads, 1)
    chain, chain_ops = _overhead_model(runtime, threads, CHAIN_STEPS)
    for _ in range(20):  # warm up: allocation, thread pools
        one()
        chain()
    best_one = best_chain = float("inf")
    clock = time.perf_counter
    for _ in range(OVERHEAD_RUNS):
        start = clock()
        one()
        best_one = min(best_one, clock() - start)
        start = clock()
        chain()
        best_chain = min(best_chain, clock() - start)
    per_op = max(best_chain - best_one, 0.0) / max(chain_ops - one_ops, 1)
    fixed = max(best_one - one_ops * per_op, 0.0)
    return fixed * 1000.0, per_op * 1000.0


def _overhead_model(runtime: str, threads: int, steps: int) -> tuple[Any, int]:
    """(one run of the model, the ops it executes) for `runtime_costs`."""
    import numpy as np
    import tensorflow as tf

    shape = (1, OVERHEAD_WIDTH)
    feed = np.ones(shape, np.float32)
    constants = [np.full(shape, 1e-3 * (i + 1), np.float32) for i in range(steps)]
    if runtime == "litert":
        from orchestrator.model.litert_model import describe, interpreter

        def chain(x: Any) -> Any:
            if steps == 1:
                return x + constants[0]
            y = x
            for c in constants:  # the input in every step: nothing folds to a constant
                y = tf.nn.relu(y + c * x)
            return y

        function = tf.function(chain, input_signature=[tf.TensorSpec(shape, tf.float32)])
        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [function.get_concrete_function()], function)
        data = converter.convert()
        lite = interpreter(data, num_threads=threads)
        lite.set_tensor(lite.get_input_details()[0]["index"], feed)
        return lite.invoke, sum(describe(data).op_counts.values())
    from orchestrator.measure.tf_runtime import session_config

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, shape)
        y = x
        for c in constants:
            y = tf.add(y, tf.constant(c))
    session = tf.compat.v1.Session(graph=graph, config=session_config(threads))
    feeds = {x: feed}

    def step() -> None:
        session.run(y, feeds)
    return step, len(graph.get_operations())


def speed(threads: int, runtime: str) -> dict[str, Any]:
    """{flops_per_second, core_flops_per_second, fixed_ms, per_op_ms, runtime, threads}:
    the host figures a latency estimate calibrates on (see orchestrator.measure.estimates)."""
    fixed_ms, per_op_ms = runtime_costs(runtime, threads)
    # a session with more threads can always do what one does: a probe that shared its
    # cores with other processes can measure less, never more
    return {"flops_per_second": round(max(matmul_flops_per_second(threads),
                                          matmul_flops_per_second(1))),
            "core_flops_per_second": round(matmul_flops_per_second(1)),
            "fixed_ms": round(fixed_ms, 6), "per_op_ms": round(per_op_ms, 7),
            "runtime": runtime, "threads": threads}
