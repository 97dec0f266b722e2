"""SavedModel loader: the TF2 loader first, then the TF1 loader as a fallback.

TF2: tf.saved_model.load, the serving_default signature (or the only one), and
convert_variables_to_constants_v2. Some SavedModels exported by older Keras versions fail in
tf.saved_model.load; tf.compat.v1.saved_model.loader still reads them, and freezing from its
session leaves function calls (StatefulPartitionedCall) that the freeze stage inlines.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import ModelSourceError
from orchestrator.model.artifact import ModelArtifact, TensorSpec, node_name
from orchestrator.model.sources._common import (
    FrozenSignature,
    build_artifact,
    error,
    freeze_concrete_function,
    output_ref,
    short,
)

log = logging.getLogger("orchestrator.model.sources")

DEFAULT_SIGNATURE = "serving_default"
_INIT_OP_SIGNATURE = "__saved_model_init_op"


def is_saved_model(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file()
                                 for f in ("saved_model.pb", "saved_model.pbtxt"))


def _pick_signature(path: Path, available: Sequence[str], wanted: str | None) -> str:
    names = [s for s in available if s != _INIT_OP_SIGNATURE]
    if wanted is not None:
        if wanted not in names:
            raise error(path, f"signature {wanted!r} not found; available: "
                              f"{', '.join(names) or 'none'}")
        return wanted
    if DEFAULT_SIGNATURE in names:
        return DEFAULT_SIGNATURE
    if len(names) == 1:
        return names[0]
    raise error(path, f"no {DEFAULT_SIGNATURE!r} signature and {len(names)} others "
                      f"({', '.join(names) or 'none'}); cannot tell which one to use")


def flat_names(structure: Any, prefix: str = "") -> list[str]:
    """Leaf names in tf.nest.flatten order (dict keys sorted): {'b': x, 'a': y} -> [a, b]."""
    if isinstance(structure, dict):
        return [n for k in sorted(structure)
                for n in flat_names(structure[k], f"{prefix}{k}/")]
    if isinstance(structure, list | tuple):
        return [n for i, v in enumerate(structure) for n in flat_names(v, f"{prefix}{i}/")]
    if structure is None:
        return []
    return [prefix.rstrip("/") or "output_0"]


def load_tf2_signature(path: Path, signature_key: str | None = None) -> FrozenSignature:
    """tf.saved_model.load + a signature + convert_variables_to_constants_v2."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))
    key = _pick_signature(path, list(loaded.signatures.keys()), signature_key)
    func = loaded.signatures[key]
    args, kwargs = func.structured_input_signature
    # Positional inputs are known by their TensorSpec name, keyword ones by their key.
    in_names = [spec.name or f"input_{i}" for i, spec in enumerate(tf.nest.flatten(args))]
    in_names += flat_names(kwargs)
    out_names = flat_names(func.structured_outputs)
    return freeze_concrete_function(func, in_names, out_names)


def _read_saved_model_proto(path: Path) -> Any:
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    binary = path / "saved_model.pb"
    try:
        if binary.is_file():
            proto.ParseFromString(binary.read_bytes())
        else:
            text_format.Parse((path / "saved_model.pbtxt").read_text(), proto)
    except Exception as exc:  # protobuf raises DecodeError/ParseError/UnicodeDecodeError
        raise error(path, f"saved_model.pb is not a SavedModel proto: {short(exc)}") from exc
    if not proto.meta_graphs:
        raise error(path, "the SavedModel holds no meta graph")
    return proto


def load_tf1_signature(path: Path, signature_key: str | None = None) -> FrozenSignature:
    """tf.compat.v1.saved_model.loader in a session + convert_variables_to_constants."""
    import tensorflow as tf

    from orchestrator.model import tf_adapter
    proto = _read_saved_model_proto(path)
    meta = next((m for m in proto.meta_graphs if "serve" in m.meta_info_def.tags),
                proto.meta_graphs[0])
    tags = list(meta.meta_info_def.tags)
    key = _pick_signature(path, list(meta.signature_def.keys()), signature_key)
    sig = meta.signature_def[key]
    inputs = {k: node_name(v.name) for k, v in sorted(sig.inputs.items())}
    outputs = {k: output_ref(v.name) for k, v in sorted(sig.outputs.items())}
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        tf.compat.v1.saved_model.loader.load(session, tags, str(path))
        graph_def = tf_adapter.convert_to_constants(
        ).convert_variables_to_constants_from_session_graph(
            session, graph.as_graph_def(), sorted({node_name(o) for o in outputs.values()}))
    return FrozenSignature(graph_def=graph_def, inputs=inputs, outputs=outputs)


def load(path: Path, inputs: Sequence[TensorSpec] | None = None,
         outputs: Sequence[str] | None = None, signature_key: str | None = None
         ) -> ModelArtifact:
    """Load and freeze a SavedModel directory (see the module doc)."""
    if not path.exists():
        raise error(path, "SavedModel directory not found")
    if not is_saved_model(path):
        raise error(path, "not a SavedModel directory (no saved_model.pb or saved_model.pbtxt)")
    try:
        frozen = load_tf2_signature(path, signature_key)
        loader = "tf2"
    except ModelSourceError:  # e.g. no such signature: the TF1 loader would say the same
        raise
    except Exception as v2_exc:  # any TF2 failure means: try the TF1 loader
        log.warning("tf.saved_model.load failed on %s (%s); trying the TF1 loader",
                    path, short(v2_exc))
        try:
            frozen = load_tf1_signature(path, signature_key)
        except ModelSourceError as v1_exc:
            raise error(path, f"{v1_exc.message} (the TF2 loader failed too: "
                              f"{short(v2_exc)})") from v1_exc
        except Exception as v1_exc:
            raise error(path, f"cannot load the SavedModel: TF2 loader: {short(v2_exc)}; "
                              f"TF1 loader: {short(v1_exc)}") from v1_exc
        loader = "tf1"
    return build_artifact(path, "saved_model", frozen, inputs, outputs, loader=loader)
