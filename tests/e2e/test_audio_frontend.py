"""Issue 17, the second model: raw audio through a fixed filterbank Conv1D whose outputs
span 40 dB (benchmarks/testbed/models_audio_frontend.py), then a small CNN and three sigmoid heads.

Full int8 cannot keep the heads close to float (8-bit activations cannot cover the front
end's range); the guard, under `min_sqnr_db: 20`, reaches the front end early, takes it
(and what else it needs) to weights-only 8-bit, and ships every head at 20 dB or more with
the size gain of 8-bit weights kept: every weight it did not take to float ships in 8 bits,
and the file is no larger than the recipe's own all-8-bit candidate plus 3 bytes for each
weight it kept in float.

The size is bounded by what the guard chose, not by a fixed share of fp32's: this model
has 10k weights, so its graph's nodes are ~40% of an 8-bit file, and a ratio to fp32 moves
with how many quantize nodes the chosen layers leave (0.32x and 0.35x were both seen).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.project_env import run_recipe
from testbed import model_builds
from testbed.models_audio_frontend import OUTPUT_NAMES

pytestmark = pytest.mark.slow

MIN_SQNR_DB = 20.0
# quantize_weights' default minimum_size: smaller weights (the 32-value heads) may stay
# float in a weights-only layer
MIN_QUANTIZED_SIZE = 128

RECIPE = f"""\
version: 1
name: audio-frontend
model:
  path: model/model.keras
  format: keras
data:
  representative: {{source: model/data.npz, array: x_calib, samples: 300}}
  evaluation: {{source: model/data.npz, inputs: x_test}}
targets:
  - name: phone
    device: phone-2016
    budgets: {{min_sqnr_db: {MIN_SQNR_DB}}}
pipelines:
  fp32: {{stages: [freeze, strip, fold, evaluate]}}
  int8:
    from: fp32
    stages: [quantize_weights, {{quantize_nodes: {{guard: true}}}}, log_ranges, freeze_ranges,
             evaluate]
  plain8:
    from: fp32
    stages: [quantize_weights, quantize_nodes, log_ranges, freeze_ranges, evaluate]
  litert:
    from: fp32
    stages: [{{convert_tflite: {{mode: fp32}}}}, {{quantize_tflite: {{guard: true}}}},
             evaluate]
