"""freeze_ranges: TF's own freeze_requantization_ranges on our log, run-time input ranges
frozen too, every range nudged so that zero is a step."""

from __future__ import annotations

import numpy as np
import pytest
from support import quant_fixtures
from support.quant_fixtures import accuracy, agreement, apply, nodes, ops, predict

from orchestrator.model import tf_adapter
from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.graph_rewrite import const_value
from orchestrator.quant import layer_errors
from orchestrator.quant.ranges import frozen_range, parse_range_log
from orchestrator.stages import get_stage
from orchestrator.stages.freeze_ranges import nudged_range

# Fixtures shared by the eight-bit stage tests: bound here so that pytest finds them.
cnn = quant_fixtures.cnn
digits = quant_fixtures.digits


@pytest.fixture(scope="module")
def logged(cnn, digits) -> ModelArtifact:  # noqa: ANN001
    """The CNN after quantize_weights, quantize_nodes and log_ranges (200 samples)."""
    weighted = apply("quantize_weights", cnn).artifact
    eight_bit = apply("quantize_nodes", weighted).artifact
    return apply("log_ranges", eight_bit, digits["x_calib"]).artifact


@pytest.mark.parametrize(("low", "high"), [(5.0, 5.0), (0.0, 0.0), (12.5, 33.3)])
def test_same_ranges_as_tfs_own_transform_then_nudged(logged, tmp_path, low, high
                                                       ) -> None:  # noqa: ANN001
    """TF's own freeze_requantization_ranges(min_max_log_file=<our log's
    RequantizationRange lines>) freezes the ranges ours start from; ours are those nudged
    so that zero is one of the 256 steps, and the run-time QuantizeV2 ranges are frozen
    too (their Min/Max gone)."""
    requantizations = {n.name for n in logged.graph_def.node if n.op == "RequantizationRange"}
    log = logged.metadata["min_max_log"]
    log_file = tmp_path / "ranges.log"
    log_file.write_text("\n".join(line for line in log.splitlines()
                                  if any(r.node in requantizations
                                         for r in parse_range_log(line))) + "\n")
    expected = tf_adapter.transform_graph(
        logged.graph_def, logged.input_names, list(logged.outputs),
        f'freeze_requantization_ranges(min_max_log_file="{log_file}", '
        f"min_percentile={low}, max_percentile={high})")
    out = apply("freeze_ranges", logged, min_percentile=low, max_percentile=high).artifact
    ours, theirs = nodes(out), {n.name: n for n in expected.node}
    for name in requantizations:
        tf_range = [float(const_value(theirs[f"{name}/frozen_{end}"])) for end in ("min", "max")]
        lo, hi = (float(const_value(ours[f"{name}/frozen_{end}"])) for end in ("min", "max"))
        assert (lo, hi) == pytest.approx(nudged_range(*tf_range), abs=1e-6)
        assert hi - lo == pytest.approx(tf_range[1] - tf_range[0], rel=1e-5)
    # the rest of the graph is TF's, without the run-time range ops of the QuantizeV2s
    dropped = {n for n in theirs if theirs[n].op in ("Min", "Max")}
    assert dropped and not [n for n in ours.values() if n.op in ("Min", "Max")]
    kept = {n: theirs[n].op for n in theirs if n in ours}
    assert all(ours[n].op == op for n, op in kept.items())
    assert set(theirs) - set(ours) <= dropped | {n for n in theirs if "/q8/in" in n}
    assert "RequantizationRange" not in ops(out)
    assert "min_max_log" not in out.metadata  # served; ranges.log keeps it


