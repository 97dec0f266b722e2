"""The benchmark stage's estimates on real files: the digits example's fp32 GraphDef and the
LiteRT flatbuffer converted from it (the same FLOPs), benchmarked in one process. Relations
computed within this run only: nothing is compared with a fixed time."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import tf_adapter  # noqa: F401  (TF env defaults before TF is imported)
from orchestrator.devices import PRESETS
from orchestrator.model import ModelArtifact, TensorSpec
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
    from orchestrator.sources import load_model

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
    pb, lite = benchmarked["pb"]["estimate_basis"], benchmarked["tflite"]["estimate_basis"]
    assert pb["runtime"] == "tensorflow" and lite["runtime"] == "litert"
    assert pb["ops"] == len(files["pb"].graph_def.node)  # every node of the session's graph
    assert 0 < lite["ops"] < pb["ops"]  # LiteRT's fused operators
    # one host, probed once per process: the same speed behind both files
    assert pb["host_core_flops_per_second"] == lite["host_core_flops_per_second"] > 0
    assert pb["host_flops_per_second"] == lite["host_flops_per_second"] > 0


def test_estimates_order_as_the_host_measured_the_same_flops(
        benchmarked: dict[str, dict]) -> None:
    pb, lite = benchmarked["pb"], benchmarked["tflite"]
    assert pb["flops"] == lite["flops"] > 0  # FLOPs alone would estimate them the same
    # the overhead is calibrated on each file's fastest timed run
    p50_pb, p50_lite = pb["latency_ms"]["min"], lite["latency_ms"]["min"]
    for target in DEVICES:
        est_pb, est_lite = pb["est_latency_ms"][target], lite["est_latency_ms"][target]
        assert pb["estimate"][target]["compute_ms"] == lite["estimate"][target]["compute_ms"]
        # same compute, same scaling: the file this host ran slower is estimated slower
        # (above the runtime's own cost per run, which both keep at the least)
        over_pb, over_lite = (pb["estimate"][target]["overhead_ms"],
                              lite["estimate"][target]["overhead_ms"])
        if p50_pb > p50_lite:
            assert est_pb > est_lite and over_pb > over_lite, (target, p50_pb, p50_lite)
        else:
            assert est_pb <= est_lite, (target, p50_pb, p50_lite)


def test_a_device_slower_than_this_host_is_never_estimated_below_it(
        benchmarked: dict[str, dict]) -> None:
    # a Cortex-A53 at 1.2 GHz (9.6 GFLOP/s on one core) is slower than any host this suite
    # runs on, at 5 GFLOP/s in all slower than the host's own measured rate too
    for info in benchmarked.values():
        made = info["estimate"]["pi"]
        basis = info["estimate_basis"]
        assert made["device_slowdown"] > 1
        assert basis["host_flops_per_second"] > DEVICES["pi"].flops_per_second
        assert info["est_latency_ms"]["pi"] >= info["latency_ms"]["min"]
        assert made["host_p50_ms"] == info["latency_ms"]["p50"]
        assert made["host_fastest_ms"] == info["latency_ms"]["min"]
        assert "on this host" in made["method"]
