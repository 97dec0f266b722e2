"""Do bias correction and cross-layer equalization pay? Each with and without, on the
digits CNN (examples/digits) and on the residual separable CNN
(benchmarks/testbed/models_separable.py, trained here, seeded, in a temporary folder).

Chains, built from the stages without Prefect/MLflow (fp32 = freeze, strip, fold):
  w8    fp32 [+ equalize] + quantize_weights                          (weights-only 8-bit)
  int8  fp32 [+ equalize] + quantize_weights, quantize_nodes(bias_correction=on/off),
        log_ranges, freeze_ranges
Per variant: test accuracy, top-1 agreement with fp32, the RMSE of the output scores
against fp32, and the mean |per-class mean error| (the shift bias correction targets).

    .venv/bin/python benchmarks/equalize.py [--samples 200] [--quick]

--quick: 50 calibration and 100 test samples. The separable CNN is the suite's, quick or
not: its trained weights are committed (benchmarks/testbed/model_builds.py), so building it loads
them, in less time than one epoch of training takes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from orchestrator.measure import tf_runtime  # noqa: E402
from orchestrator.model.artifact import ModelArtifact  # noqa: E402
from orchestrator.stages import StageContext, get_stage  # noqa: E402

DIGITS = ROOT / "examples" / "digits"


def context(stage: str, x: np.ndarray, float_model: ModelArtifact | None) -> StageContext:
    def representative(samples: int | None, batch_size: int) -> Iterator[np.ndarray]:
        rows = x if samples is None else x[:samples]
        for start in range(0, len(rows), batch_size):
            yield rows[start:start + batch_size]

    return StageContext(pipeline="bench", stage=stage, representative=representative,
                        float_model=None if float_model is None else (lambda: float_model))


def apply(name: str, model: ModelArtifact, x: np.ndarray, float_model: ModelArtifact | None
          = None, **params: Any) -> tuple[ModelArtifact, dict[str, float]]:
    stage = get_stage(name)
    result = stage.run(model, stage.params(**params), context(name, x, float_model))
    return result.artifact, result.metrics


def fp32_of(path: Path) -> ModelArtifact:
    from orchestrator.model.sources import load_model

    model = load_model(path)
    for name in ("freeze", "strip", "fold"):
        model, _ = apply(name, model, np.zeros(0))
    return model


def variants(fp32: ModelArtifact, x_calib: np.ndarray) -> list[tuple[str, ModelArtifact, str]]:
    equalized, metrics = apply("equalize", fp32, x_calib)
    out = [("fp32", fp32, ""), ("equalize (float)", equalized, "")]
    eq_note = (f"{metrics['equalized_pairs']:.0f} pairs, precision "
               f"{metrics.get('pair_precision_before', 1):.3f} -> "
               f"{metrics.get('pair_precision_after', 1):.3f}")
    for eq, base in (("", fp32), ("equalize + ", equalized)):
        w8, _ = apply("quantize_weights", base, x_calib)
        out.append((f"{eq}w8", w8, eq_note if eq else ""))
        # weights-only with corrected biases: quantize_nodes converting no op
        corrected_w8, _ = apply("quantize_nodes", w8, x_calib, float_model=base, ops=[])
        out.append((f"{eq}w8 + bias_correction", corrected_w8, ""))
        for corrected in (False, True):
            model, m = apply("quantize_nodes", w8, x_calib, float_model=base,
                             bias_correction=corrected)
            note = (f"{m['bias_corrected_layers']:.0f} layers, |shift| "
                    f"{m['bias_shift_over_scale']:.2f} bias steps") if corrected else ""
            model, _ = apply("log_ranges", model, x_calib, samples=len(x_calib))
            model, _ = apply("freeze_ranges", model, x_calib)
            out.append((f"{eq}int8{' + bias_correction' if corrected else ''}", model, note))
    return out


def table(title: str, fp32: ModelArtifact, x_calib: np.ndarray, x_test: np.ndarray,
          y_test: np.ndarray) -> None:
    reference = tf_runtime.predict(fp32, x_test)
    print(f"\n{title}: {len(x_calib)} calibration samples, {len(x_test)} test samples")
    print(f"  {'variant':<34} {'acc':>7} {'agree':>7} {'rmse':>9} {'class-mean err':>14}  note")
    for name, model, note in variants(fp32, x_calib):
        scores = tf_runtime.predict(model, x_test)
        accuracy = float(np.mean(scores.argmax(1) == y_test))
        agree = float(np.mean(scores.argmax(1) == reference.argmax(1)))
        rmse = float(np.sqrt(np.mean((scores - reference) ** 2)))
        class_mean = float(np.mean(np.abs((scores - reference).mean(axis=0))))
        print(f"  {name:<34} {accuracy:7.4f} {agree:7.4f} {rmse:9.2e} {class_mean:14.2e}  "
              f"{note}")


def train_separable(folder: Path, seed: int | None) -> dict[str, float]:
    """models_separable.make in a subprocess: its seeds, op determinism and Keras' console
    noise stay out of this one."""
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT / "benchmarks")!r})
        from testbed import models_separable
        if {seed!r} is not None:
            models_separable.SEED = {seed!r}
        made = models_separable.make(Path({str(folder)!r}))
        print(json.dumps(made))
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    if done.returncode != 0:
        sys.exit(f"training the separable model failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=None,
                        help="the separable model's training seed (default: its own)")
    parser.add_argument("--samples", type=int, default=200,
                        help="calibration samples (log_ranges and bias correction)")
    parser.add_argument("--quick", action="store_true",
                        help="50 calibration and 100 test samples")
    args = parser.parse_args(argv)
    tests = slice(None)
    if args.quick:
        args.samples, tests = min(args.samples, 50), slice(100)

    if not (DIGITS / "data.npz").is_file() or not (DIGITS / "saved_model").is_dir():
        sys.exit("run .venv/bin/python examples/digits/make_model.py first")
    with np.load(DIGITS / "data.npz") as npz:
        d = {k: npz[k] for k in ("x_calib", "x_test", "y_test")}
    table("digits CNN", fp32_of(DIGITS / "saved_model"), d["x_calib"][:args.samples],
          d["x_test"][tests], d["y_test"][tests])

    with tempfile.TemporaryDirectory() as tmp:
        facts = train_separable(Path(tmp), args.seed)
        with np.load(Path(tmp) / "data.npz") as npz:
            s = {k: npz[k] for k in ("x_calib", "x_test", "y_test")}
        fp32 = fp32_of(Path(tmp) / "model.keras")
    table(f"separable residual CNN ({facts['params']:,.0f} params, keras accuracy "
          f"{facts['accuracy']:.4f})", fp32, s["x_calib"][:args.samples], s["x_test"][tests],
          s["y_test"][tests])
    return 0


if __name__ == "__main__":
    sys.exit(main())
