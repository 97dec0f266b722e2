"""benchmark: latency statistics, FLOPs, per-device estimates, peak memory. Never timed."""

from __future__ import annotations

import os

import numpy as np
import pytest

from orchestrator.measure.estimates import estimate
from orchestrator.measure.flops import count_flops
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.spec.devices import PRESETS
from orchestrator.stages import get_stage
from orchestrator.stages.base import EvaluationData, StageContext
from orchestrator.stages.benchmark import LATENCY_KEYS, latency_stats

M, K, N = 1, 64, 32  # FLOPs of x[1, K] @ w[K, N] = 2 * M * K * N


def matmul_artifact(batch: int | None = None) -> ModelArtifact:
    """y = x @ w, with a float32 weight of K x N ones."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, K], name="x")
        w = tf.constant(np.ones((K, N), np.float32), name="w")
        tf.matmul(x, w, name="y")
    return ModelArtifact(graph_def=graph.as_graph_def(),
                         inputs=(TensorSpec("x", "float32", (batch, K)),), outputs=("y",))


def context(**kwargs: object) -> StageContext:
    return StageContext(pipeline="fp32", stage="benchmark", **kwargs)


def run_benchmark(artifact: ModelArtifact, ctx: StageContext | None = None, **params: object):
    stage = get_stage("benchmark")
    return stage.run(artifact, stage.params(**params), ctx or context())


def test_latency_keys_and_consistency() -> None:
    artifact = matmul_artifact()
    before = artifact.graph_bytes()
    result = run_benchmark(artifact, warmup=2, runs=7)
    latency = result.info["latency_ms"]
    assert tuple(latency) == LATENCY_KEYS
    host = result.info["host"]  # beside every timing: where it was measured
    assert host["cores"] == os.cpu_count() and host["cpu"] and host["tensorflow"]
    assert latency["count"] == 7
    assert latency["min"] <= latency["p50"] <= latency["p90"] <= latency["max"]
    assert latency["min"] <= latency["mean"] <= latency["max"] and latency["std"] >= 0
    assert result.metrics["latency_p50_ms"] == latency["p50"]
    assert result.metrics["latency_mean_ms"] == latency["mean"]
    # a measuring stage hands back the very same model
    assert result.artifact is artifact and artifact.graph_bytes() == before


def test_latency_stats_first_is_the_cold_run() -> None:
    stats = latency_stats(9.0, [1.0, 2.0, 4.0, 3.0])
    assert stats == {"count": 4, "first": 9.0, "curr": 3.0, "mean": 2.5,
                     "std": pytest.approx(1.118, 1e-3), "cv": pytest.approx(1.118 / 2.5, 1e-3),
                     "min": 1.0, "p50": 2.5, "p90": pytest.approx(3.7),
                     "p99": pytest.approx(3.97), "max": 4.0}
    assert tuple(stats) == LATENCY_KEYS


def test_flops_of_a_matmul_are_2mkn_at_batch_one() -> None:
    # batch 8 is benchmarked, but FLOPs are counted for one sample
    result = run_benchmark(matmul_artifact(), warmup=0, runs=1, batch_size=8)
    assert result.info["batch_size"] == 8
    assert result.info["flops"] == 2 * M * K * N
    assert result.metrics["flops"] == 2 * M * K * N
    assert count_flops(matmul_artifact().graph_def, {"x": (5, K)}) == 2 * 5 * K * N


def test_a_bias_in_the_int8_accumulator_is_counted_once() -> None:
    """quantize_nodes adds a matmul's bias in its int32 accumulator (quant.integer_bias:
    Bitcast, AddV2, Bitcast): its N adds count once, as the float graph's BiasAdd."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, K], name="x")
        w = tf.constant(np.linspace(-1, 1, K * N, dtype=np.float32).reshape(K, N))
        tf.nn.bias_add(tf.matmul(x, w), tf.constant(np.linspace(0, 1, N, dtype=np.float32)),
                       name="y")
    artifact = ModelArtifact(graph_def=graph.as_graph_def(),
                             inputs=(TensorSpec("x", "float32", (1, K)),), outputs=("y",))
    stage = get_stage("quantize_nodes")
    quantized = stage.run(artifact, stage.params(),
                          StageContext(pipeline="int8", stage="quantize_nodes")).artifact
    nodes = [n.op for n in quantized.graph_def.node]
    assert "QuantizedMatMul" in nodes and nodes.count("Bitcast") == 2, nodes
    floated, counted = count_flops(artifact.graph_def, {}), count_flops(quantized.graph_def, {})
    assert floated == 2 * K * N + N
    # beyond them, the bias in accumulator steps (N divisions each run, as the step is the
    # accumulator's range) and the range's span (1), not N more adds for the Bitcast
    assert counted == floated + N + 1, (floated, counted)


