"""The graph helpers every rewriting stage shares (orchestrator.model.graph_rewrite): one
make_const, op_counts, unique_name, subgraph and is_nhwc, where the 8-bit stages once had
copies that behaved otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.model import tf_adapter  # noqa: F401  (TF env defaults before TF is imported)
from orchestrator.model.graph_rewrite import (
    const_value,
    is_nhwc,
    make_const,
    op_counts,
    subgraph,
    unique_name,
)


def _graph(*nodes: tuple[str, str, list[str]]):  # noqa: ANN202
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.versions.producer = 1234
    for name, op, inputs in nodes:
        graph_def.node.add(name=name, op=op, input=inputs)
    return graph_def


def test_make_const_dtype_is_the_arrays_unless_tf_names_one() -> None:
    import tensorflow as tf

    ints = make_const("one", np.int32(1))
    assert ints.op == "Const" and ints.attr["dtype"].type == tf.int32.as_datatype_enum
    assert const_value(ints) == 1
    floats = make_const("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert floats.attr["dtype"].type == tf.float32.as_datatype_enum
    assert floats.attr["value"].tensor.dtype == floats.attr["dtype"].type
    np.testing.assert_array_equal(const_value(floats), np.arange(6).reshape(2, 3))
    # a Python float is a float64 array: callers pass np.float32 for a float32 Const
    assert make_const("d", 0.5).attr["dtype"].type == tf.float64.as_datatype_enum
    # quint8 has no numpy array type: the 8-bit stages name it
    codes = np.array([0, 7, 255], np.uint8)
    eight = make_const("q", codes, dtype=tf.quint8)
    assert eight.attr["dtype"].type == eight.attr["value"].tensor.dtype \
        == tf.quint8.as_datatype_enum
    np.testing.assert_array_equal(const_value(eight).astype(np.uint8), codes)


def test_op_counts_by_op_name_whatever_the_node_order() -> None:
    graph_def = _graph(("x", "Placeholder", []), ("a", "Relu", ["x"]), ("b", "Relu", ["a"]),
                       ("c", "Add", ["a", "b"]), ("d", "Relu", ["c"]))
    counts = op_counts(graph_def)
    assert counts == {"Add": 1, "Placeholder": 1, "Relu": 3}
    assert list(counts) == ["Add", "Placeholder", "Relu"]


def test_unique_name_counts_up_and_remembers_what_it_gave() -> None:
    taken = {"conv", "conv_1", "relu"}
    assert unique_name("fresh", taken) == "fresh" and "fresh" in taken
    assert unique_name("conv", taken) == "conv_2"
    assert unique_name("conv", taken) == "conv_3"  # the name given joined `taken`
    assert unique_name("fresh", taken) == "fresh_1"
    assert taken == {"conv", "conv_1", "relu", "fresh", "conv_2", "conv_3", "fresh_1"}


def test_subgraph_keeps_what_the_outputs_need_and_the_inputs() -> None:
    graph_def = _graph(("x", "Placeholder", []), ("unused_input", "Placeholder", []),
                       ("init", "NoOp", []), ("w", "Const", []),
                       ("y", "MatMul", ["x", "w", "^init"]), ("dead", "Relu", ["y"]),
                       ("z", "Relu", ["y:0"]))
    graph_def.library.function.add().signature.name = "kept"
    out = subgraph(graph_def, ["x", "unused_input", "z:0"])
    assert [n.name for n in out.node] == ["x", "unused_input", "init", "w", "y", "z"]
    assert out.versions.producer == 1234 and out.library.function[0].signature.name == "kept"
    assert len(graph_def.node) == 7  # the input graph is untouched


def test_subgraph_says_which_nodes_are_missing() -> None:
    graph_def = _graph(("x", "Placeholder", []), ("y", "Relu", ["x"]))
    with pytest.raises(KeyError, match="nodes not in graph: gone"):
        subgraph(graph_def, ["x", "gone:0"])


def test_is_nhwc() -> None:
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name="conv", op="Conv2D")
    assert is_nhwc(node)  # TF's default when the attribute is not given
    for layout, channels_last in ((b"NHWC", True), (b"", True), (b"NCHW", False)):
        node.attr["data_format"].s = layout
        assert is_nhwc(node) is channels_last
