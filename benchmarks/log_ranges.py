"""The cost of log_ranges: range logging over 1,000 samples vs plain inference of that graph.

On the digits int8 graph before freeze_ranges (fp32 + quantize_weights, quantize_nodes),
times, side by side and interleaved, the whole log_ranges stage (insert_logging, graph
import, one session, all batches, per-sample ranges, the log text) against plain inference
(graph import, one session, the same batches) over the same samples. Target: ratio <= 2.

Also shows how close batched per-sample ranges are to the classic batch-1 ranges.

    .venv/bin/python benchmarks/log_ranges.py [--samples 1000] [--repeats 5] [--quick]

--quick: 200 samples, one repeat; the ratio is printed, not judged (exit 0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from int8_size import ROOT, apply, chains, data, run_chain  # noqa: E402

from orchestrator.measure import tf_runtime  # noqa: E402
from orchestrator.model.artifact import ModelArtifact  # noqa: E402
from orchestrator.quant.ranges import frozen_range, parse_range_log  # noqa: E402
from orchestrator.stages import get_stage  # noqa: E402


def plain(model: ModelArtifact, x: np.ndarray, batch_size: int) -> float:
    start = time.perf_counter()
    with tf_runtime.GraphRunner.for_artifact(model) as runner:
        for batch in runner.batches(x, batch_size):
            runner.run(batch)
    return time.perf_counter() - start


def logged(model: ModelArtifact, x: np.ndarray, batch_size: int, per_sample: bool
           ) -> tuple[float, str]:
    start = time.perf_counter()
    params = get_stage("log_ranges").params(samples=len(x), batch_size=batch_size,
                                            per_sample=per_sample)
    out = apply("log_ranges", params, model, x, None)
    return time.perf_counter() - start, out.metadata["min_max_log"]


def frozen(log: str) -> dict[str, tuple[float, float]]:
    records = parse_range_log(log)
    return {name: frozen_range([r.min for r in records if r.node == name],
                               [r.max for r in records if r.node == name], 5, 5)
            for name in dict.fromkeys(r.node for r in records)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="200 samples, one repeat; the target is not judged")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.repeats = min(args.samples, 200), 1
    d = data()
    x = d["x_calib"][: args.samples]
    # the recipe's own fp32 pipeline, then its int8 stages up to log_ranges
    source, fp32_stages, int8_stages = chains(ROOT / "recipes" / "digits.yaml", False)
    fp32, _ = run_chain(source, fp32_stages, x)
    before_log = [(name, p) for name, p in int8_stages[:[n for n, _ in int8_stages]
                                                        .index("log_ranges")]]
    model, _ = run_chain(fp32, before_log, x)

    rows = []
    for batch_size, per_sample, repeats in ((100, True, args.repeats),
                                            (100, False, args.repeats),
                                            (1000, True, args.repeats),
                                            (1, True, min(3, args.repeats))):
        plain(model, x, batch_size)  # warm-up: kernels, allocator
        logged(model, x, batch_size, per_sample)
        t_plain, t_log = [], []
        for _ in range(repeats):  # interleaved, so that drift hits both alike
            t_plain.append(plain(model, x, batch_size))
            seconds, log = logged(model, x, batch_size, per_sample)
            t_log.append(seconds)
        rows.append((batch_size, per_sample, statistics.median(t_plain),
                     statistics.median(t_log), log))

    print(f"\nlog_ranges vs plain inference, digits int8 graph, {len(x)} samples, "
          f"median of {args.repeats} (batch 1: of {min(3, args.repeats)})\n")
    print("  batch  lines per   plain (ms)  log_ranges (ms)  ratio")
    for batch_size, per_sample, p, t, _ in rows:
        mode = "sample" if per_sample else "batch"
        print(f"  {batch_size:>5}  {mode:<9}  {p * 1e3:>10.1f}  {t * 1e3:>15.1f}  {t / p:5.2f}")
    default = rows[0]
    ratio = default[3] / default[2]
    print(f"\n  default (batch 100, per sample): ratio {ratio:.2f}  (target <= 2.00): "
          f"{'PASS' if ratio <= 2.0 else 'FAIL'}")

    classic = frozen(rows[-1][4])
    batched = frozen(default[4])
    worst = max(max(abs(classic[n][0] - batched[n][0]), abs(classic[n][1] - batched[n][1]))
                / (classic[n][1] - classic[n][0]) for n in classic)
    print(f"  frozen ranges (5/5 percentiles), batch 100 vs classic batch 1: largest "
          f"difference {worst:.2%} of the range")
    if args.quick:
        print("  --quick: 200 samples, one repeat; the target is not judged")
        return 0
    return 0 if ratio <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
