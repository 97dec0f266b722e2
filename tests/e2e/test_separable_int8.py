"""Acceptance: an 8-bit pipeline on a Keras model built with SeparableConv2D, residual `Add`s
and BatchNormalization is at most 0.35 of its fp32 size, and agrees with fp32 on at least 97%
of inputs, with the accuracy guard on where needed.

The model (benchmarks/testbed/models_separable.py, ~57k params) is trained here, seeded, in a
subprocess (so that its seeds and op determinism stay out of this test session), then a
recipe in tmp runs through `orchestrator run` with the session's Prefect server.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.project_env import run_recipe_in
from testbed import model_builds
from testbed.models_separable import INPUT_NAME

MAX_SIZE_RATIO = 0.35
MIN_AGREEMENT = 0.97

pytestmark = pytest.mark.slow

RECIPE = """\
version: 1
name: separable-int8
model:
  path: model/model.keras
  format: keras
  inputs: [{{name: {input}, dtype: float32, shape: [1, 8, 8, 1]}}]
data:
  representative: {{source: model/data.npz, array: x_calib, samples: 200}}
  evaluation: {{source: model/data.npz, inputs: x_test, labels: y_test}}
targets:
  - name: phone
    device: phone-2016
    budgets: {{min_fidelity: {fidelity}}}
pipelines:
  fp32:
    stages: [freeze, strip, fold, benchmark, evaluate]
  int8:
    from: fp32
    stages:
      - quantize_weights
      - quantize_nodes: {{guard: true}}
      - log_ranges
      - freeze_ranges
      - compact_names
      - benchmark
      - evaluate
"""


def _load(folder: Path) -> Any:
    from orchestrator.model.artifact import ModelArtifact

    return ModelArtifact.from_bytes((folder / "model.pb").read_bytes(),
                                    (folder / "signature.json").read_text())


def graph_stats(graph_def: Any, keep: set[str]) -> dict[str, Any]:
    """What makes up a GraphDef's bytes: op counts, Const bytes by dtype, name bytes."""
    from tensorflow.core.framework import types_pb2

    const_bytes: Counter[str] = Counter()
    const_count: Counter[str] = Counter()
    other_bytes = 0
    for node in graph_def.node:
        if node.op == "Const":
            dtype = types_pb2.DataType.Name(node.attr["dtype"].type)
            const_bytes[dtype] += node.ByteSize()
            const_count[dtype] += 1
        else:
            other_bytes += node.ByteSize()
    name_bytes = sum(len(n.name) + sum(len(i) for i in n.input) for n in graph_def.node)
    return {"size_bytes": graph_def.ByteSize(), "nodes": len(graph_def.node),
            "ops": dict(sorted(Counter(n.op for n in graph_def.node).items())),
            "const_bytes_by_dtype": dict(const_bytes), "consts_by_dtype": dict(const_count),
            "non_const_node_bytes": other_bytes, "name_and_input_bytes": name_bytes,
            "size_bytes_if_nodes_had_short_names": _short_named(graph_def, keep).ByteSize()}


def _short_named(graph_def: Any, keep: set[str]) -> Any:
    """A copy with every node but `keep` (inputs, outputs) renamed n0, n1, ...: how much of
    the file is names."""
    from tensorflow.core.framework import graph_pb2

    new = {n.name: n.name if n.name in keep else f"n{i}" for i, n in enumerate(graph_def.node)}
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        node.name = new[node.name]
        for k, inp in enumerate(node.input):
            control = "^" if inp.startswith("^") else ""
            name, colon, port = inp.lstrip("^").partition(":")
            node.input[k] = control + new.get(name, name) + colon + port
    return out


@pytest.fixture(scope="module")
def separable_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model.keras and data.npz of the residual separable CNN, trained seeded in a
    subprocess."""
    folder = tmp_path_factory.mktemp("separable") / "model"
    facts = model_builds.build("models_separable", folder)
    print(f"separable model: keras test accuracy {facts['accuracy']:.4f}, "
          f"params {facts['params']:,.0f}")
    assert facts["params"] >= 50_000
    assert facts["accuracy"] > 0.9, "the model did not train"
    return folder


@pytest.fixture(scope="module")
def separable_run(separable_model: Path, prefect_server: None,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The recipe run once through `orchestrator run`, in a workspace of its own (as the
    `workspace` fixture makes one, at module scope: own cwd, store and MLflow database)."""
    work = separable_model.parent
    out = work / "out"
    code = run_recipe_in(work, RECIPE.format(input=INPUT_NAME, fidelity=MIN_AGREEMENT), out)
    report = json.loads((out / "report.json").read_text())
    return {"code": code, "out": out, "report": report, "data": separable_model / "data.npz"}