"""


@pytest.fixture(scope="module")
def audio_run(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> dict:
    work = tmp_path_factory.mktemp("audio_frontend")
    facts = model_builds.build("models_audio_frontend", work / "model")
    print("audio front-end model:", facts)
    code, report = run_recipe(work, RECIPE)
    return {"code": code, "report": report, "facts": facts, "out": work / "out"}


def _sqnr(variant: dict) -> dict[str, float]:
    return {row["name"]: row["sqnr_db"] for row in variant["outputs"]}


def _graph(folder: Path):  # noqa: ANN202
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString((folder / "model.pb").read_bytes())
    return graph


def _elements(const) -> int:  # noqa: ANN001
    dims = [d.size for d in const.attr["value"].tensor.tensor_shape.dim]
    count = 1
    for size in dims:
        count *= size
    return count


def weight_elements(fp32: Path) -> dict[str, int]:
    """Each Conv2D/MatMul of the fp32 graph (the names the guard's settings use): the
    number of values of its weight constant (looking through ExpandDims and Identity)."""
    from orchestrator.quant.ranges import WEIGHT_OPS

    graph = _graph(fp32)
    nodes = {n.name: n for n in graph.node}
    found = {}
    for node in graph.node:
        if node.op not in WEIGHT_OPS:
            continue
        source = nodes.get(node.input[1].split(":")[0])
        while source is not None and source.op in ("ExpandDims", "Identity"):
            source = nodes.get(source.input[0].split(":")[0])
        assert source is not None and source.op == "Const", node.name
        found[node.name] = _elements(source)
    return found


def eight_bit_elements(folder: Path) -> int:
    """Values of the 8-bit constants of a shipped GraphDef."""
    from tensorflow.core.framework import types_pb2

    eight = {types_pb2.DT_QUINT8, types_pb2.DT_QINT8, types_pb2.DT_UINT8, types_pb2.DT_INT8}
    return sum(_elements(n) for n in _graph(folder).node
               if n.op == "Const" and n.attr["dtype"].type in eight)


def test_the_model_learned_its_heads(audio_run: dict) -> None:
    facts = audio_run["facts"]
    assert all(facts[f"{name}_accuracy"] > 0.85 for name in OUTPUT_NAMES), facts


def test_full_int8_cannot_keep_the_heads(audio_run: dict) -> None:
    plain = _sqnr(audio_run["report"]["variants"]["plain8"])
    print("plain int8 SQNR per head:", plain)
    assert min(plain.values()) < MIN_SQNR_DB


def test_the_guard_reaches_every_head_by_weights_only(audio_run: dict) -> None:
    report = audio_run["report"]
    int8, fp32 = report["variants"]["int8"], report["variants"]["fp32"]
    guarded = _sqnr(int8)
    print("guarded int8 SQNR per head:", guarded, "size", int8["size_bytes"],
          "of", fp32["size_bytes"])
    assert set(guarded) == set(OUTPUT_NAMES)
    assert min(guarded.values()) >= MIN_SQNR_DB
    chosen = next(t for t in int8["trials"] if t["chosen"])
    assert chosen["meets_budgets"] and chosen["settings"]["weights_only"]
    # the front end is taken to weights-only early (it is the problem), not last: among
    # the first three of the seven weight layers the guard tries (which of them come first
    # is the per-layer errors' call: 2nd and 3rd were both seen), in a step it keeps
    steps = [d for d in int8["guard_decisions"] if d["layers"]]
    tried = list(dict.fromkeys(d["layers"][0] for d in steps))
    assert any("filterbank" in name for name in tried[:3]), tried
    front = [d for d in steps if d["action"] == "weights_only"
             and any("filterbank" in node for node in d["layers"])]
    assert front and front[0]["outcome"] in ("kept: closer to float", "meets budgets"), front
    assert any("filterbank" in node for node in chosen["settings"]["weights_only"])
    # the LiteRT file may be chosen instead: both meet the budget (the next test)
    assert report["selected"]["phone"] in ("int8", "litert") and audio_run["code"] == 0


def test_the_guard_keeps_the_size_gain_of_8_bit_weights(audio_run: dict) -> None:
    """Bounds derived from the guard's own choice, which holds for every choice it makes:
    every weight of a layer it did not keep in float ships in 8 bits, and the file is no
    larger than the recipe's all-8-bit candidate (trial 0: its nodes and 8-bit weights)
    plus 3 bytes for each weight it kept in float (4 bytes instead of 1); a layer taken out
    of 8-bit kernels sheds its quantize nodes."""
    int8 = audio_run["report"]["variants"]["int8"]
    fp32 = audio_run["report"]["variants"]["fp32"]
    chosen = next(t for t in int8["trials"] if t["chosen"])
    weights = weight_elements(audio_run["out"] / "fp32")
    kept_float = set(chosen["settings"]["float"])
    float_values = sum(count for name, count in weights.items() if name in kept_float)
    eight_bit_values = sum(count for name, count in weights.items()
                           if name not in kept_float and count >= MIN_QUANTIZED_SIZE)
    baseline = int8["trials"][0]
    bound = baseline["size_bytes"] + 3 * float_values
    shipped_8bit = eight_bit_elements(audio_run["out"] / "int8")
    print(f"weights {weights}; kept float {sorted(kept_float)} ({float_values} values); "
          f"8-bit values shipped {shipped_8bit} (at least {eight_bit_values}); size "
          f"{int8['size_bytes']} <= {baseline['size_bytes']} + 3 x {float_values} = {bound} "
          f"({int8['size_bytes'] / fp32['size_bytes']:.3f} of fp32's {fp32['size_bytes']})")
    assert baseline["trial"] == 0 and not baseline["settings"]["float"]
    assert len(weights) >= 7  # filterbank, two convs, dense and the three heads: all found
    assert shipped_8bit >= eight_bit_values
    assert int8["size_bytes"] <= bound


def test_the_litert_quantizers_guard_keeps_integer_compute(audio_run: dict) -> None:
    """The LiteRT path (convert to float, then the LiteRT Quantizer): full int8 misses the
    heads as the converter's int8 does. On a CPU target the guard first tries the int8
    methods, each a file that computes in int8 only (ranges by error, learned rounding,
    trained ranges); they bring the worst head closer to float (here: not to 20 dB at the
    interval's bound), so it then moves layers to int16 activations, the front end among
    them, and ships a file that computes in integer only, every head at 20 dB or more."""
    from ai_edge_litert.tools import flatbuffer_utils

    litert = audio_run["report"]["variants"]["litert"]
    trials = litert["trials"]
    baseline, chosen = trials[0], next(t for t in trials if t["chosen"])
    print("LiteRT Quantizer trials:", [(t["trial"], t["quality"], t.get("computes_in"),
                                        t["seconds"]) for t in trials])
    assert baseline["computes_in"] == "int8" and not baseline["meets_budgets"]
    assert chosen["meets_budgets"] and chosen["trial"] > 0
    methods = [{"ranges": "mse"}, {"ranges": "mse", "rounding": "learned"},
               {"fine_tune": True}]
    for trial, method in zip(trials[1:4], methods, strict=True):
        assert {k: trial["settings"][k] for k in method} == method, trial["settings"]
        assert trial["computes_in"] == "int8" and not trial["settings"].get("int16_activations")
    # trained ranges bring the worst head closest (min-max ~12 dB, trained ~17 dB here)
    worst_head = [min(float(x) for x in re.findall(r"SQNR ([\d.]+) dB", t["quality"]))
                  for t in trials[:4]]
    assert max(worst_head[1:]) > worst_head[0] + 2, worst_head
    if any(t["meets_budgets"] for t in trials[1:4]):  # a method did it: int8 only ships
        assert chosen["trial"] <= 3 and litert["computes_in"] == "int8"
        return
    assert litert["computes_in"] == chosen["computes_in"] == "int8+int16"
    assert chosen["settings"]["int16_activations"] and not chosen["settings"]["float"]
    assert any("filterbank" in node for node in chosen["settings"]["int16_activations"])
    assert min(_sqnr(litert).values()) >= MIN_SQNR_DB
    # the layers it moved are the ones the quantizer measured (its per-tensor errors)
    assert set(chosen["settings"]["int16_activations"]) <= {
        row["node"] for row in litert["layer_errors"]}
    # every trial names its worst layer from the quantizer's own rows (the pipeline's
    # convert_tflite, before it, measures none)
    assert all(t["worst_layer"] for t in litert["trials"])
    data = (audio_run["out"] / "litert" / "model.tflite").read_bytes()
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    [subgraph] = model.subgraphs
    kinds = {subgraph.tensors[op.outputs[0]].type for op in subgraph.operators
             if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
             not in ("QUANTIZE", "DEQUANTIZE")}
    assert kinds == {9, 7}  # int8 and int16 tensors only: no op computes in float
