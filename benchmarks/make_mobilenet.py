"""A bigger model for the benchmarks: Keras MobileNetV2 (alpha 0.35, 96x96x3, random
weights: nothing is downloaded) with random data, and a recipe to run it.

    .venv/bin/python benchmarks/make_mobilenet.py /tmp/mobilenet [--quick]
    .venv/bin/python benchmarks/cached_rerun.py /tmp/mobilenet/recipe.yaml

--quick: MobileNetV2's smallest input (32x32x3) and 10 samples: the same layers, built fast.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RECIPE = """version: 1
name: mobilenet-v2-035
model:
  path: model.keras
  inputs: [{{name: image, dtype: float32, shape: [1, {side}, {side}, 3]}}]
data:
  representative: {{source: data.npz, array: x_calib, samples: {samples}}}
  evaluation: {{source: data.npz, inputs: x_test}}
targets:
  - name: pi
    device: raspberry-pi-3
    budgets: {{max_size_mb: 4.0, min_fidelity: 0.5}}
pipelines:
  fp32:
    stages: [freeze, strip, fold, benchmark, evaluate]
  int8:
    from: fp32
    stages: [quantize_weights, quantize_nodes, log_ranges, freeze_ranges, benchmark, evaluate]
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=Path("/tmp/mobilenet"))
    parser.add_argument("--quick", action="store_true",
                        help="32x32 inputs (MobileNetV2's smallest), 10 samples")
    args = parser.parse_args(argv)
    import keras
    import numpy as np

    side, samples = (32, 10) if args.quick else (96, 100)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((side, side, 3), name="image")
    base = keras.applications.MobileNetV2(input_shape=(side, side, 3), alpha=0.35,
                                          weights=None, classes=10, input_tensor=inputs)
    base.save(out / "model.keras")
    rng = np.random.default_rng(0)
    np.savez(out / "data.npz",
             x_calib=rng.uniform(-1, 1, (samples, side, side, 3)).astype("f4"),
             x_test=rng.uniform(-1, 1, (samples, side, side, 3)).astype("f4"))
    (out / "recipe.yaml").write_text(RECIPE.format(side=side, samples=samples))
    print(f"wrote {out}/model.keras ({base.count_params():,} params), data.npz, recipe.yaml")


if __name__ == "__main__":
    main()
