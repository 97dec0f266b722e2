"""Digits int8 at the 8-bit floor: size against one byte per weight, accuracy drop.

The 8-bit floor is the file every weight would make at one byte per element and nothing
else (no names, no ops, no ranges): fp32's const parameter count, as summarize_graph
counts it. Acceptance: int8 size <= 1.04 x the floor, accuracy drop <= 0.005 (TFLite's
int8 reaches 1.02 on a similar CNN). QuantizedConv2D and QuantizedMatMul present, no
RequantizationRange left.

Runs the transforms of recipes/digits.yaml's `fp32` and `int8` pipelines as the recipe
loads them (the stages added by default included: compact_names after freeze_ranges),
with the recipe's params, without Prefect/MLflow; prints the size after each stage, then
where the int8 file's bytes above the floor go.

    .venv/bin/python benchmarks/int8_size.py [--recipe recipes/digits.yaml] [--keep-names]
        [--quick]

--quick: the same chains on 100 calibration and 100 test samples; the table is printed,
the acceptance is not judged (exit 0 once it ran to the end).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.measure import tf_runtime  # noqa: E402,F401  (TF env defaults first
from orchestrator.model.artifact import ModelArtifact  # noqa: E402
from orchestrator.model.graph_rewrite import copy_graph  # noqa: E402
from orchestrator.stages import StageContext, get_stage  # noqa: E402

DIGITS = ROOT / "examples" / "digits"
MAX_RATIO = 1.04  # int8 size / the 8-bit floor
MAX_DROP = 0.005  # accuracy drop, fp32 -> int8
EIGHT_BIT_DTYPES = (4, 6, 11, 12)  # DT_UINT8, DT_INT8, DT_QINT8, DT_QUINT8
QUANT_OPS = ("Requantize", "Dequantize", "QuantizeV2")
# GTT's helpers: the input's run-time range (Reshape, Min, Max) and a flatten's dynamic
# batch dimension (Shape, StridedSlice, Pack)
HELPER_OPS = ("Reshape", "Min", "Max", "Shape", "StridedSlice", "Pack", "Rank", "Range")


def data() -> dict[str, np.ndarray]:
    if not (DIGITS / "data.npz").is_file() or not (DIGITS / "saved_model").is_dir():
        sys.exit("run .venv/bin/python examples/digits/make_model.py first")
    with np.load(DIGITS / "data.npz") as npz:
        return {k: npz[k] for k in ("x_calib", "x_test", "y_test")}


def chains(recipe: Path, keep_names: bool
           ) -> tuple[ModelArtifact, list[tuple[str, Any]], list[tuple[str, Any]]]:
    """The recipe's source model (its declared inputs and outputs) and the transforms of its
    fp32 and int8 pipelines, as the recipe loads them."""
    from orchestrator.engine.prepared_run import load_source
    from orchestrator.recipe.loading import load_recipe

    loaded = load_recipe(recipe, ["pipelines.int8.keep_names=true"] if keep_names else [],
                         check_files=False)

    def transforms(name: str) -> list[tuple[str, Any]]:
        return [(s, p) for s, p in loaded.stages[name] if get_stage(s).kind == "transform"]

    return load_source(loaded), transforms("fp32"), transforms("int8")


def apply(name: str, params: Any, artifact: ModelArtifact, x: np.ndarray,
          float_model: ModelArtifact | None) -> ModelArtifact:
    """One stage, given what the flow would give it: representative data, the float model."""
    def representative(samples: int | None, batch_size: int) -> Iterator[np.ndarray]:
        rows = x if samples is None else x[:samples]
        for start in range(0, len(rows), batch_size):
            yield rows[start:start + batch_size]

    ctx = StageContext(pipeline="bench", stage=name, representative=representative,
                       float_model=None if float_model is None else (lambda: float_model))
    result = get_stage(name).run(artifact, params, ctx)
    for warning in result.warnings:
        print(f"  [{name}] warning: {warning}")
    return result.artifact


def run_chain(model: ModelArtifact, stages: list[tuple[str, Any]], x: np.ndarray,
              float_model: ModelArtifact | None = None
              ) -> tuple[ModelArtifact, list[tuple[str, int, float]]]:
    steps = []
    for name, params in stages:
        if float_model is None and name in ("quantize_weights", "quantize_nodes"):
            float_model = model
        start = time.perf_counter()
        model = apply(name, params, model, x, float_model)
        steps.append((name, model.graph_def.ByteSize(), time.perf_counter() - start))
    return model, steps


def const_params(artifact: ModelArtifact) -> int:
    """summarize_graph's const parameter count: elements of every Const."""
    return sum(math.prod(d.size for d in n.attr["value"].tensor.tensor_shape.dim)
               for n in artifact.graph_def.node if n.op == "Const")


def _field(length: int) -> int:
    """Bytes of a length-delimited protobuf field: tag, length varint, payload."""
    return 1 + max(1, math.ceil(length.bit_length() / 7)) + length


