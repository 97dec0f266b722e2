"""The `benchmark` stage's own overhead against a bare loop over the same runs.

For the digits fp32 graph (TF session) and its int8 `.tflite` (LiteRT interpreter), each
repetition times, one after the other in this process with 1 thread:
- bare: the plainest loop that runs the model, timed per run: `session.run(fetches, feed)`
  with the feed built once; for LiteRT `invoke()` with the input set once (what TFLite's
  benchmark_model times);
- stage: the `benchmark` stage over the same number of runs (profiling, memory and the
  threads matrix off: their extra runs are not in the timings), its `latency_ms`.

Printed per model: the median over repetitions of the per-run mean and p50, bare and stage,
and their ratio. Goal: stage / bare <= 1.10.

    .venv/bin/python benchmarks/benchmark_overhead.py [--runs 300] [--repeats 7] [--quick]

--quick: 10 runs, one repeat, the .tflite calibrated on 20 samples; the same table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from int8_size import chains, data, run_chain  # noqa: E402

from orchestrator.model.artifact import ModelArtifact  # noqa: E402
from orchestrator.stages import StageContext, get_stage  # noqa: E402

GOAL = 1.10


def bare_graph(artifact: ModelArtifact, x: np.ndarray, runs: int) -> list[float]:
    """Per-run ms of a plain session.run loop."""
    import tensorflow as tf

    from orchestrator.measure.tf_runtime import session_config

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(artifact.graph_def, name="")
    feed = {graph.get_tensor_by_name(f"{artifact.input_names[0]}:0"): x}
    fetches = [graph.get_tensor_by_name(f"{o}:0") for o in artifact.outputs]
    with tf.compat.v1.Session(graph=graph, config=session_config(1)) as session:
        for _ in range(5):
            session.run(fetches, feed)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            session.run(fetches, feed)
            times.append((time.perf_counter() - start) * 1000.0)
    return times


def bare_litert(flatbuffer: bytes, x: np.ndarray, runs: int) -> list[float]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer, num_threads=1)
    interpreter.allocate_tensors()
    (given,), outputs = interpreter.get_input_details(), interpreter.get_output_details()
    scale, zero = given["quantization"]
    sample = (np.round(x / scale + zero) if scale else x).astype(given["dtype"])
    interpreter.set_tensor(given["index"], sample)
    times = []
    for index in range(runs + 5):
        start = time.perf_counter()
        interpreter.invoke()
        if index >= 5:
            times.append((time.perf_counter() - start) * 1000.0)
    interpreter.get_tensor(outputs[0]["index"])
    return times


def stage_latency(artifact: ModelArtifact, x: np.ndarray, runs: int) -> dict[str, float]:
    """The stage's latency on the very input the bare loop feeds (its representative)."""
    stage = get_stage("benchmark")
    params = stage.params(warmup=5, runs=runs, threads=1, profile_runs=0, memory=False)
    ctx = StageContext(pipeline="bench", stage="benchmark",
                       representative=lambda samples, batch_size: iter([x]))
    result = stage.run(artifact, params, ctx)
    return dict(result.info["latency_ms"])


def compare(name: str, bare: Any, artifact: ModelArtifact, x: np.ndarray, runs: int,
            repeats: int) -> dict[str, Any]:
    bare_means, bare_p50s, stage_means, stage_p50s = [], [], [], []
    for _ in range(repeats):  # interleaved, so that a busy moment hits both alike
        times = bare(runs)
        bare_means.append(statistics.fmean(times))
        bare_p50s.append(statistics.median(times))
        latency = stage_latency(artifact, x, runs)
        stage_means.append(latency["mean"])
        stage_p50s.append(latency["p50"])
    row = {"model": name, "bare_mean": statistics.median(bare_means),
           "stage_mean": statistics.median(stage_means),
           "bare_p50": statistics.median(bare_p50s), "stage_p50": statistics.median(stage_p50s)}
    row["mean_ratio"] = row["stage_mean"] / row["bare_mean"]
    row["p50_ratio"] = row["stage_p50"] / row["bare_p50"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true",
                        help="10 runs, 1 repeat, 20 calibration samples for the .tflite")
    args = parser.parse_args(argv)
    runs, repeats = (10, 1) if args.quick else (args.runs, args.repeats)
    calibration = 20 if args.quick else 200
    arrays = data()
    source, fp32_stages, _ = chains(ROOT / "recipes" / "digits.yaml", keep_names=False)
    fp32, _ = run_chain(source, fp32_stages, arrays["x_calib"])
    x = arrays["x_test"][:1]

    def representative(samples: int | None, batch_size: int) -> Any:
        rows = arrays["x_calib"][:samples or calibration]
        return (rows[i:i + batch_size] for i in range(0, len(rows), batch_size))

    convert = get_stage("convert_tflite")
    lite = convert.run(fp32, convert.params(mode="int8", calibration_samples=calibration),
                       StageContext(pipeline="bench", stage="convert_tflite",
                                    representative=representative)).artifact
    rows = [compare("digits fp32 (TF session)", lambda n: bare_graph(fp32, x, n), fp32, x,
                    runs, repeats),
            compare("digits int8 .tflite (LiteRT)",
                    lambda n: bare_litert(lite.payload, x, n), lite, x, runs, repeats)]
    print(f"{runs} runs x {repeats} repeats, 1 thread; medians over repeats, ms per run")
    print("| model | bare mean | stage mean | ratio | bare p50 | stage p50 | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['bare_mean']:.4f} | {r['stage_mean']:.4f} | "
              f"{r['mean_ratio']:.3f} | {r['bare_p50']:.4f} | {r['stage_p50']:.4f} | "
              f"{r['p50_ratio']:.3f} |")
    worst = max(max(r["mean_ratio"], r["p50_ratio"]) for r in rows)
    print(f"overhead: stage / bare at most {worst:.3f} (goal <= {GOAL:.2f}): "
          + ("met" if worst <= GOAL else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