def test_quantized_graph_counts_the_same_flops() -> None:
    from orchestrator.model.tf_adapter import transform_graph

    artifact = matmul_artifact()
    quantized = artifact.replace(graph_def=transform_graph(artifact.graph_def, ["x"], ["y"],
                                                           "quantize_nodes"))
    assert any(n.op == "QuantizedMatMul" for n in quantized.graph_def.node)
    devices = {"phone": PRESETS["phone-2016"], "server": PRESETS["x86-server"]}
    result = run_benchmark(quantized, context(devices=devices), warmup=0, runs=1)
    floated = run_benchmark(artifact, context(devices=devices), warmup=0, runs=1)
    assert result.info["flops"] == floated.info["flops"] == 2 * M * K * N
    assert result.info["precision"] == "int8"
    basis = result.info["estimate_basis"]
    assert basis["runtime"] == "tensorflow" and basis["ops"] == len(quantized.graph_def.node)
    assert basis["host_p50_ms"] == result.info["latency_ms"]["p50"]
    # the estimate prices every node: the matmul as an int8 fully connected op of the float
    # one's FLOPs, beside the nodes that quantize its inputs and dequantize its output
    matmuls = {row[1]: row for run in (result, floated)
               for row in run.info["estimate_basis"]["operators"]
               if row[2] == "fully_connected"}
    assert matmuls["QuantizedMatMul"][3] == "int8" and matmuls["MatMul"][3] == "float32"
    assert matmuls["QuantizedMatMul"][4] == matmuls["MatMul"][4] == 2 * M * K * N
    assert len(basis["operators"]) == basis["ops"]
    assert any(row[1] == "Dequantize" and row[3] == "int8" for row in basis["operators"])
    for target, device in devices.items():
        made = result.info["estimate"][target]
        assert result.info["est_latency_ms"][target] == pytest.approx(
            estimate(2 * M * K * N, device, "int8", basis).latency_ms, abs=1e-4)
        assert result.info["est_latency_ms"][target] == pytest.approx(
            made["compute_ms"] + made["overhead_ms"], abs=1e-4)
        assert made["host_p50_ms"] == basis["host_p50_ms"]
        assert made["by_kind_ms"]["elementwise"] > 0  # the (de)quantize nodes
        # one matmul this small gains nothing from 8 bits: the 15 nodes quantizing adds cost
        # more than it saves (FLOPs at an int8 rate alone would say it is faster)
        assert (result.info["est_latency_ms"][target]
                > floated.info["est_latency_ms"][target]), target


