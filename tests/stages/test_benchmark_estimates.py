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


def test_each_overhead_is_the_file_excess_kept_within_the_runtime_probe(
        benchmarked: dict[str, dict]) -> None:
    for kind, info in benchmarked.items():
        basis = info["estimate_basis"]
        floor = basis["fixed_ms"]
        ceiling = floor + basis["ops"] * basis["per_op_ms"]
        excess = (basis["host_min_ms"]
                  - info["flops"] / basis["host_flops_per_second"] * 1000.0)
        for target in DEVICES:
            made = info["estimate"][target]
            host_overhead = made["overhead_ms"] / made["device_slowdown"]
            assert floor * 0.999 <= host_overhead <= ceiling * 1.001, (kind, target, made)
            assert made["ceiling_applied"] == (excess > ceiling), (kind, target, made)
            if floor < excess < ceiling:  # the file's own measurement decides
                assert host_overhead == pytest.approx(excess, rel=1e-3)
            assert made["method"].count("probed on this host") == 1


def test_estimates_order_as_the_runtimes_cost_the_same_flops(
        benchmarked: dict[str, dict]) -> None:
    pb, lite = benchmarked["pb"], benchmarked["tflite"]
    assert pb["flops"] == lite["flops"] > 0  # FLOPs alone would estimate them the same
    for target in DEVICES:
        assert pb["estimate"][target]["compute_ms"] == lite["estimate"][target]["compute_ms"]
        # same compute, same scaling: the session's cost per run is over LiteRT's whole
        # band (its per-run and per-operator costs), so the graph is estimated slower
        lite_basis = lite["estimate_basis"]
        if pb["estimate_basis"]["fixed_ms"] > (lite_basis["fixed_ms"] + lite_basis["ops"]
                                               * lite_basis["per_op_ms"]):
            assert pb["est_latency_ms"][target] > lite["est_latency_ms"][target], target


def test_a_device_slower_than_this_host_is_never_estimated_below_it(
        benchmarked: dict[str, dict]) -> None:
    # a Cortex-A53 at 1.2 GHz (9.6 GFLOP/s on one core) is slower than any host this suite
    # runs on, at 5 GFLOP/s in all slower than the host's own measured rate too: it is
    # estimated above this host's own compute + capped overhead
    for info in benchmarked.values():
        made = info["estimate"]["pi"]
        basis = info["estimate_basis"]
        assert made["device_slowdown"] > 1
        assert basis["host_flops_per_second"] > DEVICES["pi"].flops_per_second
        host_compute = info["flops"] / basis["host_flops_per_second"] * 1000.0
        host_overhead = made["overhead_ms"] / made["device_slowdown"]
        assert info["est_latency_ms"]["pi"] >= host_compute + host_overhead
        assert made["host_p50_ms"] == info["latency_ms"]["p50"]
        assert made["host_fastest_ms"] == info["latency_ms"]["min"]
        assert "on this host" in made["method"]