def test_run_succeeds_and_meets_the_fidelity_budget(separable_run: dict[str, Any]) -> None:
    report = separable_run["report"]
    int8 = report["variants"]["int8"]
    print("int8 targets:", json.dumps(int8["targets"]))
    assert separable_run["code"] == 0, int8["targets"]
    assert report["selected"]["phone"] is not None


def test_int8_is_at_most_035_of_fp32_size(separable_run: dict[str, Any]) -> None:
    variants = separable_run["report"]["variants"]
    fp32, int8 = variants["fp32"]["size_bytes"], variants["int8"]["size_bytes"]
    ratio = int8 / fp32
    print(f"size: fp32 {fp32:,} B, int8 {int8:,} B, ratio {ratio:.4f} "
          f"(gzip {variants['int8']['gzip_size_bytes'] / variants['fp32']['gzip_size_bytes']:.4f})")
    if ratio > MAX_SIZE_RATIO:  # say where the bytes are before failing
        for name in ("fp32", "int8"):
            artifact = _load(separable_run["out"] / name)
            keep = {*artifact.input_names, *(o.split(":")[0] for o in artifact.outputs)}
            stats = graph_stats(artifact.graph_def, keep)
            print(f"{name}: {json.dumps(stats, indent=1)}")
    assert ratio <= MAX_SIZE_RATIO, (
        f"int8 is {ratio:.3f} of fp32 ({int8:,} of {fp32:,} bytes); see the byte breakdown above")


def test_int8_agrees_with_fp32(separable_run: dict[str, Any]) -> None:
    from orchestrator.measure.tf_runtime import predict

    report = separable_run["report"]
    fidelity = report["variants"]["int8"]["fidelity"]
    print(f"report: int8 fidelity {fidelity}, accuracy {report['variants']['int8']['accuracy']}, "
          f"fp32 accuracy {report['variants']['fp32']['accuracy']}")
    assert report["variants"]["fp32"]["fidelity"] == 1.0
    assert fidelity >= MIN_AGREEMENT

    x_test = np.load(separable_run["data"])["x_test"]
    fp32 = predict(_load(separable_run["out"] / "fp32"), x_test)
    int8 = predict(_load(separable_run["out"] / "int8"), x_test)
    assert fp32.shape == int8.shape == (len(x_test), 10)
    agreement = float(np.mean(fp32.argmax(axis=1) == int8.argmax(axis=1)))
    print(f"direct top-1 agreement fp32 vs int8 on {len(x_test)} inputs: {agreement:.4f}")
    assert agreement >= MIN_AGREEMENT


def test_graphs(separable_run: dict[str, Any]) -> None:
    fp32 = _load(separable_run["out"] / "fp32").graph_def
    int8 = _load(separable_run["out"] / "int8").graph_def
    fp32_ops = Counter(n.op for n in fp32.node)
    int8_ops = Counter(n.op for n in int8.node)
    print("fp32 ops:", dict(sorted(fp32_ops.items())))
    print("int8 ops:", dict(sorted(int8_ops.items())))
    assert not [op for op in fp32_ops if op.startswith("FusedBatchNorm")]
    assert fp32_ops["DepthwiseConv2dNative"] == 4  # the SeparableConv2Ds are really there
    assert "RequantizationRange" not in int8_ops
    assert int8_ops["QuantizedConv2D"] >= 1
    # the pointwise halves of the four SeparableConv2Ds run in eight bits: a QuantizedConv2D
    # whose input is the (float) depthwise conv's output, quantized
    nodes = {n.name: n for n in int8.node}

    def producer(name: str) -> Any:
        return nodes.get(name.lstrip("^").split(":")[0])

    pointwise = [n for n in int8.node if n.op == "QuantizedConv2D"
                 and (q := producer(n.input[0])) is not None and q.op == "QuantizeV2"
                 and (d := producer(q.input[0])) is not None
                 and d.op == "DepthwiseConv2dNative"]
    assert len(pointwise) == 4, [n.name for n in pointwise]
    assert separable_run["report"]["variants"]["int8"]["ops"] == dict(sorted(int8_ops.items()))


def test_trials_table_if_any(separable_run: dict[str, Any]) -> None:
    int8 = separable_run["report"]["variants"]["int8"]
    if "trials" not in int8:
        print("no trials table (the guard had nothing to do)")
        return
    trials = int8["trials"]
    print("trials:", json.dumps(trials, indent=1))
    assert isinstance(trials, list) and trials
    for row in trials:
        assert isinstance(row, dict)
        assert {"trial", "settings", "meets_budgets"} <= set(row)
    assert trials[0]["trial"] == 0
