"""Shared helpers of the 8-bit stages: what they convert, range logs and percentiles, and
how much of a graph's weights is stored in 8 bits.

The range-log format and the percentile rule follow TensorFlow's Graph Transform Tool
(insert_logging and freeze_requantization_ranges) exactly, so that a log written here is
accepted by TF's own transform and gives the same frozen ranges.

TensorFlow is imported only inside functions. Graph helpers (Const nodes, op counts, unique
names, subgraphs) are orchestrator.model.graph_rewrite's; TF's 8-bit arithmetic is
orchestrator.quant.numerics'.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.quant.numerics import round_half_away

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef

# Float op types GTT's quantize_nodes converts (GetQuantizedOpList in quantize_nodes.cc).
QUANTIZABLE_OPS: tuple[str, ...] = (
    "Add", "AvgPool", "BiasAdd", "Concat", "Conv2D", "Conv2DBackpropInput", "MatMul",
    "MaxPool", "Mul", "Relu", "Relu6", "Reshape", "ResizeBilinear")
# The quantizable ops that carry weights: usually the most harmful in 8 bits.
WEIGHT_OPS: tuple[str, ...] = ("MatMul", "Conv2D", "Conv2DBackpropInput")

# The guard's whole-stage knob for range percentiles: the quantizer declares it, the stage
# that freezes ranges reads it (orchestrator.quant.knobs).
PERCENTILE_KNOB = "percentile"
LOG_MESSAGE = "__requant_min_max:"
PRINT_SUFFIX = "__print__"
# The classic logging transform (SPEC section 5); first_n=0 keeps the Print ops silent,
# since log_ranges fetches the range tensors directly instead of reading stderr.
INSERT_LOGGING = (f'insert_logging(op=RequantizationRange, show_name=true, '
                  f'message="{LOG_MESSAGE}", first_n=0)')
# Range values in the log: 9 significant digits read back (strtof) as the same float32.
LOG_VALUE_FORMAT = ".9g"


# The metadata key of the digest of the graph a range log was taken on (log_ranges): a
# log applies to that graph only (freeze_ranges checks it).
LOGGED_GRAPH = "min_max_log_graph"


# --- graph digests and weight bytes --------------------------------------------------------

def graph_digest(graph_def: GraphDef) -> str:
    """SHA-256 of the graph's deterministic serialization."""
    import hashlib

    return hashlib.sha256(graph_def.SerializeToString(deterministic=True)).hexdigest()


def const_elements(node: NodeDef) -> int:
    """Number of elements of a Const node, from its shape (no decoding)."""
    return math.prod(d.size for d in node.attr["value"].tensor.tensor_shape.dim)


@dataclass(frozen=True)
class WeightStats:
    """Float vs 8-bit constant bytes of a graph."""

    float_bytes: int          # bytes still stored as float32
    quantized_bytes: int      # bytes stored as quint8 (one per element)
    quantized_elements: int
    float_elements: int

    @property
    def quantized_fraction(self) -> float:
        """Share of the weight elements stored at 8 bits (1.0 when there are none)."""
        total = self.quantized_elements + self.float_elements
        return self.quantized_elements / total if total else 1.0


def weight_stats(graph_def: GraphDef) -> WeightStats:
    """Counts float32 and quint8 Const elements (scalars and int consts are not weights)."""
    from tensorflow.core.framework import types_pb2

    f_el = q_el = 0
    for node in graph_def.node:
        if node.op != "Const":
            continue
        dtype = node.attr["dtype"].type
        n = const_elements(node)
        if n <= 1:
            continue  # scalars: quantization ranges and hyper-parameters, not weights
        if dtype == types_pb2.DT_FLOAT:
            f_el += n
        elif dtype in (types_pb2.DT_QUINT8, types_pb2.DT_QINT8):
            q_el += n
    return WeightStats(float_bytes=4 * f_el, quantized_bytes=q_el,
                       quantized_elements=q_el, float_elements=f_el)


# --- range logs -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RangeRecord:
    """One logged range: the RequantizationRange node's name and its min/max outputs."""

    node: str
    min: float
    max: float


def format_float(value: float) -> str:
    """Shortest text that parses back (strtof) to the same float32."""
    return str(np.float32(value))