def where_bytes_go(graph: Any) -> list[tuple[str, int]]:
    """The serialized GraphDef split into parts that add up to its size."""
    parts: Counter[str] = Counter()
    for node in graph.node:
        whole = _field(node.ByteSize())
        names = _field(len(node.name.encode()))
        inputs = sum(_field(len(i.encode())) for i in node.input)
        parts["node names"] += names
        parts["input references"] += inputs
        rest = whole - names - inputs
        if node.op == "Const":
            tensor = node.attr["value"].tensor
            elements = math.prod(d.size for d in tensor.tensor_shape.dim)
            if tensor.dtype in EIGHT_BIT_DTYPES:
                parts["8-bit weights, one byte each"] += elements
                parts["8-bit weight consts: dtype, shape, framing"] += rest - elements
            elif elements <= 1 and tensor.dtype == 1:
                parts["float scalars (weight and activation ranges)"] += rest
            elif tensor.dtype == 1:
                parts["float tensors (left in float)"] += rest
            else:
                parts["other consts (shapes, axes)"] += rest
        elif node.op.startswith("Quantized") or node.op in QUANT_OPS:
            parts["8-bit ops: op type, attrs, framing"] += rest
        elif node.op in HELPER_OPS:
            parts["helper ops (input range, dynamic shape)"] += rest
        else:
            parts["other ops (placeholder, softmax, ...)"] += rest
    parts["GraphDef versions and library"] = graph.ByteSize() - sum(parts.values())
    return sorted(parts.items(), key=lambda kv: -kv[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "digits.yaml",
                        help="the recipe whose fp32 and int8 pipelines to run")
    parser.add_argument("--keep-names", action="store_true",
                        help="int8 with keep_names: true (no compact_names added)")
    parser.add_argument("--quick", action="store_true",
                        help="100 calibration and test samples; acceptance not judged")
    args = parser.parse_args(argv)
    d = data()
    if args.quick:
        d = {k: v[:100] for k, v in d.items()}
    source, fp32_stages, int8_stages = chains(args.recipe, args.keep_names)
    fp32, _ = run_chain(source, fp32_stages, d["x_calib"])
    int8, steps = run_chain(fp32, int8_stages, d["x_calib"])

    # as shipped: TF's import_graph_def writes default attrs back into the GraphDef it runs
    shipped32, shipped8 = copy_graph(fp32.graph_def), copy_graph(int8.graph_def)
    x, y = d["x_test"], d["y_test"]
    p32, p8 = tf_runtime.predict(fp32, x), tf_runtime.predict(int8, x)
    acc32, acc8 = float(np.mean(p32.argmax(1) == y)), float(np.mean(p8.argmax(1) == y))
    agree = float(np.mean(p32.argmax(1) == p8.argmax(1)))
    floor = const_params(fp32)
    size32, size8 = shipped32.ByteSize(), shipped8.ByteSize()
    ratio = size8 / floor
    counts = Counter(node.op for node in shipped8.node)

    print(f"\ndigits CNN: fp32 = {', '.join(s for s, _ in fp32_stages)}; "
          f"int8 = fp32 + {', '.join(s for s, _ in int8_stages)}\n")
    rows = [("8-bit floor (bytes)", f"{floor:,}  (one byte per weight element: fp32's const "
             "parameter count; no names, no ops)"),
            ("fp32 size (bytes)", f"{size32:,}"),
            ("int8 size (bytes)", f"{size8:,}"),
            ("int8 size / 8-bit floor", f"{ratio:.4f}  (target <= {MAX_RATIO}; "
             "TFLite int8: 1.02)"),
            ("int8 size / fp32 size", f"{size8 / size32:.4f}"),
            ("accuracy fp32 / int8", f"{acc32:.4f} / {acc8:.4f}"),
            ("accuracy drop", f"{acc32 - acc8:+.4f}  (target <= {MAX_DROP})"),
            ("top-1 agreement", f"{agree:.2%}"),
            ("QuantizedConv2D / QuantizedMatMul",
             f"{counts['QuantizedConv2D']} / {counts['QuantizedMatMul']}"),
            ("RequantizationRange left", str(counts["RequantizationRange"]))]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")

    print("\n  stage               size (bytes)  / floor  seconds")
    print(f"  {'fp32':<18}  {size32:>12,}  {size32 / floor:7.4f}")
    for name, size, seconds in steps:
        print(f"  {name:<18}  {size:>12,}  {size / floor:7.4f}  {seconds:7.2f}")

    print(f"\n  where the int8 bytes go ({size8 - floor:+,} above the floor)")
    for key, value in where_bytes_go(shipped8):
        print(f"  {key:<44}  {value:>9,}")
    print(f"  {'total':<44}  {size8:>9,}")

    ok = (ratio <= MAX_RATIO and acc32 - acc8 <= MAX_DROP and counts["QuantizedConv2D"]
          and counts["QuantizedMatMul"] and not counts["RequantizationRange"])
    print(f"\n  acceptance (size <= {MAX_RATIO} x floor, drop <= {MAX_DROP}): "
          f"{'PASS' if ok else 'FAIL'}")
    if args.quick:
        print("  --quick: 100 samples, acceptance not judged")
        return 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
