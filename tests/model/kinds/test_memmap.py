"""memmap: the exact MemmappedEnv package for the digits fp32 and int8 graphs, a reader that
checks it, bit-identical outputs, and a runnable ImmutableConst variant."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli.main import main
from orchestrator.measure.tf_runtime import predict
from orchestrator.model import kinds
from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.memmap_format import (
    ALIGNMENT,
    GRAPH_REGION,
    MemmappedFormatError,
    read_package,
    rebuild,
    region_name,
    tensor_bytes,
    write_runnable,
)
from orchestrator.stages import StageContext, get_stage

POD_SKIP = {"string", "resource", "variant"}


def memmap(artifact: ModelArtifact, **params: object) -> object:
    stage = get_stage("memmap")
    return stage.run(artifact, stage.params(measure=False, **params),
                     StageContext(pipeline="test", stage="memmap"))


@pytest.fixture(params=["fp32", "int8"])
def graph(request: pytest.FixtureRequest) -> ModelArtifact:
    return request.getfixturevalue(f"digits_{request.param}")


def big_consts(artifact: ModelArtifact, min_bytes: int) -> dict[str, str]:
    import tensorflow as tf

    found = {}
    for node in artifact.graph_def.node:
        if node.op == "Const":
            dtype = tf.as_dtype(node.attr["dtype"].type)
            if dtype.name not in POD_SKIP and len(tensor_bytes(node.attr["value"].tensor)) \
                    >= min_bytes:
                found[node.name] = dtype.name
    return found


def test_package_layout_and_conversion(graph: ModelArtifact) -> None:
    result = memmap(graph)
    out = result.artifact
    assert out.kind == "memmapped" and out.graph_def is None
    data = kinds.to_bytes(out)
    package = read_package(data)
    # the last 8 bytes: the directory's offset, little-endian; the directory follows the
    # last region
    (offset,) = struct.unpack("<Q", data[-8:])
    last = max(r.offset + r.length for r in package.regions)
    assert last <= offset < len(data) - 8
    assert all(r.offset % ALIGNMENT == 0 for r in package.regions)
    assert all(r.name.startswith("memmapped_package://") for r in package.regions)
    assert package.regions[-1].name == GRAPH_REGION
    # every POD const of >= 10,000 bytes converted (the int8 graph's are quint8)
    expected = big_consts(graph, 10_000)
    converted = {n.name: n for n in package.graph_def.node if n.op == "ImmutableConst"}
    assert set(converted) == set(expected) and expected
    for name, node in converted.items():
        assert set(node.attr) == {"dtype", "shape", "memory_region_name"}
        assert node.attr["memory_region_name"].s.decode() == "memmapped_package://" + name
    if graph is not None and any(n.op.startswith("Quantized") for n in graph.graph_def.node):
        assert "quint8" in expected.values()
    assert not big_consts(ModelArtifact(package.graph_def, graph.inputs, graph.outputs),
                          10_000)
    assert result.info["memmap"]["converted_nodes"] == len(expected)
    assert result.info["memmap"]["regions"] == len(expected) + 1


def test_rebuilt_and_runnable_outputs_are_bit_identical(graph: ModelArtifact, digits_data: dict,
                                                        tmp_path: Path) -> None:
    x = digits_data["x_test"][:50]
    before = predict(graph, x)
    out = memmap(graph).artifact
    package = read_package(kinds.to_bytes(out))
    rebuilt = kinds.runnable(out)
    assert rebuilt.graph_def.SerializeToString(deterministic=True) == \
        rebuild(package).SerializeToString(deterministic=True)
    assert np.array_equal(predict(rebuilt, x), before)
    # the directly runnable variant: ImmutableConst nodes map the weight files by path
    runnable = ModelArtifact(write_runnable(package, tmp_path / "weights"), graph.inputs,
                             graph.outputs)
    assert any(n.op == "ImmutableConst" for n in runnable.graph_def.node)
    assert np.array_equal(predict(runnable, x), before)


def test_min_conversion_size_bytes(digits_fp32: ModelArtifact) -> None:
    every = memmap(digits_fp32, min_conversion_size_bytes=1).artifact
    few = memmap(digits_fp32, min_conversion_size_bytes=10**9)
    nodes = read_package(kinds.to_bytes(every)).converted_nodes()
    assert {n["node"] for n in nodes} == set(big_consts(digits_fp32, 1))
    assert few.info["memmap"]["converted_nodes"] == 0 and few.warnings


def test_region_names_are_sanitized_and_unique() -> None:
    used: set[str] = set()
    assert region_name("conv/kernel:0", used) == "memmapped_package://conv_kernel_0"
    assert region_name("conv_kernel_0", used) == "memmapped_package://conv_kernel_0_"
    assert region_name("conv.kernel-0", used) == "memmapped_package://conv.kernel_0"


def test_measured_load_time_and_memory(digits_int8: ModelArtifact) -> None:
    """Fresh processes load the runnable variant and the frozen graph (no timing asserted)."""
    stage = get_stage("memmap")
    info = stage.run(digits_int8, stage.params(), StageContext(pipeline="t", stage="memmap")
                     ).info["memmap"]
    for key in ("load_ms", "rss_growth_mb", "frozen_load_ms", "frozen_rss_growth_mb",
                "anon_growth_mb", "frozen_anon_growth_mb"):
        assert isinstance(info[key], float), info
    assert info["load_ms"] > 0 and info["frozen_load_ms"] > 0
    assert info["outputs_identical"] is True


@pytest.mark.parametrize("damage", ["offset_past_end", "offset_into_region", "truncated",
                                    "tiny", "misaligned"])
def test_corrupt_package_is_a_clear_error(damage: str, digits_fp32: ModelArtifact,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray(kinds.to_bytes(memmap(digits_fp32).artifact))
    (offset,) = struct.unpack("<Q", data[-8:])
    if damage == "offset_past_end":
        data[-8:] = struct.pack("<Q", len(data) + 12345)
    elif damage == "offset_into_region":
        data[-8:] = struct.pack("<Q", 64)
    elif damage == "truncated":
        data = data[:len(data) // 2] + data[-8:]
    elif damage == "tiny":
        data = data[:5]
    else:  # the first region moved off its 64-byte boundary in the directory
        from orchestrator.model.tf_adapter import memmapped_directory_proto

        directory = memmapped_directory_proto()
        directory.ParseFromString(bytes(data[offset:-8]))
        directory.element[0].offset += 1
        data = data[:offset] + directory.SerializeToString() + data[-8:]
    with pytest.raises(MemmappedFormatError) as info:
        read_package(bytes(data))
    assert info.value.exit_code == 2
    path = tmp_path / "model.mmap"
    path.write_bytes(bytes(data))
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_inspect_reads_a_package(digits_int8: ModelArtifact, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    import json

    path = tmp_path / "model.mmap"
    path.write_bytes(kinds.to_bytes(memmap(digits_int8).artifact))
    assert main(["inspect", str(path), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["kind"] == "memmapped"
    assert [n["dtype"] for n in found["converted_nodes"]] == ["quint8"]
    assert found["summary"]["op_counts"]["ImmutableConst"] == 1
    assert found["summary"]["params"] > 250_000
    assert main(["inspect", str(path)]) == 0
    assert "ImmutableConst" in capsys.readouterr().out