@pytest.mark.parametrize(("low", "high"), [(5.0, 5.0), (0.0, 0.0), (12.5, 33.3), (49.0, 1.0)])
def test_frozen_constants_follow_the_percentiles(logged, low, high) -> None:  # noqa: ANN001
    out = apply("freeze_ranges", logged, min_percentile=low, max_percentile=high)
    by_name = nodes(out.artifact)
    records = parse_range_log(logged.metadata["min_max_log"])
    quantize = [n.name for n in logged.graph_def.node if n.op == "QuantizeV2"
                and n.name in {r.node for r in records}]
    assert quantize  # the model input's range is logged and frozen too
    for name in {r.node for r in records}:
        lo, hi = frozen_range([r.min for r in records if r.node == name],
                              [r.max for r in records if r.node == name], low, high)
        frozen = [float(const_value(by_name[f"{name}/frozen_{end}"])) for end in ("min", "max")]
        assert frozen == pytest.approx(nudged_range(lo, hi), abs=1e-6)
        assert frozen[0] <= min(lo, 0.0) + 1e-6 or frozen[1] >= max(hi, 0.0) - 1e-6
        step = (frozen[1] - frozen[0]) / 255
        assert abs(-frozen[0] / step - round(-frozen[0] / step)) < 1e-3  # zero is a step
    # the table keeps the percentile ranges, as TF's rule gives them
    assert {r["node"]: (r["frozen_min"], r["frozen_max"]) for r in out.info["ranges"]} == {
        name: frozen_range([r.min for r in records if r.node == name],
                           [r.max for r in records if r.node == name], low, high)
        for name in {x.node for x in records}}
    assert out.metrics["frozen_input_ranges"] == len(quantize)
    assert out.metrics["ranges_nudged"] >= out.metrics["frozen_ranges"] + len(quantize)


def test_the_frozen_graph_computes_each_sample_as_a_batch_of_one(logged, digits
                                                                 ) -> None:  # noqa: ANN001
    """Before freezing, a run-time QuantizeV2 range spans the whole batch, so a sample's
    result depends on its batch; after, it does not."""
    from orchestrator.measure.tf_runtime import predict as run

    out = apply("freeze_ranges", logged).artifact
    x = digits["x_test"][:32]
    for model, independent in ((logged, False), (out, True)):
        batched, single = run(model, x, batch_size=32), run(model, x, batch_size=1)
        assert np.allclose(batched, single, atol=1e-6) == independent


def test_nudging_removes_requantizes_offset() -> None:
    """Why ranges are nudged: TF's Requantize into an arbitrary range, read back on the
    MIN_FIRST grid (as every consumer reads it), is off by a constant fraction of a step;
    into the nudged range it is not."""
    import tensorflow as tf

    values = np.linspace(-3.0, 5.0, 4001).astype(np.float32)
    accumulator_min, accumulator_max = -8.0, 8.0
    q32 = tf.raw_ops.QuantizeV2(input=values, min_range=accumulator_min,
                                max_range=accumulator_max, T=tf.qint32, mode="MIN_FIRST")
    for lo, hi, offset_allowed in ((-3.1337, 5.0421, None), (*nudged_range(-3.1337, 5.0421),
                                                             0.02)):
        q8 = tf.raw_ops.Requantize(input=q32.output, input_min=q32.output_min,
                                   input_max=q32.output_max, requested_output_min=lo,
                                   requested_output_max=hi, out_type=tf.quint8)
        back = tf.raw_ops.Dequantize(input=q8.output, min_range=q8.output_min,
                                     max_range=q8.output_max, mode="MIN_FIRST").numpy()
        step = (hi - lo) / 255
        offset = abs(float(np.mean(back - values))) / step
        if offset_allowed is None:
            assert offset > 0.1, offset  # un-nudged: a visible constant offset
        else:
            assert offset < offset_allowed, offset


def test_accuracy_is_kept(cnn, logged, digits) -> None:  # noqa: ANN001
    out = apply("freeze_ranges", logged).artifact
    counts = ops(out)
    assert counts["QuantizedConv2D"] == 2 and counts["QuantizedMatMul"] == 2
    assert "RequantizationRange" not in counts
    x, y = digits["x_test"], digits["y_test"]
    before, after = predict(cnn, x), predict(out, x)
    assert agreement(before, after) >= 0.97
    assert accuracy(after, y) >= accuracy(before, y) - 0.02


def test_log_without_matching_nodes_names_the_expected_ones(logged) -> None:  # noqa: ANN001
    other = logged.replace(metadata={"min_max_log": ";elsewhere/range__print__;"
                                     "__requant_min_max:[-1][1]\n"})
    expected = [n.name for n in logged.graph_def.node if n.op == "RequantizationRange"]
    with pytest.raises(ValueError, match="matches none") as error:
        apply("freeze_ranges", other)
    assert "elsewhere/range" in str(error.value)
    assert expected[0] in str(error.value)


def test_log_without_range_lines(logged) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="no range lines"):
        apply("freeze_ranges", logged.replace(metadata={"min_max_log": "hello\n"}))


