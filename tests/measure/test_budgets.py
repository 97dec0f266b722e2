"""Quality budgets against evaluate's metrics: violations, shortfall, headline, per output."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from orchestrator.measure.budgets import (
    MB,
    Violation,
    broken_kinds,
    check_budgets,
    has_quality_budgets,
    quality_against_budgets,
    quality_headline,
    quality_shortfall,
    quality_violations,
)
from orchestrator.spec.models import Budgets

# evaluate's metrics of a model with a class head `kind` and two sigmoid heads
METRICS = {"accuracy": 0.95, "accuracy_drop": 0.004, "fidelity": 0.99,
           "top1_agreement.kind": 0.99, "sqnr_db.kind": 31.0,
           "sqnr_db.onset": 23.1, "cosine.onset": 0.9985, "max_abs_error.onset": 0.04,
           "threshold_agreement.onset": 0.996,
           "sqnr_db.offset": 27.4, "cosine.offset": 0.9992, "max_abs_error.offset": 0.02,
           "threshold_agreement.offset": 1.0, "min_sqnr_db": 23.1}


def test_min_sqnr_applies_to_every_output_but_class_scores() -> None:
    assert quality_violations(METRICS, Budgets(min_sqnr_db=20)) == []
    violations = quality_violations(METRICS, Budgets(min_sqnr_db=25))
    assert violations == ["SQNR 23.1 dB (onset) < min_sqnr_db 25"]
    # the class head (31 dB) is not held to it; offset (27.4) is
    assert len(quality_violations(METRICS, Budgets(min_sqnr_db=28))) == 2


def test_per_output_budgets_win_over_the_global_one() -> None:
    budgets = Budgets(min_sqnr_db=25, outputs={
        "onset": {"min_sqnr_db": 22, "min_agreement": 0.999},
        "kind": {"min_agreement": 0.98, "min_sqnr_db": 35},
        "offset": {"max_abs_error": 0.01, "min_cosine": 0.999}})
    violations = quality_violations(METRICS, budgets)
    assert violations == [
        "agreement (onset) 0.9960 < outputs.onset.min_agreement 0.999",
        "SQNR 31.0 dB (kind) < outputs.kind.min_sqnr_db 35",
        "max abs error (offset) 0.02 > outputs.offset.max_abs_error 0.01"]
    assert quality_headline(METRICS, budgets) == "SQNR 31.0 dB (kind)"  # 4 dB short: worst


def test_unmeasured_or_unknown_outputs_are_violations() -> None:
    assert quality_violations({}, Budgets(min_sqnr_db=20)) == [
        "SQNR not measured: add evaluate to the pipeline"]
    only_classes = {"top1_agreement.probs": 1.0, "sqnr_db.probs": 40.0}
    assert "every output is class scores" in quality_violations(
        only_classes, Budgets(min_sqnr_db=20))[0]
    [unknown] = quality_violations(METRICS, Budgets(outputs={"onsett": {"min_sqnr_db": 1}}))
    assert unknown == ("outputs.onsett: no such output measured (outputs: kind, onset, "
                       "offset)")
    [no_figure] = quality_violations({"sqnr_db.level": 30.0},
                                     Budgets(outputs={"level": {"min_agreement": 0.9}}))
    assert "has no agreement figure (neither class scores nor probabilities)" in no_figure
    assert math.isinf(quality_shortfall({}, Budgets(min_sqnr_db=20)))


def test_accuracy_and_fidelity_budgets_as_before() -> None:
    budgets = Budgets(max_accuracy_drop=0.001, min_fidelity=0.995)
    assert quality_violations(METRICS, budgets) == [
        "accuracy drop 0.0040 > max_accuracy_drop 0.001",
        "fidelity 0.9900 < min_fidelity 0.995"]
    assert quality_violations({"fidelity": 0.9}, Budgets(max_accuracy_drop=0.01)) == [
        "accuracy_drop not measured: add evaluate (with labelled data) to the pipeline"]
    assert quality_violations({}, Budgets()) == []


def test_shortfall_is_zero_when_met_and_grows_with_the_miss() -> None:
    budgets = Budgets(min_sqnr_db=25, max_accuracy_drop=0.002)
    assert quality_shortfall(METRICS, Budgets(min_sqnr_db=20, max_accuracy_drop=0.01)) == 0.0
    # 1.9 dB short on onset, 0.002 over the accuracy drop (0.2 of a point)
    assert quality_shortfall(METRICS, budgets) == pytest.approx(1.9 + 0.2)
    better = {**METRICS, "sqnr_db.onset": 24.5}
    worse = {**METRICS, "sqnr_db.onset": 18.0, "sqnr_db.offset": 22.0}
    assert (quality_shortfall(better, budgets) < quality_shortfall(METRICS, budgets)
            < quality_shortfall(worse, budgets))


def test_headline_is_the_figure_that_matters() -> None:
    assert quality_headline(METRICS, Budgets(min_sqnr_db=20)) == "min SQNR 23.1 dB (onset)"
    assert quality_headline(METRICS, Budgets(min_sqnr_db=25)) == "SQNR 23.1 dB (onset)"
    assert quality_headline(METRICS, Budgets(max_accuracy_drop=0.01, min_sqnr_db=20)) == \
        "accuracy drop 0.0040"
    assert quality_headline(METRICS, Budgets(min_fidelity=0.5)) == "fidelity 0.9900"
    assert quality_headline(METRICS, Budgets()) == "accuracy drop 0.0040"
    unlabelled = {k: v for k, v in METRICS.items() if not k.startswith("accuracy")}
    assert quality_headline(unlabelled, Budgets()) == "min SQNR 23.1 dB (onset)"
    assert quality_headline({"fidelity": 0.97}, Budgets()) == "fidelity 0.9700"
    assert quality_headline({}, Budgets()) == "quality not measured"


def test_check_budgets_reads_the_variants_per_output_metrics() -> None:
    variant = {"size_bytes": MB // 2, "ram_bytes": MB, "ram_source": "model size",
               "accuracy_drop": None, "fidelity": 0.998,
               "outputs": [{"name": "onset", "kind": "probabilities", "sqnr_db": 18.5},
                           {"name": "offset", "kind": "values", "sqnr_db": 26.0}],
               # a stage's per-layer figure in the merged metrics is no output
               "metrics": {"sqnr_db.conv1": 3.0, "size_bytes": 1.0}}
    assert check_budgets(variant, Budgets(min_sqnr_db=20, max_size_mb=1), None) == [
        "SQNR 18.5 dB (onset) < min_sqnr_db 20"]
    assert check_budgets(variant, Budgets(min_fidelity=0.99), None) == []


def test_each_violation_knows_the_budget_it_broke() -> None:
    variant = {"size_bytes": 2 * MB, "ram_bytes": MB, "ram_source": "model size",
               "accuracy_drop": 0.05, "fidelity": 0.5,
               "outputs": [{"name": "onset", "kind": "probabilities", "sqnr_db": 18.5,
                            "cosine": 0.5}]}
    budgets = Budgets(max_size_mb=1, min_sqnr_db=20, outputs={"onset": {"min_cosine": 0.9}})
    found = check_budgets(variant, budgets, 0.5)
    assert [v.kind for v in found] == ["size", "sqnr", "output"]
    assert broken_kinds(found) == ["size", "sqnr", "output"]
    # only the size broke: the latency is not marked
    assert broken_kinds(check_budgets(variant, Budgets(max_size_mb=1, max_latency_ms=1), 0.5)
                        ) == ["size"]
    assert broken_kinds(check_budgets(variant, Budgets(max_latency_ms=0.1), 0.5)) == [
        "latency"]
    assert broken_kinds(["a plain string from an older report"]) == []
    with pytest.raises(ValueError, match="unknown violation kind"):
        Violation("x", "colour")


def test_a_violation_is_its_message_and_survives_pickling() -> None:
    import copy
    import json
    import pickle

    found = Violation("size 2.00 MiB > max_size_mb 1 MiB", "size")
    again = pickle.loads(pickle.dumps(found))
    assert again == found and again.kind == "size" and copy.deepcopy(found).kind == "size"
    assert json.dumps([found]) == '["size 2.00 MiB > max_size_mb 1 MiB"]'


def test_a_size_just_over_its_budget_shows_the_digits_that_break_it() -> None:
    variant = {"size_bytes": MB + 400, "ram_bytes": 0, "ram_source": "model size"}
    [found] = check_budgets(variant, Budgets(max_size_mb=1), None)
    # three digits would print "1.00 MiB > 1": contradicting itself
    assert found == "size 1.0004 MiB > max_size_mb 1 MiB"
    [slow] = check_budgets({**variant, "size_bytes": 1}, Budgets(max_latency_ms=0.05), 0.0569)
    assert slow == "estimated latency 56.9 µs > max_latency_ms 0.05 ms"


def test_ram_over_the_device_and_over_the_budget_read_alike() -> None:
    """Size, the device's RAM limit and max_ram_mb: one rule (over the limit, shown with
    the digits that tell the two apart), and both RAM messages name what was measured."""
    from types import SimpleNamespace

    variant = {"size_bytes": MB + 400, "ram_bytes": 3 * MB + 400, "ram_measure": "heap growth"}
    device = SimpleNamespace(ram_limit_mb=3)
    budgets = Budgets(max_size_mb=1, max_ram_mb=2)
    assert check_budgets(variant, budgets, None, device) == [
        "RAM 3.0004 MiB (heap growth) > the device's limit of 3.0000 MiB",
        "size 1.0004 MiB > max_size_mb 1 MiB",
        "RAM 3.00 MiB (heap growth) > max_ram_mb 2 MiB"]
    assert [v.kind for v in check_budgets(variant, budgets, None, device)] == [
        "ram", "size", "ram"]
    # at the limit is within it; no limit, no check (nor a look at the figure)
    at_limit = {"size_bytes": MB, "ram_bytes": 3 * MB}
    assert check_budgets(at_limit, Budgets(max_size_mb=1, max_ram_mb=3), None, device) == []
    assert check_budgets({"size_bytes": None, "ram_bytes": None}, Budgets(), None) == []


def test_budgets_model() -> None:
    assert not has_quality_budgets(Budgets(max_size_mb=1))
    assert has_quality_budgets(Budgets(min_sqnr_db=20))
    assert has_quality_budgets(Budgets(outputs={"a": {"min_cosine": 0.9}}))
    for bad in ({"min_sqnr_db": float("nan")}, {"outputs": {"a": {"min_agreement": 2}}},
                {"outputs": {"a": {"min_snr": 20}}}):
        with pytest.raises(ValidationError):
            Budgets.model_validate(bad)


def test_per_output_budgets_as_the_runs_params_show_them() -> None:
    from orchestrator.tracking.client import _budgets

    budgets = Budgets(max_size_mb=1, outputs={"onset": {"min_sqnr_db": 25}})
    assert _budgets(budgets) == "max_size_mb=1, outputs.onset.min_sqnr_db=25"


def test_each_budgeted_figure_is_shown_beside_its_bound() -> None:
    # the trial: outputs {output_0: {min_sqnr_db: 39}} met at 41.2 dB, while the
    # logits (what the guard ranks by) were at 16.9 dB: the line shows the budgeted figure
    metrics = {"sqnr_db.output_0": 41.2, "min_logit_sqnr_db": 16.9}
    budgets = Budgets(outputs={"output_0": {"min_sqnr_db": 39}})
    assert quality_against_budgets(metrics, budgets) == ["output_0 SQNR 41.2 dB ≥ 39 dB"]
    assert quality_against_budgets({"sqnr_db.output_0": 30.0}, budgets) == [
        "output_0 SQNR 30.0 dB < 39 dB"]
    both = Budgets(max_accuracy_drop=0.01, min_fidelity=0.999)
    assert quality_against_budgets(METRICS, both) == ["accuracy drop 0.0040 ≤ 0.01",
                                                      "fidelity 0.9900 < 0.999"]
    assert quality_against_budgets({}, Budgets(max_accuracy_drop=0.01)) == [
        "accuracy_drop not measured: add evaluate (with labelled data) to the pipeline"]


def test_a_boards_agreement_with_the_host_is_read_alike_by_budgets_gate_and_table() -> None:
    from orchestrator.measure.budgets import agreement_with_host
    from orchestrator.results.board_figures import board_rows
    from orchestrator.results.gate import Limits, compare

    assert agreement_with_host({"top1_agreement": 0.9, "agreement_with_host": 0.8,
                                "fidelity": 0.7}) == 0.9
    assert agreement_with_host({"agreement_with_host": 0.8, "fidelity": 0.7}) == 0.8
    assert agreement_with_host({"fidelity": 0.7}) == 0.7  # a report from before issue 39
    assert agreement_with_host({"measured": False}) is None
    measured = {"measured": True, "where": "ssh://pi@b", "latency_ms": {"p50": 1.0},
                "agreement_with_host": 0.8, "fidelity": 0.5, "board": {}, "outputs": {},
                "emulated": True}
    [row] = board_rows({"variants": {"v": {"targets": {"pi": {"measured": measured}}}}})
    assert row["agreement with host"] == "0.8000"

    def run(agreement: float) -> dict:
        return {"variants": {"v": {"size_bytes": 1, "targets": {"pi": {"measured": {
            **measured, "agreement_with_host": agreement}}}}}}

    rows = compare(run(0.8), run(0.99), Limits(max_fidelity_drop=0.01)).rows
    [agreement] = [r for r in rows if "agreement (board)" in str(r)]
    assert "0.99" in str(agreement) and "0.8" in str(agreement)
