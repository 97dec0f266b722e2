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
# What the latency estimates calibrate on (orchestrator.estimates): this host's measured
# float32 speed, and what its runtimes cost per run with (next to) no work. Each is measured
# once per process: the figures do not change while a run lasts.

PROBE_SIZE = 256  # matmul side: 34 MFLOP a run, under a ms: many runs fit between the
# other processes of a busy host, so the fastest is clean (at 512, best-of-20 ranged 35-88
# GFLOP/s on a loaded 2-core host; at 256, best-of-100 ranged 79-87)
PROBE_RUNS = 100
FIXED_RUNS = 200


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


@lru_cache(maxsize=2)
def runtime_fixed_ms(runtime: str) -> float:
    """The fastest of FIXED_RUNS runs of a one-op model (a ReLU of one number) in
    `runtime`, timed as the benchmark stage times a run: a TF session's run with its feed
    and fetch ("tensorflow"), LiteRT's Invoke() alone ("litert"). What a run costs before
    any work; the fastest, as the estimates take each file's fastest run."""
    import time

    import numpy as np
    import tensorflow as tf

    feed = np.ones((1, 1), np.float32)
    if runtime == "litert":
        from orchestrator.litert_model import interpreter

        function = tf.function(tf.nn.relu, input_signature=[tf.TensorSpec((1, 1), tf.float32)])
        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [function.get_concrete_function()], function)
        lite = interpreter(converter.convert(), num_threads=1)
        lite.set_tensor(lite.get_input_details()[0]["index"], feed)
        step = lite.invoke
    else:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, (1, 1))
            y = tf.nn.relu(x)
        session = tf.compat.v1.Session(graph=graph, config=tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=1, inter_op_parallelism_threads=1))

        def step() -> None:
            session.run(y, {x: feed})
    for _ in range(20):  # warm up
        step()
    times = []
    for _ in range(FIXED_RUNS):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if runtime != "litert":
        session.close()
    return min(times) * 1000.0


def speed(threads: int, runtime: str) -> dict[str, Any]:
    """{flops_per_second, core_flops_per_second, fixed_ms, runtime, threads}: the host
    figures a latency estimate calibrates on (see orchestrator.estimates)."""
    # a session with more threads can always do what one does: a probe that shared its
    # cores with other processes can measure less, never more
    return {"flops_per_second": round(max(matmul_flops_per_second(threads),
                                          matmul_flops_per_second(1))),
            "core_flops_per_second": round(matmul_flops_per_second(1)),
            "fixed_ms": round(runtime_fixed_ms(runtime), 5), "runtime": runtime,
            "threads": threads}
