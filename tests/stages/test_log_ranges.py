"""log_ranges: classic line format, values equal to the RequantizationRange tensors."""

from __future__ import annotations

import csv
import io
import re

import numpy as np
import pytest
from support import quant_fixtures
from support.quant_fixtures import apply, ops

from orchestrator.measure.tf_runtime import GraphRunner
from orchestrator.model.artifact import ModelArtifact, tensor_name
from orchestrator.quant.ranges import (
    format_range_line,
    frozen_range,
    parse_range_log,
    run_time_quantizations,
)
from orchestrator.stages import get_stage

# Fixtures shared by the eight-bit stage tests: bound here so that pytest finds them.
cnn = quant_fixtures.cnn
cnn_batch1 = quant_fixtures.cnn_batch1
digits = quant_fixtures.digits

LINE = re.compile(r"^;(?P<node>.+)__print__;__requant_min_max:\[(?P<min>[^\]]+)\]"
                  r"\[(?P<max>[^\]]+)\]$")


@pytest.fixture(scope="module")
def eight_bit(cnn) -> ModelArtifact:  # noqa: ANN001
    return apply("quantize_nodes", cnn).artifact


def requantization_nodes(artifact: ModelArtifact) -> list[str]:
    return [n.name for n in artifact.graph_def.node if n.op == "RequantizationRange"]


def range_nodes(artifact: ModelArtifact) -> list[str]:
    """What log_ranges logs, in its order: the RequantizationRange nodes, then the
    QuantizeV2 nodes whose range a Min/Max computes at run time."""
    return requantization_nodes(artifact) + run_time_quantizations(artifact.graph_def)


def fetch_ranges(artifact: ModelArtifact, batch: np.ndarray) -> dict[str, tuple[float, float]]:
    """The ranges of one run, fetched directly: a RequantizationRange's outputs, and the
    Min/Max a run-time QuantizeV2 reads."""
    nodes = {n.name: n for n in artifact.graph_def.node}
    names = range_nodes(artifact)
    fetches: list[str] = []
    for n in names:
        if nodes[n].op == "QuantizeV2":
            fetches += [tensor_name(nodes[n].input[1]), tensor_name(nodes[n].input[2])]
        else:
            fetches += [f"{n}:0", f"{n}:1"]
    with GraphRunner.for_artifact(artifact) as runner:
        values = runner.run(batch, fetches=fetches)
    return {n: (float(values[2 * i]), float(values[2 * i + 1])) for i, n in enumerate(names)}


def test_lines_have_the_classic_format(eight_bit, digits) -> None:  # noqa: ANN001
    x = digits["x_calib"]
    result = apply("log_ranges", eight_bit, x, samples=60, batch_size=25)
    text = result.files["ranges.log"].decode()
    assert result.artifact.metadata["min_max_log"] == text
    lines = text.splitlines()
    names = range_nodes(eight_bit)
    assert len(lines) == 60 * len(names)  # one line per node per sample
    seen = []
    for line in lines:
        match = LINE.match(line)
        assert match, line
        float(match["min"]), float(match["max"])
        seen.append(match["node"])
    assert set(seen) == set(names)
    for line, record in zip(lines, parse_range_log(text), strict=True):
        assert line == format_range_line(record.node, record.min, record.max)
    assert seen[: len(names)] == names  # a run logs every node, then the next run
    requantizations = requantization_nodes(eight_bit)
    assert 0 < len(requantizations) < len(names)  # the model input is quantized at run time
    assert result.metrics == {"ranges_nodes": len(requantizations),
                              "input_ranges_nodes": len(names) - len(requantizations),
                              "ranges_samples": 60, "ranges_records": 60 * len(names)}
    assert not result.warnings


