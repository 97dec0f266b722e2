"""Views of the graph: Graphviz DOT (rendered to SVG when `dot` is installed) and TensorBoard.

A measuring stage: the model passes through unchanged. It writes:
- `graph.dot`: one box per op type with its node count, and one arrow per pair of op types
  that feed each other, labelled with the number of node inputs it stands for (control
  dependencies dashed, weights lighter). Small even for large models.
- `graph_nodes.dot` (with `all_nodes`): every node by name and op type, in boxes by name
  scope or by op type, with an arrow per input (`:k` marks output k > 0).
- `graph.svg`, `graph_nodes.svg`: the same, rendered by Graphviz's `dot` when it is on PATH;
  when it is not, a warning says how to install it.
- `tensorboard/`: a TensorBoard log dir holding the graph
  (`tensorboard --logdir <variant>/tensorboard`, then the Graphs tab).
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter, defaultdict
from typing import Any, Literal

from pydantic import Field

from orchestrator.limits import bounded
from orchestrator.model.artifact import ModelArtifact, node_name
from orchestrator.stages import register
from orchestrator.stages.base import (
    ANY_KIND,
    Stage,
    StageContext,
    StageParams,
    StageResult,
    shipped_graph,
)

TYPES_DOT = "graph.dot"
NODES_DOT = "graph_nodes.dot"
EVENTS_FILE = "tensorboard/events.out.tfevents.0.orchestrator"
NO_DOT = ("{svgs} not rendered: Graphviz's `dot` is not on PATH. Install Graphviz "
          "(Debian/Ubuntu: `apt-get install graphviz`, macOS: `brew install graphviz`, "
          "others: https://graphviz.org/download/) and re-run with --no-cache, or render "
          "the DOT files yourself, e.g. `dot -Tsvg {dot} -o {svg}`")

# fill colours by what an op does, so that inputs, weights and 8-bit math stand out
COLOURS = {"input": "#c8e6c9", "const": "#eeeeee", "quantized": "#ffe0b2", "output": "#bbdefb",
           "other": "#ffffff"}


class Params(StageParams):
    all_nodes: bool = Field(
        False, description="Also write graph_nodes.dot (and .svg): every node by name, "
        "with an arrow per input.")
    cluster_by: Literal["name_scope", "op_type"] = Field(
        "name_scope", description="How graph_nodes.dot boxes its nodes: by name scope "
        "(nested, as in TensorBoard), or by op type.")
    rankdir: Literal["TB", "LR"] = Field(
        "TB", description="Graphviz layout direction: top to bottom or left to right.")
    render: bool = Field(
        True, description="Render each DOT file to SVG with Graphviz's `dot` when it is "
        "on PATH (a warning says how to install it when it is not).")
    render_timeout_s: bounded("timeout_s") = Field(
        300.0, description="Give up rendering one SVG after this many seconds "
        "(with a warning); the DOT file is still written.")
    tensorboard: bool = Field(
        True, description="Write a TensorBoard log dir holding the graph, under "
        "tensorboard/.")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _category(op: str, is_output: bool) -> str:
    if is_output:
        return "output"
    if op in ("Placeholder", "PlaceholderWithDefault"):
        return "input"
    if op in ("Const", "ImmutableConst"):
        return "const"
    if op.startswith(("Quantize", "Dequantize", "Requantiz")):
        return "quantized"
    return "other"


def _edges(graph_def: Any) -> list[tuple[str, str, int, bool]]:
    """(producer, consumer, output index, is control) for every input of every node."""
    names = {n.name for n in graph_def.node}
    edges = []
    for node in graph_def.node:
        for raw in node.input:
            source = node_name(raw)
            if source not in names:
                continue
            control = raw.startswith("^")
            index = 0 if control or ":" not in raw else int(raw.rsplit(":", 1)[1])
            edges.append((source, node.name, index, control))
    return edges


def _header(title: str, rankdir: str) -> list[str]:
    return [f"digraph {_quote(title)} {{",
            f"  graph [rankdir={rankdir}, label={_quote(title)}, labelloc=t, fontsize=16, "
            'fontname="Helvetica", nodesep=0.3, ranksep=0.45];',
            '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=12];',
            '  edge [fontname="Helvetica", fontsize=10, color="#555555"];']


def types_dot(artifact: ModelArtifact, title: str, rankdir: str = "TB") -> str:
    """DOT of op types: one box per type (with its count), one arrow per connected pair."""
    graph_def = artifact.graph_def
    ops = {n.name: n.op for n in graph_def.node}
    counts = Counter(ops.values())
    output_types = {ops[node_name(o)] for o in artifact.outputs if node_name(o) in ops}
    flows: Counter[tuple[str, str, bool]] = Counter(
        (ops[src], ops[dst], control) for src, dst, _, control in _edges(graph_def))
    lines = _header(title, rankdir)
    for op in sorted(counts):
        colour = COLOURS[_category(op, op in output_types)]
        label = f"{op}\n× {counts[op]}"
        lines.append(f'  {_quote(op)} [label={_quote(label)}, fillcolor="{colour}"];')
    for (src, dst, control), count in sorted(flows.items()):
        style = ", style=dashed" if control else ""
        if _category(src, False) == "const":  # weights: drawn lighter, behind the data flow
            style += ', color="#b0b0b0", fontcolor="#8a8a8a"'
        lines.append(f"  {_quote(src)} -> {_quote(dst)} [label={_quote(str(count))}{style}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _scope_tree(names: list[str]) -> dict[str, Any]:
    """Nested dict of name scopes; the key "" holds the nodes directly in a scope."""
    tree: dict[str, Any] = {"": []}
    for name in names:
        branch = tree
        for part in name.split("/")[:-1]:
            branch = branch.setdefault(part, {"": []})
        branch[""].append(name)
    return tree


def nodes_dot(artifact: ModelArtifact, title: str, cluster_by: str = "name_scope",
              rankdir: str = "TB") -> str:
    """DOT of every node, labelled name and op type, boxed by op type or name scope."""
    graph_def = artifact.graph_def
    ops = {n.name: n.op for n in graph_def.node}
    outputs = {node_name(o) for o in artifact.outputs}
    lines = _header(title, rankdir)

    def node_line(name: str, indent: str) -> str:
        colour = COLOURS[_category(ops[name], name in outputs)]
        label = f"{name.rsplit('/', 1)[-1]}\n{ops[name]}"
        return (f"{indent}{_quote(name)} [label={_quote(label)}, tooltip={_quote(name)}, "
                f'fillcolor="{colour}"];')

    clusters = 0

    def open_cluster(label: str, indent: str) -> None:
        nonlocal clusters
        clusters += 1
        lines.append(f"{indent}subgraph cluster_{clusters} {{")
        lines.append(f'{indent}  label={_quote(label)}; style="rounded"; color="#9e9e9e";')

    if cluster_by == "op_type":
        by_type: dict[str, list[str]] = defaultdict(list)
        for name, op in ops.items():
            by_type[op].append(name)
        for op in sorted(by_type):
            open_cluster(f"{op} ({len(by_type[op])})", "  ")
            lines.extend(node_line(name, "    ") for name in by_type[op])
            lines.append("  }")
    else:
        def emit(tree: dict[str, Any], indent: str) -> None:
            lines.extend(node_line(name, indent) for name in tree[""])
            for scope in sorted(k for k in tree if k):
                open_cluster(scope, indent)
                emit(tree[scope], indent + "  ")
                lines.append(f"{indent}}}")

        emit(_scope_tree(list(ops)), "  ")
    for src, dst, index, control in _edges(graph_def):
        attrs = ["style=dashed"] if control else []
        if index:
            attrs.append(f"label={_quote(f':{index}')}")
        suffix = f" [{', '.join(attrs)}]" if attrs else ""
        lines.append(f"  {_quote(src)} -> {_quote(dst)}{suffix};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(dot_text: str, timeout_s: float) -> bytes | str | None:
    """The SVG `dot` makes of `dot_text`; None when `dot` is not on PATH; a message when it
    fails or times out. The DOT goes in on stdin, the SVG comes back on stdout."""
    executable = shutil.which("dot")
    if executable is None:
        return None
    try:
        done = subprocess.run([executable, "-Tsvg"], input=dot_text.encode(),  # noqa: S603
                              capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"Graphviz's `dot` took longer than {timeout_s:g} s"
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()
        return f"Graphviz's `dot` failed (exit {done.returncode}): {message}"
    return done.stdout


def tensorboard_events(artifact: ModelArtifact) -> bytes:
    """A TensorBoard event file holding the graph: the version record, then the GraphDef.
    Written through TF's record writer into its in-memory file system, so that nothing
    touches the disk; wall times are 0, so the same graph gives the same bytes."""
    import uuid

    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    path = f"ram://orchestrator-graph-view/{uuid.uuid4().hex}/events"
    try:
        with tf.io.TFRecordWriter(path) as writer:
            writer.write(event_pb2.Event(wall_time=0.0, file_version="brain.Event:2")
                         .SerializeToString())
            writer.write(event_pb2.Event(wall_time=0.0, step=0,
                                         graph_def=artifact.graph_bytes()).SerializeToString())
        with tf.io.gfile.GFile(path, "rb") as handle:
            return handle.read()
    finally:
        if tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)


def run(given: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    artifact = shipped_graph(given, ctx)  # as the app loads it (memmapped, decrypted)
    graph_def = artifact.graph_def
    op_types = len({n.op for n in graph_def.node})
    # only what the cache key covers: a cached view may serve another pipeline's same model
    title = (f"{len(graph_def.node)} nodes, {op_types} op types"
             + (f", {len(graph_def.library.function)} functions"
                if graph_def.library.function else ""))
    dots = {TYPES_DOT: types_dot(artifact, title, params.rankdir)}
    if params.all_nodes:
        dots[NODES_DOT] = nodes_dot(artifact, title, params.cluster_by, params.rankdir)
    files = {name: text.encode() for name, text in dots.items()}
    warnings = []
    if params.render:
        for name, text in dots.items():
            svg_name = name.removesuffix(".dot") + ".svg"
            svg = render_svg(text, params.render_timeout_s)
            if isinstance(svg, bytes):
                files[svg_name] = svg
            elif svg is None:
                warnings.append(NO_DOT.format(dot=name, svg=svg_name, svgs=" and ".join(
                    n.removesuffix(".dot") + ".svg" for n in dots)))
                break  # one warning covers every file
            else:
                warnings.append(f"{svg_name} not rendered: {svg}; the DOT file is "
                                f"written: `dot -Tsvg {name} -o {svg_name}`")
    if params.tensorboard:
        files[EVENTS_FILE] = tensorboard_events(artifact)
    return StageResult(artifact=given, files=files, warnings=warnings,
                       metrics={"graph_nodes": float(len(graph_def.node)),
                                "graph_op_types": float(op_types)})


STAGE = register(Stage(name="graph_view", run=run, params=Params, doc=__doc__,
                       kind="measure", accepts=ANY_KIND - {"tflite"}))
