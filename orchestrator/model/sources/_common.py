"""What the loaders share: path checks, freezing a concrete function, and resolving the
recipe's input/output names against the graph (signature names or node names).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ModelSourceError
from orchestrator.model import graph_info
from orchestrator.model.artifact import ModelArtifact, TensorSpec, node_name

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef


@dataclass(frozen=True)
class FrozenSignature:
    """A graph with its variables frozen, plus the signature's friendly names -> graph names.

    `inputs`/`outputs` are empty when the format has no signature (frozen graphs, checkpoints).
    """

    graph_def: GraphDef
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)


def error(path: Path, message: str, field: str | None = None) -> ModelSourceError:
    """`field`: the recipe entry at fault (`model.inputs.0.shape`), where it is one."""
    return ModelSourceError(message, file=str(path), field=field)


def require_file(path: Path, what: str) -> None:
    """A non-empty regular file, else ModelSourceError."""
    if not path.exists():
        raise error(path, f"{what} not found")
    if not path.is_file():
        raise error(path, f"expected a {what} file, found a directory")
    if path.stat().st_size == 0:
        raise error(path, f"{what} is empty")


def short(exc: BaseException, limit: int = 300) -> str:
    """The first line of a (possibly huge) TF error message."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first if len(first) <= limit else first[:limit] + "..."


def output_ref(tensor: str) -> str:
    """'node:0' -> 'node'; 'node:1' stays (an artifact output may name a tensor index)."""
    return tensor[:-2] if tensor.endswith(":0") else tensor


def freeze_concrete_function(func: Any, input_names: Sequence[str],
                             output_names: Sequence[str]) -> FrozenSignature:
    """convert_variables_to_constants_v2 on a ConcreteFunction.

    `input_names`/`output_names` are the friendly names in the order of the function's
    flattened inputs/outputs.
    """
    from orchestrator.model import tf_adapter
    frozen = tf_adapter.convert_to_constants().convert_variables_to_constants_v2(func)
    graph_def = frozen.graph.as_graph_def()
    placeholders = [t for t in frozen.inputs if t.dtype.name not in ("resource", "variant")]
    if len(placeholders) != len(input_names) or len(frozen.outputs) != len(output_names):
        raise RuntimeError("signature and frozen function disagree on inputs/outputs")
    return FrozenSignature(
        graph_def=graph_def,
        inputs={f: node_name(t.name) for f, t in zip(input_names, placeholders, strict=True)},
        outputs={f: output_ref(t.name) for f, t in zip(output_names, frozen.outputs,
                                                         strict=True)})


def _compatible(a: Sequence[int | None] | None, b: Sequence[int | None] | None) -> bool:
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(x is None or y is None or x == y
                                    for x, y in zip(a, b, strict=True))


def _producer_scopes(graph_def: GraphDef, ref: str) -> set[str]:
    """Name scopes of the op behind an output, looking through Identity nodes.

    'StatefulPartitionedCall/digits_cnn_1/probs_1/Softmax' -> {'probs', 'digits_cnn', ...}:
    lets a recipe name a Keras-exported output by its layer name ('probs').
    """
    by_name = {n.name: n for n in graph_def.node}
    node = by_name.get(node_name(ref))
    for _ in range(16):
        if node is None or node.op not in ("Identity", "IdentityN"):
            break
        data = [i for i in node.input if not i.startswith("^")]
        node = by_name.get(node_name(data[0])) if data else None
    if node is None:
        return set()
    return {re.sub(r"_\d+$", "", part) for part in node.name.split("/")[:-1]}


def _resolve_output(graph_def: GraphDef, name: str, signature: Mapping[str, str],
                    nodes: set[str]) -> str | None:
    if name in signature:
        return signature[name]
    if node_name(name) in nodes and not name.startswith("^"):
        return output_ref(name)
    matches = [ref for ref in signature.values() if name in _producer_scopes(graph_def, ref)]
    return matches[0] if len(matches) == 1 else None