def test_batch_of_one_equals_the_tensors_exactly(eight_bit, digits) -> None:  # noqa: ANN001
    x = digits["x_calib"][:6]
    records = parse_range_log(apply("log_ranges", eight_bit, x, batch_size=1)
                              .artifact.metadata["min_max_log"])
    names = range_nodes(eight_bit)
    for i in range(len(x)):
        direct = fetch_ranges(eight_bit, x[i:i + 1])
        for record in records[i * len(names):(i + 1) * len(names)]:
            assert (record.min, record.max) == direct[record.node]


def test_batched_per_sample_ranges_add_up_to_the_batch_range(eight_bit, digits) -> None:  # noqa: ANN001
    x = digits["x_calib"][:40]
    records = parse_range_log(apply("log_ranges", eight_bit, x, batch_size=20)
                              .artifact.metadata["min_max_log"])
    names = range_nodes(eight_bit)
    for b in range(2):
        direct = fetch_ranges(eight_bit, x[b * 20:(b + 1) * 20])
        chunk = records[b * 20 * len(names):(b + 1) * 20 * len(names)]
        for name in names:
            mins = [r.min for r in chunk if r.node == name]
            maxs = [r.max for r in chunk if r.node == name]
            assert len(mins) == 20
            assert (min(mins), max(maxs)) == direct[name]
            if name in requantization_nodes(eight_bit):
                assert len(set(maxs)) > 1  # really per sample


def test_batched_ranges_are_close_to_classic_batch_one(eight_bit, digits) -> None:  # noqa: ANN001
    x = digits["x_calib"][:100]
    one = parse_range_log(apply("log_ranges", eight_bit, x, batch_size=1)
                          .artifact.metadata["min_max_log"])
    many = parse_range_log(apply("log_ranges", eight_bit, x, batch_size=50)
                           .artifact.metadata["min_max_log"])
    for name in range_nodes(eight_bit):
        a = frozen_range([r.min for r in one if r.node == name],
                         [r.max for r in one if r.node == name], 5, 5)
        b = frozen_range([r.min for r in many if r.node == name],
                         [r.max for r in many if r.node == name], 5, 5)
        span = a[1] - a[0]
        assert abs(a[0] - b[0]) <= 0.05 * span and abs(a[1] - b[1]) <= 0.05 * span, name


def test_per_run_lines(eight_bit, digits) -> None:  # noqa: ANN001
    x = digits["x_calib"][:50]
    result = apply("log_ranges", eight_bit, x, batch_size=20, per_sample=False)
    records = parse_range_log(result.files["ranges.log"].decode())
    names = range_nodes(eight_bit)
    assert len(records) == 3 * len(names)  # batches of 20, 20, 10
    direct = fetch_ranges(eight_bit, x[40:50])
    assert {r.node: (r.min, r.max) for r in records[-len(names):]} == direct


def test_fixed_batch_graph_runs_sample_by_sample(cnn_batch1, digits) -> None:  # noqa: ANN001
    eight_bit = apply("quantize_nodes", cnn_batch1).artifact
    x = digits["x_calib"][:7]
    result = apply("log_ranges", eight_bit, x, batch_size=100)
    assert result.metrics["ranges_samples"] == 7
    assert result.metrics["ranges_records"] == 7 * len(range_nodes(eight_bit))


def test_fixed_batch_of_four_pads_the_last_run(digits_example, digits) -> None:  # noqa: ANN001
    from support.quant_fixtures import _frozen

    model = _frozen("cnn", str(digits_example), 4)
    eight_bit = apply("quantize_nodes", model).artifact
    x = digits["x_calib"][:10]
    records = parse_range_log(apply("log_ranges", eight_bit, x, batch_size=100)
                              .artifact.metadata["min_max_log"])
    names = range_nodes(eight_bit)
    assert len(records) == 10 * len(names)
    # The padded run (samples 8, 9 plus two repeats of 9) gives those samples' own ranges.
    padded = np.concatenate([x[8:10], x[9:10], x[9:10]])
    direct = fetch_ranges(eight_bit, padded)
    for name in names:
        last = [r for r in records[8 * len(names):] if r.node == name]
        assert (min(r.min for r in last), max(r.max for r in last)) == direct[name]


