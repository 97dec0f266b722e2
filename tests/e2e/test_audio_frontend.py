"""Issue 17, the second model: raw audio through a fixed filterbank Conv1D whose outputs
span 40 dB (tests/e2e/models_audio_frontend.py), then a small CNN and three sigmoid heads.

Full int8 cannot keep the heads close to float (8-bit activations cannot cover the front
end's range); the guard, under `min_sqnr_db: 20`, reaches the front end early, takes it
(and what else it needs) to weights-only 8-bit, and ships every head at 20 dB or more at
no more than 0.35 of fp32's size.
"""

from __future__ import annotations

import model_builds  # tests/e2e: on sys.path (prepend mode)
import pytest
from models_audio_frontend import OUTPUT_NAMES  # tests/e2e: on sys.path (prepend mode)

pytestmark = pytest.mark.slow

MIN_SQNR_DB = 20.0
MAX_SIZE_RATIO = 0.35

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
"""


@pytest.fixture(scope="module")
def audio_run(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> dict:
    work = tmp_path_factory.mktemp("audio_frontend")
    facts = model_builds.build("models_audio_frontend", work / "model")
    print("audio front-end model:", facts)
    code, report = model_builds.run_recipe(work, RECIPE)
    return {"code": code, "report": report, "facts": facts}


def _sqnr(variant: dict) -> dict[str, float]:
    return {row["name"]: row["sqnr_db"] for row in variant["outputs"]}


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
    assert int8["size_bytes"] / fp32["size_bytes"] <= MAX_SIZE_RATIO
    chosen = next(t for t in int8["trials"] if t["chosen"])
    assert chosen["meets_budgets"] and chosen["settings"]["weights_only"]
    # the front end is taken to weights-only early (it is the problem), not last
    steps = [d for d in int8["guard_decisions"] if d["layers"]]
    assert any("filterbank" in node for d in steps[:3] for node in d["layers"]
               if d["action"] == "weights_only"), steps[:3]
    assert report["selected"]["phone"] == "int8" and audio_run["code"] == 0
