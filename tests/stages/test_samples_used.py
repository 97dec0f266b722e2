"""Issue 39: report.json says how many data samples each stage used. The stages that read
representative data say it in `info["samples"]` (the report's stage entry carries it): the
rows they calibrated on, which is fewer than asked when the data has fewer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import quant_fixtures
from support.quant_fixtures import apply

from orchestrator.model.artifact import ModelArtifact
from orchestrator.results.report import _samples
from orchestrator.stages.base import counting_samples

cnn = quant_fixtures.cnn
digits = quant_fixtures.digits
separable = quant_fixtures.separable

ROWS = 37  # fewer than every stage's default (200)


@pytest.fixture(scope="module")
def few(digits: dict[str, np.ndarray]) -> np.ndarray:
    return digits["x_calib"][:ROWS]


def test_counting_samples_gives_the_most_rows_one_call_read(few: np.ndarray) -> None:
    ctx, used = counting_samples(quant_fixtures.context(few))
    assert used() == 0
    assert ctx.representative is not None
    assert sum(len(b) for b in ctx.representative(10, 4)) == 10
    assert used() == 10
    list(ctx.representative(None, 16))  # all the data has
    list(ctx.representative(5, 1))      # a smaller read after it does not lower the count
    assert used() == ROWS


def test_convert_tflite_int8_says_the_samples_it_calibrated_on(cnn: ModelArtifact,
                                                               few: np.ndarray) -> None:
    result = apply("convert_tflite", cnn, few, mode="int8", diagnostic_samples=0)
    assert result.info["samples"] == ROWS  # calibration_samples is 200: the data has 37
    asked = apply("convert_tflite", cnn, few, mode="int8", diagnostic_samples=0,
                  calibration_samples=12)
    assert asked.info["samples"] == 12
    fp32 = apply("convert_tflite", cnn, few, mode="fp32")
    assert "samples" not in fp32.info  # no data read


def test_quantize_tflite_says_the_samples_it_calibrated_on(separable: ModelArtifact,
                                                           few: np.ndarray) -> None:
    float_tflite = apply("convert_tflite", separable, mode="fp32").artifact
    result = apply("quantize_tflite", float_tflite, few, diagnostic_samples=0)
    assert result.info["samples"] == ROWS


def test_log_ranges_says_the_samples_it_ran(cnn: ModelArtifact, few: np.ndarray) -> None:
    eight_bit = apply("quantize_nodes", cnn).artifact
    assert apply("log_ranges", eight_bit, few, samples=30).info["samples"] == 30
    assert apply("log_ranges", eight_bit, few).info["samples"] == ROWS


@pytest.mark.parametrize(("info", "expected"), [
    ({"samples": 450, "output_kind": "class_scores"}, 450),    # evaluate
    ({"device": {"phone": {"measured": True, "samples": 64}}}, 64),  # measure_on_device
    ({"device": {"phone": {"measured": False, "reason": "x"}}}, None),
    ({"ranges": []}, None),
])
def test_the_report_s_stage_entry_reads_it(info: dict[str, Any], expected: int | None
                                           ) -> None:
    assert _samples(info) == expected