def resolve_io(path: Path, frozen: FrozenSignature, inputs: Sequence[TensorSpec] | None,
               outputs: Sequence[str] | None) -> tuple[tuple[TensorSpec, ...], tuple[str, ...],
                                                       dict[str, str], dict[str, str]]:
    """The artifact's inputs and outputs, plus friendly-name maps for its metadata.

    Recipe names may be signature names or graph node names (outputs also a layer name
    when unambiguous). Unnamed ones come from the signature, else are detected as
    summarize_graph does. Unknown names raise ModelSourceError listing the candidates.
    """
    graph_def = frozen.graph_def
    by_name = {n.name: n for n in graph_def.node}
    sig_in_by_node = {node: friendly for friendly, node in frozen.inputs.items()}
    sig_out_by_ref = {ref: friendly for friendly, ref in frozen.outputs.items()}

    if frozen.inputs:
        default_inputs = [graph_info.input_spec(by_name[n]) for n in frozen.inputs.values()]
    else:
        default_inputs = graph_info.detect_inputs(graph_def)

    if inputs:
        resolved: list[TensorSpec] = []
        for index, spec in enumerate(inputs):
            entry = f"model.inputs.{index}"
            name = frozen.inputs.get(spec.name, spec.name)
            if node_name(name) not in by_name:
                candidates = list(frozen.inputs) or [s.name for s in default_inputs]
                raise error(path, f"input {spec.name!r} not found in the model; "
                                  f"candidates: {', '.join(candidates) or 'none'}",
                            f"{entry}.name")
            name = node_name(name)
            node = by_name[name]
            shape = spec.shape
            if node.op == "Placeholder":
                actual = graph_info.input_spec(node)
                if actual.dtype != spec.dtype:
                    raise error(path, f"input {spec.name!r} is {actual.dtype} in the model, "
                                      f"but the recipe says {spec.dtype}", f"{entry}.dtype")
                if not _compatible(actual.shape, spec.shape):
                    raise error(path, f"input {spec.name!r} has shape "
                                      f"{list(actual.shape or [])} in the model; the recipe's "
                                      f"{list(spec.shape or [])} does not fit it",
                                f"{entry}.shape")
                shape = spec.shape if spec.shape is not None else actual.shape
            resolved.append(TensorSpec(name=name, dtype=spec.dtype, shape=shape))
        input_specs = tuple(resolved)
    else:
        input_specs = tuple(default_inputs)
    if not input_specs:
        raise error(path, "no inputs found (no Placeholder); name them in the recipe's "
                          "model.inputs")

    if outputs:
        nodes = set(by_name)
        refs = []
        named: dict[str, str] = {}
        for index, name in enumerate(outputs):
            ref = _resolve_output(graph_def, name, frozen.outputs, nodes)
            if ref is None:
                candidates = list(frozen.outputs) or graph_info.detect_outputs(
                    graph_def, [s.name for s in input_specs])
                raise error(path, f"output {name!r} not found in the model; "
                                  f"candidates: {', '.join(candidates) or 'none'}",
                            f"model.outputs.{index}")
            refs.append(ref)
            # Record the recipe's own word for it, unless that word is the node name.
            if output_ref(name) != ref:
                named[ref] = name
        sig_out_by_ref.update(named)
        output_refs = tuple(refs)
    elif frozen.outputs:
        output_refs = tuple(frozen.outputs.values())
    else:
        output_refs = tuple(graph_info.detect_outputs(graph_def, [s.name for s in input_specs]))
    if not output_refs:
        raise error(path, "no outputs found; name them in the recipe's model.outputs")

    input_map = {sig_in_by_node.get(s.name, s.name): s.name for s in input_specs}
    output_map = {sig_out_by_ref.get(r, r): r for r in output_refs}
    return input_specs, output_refs, input_map, output_map


def build_artifact(path: Path, fmt: str, frozen: FrozenSignature,
                   inputs: Sequence[TensorSpec] | None, outputs: Sequence[str] | None,
                   **metadata: Any) -> ModelArtifact:
    """Resolve names and wrap the frozen graph as a ModelArtifact."""
    input_specs, output_refs, input_map, output_map = resolve_io(path, frozen, inputs, outputs)
    return ModelArtifact(
        graph_def=frozen.graph_def, inputs=input_specs, outputs=output_refs,
        metadata={"source_format": fmt, "input_names": input_map,
                  "output_names": output_map, **metadata})


def check_no_variables(path: Path, graph_def: GraphDef) -> None:
    """A loaded graph must hold its weights as constants."""
    left = sorted({n.op for n in graph_def.node if n.op in graph_info.VARIABLE_OPS})
    if left:
        raise error(path, f"the graph still holds variables ({', '.join(left)}) and no "
                          "checkpoint to read them from; load it as a checkpoint or SavedModel")