def test_log_missing_some_nodes(logged) -> None:  # noqa: ANN001
    lines = logged.metadata["min_max_log"].splitlines()
    first = parse_range_log(lines[0])[0].node
    partial = "\n".join(line for line in lines if f";{first}__print__;" in line)
    with pytest.raises(ValueError, match="has no lines for"):
        apply("freeze_ranges", logged.replace(metadata={"min_max_log": partial}))


def test_log_naming_unknown_nodes(logged) -> None:  # noqa: ANN001
    extra = logged.metadata["min_max_log"] + ";ghost__print__;__requant_min_max:[-1][1]\n"
    with pytest.raises(ValueError, match="ghost"):
        apply("freeze_ranges", logged.replace(metadata={"min_max_log": extra}))


def test_without_log_ranges(cnn) -> None:  # noqa: ANN001
    eight_bit = apply("quantize_nodes", cnn).artifact
    with pytest.raises(ValueError, match="run log_ranges"):
        apply("freeze_ranges", eight_bit)


def test_parser_reads_a_console_log_like_tf() -> None:
    text = ("I0101 12:00:00 noise\n"
            ";a/range__print__;__requant_min_max:[-1.5][2.25]\n"
            "2017-01-01 ;Relu;;b/range__print__;__requant_min_max:[-0.5][7]\n"
            ";c/range__print__;__requant_min_max:[x][1]\n"     # not a number: skipped
            ";d/range;__requant_min_max:[-1][1]\n"             # no __print__: skipped
            ";e/range__print__;__requant_min_max:[-1][1][2]\n")  # three values: skipped
    assert [(r.node, r.min, r.max) for r in parse_range_log(text)] == [
        ("a/range", -1.5, 2.25), ("b/range", -0.5, 7.0)]


def test_registration() -> None:
    stage = get_stage("freeze_ranges")
    assert stage.requires == ("log_ranges",)
    assert stage.optional_data == ("representative",) and stage.uses_data == ()
    params = stage.params()
    assert (params.min_percentile, params.max_percentile) == (5.0, 5.0)
    assert params.diagnostics and params.diagnostics_samples == 200


# --- per-layer diagnostics ------------------------------------------------------------------

def diagnosed(logged: ModelArtifact, float_model: ModelArtifact | None, x: np.ndarray | None,
              calls: list | None = None, **params: object):  # noqa: ANN201
    """freeze_ranges with a context that has (or lacks) the float model and the data."""
    ctx = quant_fixtures.context(x, "freeze_ranges")
    if ctx.representative is not None and calls is not None:
        inner = ctx.representative

        def representative(samples, batch_size):  # noqa: ANN001, ANN202
            calls.append((samples, batch_size))
            return inner(samples, batch_size)

        ctx.representative = representative
    ctx.float_model = None if float_model is None else (lambda: float_model)
    stage = get_stage("freeze_ranges")
    return stage.run(logged, stage.params(**params), ctx)


def test_diagnostics_in_info_metrics_tsv_and_warning(cnn, logged, digits) -> None:  # noqa: ANN001
    calls: list = []
    result = diagnosed(logged, cnn, digits["x_calib"], calls, diagnostics_samples=120)
    assert calls == [(120, layer_errors.BATCH_SIZE)]
    rows = result.info["layer_errors"]
    frozen = result.artifact.graph_def
    # a row per eight-bit op, a conv/matmul and its bias (added in its accumulator) as one
    eight_bit = sum(n.op.startswith("Quantized") for n in frozen.node)
    linear = sum(n.op in ("QuantizedConv2D", "QuantizedMatMul") for n in frozen.node)
    fused = sum(n.op == "Bitcast" and n.attr["type"].type == 13 for n in frozen.node)
    assert (linear, fused) == (4, 4)
    assert len(rows) == eight_bit - linear + fused == 9
    assert [tuple(r) for r in rows] == [layer_errors.FIELDS] * len(rows)
    # the same rows as the computation itself on the frozen graph and the same samples
    assert rows == layer_errors.measure(cnn, result.artifact, [digits["x_calib"][:120]])
    assert result.files["layer_errors.tsv"].decode() == layer_errors.table_tsv(rows)
    assert result.metrics["layer_error_max"] == max(r["rmse_over_scale"] for r in rows)
    assert result.metrics["layer_nmse_max"] == max(r["nmse"] for r in rows)
    flagged = [r for r in rows if r["rmse_over_scale"] > 0.7]
    assert flagged and result.metrics["layers_flagged"] == len(flagged)
    # a diagnostic for the report and page; report.advice warns where a budget breaks
    assert result.warnings == []
    [warning] = result.info["diagnostics"]
    assert warning.startswith(f"{len(flagged)} layer(s) above 0.7 RMSE/scale")
    from orchestrator.formatting import layer_names

    short = layer_names([r["node"] for r in rows])  # as the console and the page name them
    assert all(len(short[r["node"]]) < len(r["node"]) for r in rows)  # "<scope>/" left out
    for row in rows:  # the three worst flagged ones are named, no other
        named = f" {short[row['node']]} {row['rmse_over_scale']:.2f}" in warning
        assert named == (row in layer_errors.flagged(rows)[:3])
    # one requantization per conv/matmul: its bias is added before it
    assert result.info["ranges"] and result.metrics["frozen_ranges"] == 4
    # diagnostics change nothing in the model
    plain = apply("freeze_ranges", logged).artifact
    assert frozen.SerializeToString(deterministic=True) == \
        plain.graph_def.SerializeToString(deterministic=True)


