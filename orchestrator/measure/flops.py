"""FLOPs of one run of a GraphDef, by TF's v1 profiler (2 per multiply-add), with the
Quantized* ops it does not register counted like their float twins: the figure `benchmark`,
`convert_tflite` and `inspect` report, and the estimates scale.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def count_flops(graph_def: Any, input_shapes: Mapping[str, Sequence[int]],
                warnings: list[str] | None = None) -> int:
    """Float operations of one run with the inputs fixed to `input_shapes` (node name ->
    shape), by the v1 profiler (2 per multiply-add), plus Quantized* ops counted like their
    float twins. Ops whose shapes stay unknown count 0, with a note in `warnings`."""
    import tensorflow as tf

    graph = imported(graph_def, input_shapes)
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    # The profiler reports ops of unknown shape on stderr, and logs a deprecation per call.
    notes, logger = io.StringIO(), tf.get_logger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(notes):
            profile = tf.compat.v1.profiler.profile(graph, options=options)
    finally:
        logger.setLevel(level)
    if warnings is not None and notes.getvalue().strip():
        warnings.append(f"FLOPs undercounted: {notes.getvalue().strip()}")
    return int(profile.total_float_ops) + _quantized_flops(graph)


def imported(graph_def: Any, input_shapes: Mapping[str, Sequence[int]]) -> Any:
    """`graph_def` imported into a tf.Graph with its placeholders fixed to `input_shapes`
    (node name -> shape), so that every tensor's shape is known where it can be."""
    import tensorflow as tf

    fixed = tf.compat.v1.GraphDef()
    fixed.CopyFrom(graph_def)
    for node in fixed.node:
        node.attr.pop("_output_shapes", None)  # stale once the input shape changes
        if node.name in input_shapes and node.op.startswith("Placeholder"):
            node.attr["shape"].CopyFrom(tf.compat.v1.AttrValue(
                shape=tf.TensorShape(list(input_shapes[node.name])).as_proto()))
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(fixed, name="")
    return graph


def _shape(graph: Any, name: str) -> list[int] | None:
    shape = graph.get_tensor_by_name(name if ":" in name else f"{name}:0").shape
    if shape.rank is None or not shape.is_fully_defined():
        return None
    return shape.as_list()


def _quantized_flops(graph: Any) -> int:
    """The profiler registers no Quantized* ops: count them with the float formulas of
    tensorflow/python/profiler/internal/flops_registry.py and nn_ops.py."""
    total = 0
    for op in graph.get_operations():
        # a bias added in a conv/matmul's accumulator (orchestrator.quant.integer_bias) is an
        # int32 AddV2 between two Bitcasts: the profiler counts it as it counts any AddV2
        if not op.type.startswith("Quantized"):
            continue
        out = _shape(graph, op.name)
        if out is None:
            continue
        out_count = int(np.prod(out, dtype=np.int64))
        if op.type in ("QuantizedConv2D", "QuantizedConv2DWithBias",
                       "QuantizedConv2DWithBiasAndRelu"):
            filt = _shape(graph, op.inputs[1].name)
            total += 0 if filt is None else out_count * filt[0] * filt[1] * filt[2] * 2
        elif op.type == "QuantizedDepthwiseConv2D":
            filt = _shape(graph, op.inputs[1].name)
            total += 0 if filt is None else out_count * filt[0] * filt[1] * 2
        elif op.type == "QuantizedMatMul":
            a = _shape(graph, op.inputs[0].name)
            if a is not None:
                k = a[0] if op.get_attr("transpose_a") else a[1]
                total += out_count * k * 2
        elif op.type in ("QuantizedAvgPool", "QuantizedMaxPool"):
            total += out_count * int(np.prod(op.get_attr("ksize")))
        elif op.type in ("QuantizedBiasAdd", "QuantizedMul", "QuantizedAdd"):
            total += out_count  # one operation per output element, as BiasAdd/Mul/AddV2
    return total
