"""A GraphDef's nodes as operators (orchestrator.measure.graph_operators), on the digits
example's own fp32 graph and its quantize_nodes int8 twin: every node listed once, each
classified by its kernel, FLOPs as TF's profiler counts each node (checked node by node
against TF's own flops registry), 8-bit ops priced as int8."""

from __future__ import annotations

from collections import Counter

from support.digits_graphs import digits_fp32, digits_int8

from orchestrator.measure.flops import count_flops, imported
from orchestrator.measure.graph_operators import graph_operators
from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.operators import KINDS, PRECISIONS

__all__ = ["digits_fp32", "digits_int8"]

ONE = {"image": (1, 8, 8, 1)}
GEMM = ("conv", "conv_1x1", "depthwise", "fully_connected")


def profiler_flops(artifact: ModelArtifact) -> dict[str, int]:
    """Each node's FLOPs from TF's own registry (what the v1 profiler sums); 0 where the
    registry has no entry (Relu, Const, ...)."""
    import tensorflow.python.profiler.internal.flops_registry  # noqa: F401  (registers them)
    from tensorflow.python.framework import ops

    graph = imported(artifact.graph_def, ONE)
    return {op.name: int(ops.get_stats_for_node_def(graph, op.node_def, "flops").value or 0)
            for op in graph.get_operations()}


def test_every_node_of_the_float_graph_is_one_operator_counted_as_the_profiler_does(
        digits_fp32: ModelArtifact) -> None:
    found = graph_operators(digits_fp32.graph_def, ONE)
    assert sorted(o.name for o in found) == sorted(n.name for n in digits_fp32.graph_def.node)
    assert all(o.kind in KINDS and o.precision == "float32" for o in found)
    kinds = {o.op: o.kind for o in found}
    assert kinds["Conv2D"] == "conv" and kinds["MatMul"] == "fully_connected"
    assert kinds["Softmax"] == "softmax" and kinds["Relu"] == "elementwise"
    assert kinds["Const"] == kinds["Identity"] == kinds["Reshape"] == "reshape"
    expected = profiler_flops(digits_fp32)
    assert {o.name: o.flops for o in found} == expected
    convs = [o for o in found if o.op == "Conv2D"]
    assert len(convs) == 2 and all(o.flops > 0 for o in convs)
    # the sum is the benchmark stage's `flops` of the same graph
    assert sum(o.flops for o in found) == count_flops(digits_fp32.graph_def, ONE, [])
    # the digits CNN: 3x3 1->16 then 3x3 16->32 at 8x8 ("same" padding, stride 1)
    assert [o.detail for o in convs] == ["3x3/1 1->16 ch, 8x8 out", "3x3/1 16->32 ch, 8x8 out"]
    assert [o.flops for o in convs] == [2 * 8 * 8 * 16 * 9, 2 * 8 * 8 * 32 * 9 * 16]
    assert [o.elements for o in convs] == [8 * 8 * 16, 8 * 8 * 32]
    # bytes: the input, the filter and the output, 4 bytes each
    assert convs[1].bytes == 4 * (8 * 8 * 16 + 3 * 3 * 16 * 32 + 8 * 8 * 32)


def test_the_quantized_graph_is_int8_with_its_float_twins_flops(
        digits_fp32: ModelArtifact, digits_int8: ModelArtifact) -> None:
    floats = {o.name: o for o in graph_operators(digits_fp32.graph_def, ONE)}
    found = graph_operators(digits_int8.graph_def, ONE)
    assert sorted(o.name for o in found) == sorted(n.name for n in digits_int8.graph_def.node)
    assert all(o.precision in PRECISIONS for o in found)
    ops = Counter(o.op for o in found)
    assert ops["QuantizedConv2D"] == 2 and ops["QuantizedMatMul"] == 2
    for op in found:
        if op.op.startswith("Quantized") or op.op in ("QuantizeV2", "Dequantize",
                                                      "Requantize"):
            assert op.precision == "int8", op
        if op.op == "Softmax":
            assert op.precision == "float32", op
        if op.op == "Bitcast":  # the accumulator's view as int32 and back: no data moved
            assert op.kind == "reshape" and op.flops == 0, op
    gemms = [o for o in found if o.kind in GEMM]
    assert {o.op for o in gemms} == {"QuantizedConv2D", "QuantizedMatMul"}
    for op in gemms:  # each 8-bit kernel does its float twin's arithmetic
        twin = floats[op.name.removesuffix("/q8")]
        assert (op.kind, op.flops, op.elements) == (twin.kind, twin.flops, twin.elements)
        assert op.detail == twin.detail
        assert op.bytes < twin.bytes  # 8-bit inputs and weights
    assert sum(o.flops for o in gemms) == sum(o.flops for o in floats.values()
                                              if o.kind in GEMM)
    # every node TF's registry counts (the float ops between the 8-bit ones) as it counts
    expected = profiler_flops(digits_int8)
    for op in found:
        if not op.op.startswith("Quantized"):
            assert op.flops == expected[op.name], op