def test_estimates_per_target_and_peak_memory() -> None:
    devices = {"pi": PRESETS["raspberry-pi-3"]}
    result = run_benchmark(matmul_artifact(), context(devices=devices), warmup=0, runs=2)
    assert result.info["precision"] == "float32"
    made = result.info["estimate"]["pi"]
    basis = result.info["estimate_basis"]
    # the kernels' time: every op's kernel by kind (dispatch and barriers are overhead)
    assert made["compute_ms"] == pytest.approx(sum(made["by_kind_ms"].values()), abs=1e-5)
    assert made["top_ops"][0]["ms"] >= made["top_ops"][-1]["ms"] > 0
    assert {op["op"] for op in made["top_ops"]} == {"MatMul", "Const", "Placeholder"}
    assert result.info["est_latency_ms"]["pi"] == pytest.approx(
        made["compute_ms"] + made["overhead_ms"], abs=1e-4)
    assert result.metrics["est_latency_ms.pi"] == result.info["est_latency_ms"]["pi"]
    # the session's probed cost per run and per node, scaled to the device's core
    assert made["fixed_ms"] == pytest.approx(basis["fixed_ms"] * made["device_slowdown"],
                                             rel=1e-3)
    assert made["overhead_ms"] == pytest.approx(
        made["fixed_ms"] + made["ops"] * made["per_op_ms"], rel=1e-4)
    assert made["ceiling_applied"] is False and made["host_cv"] >= 0
    weights, feed, output = K * N * 4, K * 4, N * 4
    assert result.info["peak_memory_bytes"] == weights + feed + output
    assert "peak_memory_bytes" not in run_benchmark(matmul_artifact(), warmup=0, runs=1,
                                                    memory=False).info


def test_fixed_batch_and_data_input() -> None:
    artifact = matmul_artifact(batch=1)
    calls = []

    def evaluation() -> EvaluationData:
        calls.append(1)
        return EvaluationData(inputs=np.ones((3, K), np.float32), labels=None)

    result = run_benchmark(artifact, context(evaluation=evaluation), warmup=0, runs=2,
                           batch_size=4, threads=1)
    assert calls and result.info["batch_size"] == 1 and result.info["threads"] == 1


def test_params_are_validated() -> None:
    from pydantic import ValidationError

    params = get_stage("benchmark").params
    assert params().warmup == 5 and params().runs == 50 and params().batch_size == 1
    with pytest.raises(ValidationError):
        params(runs=0)
    with pytest.raises(ValidationError):
        params(repeat=3)


def test_unknown_shapes_are_reported_not_hidden() -> None:
    warnings: list[str] = []
    # the input's batch left unknown: the profiler cannot count the MatMul
    assert count_flops(matmul_artifact().graph_def, {}, warnings) == 0
    assert warnings and "incomplete shapes" in warnings[0]


def test_threads_matrix_runs_each_setting_and_profile_tables_add_up() -> None:
    result = run_benchmark(matmul_artifact(), runs=5, warmup=1, threads=[1, 2],
                           profile_runs=3)
    matrix = result.info["threads_matrix"]
    assert [row["threads"] for row in matrix] == [1, 2]
    assert all(row["latency_ms"]["count"] == 5 for row in matrix)
    assert result.info["threads"] == 1 and result.info["latency_ms"] == matrix[0]["latency_ms"]
    assert len(result.info["latency_runs_ms"]) == 5
    top = result.files["profile_top.tsv"].decode().splitlines()
    assert top[0].split("\t") == ["node type", "start", "first", "avg ms", "%", "cdf%",
                                  "mem KB", "name"]
    rows = [line.split("\t") for line in top[1:]]
    names = {row[-1] for row in rows}
    assert "y" in names and names <= {n.name for n in matmul_artifact().graph_def.node}
    assert abs(sum(float(row[4]) for row in rows) - 100.0) < 1.0
    assert abs(float(rows[-1][5]) - 100.0) < 1.0  # cdf ends at 100
    by_type = result.files["profile_by_type.tsv"].decode().splitlines()
    assert by_type[0].split("\t") == ["node type", "count", "avg ms", "avg %", "cdf %",
                                      "mem KB"]
    types = {line.split("\t")[0]: int(line.split("\t")[1]) for line in by_type[1:]}
    assert types.get("MatMul") == 1
    assert result.info["profile"]["source"] == "step_stats"
    assert result.info["profile"]["by_node_type"][0]["node type"] in types


@pytest.mark.parametrize("bad", [{"threads": 0}, {"threads": []}, {"threads": [1, 0]},
                                 {"runs": 0}])
def test_bad_benchmark_params_are_refused(bad: dict) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        get_stage("benchmark").params(**bad)
