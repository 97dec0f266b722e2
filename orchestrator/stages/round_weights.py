"""Round float weights to a few values: same file size, but it zips to near 8-bit size.

The classic `round_weights(num_steps=256)`: each float constant with at least
`minimum_size` elements is split into `num_steps` equal buckets between its min and max,
and every value becomes its bucket's centre. Weights stay float32, so the model loads and
memory-maps as before; only the compressed size (`gzip_size_bytes`) shrinks, which is what
app stores and OTA downloads ship.

Computed here rather than by TF's transform, which puts a tensor's maximum into an extra
bucket (up to num_steps + 1 values) and shifts constant tensors; otherwise the same.
"""

from __future__ import annotations

import gzip
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from orchestrator.limits import bounded
from orchestrator.model.graph_rewrite import const_value, copy_graph
from orchestrator.quant import ranges as q
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

if TYPE_CHECKING:
    from orchestrator.model.artifact import ModelArtifact

_DT_FLOAT = 1


class Params(StageParams):
    num_steps: bounded("num_steps") = Field(256,
                           description="Distinct values per weight tensor (256: 8 bits).")
    minimum_size: bounded("elements") = Field(
        16, description="Round float constants with at least this many elements "
        "(smaller ones are often accuracy-sensitive and gain nothing).")


def round_values(values: np.ndarray, num_steps: int) -> np.ndarray:
    """Bucket centres of `num_steps` equal buckets over [min, max], in float32."""
    values = values.astype(np.float32)
    lo, hi = values.min(), values.max()
    if not lo < hi:  # constant (or NaN) tensor: already one value
        return values
    width = np.float32((hi - lo) / np.float32(num_steps))
    buckets = np.clip(np.floor((values - lo) / width), 0, num_steps - 1).astype(np.float32)
    return (lo + width * (buckets + np.float32(0.5))).astype(np.float32)


def gzip_size(data: bytes) -> int:
    return len(gzip.compress(data, compresslevel=9, mtime=0))


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    import tensorflow as tf

    graph = copy_graph(artifact.graph_def)
    rounded = 0
    for node in graph.node:
        if node.op != "Const" or node.attr["dtype"].type != _DT_FLOAT \
                or q.const_elements(node) < params.minimum_size:
            continue
        values = const_value(node)
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(
            round_values(values, params.num_steps), dtype=tf.float32, shape=values.shape))
        rounded += 1
    result = artifact.replace(graph_def=graph)
    before, after = gzip_size(artifact.graph_bytes()), gzip_size(result.graph_bytes())
    return StageResult(
        artifact=result,
        metrics={"gzip_size_bytes": float(after), "gzip_size_bytes_before": float(before),
                 "gzip_ratio": after / before if before else 1.0,
                 "rounded_tensors": float(rounded)},
        info={"gzip_size_bytes": after})


STAGE = register(Stage(name="round_weights", run=run, params=Params, doc=__doc__ or ""))
