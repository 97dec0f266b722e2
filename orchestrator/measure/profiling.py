"""Per-node timing, as TF's `benchmark_model` tables it.

A runner times each node over a few traced runs (`GraphRunner.node_timings`: step stats of
`RunOptions(trace_level=FULL_TRACE)`); this module turns the records into the two classic
tables:
- "Top by Computation Time": node type, start, first, avg ms, %, cdf%, mem KB, name;
- "Summary by node type": type, count, avg ms, avg %, cdf %, mem KB.
The % columns share out the summed node time, so they add up to 100.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TOP_COLUMNS = ("node type", "start", "first", "avg ms", "%", "cdf%", "mem KB", "name")
BY_TYPE_COLUMNS = ("node type", "count", "avg ms", "avg %", "cdf %", "mem KB")
TOP_FILE = "profile_top.tsv"
BY_TYPE_FILE = "profile_by_type.tsv"
# Step stats name these bookkeeping nodes; they are not the model's ops.
_NOT_OPS = frozenset({"_SOURCE", "_SINK"})


@dataclass(frozen=True)
class NodeTiming:
    """One node over the traced runs: its start offset in the run and durations, in ms,
    and the bytes its outputs allocated."""

    name: str
    op_type: str
    start_ms: float
    first_ms: float
    avg_ms: float
    mem_bytes: int


def from_step_stats(runs: Sequence[Any], op_types: dict[str, str]) -> list[NodeTiming]:
    """NodeTimings from the StepStats of several runs (node name -> op type given)."""
    starts: dict[str, list[float]] = defaultdict(list)
    times: dict[str, list[float]] = defaultdict(list)
    memory: dict[str, int] = {}
    for step_stats in runs:
        nodes = [n for dev in step_stats.dev_stats for n in dev.node_stats
                 if n.node_name not in _NOT_OPS and n.node_name.split(":")[0] in op_types]
        if not nodes:
            continue
        run_start = min(n.all_start_micros for n in nodes)
        for node in nodes:
            name = node.node_name.split(":")[0]
            starts[name].append((node.all_start_micros - run_start) / 1000.0)
            times[name].append(node.all_end_rel_micros / 1000.0)
            memory[name] = max(memory.get(name, 0), sum(
                o.tensor_description.allocation_description.requested_bytes
                for o in node.output))
    return [NodeTiming(name, op_types[name], sum(starts[name]) / len(starts[name]),
                       times[name][0], sum(times[name]) / len(times[name]), memory[name])
            for name in times]


def top_rows(timings: Sequence[NodeTiming]) -> list[dict[str, Any]]:
    """"Top by Computation Time": every node, slowest first."""
    total = sum(t.avg_ms for t in timings) or 1.0
    rows, cdf = [], 0.0
    for t in sorted(timings, key=lambda t: t.avg_ms, reverse=True):
        share = 100.0 * t.avg_ms / total
        cdf += share
        rows.append({"node type": t.op_type, "start": round(t.start_ms, 3),
                     "first": round(t.first_ms, 3), "avg ms": round(t.avg_ms, 3),
                     "%": round(share, 3), "cdf%": round(cdf, 3),
                     "mem KB": round(t.mem_bytes / 1024, 3), "name": t.name})
    return rows


def by_type_rows(timings: Sequence[NodeTiming]) -> list[dict[str, Any]]:
    """"Summary by node type": per op type, its node count and summed time, slowest
    first."""
    total = sum(t.avg_ms for t in timings) or 1.0
    grouped: dict[str, list[NodeTiming]] = defaultdict(list)
    for t in timings:
        grouped[t.op_type].append(t)
    rows, cdf = [], 0.0
    for op_type, group in sorted(grouped.items(), key=lambda kv: -sum(t.avg_ms for t in kv[1])):
        avg = sum(t.avg_ms for t in group)
        share = 100.0 * avg / total
        cdf += share
        rows.append({"node type": op_type, "count": len(group), "avg ms": round(avg, 3),
                     "avg %": round(share, 3), "cdf %": round(cdf, 3),
                     "mem KB": round(sum(t.mem_bytes for t in group) / 1024, 3)})
    return rows


def tsv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> bytes:
    lines = ["\t".join(columns)] + ["\t".join(str(row[c]) for c in columns) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def text_table(title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str],
               limit: int | None = None) -> str:
    """A plain-text table as benchmark_model prints it (the last column left-aligned)."""
    shown = list(rows)[:limit] if limit else list(rows)
    cells = [[str(row[c]) for c in columns] for row in shown]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if i < len(values) - 1 else v
                         for i, (v, w) in enumerate(zip(values, widths, strict=True)))
    return "\n".join([f"============ {title} ============", line(list(columns)),
                      *(line(r) for r in cells)])
