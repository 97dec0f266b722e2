"""The shared formatting of timings, sizes, counts and layer names."""

from __future__ import annotations

import pytest

from orchestrator.formatting import (
    format_count,
    format_mib,
    format_ms,
    format_number,
    format_size,
    layer_name,
    layer_names,
    significant,
)


@pytest.mark.parametrize(("ms", "text"), [
    (0.005, "5.00 µs"),  # LiteRT's p50: three significant digits, not "0.005"
    (0.00512, "5.12 µs"),
    (0.0569, "56.9 µs"),
    (0.299, "299 µs"),
    (0.99949, "999 µs"),
    (0.9996, "1.00 ms"),  # rounds up to 1,000 µs: said in ms
    (1.0, "1.00 ms"),
    (3.003, "3.00 ms"),
    (9.996, "10.0 ms"),
    (225.048, "225 ms"),
    (1234.5, "1,234 ms"),
    (0, "0 ms"),
    (None, "-"),
])
def test_timings_have_three_significant_digits(ms: float | None, text: str) -> None:
    assert format_ms(ms) == text


def test_significant_digits() -> None:
    assert significant(0.000123456) == "0.000123"
    assert significant(12.3456, 4) == "12.35"
    assert significant(99999.0) == "99,999"


def test_sizes_are_mib_the_unit_of_the_budget_keys() -> None:
    assert format_size(1_076_839) == "1.03 MiB"
    assert format_size(272_520) == "0.260 MiB"
    assert format_size(10_000) == "0.00954 MiB"
    assert format_size(1024 * 1024, unit=False) == "1.00"
    assert format_size(None) == "-"
    assert format_mib(13.059) == "13.1 MiB"


def test_counts() -> None:
    assert format_count(268_364) == "268,364"
    assert format_count(None) == "-"


def test_numbers_by_spec_and_a_dash_when_not_measured() -> None:
    """The one formatter of the report page and the history table (they had a copy each)."""
    assert format_number(0.98125, ".4f") == "0.9812"
    assert format_number(-0.0031, "+.4f") == "-0.0031"
    assert format_number(272_520, ",") == "272,520"
    assert format_number(3) == "3"
    assert format_number(None, ".4f") == "-"
    assert format_number(float("nan"), ".4f") == "-" == format_ms(float("nan"))


NAMES = ["StatefulPartitionedCall/digits_cnn_1/dense1_1/MatMul;"
         "StatefulPartitionedCall/digits_cnn_1/relu3_1/Relu",
         "StatefulPartitionedCall/digits_cnn_1/bn1_1/batchnorm/add_1",
         "Identity"]


def test_layer_names_drop_the_call_and_the_shared_scope() -> None:
    assert layer_names(NAMES) == {NAMES[0]: "dense1_1/MatMul",
                                  NAMES[1]: "bn1_1/batchnorm/add_1",
                                  NAMES[2]: "Identity"}


def test_a_long_name_keeps_its_tail_cut_at_a_slash() -> None:
    assert layer_names(NAMES, width=17)[NAMES[1]] == "…/batchnorm/add_1"
    assert layer_names(NAMES, width=16)[NAMES[1]] == "…/add_1"
    assert layer_name("scope/" + "x" * 30, width=10) == "…" + "x" * 9
    # a name alone keeps its scope: it may be all that tells it apart
    assert layer_names(["StatefulPartitionedCall/net/conv/Conv2D"]) == {
        "StatefulPartitionedCall/net/conv/Conv2D": "net/conv/Conv2D"}
