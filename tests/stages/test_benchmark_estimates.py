"""The benchmark stage's estimates on real files: the digits example's fp32 GraphDef and the
LiteRT flatbuffer converted from it (the same FLOPs), benchmarked in one process. Relations
computed within this run only: nothing is compared with a fixed time."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.model import tf_adapter  # noqa: F401  (TF env defaults before TF is imported
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.spec.devices import PRESETS
from orchestrator.stages import get_stage
from orchestrator.stages.base import StageContext

DEVICES = {"pi": PRESETS["raspberry-pi-3"], "phone": PRESETS["phone-2016"],
           "server": PRESETS["x86-server"]}


def apply(name: str, artifact: ModelArtifact, **params: object) -> ModelArtifact:
    stage = get_stage(name)
    return stage.run(artifact, stage.params(**params),
                     StageContext(pipeline="test", stage=name)).artifact


@pytest.fixture(scope="module")
def files(digits_example: Path) -> dict[str, ModelArtifact]:
    from orchestrator.model.sources import load_model

    graph = load_model(digits_example / "saved_model", "auto",
                       [TensorSpec("image", "float32", (1, 8, 8, 1))], ["probs"])
    for name in ("freeze", "strip", "fold"):
        graph = apply(name, graph)
    return {"pb": graph, "tflite": apply("convert_tflite", graph, mode="fp32")}


@pytest.fixture(scope="module")
def benchmarked(files: dict[str, ModelArtifact]) -> dict[str, dict]:
    stage = get_stage("benchmark")
    ctx = StageContext(pipeline="test", stage="benchmark", devices=DEVICES)
    return {kind: stage.run(artifact, stage.params(warmup=5, runs=30, profile_runs=0,
                                                   memory=False), ctx).info
            for kind, artifact in files.items()}


def test_each_file_is_calibrated_on_its_own_runtime(benchmarked: dict[str, dict],
                                                    files: dict[str, ModelArtifact]) -> None:
    from orchestrator.model.litert_model import describe

    pb, lite = benchmarked["pb"]["estimate_basis"], benchmarked["tflite"]["estimate_basis"]
    assert pb["runtime"] == "tensorflow" and lite["runtime"] == "litert"
    assert pb["ops"] == len(files["pb"].graph_def.node)  # every node of the session's graph
    # LiteRT's operators, as `inspect` counts them: fewer, fused
    assert lite["ops"] == sum(describe(files["tflite"].payload).op_counts.values())
    assert 0 < lite["ops"] < pb["ops"]
    # one host, probed once per process: the same speed behind both files
    assert pb["host_core_flops_per_second"] == lite["host_core_flops_per_second"] > 0
    assert pb["host_flops_per_second"] == lite["host_flops_per_second"] > 0
    # each runtime's own probe: a TF session's run costs more than an Invoke()
    assert pb["fixed_ms"] > lite["fixed_ms"] >= 0
    assert pb["per_op_ms"] >= 0 and lite["per_op_ms"] >= 0
    for kind in ("pb", "tflite"):
        info = benchmarked[kind]
        assert info["estimate_basis"]["host_cv"] == info["latency_ms"]["cv"]


def test_each_overhead_is_its_runtime_cost_on_the_device(benchmarked: dict[str, dict]
                                                        ) -> None:
    from orchestrator.measure.estimates import estimate

    # a TF session's cost per run and per node is probed on this host and scaled to the
    # device's core; LiteRT's dispatch is the calibrated one (no per-run cost)
    for kind, info in benchmarked.items():
        basis = info["estimate_basis"]
        assert len(basis["operators"]) == basis["ops"]  # one priced row per op a run runs
        for target in DEVICES:
            made = info["estimate"][target]
            slowdown = made["device_slowdown"]
            assert made["ceiling_applied"] is False and made["ops"] == basis["ops"]
            if kind == "pb":
                assert made["fixed_ms"] == pytest.approx(basis["fixed_ms"] * slowdown, rel=1e-3)
                # the probed cost per node, scaled; with more than one thread, a barrier
                # per node on top (the calibrated one LiteRT's ops pay too)
                one = estimate(info["flops"], DEVICES[target].model_copy(update={"threads": 1}),
                               info["precision"], basis)
                assert one is not None and one.threads == 1 < made["threads"]
                assert one.per_op_ms == pytest.approx(basis["per_op_ms"] * slowdown, rel=1e-3)
                assert made["per_op_ms"] > one.per_op_ms
                assert made["method"].count("probed on this host") == 1
            else:
                assert made["fixed_ms"] == 0 and made["per_op_ms"] > 0
                assert "calibrated dispatch" in made["method"]
                assert "probed on this host" not in made["method"]
            assert made["overhead_ms"] == pytest.approx(
                made["ops"] * made["per_op_ms"] + made["fixed_ms"], rel=1e-4)
            # the parts add up: kernels + overhead, and the kernels by kind
            assert made["compute_ms"] + made["overhead_ms"] == pytest.approx(
                info["est_latency_ms"][target], rel=1e-3, abs=1e-4)  # kept to 0.1 µs
            assert sum(made["by_kind_ms"].values()) == pytest.approx(made["compute_ms"],
                                                                     rel=1e-4)


def test_the_files_own_host_timings_do_not_enter_the_estimate(
        benchmarked: dict[str, dict]) -> None:
    from orchestrator.measure.estimates import estimate

    for info in benchmarked.values():
        basis = info["estimate_basis"]
        slowed = {**basis, "host_p50_ms": basis["host_p50_ms"] * 10,
                  "host_min_ms": basis["host_min_ms"] * 5, "host_cv": 0.9}
        for target, device in DEVICES.items():
            again = estimate(info["flops"], device, info["precision"], slowed)
            assert again is not None
            assert round(again.latency_ms, 4) == info["est_latency_ms"][target]
            assert again.host_p50_ms == basis["host_p50_ms"] * 10  # kept beside it


def test_a_graph_node_that_moves_no_data_costs_only_its_dispatch(
        benchmarked: dict[str, dict]) -> None:
    # Const, Placeholder, Identity, Reshape: the session's executor dispatches each, and a
    # Const's weights are not work (graph_operators classes them `reshape`)
    from orchestrator.measure.estimates import estimate

    info = benchmarked["pb"]
    basis = info["estimate_basis"]
    count = sum(1 for row in basis["operators"] if row[2] == "reshape")
    assert count >= 10  # this graph's weights, its input, its flatten and its output
    # a thousand times the weights: the same cost
    heavier = {**basis, "operators": [[*row[:5], row[5] * 1000, row[6] * 1000, *row[7:]]
                                      if row[2] == "reshape" else row
                                      for row in basis["operators"]]}
    without = {**basis, "operators": [row for row in basis["operators"]
                                      if row[2] != "reshape"]}
    for target, device in DEVICES.items():
        again = estimate(info["flops"], device, info["precision"], heavier)
        assert again is not None
        assert round(again.latency_ms, 4) == info["est_latency_ms"][target], target
        assert info["estimate"][target]["by_kind_ms"]["reshape"] == 0.0  # no kernel time
        # on one thread (no barriers), each adds exactly its dispatch
        single = device.model_copy(update={"threads": 1})
        one = estimate(info["flops"], single, info["precision"], basis)
        less = estimate(info["flops"], single, info["precision"], without)
        assert one is not None and less is not None
        dispatch = basis["per_op_ms"] * one.device_slowdown  # type: ignore[operator]
        assert one.latency_ms - less.latency_ms == pytest.approx(count * dispatch, rel=1e-3)


def test_estimates_order_as_the_runtimes_cost_the_same_flops(
        benchmarked: dict[str, dict]) -> None:
    pb, lite = benchmarked["pb"], benchmarked["tflite"]
    assert pb["flops"] == lite["flops"] > 0  # FLOPs alone would estimate them the same
    for target in DEVICES:
        made_pb, made_lite = pb["estimate"][target], lite["estimate"][target]
        assert (made_pb["priced_as"], made_lite["priced_as"]) == ("tensorflow",
                                                                  "litert-xnnpack")
        # the same convolutions (compute-bound; the 1 MB dense layer is bound by memory
        # on every device, at the same bytes): a TF session's kernels are slower than
        # XNNPACK's, and it adds its cost per run and per node, so the graph is slower
        assert made_pb["by_kind_ms"]["conv"] > made_lite["by_kind_ms"]["conv"], target
        assert pb["est_latency_ms"][target] > lite["est_latency_ms"][target], target


def test_a_device_is_estimated_by_its_cores(benchmarked: dict[str, dict]) -> None:
    # a Cortex-A53 at 1.2 GHz is slower per core than any host this suite runs on, and
    # than the phone's Kryo, which is slower than the server's x86: the same file, the same
    # runtime, estimated in that order; each for its big cores' threads
    from orchestrator.measure.estimates import estimate

    for info in benchmarked.values():
        est = info["est_latency_ms"]
        made = info["estimate"]
        assert made["pi"]["device_slowdown"] > made["phone"]["device_slowdown"] > 1
        assert est["pi"] > est["phone"] > est["server"]
        for target, device in DEVICES.items():
            assert made[target]["threads"] == device.big_cores
            assert made[target]["threads_from"] == "big cores"
            assert made[target]["host_p50_ms"] == info["latency_ms"]["p50"]
            assert made[target]["host_fastest_ms"] == info["latency_ms"]["min"]
            assert 0 < len(made[target]["top_ops"]) <= 5
            assert made[target]["expected_error"]["p80_factor"] > 1
        # one thread on the pi: no speedup on compute, so slower than its 4 cores
        one = estimate(info["flops"], DEVICES["pi"].model_copy(update={"threads": 1}),
                       info["precision"], info["estimate_basis"])
        assert one is not None and one.threads == 1 and one.thread_speedup == 1
        assert one.threads_from == "target"
        assert one.latency_ms > est["pi"]