def test_ranges_table(eight_bit, digits) -> None:  # noqa: ANN001
    x = digits["x_calib"][:50]
    result = apply("log_ranges", eight_bit, x, min_percentile=10, max_percentile=2)
    rows = list(csv.DictReader(io.StringIO(result.files["ranges.csv"].decode())))
    records = parse_range_log(result.files["ranges.log"].decode())
    assert [r["node"] for r in rows] == range_nodes(eight_bit)
    for row in rows:
        mins = [r.min for r in records if r.node == row["node"]]
        maxs = [r.max for r in records if r.node == row["node"]]
        assert int(row["count"]) == 50
        value = {k: np.float32(row[k]) for k in ("min", "max", "frozen_min", "frozen_max")}
        assert value["min"] == min(mins) and value["max"] == max(maxs)
        lo, hi = frozen_range(mins, maxs, 10, 2)
        assert (value["frozen_min"], value["frozen_max"]) == (lo, hi)
        assert min(mins) <= lo <= hi <= max(maxs)
        if row["node"] in requantization_nodes(eight_bit):  # these include zero
            assert lo <= 0 < hi
    assert result.info["ranges"][0]["node"] == rows[0]["node"]


def test_graph_is_passed_on_unchanged(eight_bit, digits) -> None:  # noqa: ANN001
    out = apply("log_ranges", eight_bit, digits["x_calib"][:10]).artifact
    assert out.graph_def == eight_bit.graph_def
    assert "Print" not in ops(out)


def test_non_finite_range_names_node_and_sample(eight_bit, digits) -> None:  # noqa: ANN001
    # Finite inputs whose range overflows float32 inside the graph.
    x = digits["x_calib"][:30].copy()
    x[17, 3, 3, 0] = 3e38
    first_range = range_nodes(eight_bit)
    with pytest.raises(ValueError, match=r"sample 17 \(batch 1\)") as error:
        apply("log_ranges", eight_bit, x, batch_size=10)
    assert "non-finite range" in str(error.value)
    assert any(repr(name) in str(error.value) for name in first_range)


def test_nan_input_names_the_sample(eight_bit, digits) -> None:  # noqa: ANN001
    x = digits["x_calib"][:30].copy()
    x[4, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"sample 4 \(batch 0\) contains NaN"):
        apply("log_ranges", eight_bit, x, batch_size=10)


def test_float_graph_is_an_error(cnn, digits) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="run quantize_nodes first"):
        apply("log_ranges", cnn, digits["x_calib"][:10])


def test_needs_representative_data(eight_bit) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="representative"):
        apply("log_ranges", eight_bit)


def test_qint32_to_float_is_requantization_range_bit_for_bit() -> None:
    """The per-sample conversion must give exactly what the op gives, over wide ranges."""
    import tensorflow as tf

    from orchestrator.quant.numerics import qint32_to_float

    rng = np.random.default_rng(0)
    for _ in range(300):
        top = np.float32(10.0 ** rng.uniform(-3, 4))
        bottom = -top if rng.random() < 0.5 else np.float32(-(10.0 ** rng.uniform(-3, 4)))
        values = rng.integers(-2**31, 2**31 - 1, size=2).astype(np.int32)
        values[0] = -2**31 + rng.integers(0, 1000) if rng.random() < 0.3 else values[0]
        data = tf.bitcast(tf.constant(values), tf.qint32)
        lo, hi = tf.raw_ops.RequantizationRange(input=data, input_min=bottom, input_max=top)
        mine = qint32_to_float(values, bottom, top)
        assert min(np.float32(0), mine.min()) == lo.numpy() and mine.max() == hi.numpy()


def test_registration() -> None:
    stage = get_stage("log_ranges")
    assert stage.uses_data == ("representative",)
    assert stage.params().samples == 200
    assert stage.params(samples=None).samples is None
