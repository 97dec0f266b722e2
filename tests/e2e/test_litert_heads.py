"""Acceptance (issue 39, section 5): a multi-output model through LiteRT. Three heads of
different widths, outputs of one op (`heads:0/1/2`, a SPLIT_V in the .tflite), named in
the recipe out of their graph order, go through `[freeze, strip, fold, convert_tflite fp32,
evaluate, benchmark]` and through `quantize_tflite` with every output matched by name: fp32
keeps fidelity 1.0 and 200 dB on every head, each head is reported under its own name
with its own shape, the shipped file's outputs come in the recipe's order under a
signature, and `orchestrator benchmark` reads them the same. Before, the LiteRT runner
matched outputs by node name (all three `heads`) or position, and evaluate failed with
"stage fp32/evaluate failed: stage fp32/evaluate failed: output 'heads_2': shape (15, 12,
88) differs from the source model's (15, 12, 172)" (the stage named twice). A failing stage
is named once.

The model is a small frozen graph made here in a second (no training: fidelity is against
the source itself); the recipe runs through `orchestrator run` with the session's Prefect
server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.project_env import run_recipe_in

from orchestrator.cli.main import main

pytestmark = pytest.mark.slow

# recipe order: name in report.json -> (graph tensor, width); not the graph's order
HEADS = {"heads_2": ("heads:2", 172), "heads": ("heads", 264), "heads_1": ("heads:1", 88)}
FRAMES, FEATURES = 12, 8

RECIPE = """\
version: 1
name: litert-heads
model:
  path: model/heads.pb
  outputs: ["heads:2", "heads", "heads:1"]
data:
  representative: {source: model/data.npz, array: x_calib, samples: 40}
  evaluation: {source: model/data.npz, inputs: x_test}
targets:
  - name: phone
    device: phone-2016
pipelines:
  fp32:
    stages: [freeze, STRIP, fold, {convert_tflite: {mode: fp32}}, evaluate,
             {benchmark: {runs: 5, profile_runs: 0}}]
  int8:
    stages: [freeze, strip, fold, {convert_tflite: {mode: fp32}}, quantize_tflite, evaluate,
             {benchmark: {runs: 5, profile_runs: 0}}]
"""


def make_model(folder: Path) -> None:
    """model/heads.pb: frames (N, 12, 8) -> dense 32 + relu -> dense 524 -> split into
    heads of 264, 88 and 172 (`heads`, `heads:1`, `heads:2`); model/data.npz."""
    import tensorflow as tf

    rng = np.random.default_rng(39)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, FRAMES, FEATURES], name="frames")
        h = tf.reshape(x, [-1, FEATURES])
        h = tf.nn.relu(tf.matmul(h, tf.constant(
            rng.normal(size=(FEATURES, 32)).astype(np.float32))))
        h = tf.matmul(h, tf.constant(rng.normal(size=(32, 524)).astype(np.float32) / 6))
        h = tf.reshape(h, [-1, FRAMES, 524])
        tf.split(h, [264, 88, 172], axis=-1, name="heads")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "heads.pb").write_bytes(graph.as_graph_def().SerializeToString())
    np.savez(folder / "data.npz",
             x_calib=rng.normal(size=(40, FRAMES, FEATURES)).astype(np.float32),
             x_test=rng.normal(size=(15, FRAMES, FEATURES)).astype(np.float32))


def _run(work: Path, out: Path, strip: str = "strip") -> int:
    """`orchestrator run` of the recipe in `work` (its own cwd, store and MLflow)."""
    return run_recipe_in(work, RECIPE.replace("STRIP", strip), out, "--no-cache")


@pytest.fixture(scope="module")
def heads_run(tmp_path_factory: pytest.TempPathFactory, prefect_server: None
              ) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("litert_heads")
    make_model(work / "model")
    out = work / "out"
    code = _run(work, out)
    assert (out / "report.json").exists(), f"the run failed (exit {code}): see its error above"
    return {"code": code, "work": work, "out": out,
            "report": json.loads((out / "report.json").read_text())}


def test_every_head_is_compared_with_its_own_source_output(heads_run: dict[str, Any]
                                                           ) -> None:
    assert heads_run["code"] == 0
    variants = heads_run["report"]["variants"]
    for variant in ("fp32", "int8"):
        rows = variants[variant]["outputs"]
        assert [(r["name"], r["tensor"], r["shape"]) for r in rows] == [
            (name, tensor, [FRAMES, width]) for name, (tensor, width) in HEADS.items()]
    fp32 = variants["fp32"]
    assert fp32["fidelity"] == pytest.approx(1.0, abs=1e-6)
    assert all(r["sqnr_db"] >= 120 for r in fp32["outputs"]), fp32["outputs"]
    # int8 is close, per head: a wrong pairing of heads would not even have their shapes
    int8 = variants["int8"]
    assert all(r["sqnr_db"] > 15 for r in int8["outputs"]), int8["outputs"]
    assert 0.98 < int8["fidelity"] < 1.0


def test_the_shipped_files_outputs_are_in_the_recipes_order_under_a_signature(
        heads_run: dict[str, Any]) -> None:
    from ai_edge_litert.interpreter import Interpreter

    for variant in ("fp32", "int8"):
        model = Interpreter(model_content=(heads_run["out"] / variant / "model.tflite")
                            .read_bytes())
        details = model.get_output_details()
        assert [(d["name"], int(d["shape"][-1])) for d in details] == [
            (tensor, width) for tensor, width in HEADS.values()], variant
        signature = model._get_full_signature_list()["serving_default"]["outputs"]
        assert {name: index for name, index in signature.items()} == {
            d["name"]: d["index"] for d in details}, variant


def test_orchestrator_benchmark_names_the_outputs_in_order(
        heads_run: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    code = main(["benchmark", str(heads_run["out"] / "int8" / "model.tflite"), "--runs", "3"])
    said = capsys.readouterr().out
    assert code == 0, said
    assert "Outputs: heads:2, heads, heads:1" in said, said


def test_a_failing_stage_is_named_once(heads_run: dict[str, Any],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    code = _run(heads_run["work"], heads_run["work"] / "out_bad",
                strip="{strip: {input_shape: [1, 5, 5]}}")
    said = capsys.readouterr()
    text = said.out + said.err
    assert code == 3, text
    assert text.count("stage fp32/strip failed") == 1, text
    assert "does not fit 'frames'" in text, text