@pytest.mark.parametrize("missing", ["float_model", "representative", "off"])
def test_no_diagnostics_without_float_model_or_data(cnn, logged, digits, missing) -> None:  # noqa: ANN001
    result = diagnosed(logged, None if missing == "float_model" else cnn,
                       None if missing == "representative" else digits["x_calib"],
                       diagnostics=missing != "off")
    assert "layer_errors" not in result.info and not result.files and not result.warnings
    assert not {"layer_error_max", "layers_flagged", "layer_nmse_max"} & set(result.metrics)
    assert "RequantizationRange" not in ops(result.artifact)
    assert agreement(predict(cnn, digits["x_test"]),
                     predict(result.artifact, digits["x_test"])) >= 0.97


def test_diagnostics_that_cannot_run_cost_a_warning_not_the_model(cnn, logged, digits  # noqa: ANN001
                                                                    ) -> None:
    """A float model that does not fit the 8-bit graph (its input has another shape)."""
    bad_input = digits["x_calib"].reshape(len(digits["x_calib"]), -1)
    result = diagnosed(logged, cnn, bad_input)
    assert "layer_errors" not in result.info
    [warning] = result.warnings
    assert warning.startswith("layer diagnostics skipped:")
    assert "RequantizationRange" not in ops(result.artifact)


def test_digits_int8_acceptance(digits_example, digits) -> None:  # noqa: ANN001
    """The digits recipe's int8 chain: <= 1.07 x params bytes, <= 0.01 drop, >= 99% agree."""
    from orchestrator.model.sources import load_model

    model = load_model(digits_example / "saved_model")
    fp32 = model
    for name in ("freeze", "strip", "fold"):
        fp32 = apply(name, fp32).artifact
    int8 = fp32
    for name in ("quantize_weights", "quantize_nodes"):
        int8 = apply(name, int8).artifact
    int8 = apply("log_ranges", int8, digits["x_calib"]).artifact
    int8 = apply("freeze_ranges", int8).artifact

    params = sum(int(np.prod([d.size for d in n.attr["value"].tensor.tensor_shape.dim]))
                 for n in fp32.graph_def.node if n.op == "Const")
    ratio = int8.graph_def.ByteSize() / params
    assert 1.0 <= ratio <= 1.07, ratio
    counts = ops(int8)
    assert counts["QuantizedConv2D"] and counts["QuantizedMatMul"]
    assert "RequantizationRange" not in counts
    x, y = digits["x_test"], digits["y_test"]
    before, after = predict(fp32, x), predict(int8, x)
    assert accuracy(before, y) - accuracy(after, y) <= 0.01
    assert agreement(before, after) >= 0.99


def test_a_log_taken_on_another_graph_is_refused(logged) -> None:  # noqa: ANN001
    """Each candidate's ranges come from its own graph: a log carried onto a graph that
    changed after log_ranges is refused, not applied."""
    import dataclasses

    from orchestrator.model.graph_rewrite import copy_graph

    changed = copy_graph(logged.graph_def)
    node = next(n for n in changed.node if n.op == "Const" and n.attr["dtype"].type == 1)
    node.attr["value"].tensor.float_val.append(0.5)  # any change to the graph's bytes
    moved = dataclasses.replace(logged, graph_def=changed)
    with pytest.raises(ValueError, match="taken on another graph"):
        apply("freeze_ranges", moved)
    out = apply("freeze_ranges", logged).artifact  # its own graph: accepted, digest dropped
    assert "min_max_log_graph" not in out.metadata