def format_range_line(node: str, lo: float, hi: float) -> str:
    """`;<node>__print__;__requant_min_max:[<min>][<max>]`, as insert_logging prints it."""
    return (f";{node}{PRINT_SUFFIX};{LOG_MESSAGE}"
            f"[{float(lo):{LOG_VALUE_FORMAT}}][{float(hi):{LOG_VALUE_FORMAT}}]")


def _parse_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return float(np.float32(value))


def parse_range_log(text: str) -> list[RangeRecord]:
    """The range records of a log, with the same rules as TF's ExtractMinMaxRecords.

    Lines that are not range logs are ignored, so a whole console log may be passed.
    """
    records = []
    marker = PRINT_SUFFIX + ";" + LOG_MESSAGE
    for line in text.split("\n"):
        if marker not in line:
            continue
        parts = line.split(";")
        index = None
        for i in range(1, len(parts)):
            if parts[i].startswith(LOG_MESSAGE):
                index = i
        if index is None:
            continue
        pieces = parts[index].split("[")
        if len(pieces) != 3 or pieces[0] != LOG_MESSAGE:
            continue
        lo_parts, hi_parts = pieces[1].split("]"), pieces[2].split("]")
        if len(lo_parts) != 2 or len(hi_parts) != 2:
            continue
        lo, hi = _parse_float(lo_parts[0]), _parse_float(hi_parts[0])
        name = parts[index - 1]
        if lo is None or hi is None or not name.endswith(PRINT_SUFFIX):
            continue
        records.append(RangeRecord(name[: -len(PRINT_SUFFIX)], lo, hi))
    return records


def percentile_indices(count: int, min_percentile: float,
                       max_percentile: float) -> tuple[int, int]:
    """Indices into the sorted mins and maxes that freeze_requantization_ranges picks.

    Same float32 arithmetic and rounding as the C++ transform.
    """
    n = np.float32(count)
    lo = int(round_half_away(n * (np.float32(min_percentile) / np.float32(100.0))))
    hi = int(round_half_away(n * (np.float32(1.0) - np.float32(max_percentile)
                                  / np.float32(100.0))))
    return max(lo, 0), min(hi, count - 1)


def frozen_range(mins: Sequence[float], maxs: Sequence[float], min_percentile: float,
                 max_percentile: float) -> tuple[float, float]:
    """The (min, max) freeze_requantization_ranges freezes for one node's records."""
    lo, hi = percentile_indices(len(mins), min_percentile, max_percentile)
    return (float(np.sort(np.asarray(mins, np.float32))[lo]),
            float(np.sort(np.asarray(maxs, np.float32))[hi]))


def group_ranges(records: Iterable[RangeRecord]) -> dict[str, tuple[list[float], list[float]]]:
    """node -> (mins, maxs), nodes in order of first appearance."""
    grouped: dict[str, tuple[list[float], list[float]]] = {}
    for record in records:
        mins, maxs = grouped.setdefault(record.node, ([], []))
        mins.append(record.min)
        maxs.append(record.max)
    return grouped


def range_table(ranges: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                min_percentile: float, max_percentile: float) -> list[dict[str, Any]]:
    """Per node: record count, overall min/max, and the frozen range at these percentiles."""
    rows = []
    for node, (mins, maxs) in ranges.items():
        lo, hi = frozen_range(mins, maxs, min_percentile, max_percentile)
        rows.append({"node": node, "count": len(mins), "min": float(np.min(mins)),
                     "max": float(np.max(maxs)), "frozen_min": lo, "frozen_max": hi,
                     "min_percentile": min_percentile, "max_percentile": max_percentile})
    return rows


def table_csv(rows: Sequence[dict[str, Any]]) -> str:
    """The range table as CSV text (header row first)."""
    out = io.StringIO()
    fields = ["node", "count", "min", "max", "frozen_min", "frozen_max",
              "min_percentile", "max_percentile"]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (format_float(v) if isinstance(v, float) else v)
                         for k, v in row.items()})
    return out.getvalue()


def run_time_quantizations(graph_def: GraphDef) -> list[str]:
    """QuantizeV2 nodes whose range a Min and a Max compute at run time (from a float
    tensor), in graph order."""
    nodes = {n.name: n for n in graph_def.node}

    def op_of(name: str) -> str | None:
        node = nodes.get(name.split(":")[0].lstrip("^"))
        return None if node is None else node.op

    return [n.name for n in graph_def.node if n.op == "QuantizeV2" and len(n.input) >= 3
            and op_of(n.input[1]) == "Min" and op_of(n.input[2]) == "Max"]
