"""Issue 17's reproduction: a mini-Xception on real photo crops (64x64 grayscale, 7
classes; benchmarks/testbed/models_photo_xception.py) through the plain 8-bit pipeline, with the
accuracy guard under a tight top-1 agreement budget.

Before the fix, taking a layer back to float moved this model's output *away* from float
again and again (TF's QuantizedBiasAdd offset and un-nudged requantization ranges made
every candidate's error shift at random), the guard ended short after 16 trials and fp32
was selected. Now:
- every step the guard keeps moves the continuous measure (the lowest logit SQNR) towards
  float, and so does every step that takes a whole layer to float;
- int8 meets the budget at under 0.35 of fp32's size;
- the 8-bit graph computes a sample the same in any batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.project_env import run_recipe
from testbed import model_builds

from orchestrator.guard.trials import NOISE_DB

pytestmark = pytest.mark.slow

MIN_FIDELITY = 0.98  # tighter than the 0.97, so that the guard must work, and met
# at the lower bound of its 90% interval (0.99 needs all 315 search samples to agree)
MAX_SIZE_RATIO = 0.35

RECIPE = f"""\
version: 1
name: photo-xception
model:
  path: model/model.keras
data:
  representative: {{source: model/data.npz, array: x_calib, samples: 200}}
  evaluation: {{source: model/data.npz, inputs: x_test, labels: y_test}}
targets: [{{name: phone, device: phone-2016, budgets: {{min_fidelity: {MIN_FIDELITY}}}}}]
pipelines:
  fp32: {{stages: [freeze, strip, fold, evaluate]}}
  int8:
    from: fp32
    stages: [quantize_weights, {{quantize_nodes: {{guard: true}}}}, log_ranges, freeze_ranges,
             evaluate]
  int8_float_only:
    from: fp32
    stages: [{{quantize_nodes: {{guard: true}}}}, log_ranges, freeze_ranges, evaluate]
"""


@pytest.fixture(scope="module")
def photo_run(tmp_path_factory: pytest.TempPathFactory, prefect_server: None
              ) -> dict:
    work = tmp_path_factory.mktemp("photo_xception")
    facts = model_builds.build("models_photo_xception", work / "model")
    print("photo mini-Xception:", facts)
    code, report = run_recipe(work, RECIPE)
    for name in ("int8", "int8_float_only"):
        for trial in report["variants"][name]["trials"]:
            print(name, trial["trial"], trial["quality"], trial["logit_sqnr_db"],
                  trial["size_bytes"], "chosen" if trial["chosen"] else "")
    return {"code": code, "report": report, "work": work, "facts": facts}


def test_model_is_a_trained_photo_classifier(photo_run: dict) -> None:
    assert 50_000 <= photo_run["facts"]["params"] <= 70_000
    assert photo_run["facts"]["accuracy"] > 1.5 / 7  # well above chance on 7 classes


def test_int8_meets_the_budget_at_under_035_of_fp32(photo_run: dict) -> None:
    report = photo_run["report"]
    int8, fp32 = report["variants"]["int8"], report["variants"]["fp32"]
    assert int8["fidelity"] >= MIN_FIDELITY, int8["trials"]
    assert int8["size_bytes"] / fp32["size_bytes"] <= MAX_SIZE_RATIO
    assert report["selected"]["phone"] == "int8" and photo_run["code"] == 0
    assert any(op.startswith("Quantized") for op in int8["ops"])
    assert "QuantizedBiasAdd" not in int8["ops"]  # biases go into the accumulator


def _steps(variant: dict) -> list[dict]:
    """The decisions about single layers (or groups) whose trial ran."""
    return [d for d in variant["guard_decisions"] if d["layers"]
            and d["logit_sqnr_db_after"] is not None and d["action"] in ("float",
                                                                        "weights_only")]


def test_every_kept_step_moves_towards_float(photo_run: dict) -> None:
    for name in ("int8", "int8_float_only"):
        steps = _steps(photo_run["report"]["variants"][name])
        assert steps, name
        for step in steps:
            if step["outcome"] != "stepped back: no closer":
                assert step["logit_sqnr_db_after"] > step["logit_sqnr_db_before"] + NOISE_DB \
                    or step["outcome"] == "meets budgets", step


def _exact_in_8_bits(layers: list[str]) -> bool:
    """Layers whose 8-bit op is exact: QuantizedMaxPool picks one of its quantized inputs,
    so the layer in float adds nothing back, only moves its output's requantization."""
    return all("MaxPool" in layer.rsplit("/", 1)[-1] for layer in layers)


def test_taking_layers_to_float_never_moves_away(photo_run: dict) -> None:
    """Every float step, kept or not, leaves the output at least as close to float (within
    a tenth of a dB): a whole layer in float cannot add error. A max pool is exact in 8
    bits already: in float it only moves a requantization, which may cost a little (on an
    AMD EPYC host, block1's pool went from 24.881 to 24.727 dB, with the code of this test's
    own commit as well), so it is held to the guard's rule instead: a step that does not
    help is stepped back."""
    variant = photo_run["report"]["variants"]["int8_float_only"]
    floats = [d for d in _steps(variant) if d["action"] == "float"]
    assert len(floats) >= 2, variant["guard_decisions"]
    for step in floats:
        if _exact_in_8_bits(step["layers"]):
            assert step["logit_sqnr_db_after"] > step["logit_sqnr_db_before"] + NOISE_DB \
                or step["outcome"] in ("stepped back: no closer", "meets budgets"), step
        else:
            assert step["logit_sqnr_db_after"] >= step["logit_sqnr_db_before"] - 0.1, step
    # the layers it took back are whole: a conv goes with its BiasAdd (and activation)
    for step in floats:
        convs = [n for n in step["layers"] if n.endswith("/mul_1") or "convolution" in n]
        if convs:
            assert any(n.endswith("/add_1") or n.endswith("BiasAdd") for n in step["layers"])


def test_the_8bit_graph_is_batch_independent(photo_run: dict) -> None:
    from orchestrator.measure.tf_runtime import predict
    from orchestrator.model.artifact import ModelArtifact

    folder = photo_run["work"] / "out" / "int8"
    model = ModelArtifact.from_bytes((folder / "model.pb").read_bytes(),
                                     (folder / "signature.json").read_text())
    with np.load(photo_run["work"] / "model" / "data.npz") as data:
        x = data["x_test"][:40]
    batched, single = predict(model, x, batch_size=40), predict(model, x, batch_size=1)
    # the same 8-bit values; only the float ops' summation order may differ (~1e-7)
    np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-6)
    assert (batched.argmax(1) == single.argmax(1)).all()


def test_report_names_both_measures_per_trial(photo_run: dict) -> None:
    for trial in photo_run["report"]["variants"]["int8"]["trials"]:
        assert trial["quality"].startswith("fidelity"), trial  # the recipe's measure
        assert isinstance(trial["logit_sqnr_db"], float), trial  # the guard's
    out = Path(photo_run["work"]) / "out" / "int8" / "layer_errors.tsv"
    assert out.read_text().startswith("node\t")
