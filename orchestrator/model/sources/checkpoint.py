"""TF1 checkpoint loader: a `.meta` graph plus the checkpoint's variable values.

Accepts the `.meta` file, the checkpoint prefix (`dir/model.ckpt`), its `.index` file, or
a directory with a `checkpoint` file (the latest checkpoint) or a single `.meta`.
import_meta_graph + restore + convert_variables_to_constants; outputs are detected (as
summarize_graph does, ignoring saver/initialiser/gradient nodes) unless the recipe names them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.model.artifact import ModelArtifact, TensorSpec, node_name
from orchestrator.model.sources._common import (
    FrozenSignature,
    build_artifact,
    error,
    require_file,
    resolve_io,
    short,
)


def is_checkpoint(path: Path) -> bool:
    """True for a .meta/.index file, a prefix with a .meta, or a dir holding a checkpoint."""
    if path.is_dir():
        return (path / "checkpoint").is_file() or any(path.glob("*.meta"))
    if path.suffix in (".meta", ".index"):
        return True
    return Path(f"{path}.meta").is_file()


def checkpoint_files(path: Path) -> tuple[Path, str]:
    """(meta graph file, checkpoint prefix) for any accepted form of `path`."""
    if path.is_dir():
        state = path / "checkpoint"
        if state.is_file():
            import tensorflow as tf

            prefix = tf.train.latest_checkpoint(str(path))
            if prefix is None:
                raise error(state, "the checkpoint state file names no checkpoint")
            return Path(f"{prefix}.meta"), prefix
        metas = sorted(path.glob("*.meta"))
        if len(metas) != 1:
            raise error(path, f"expected one .meta file in the directory, found {len(metas)}")
        return metas[0], str(metas[0].with_suffix(""))
    if path.suffix in (".meta", ".index"):
        return path.with_suffix(".meta"), str(path.with_suffix(""))
    return Path(f"{path}.meta"), str(path)


def load(path: Path, inputs: Sequence[TensorSpec] | None = None,
         outputs: Sequence[str] | None = None) -> ModelArtifact:
    """Load a TF1 checkpoint and freeze it to the (named or detected) outputs."""
    if not path.exists() and not Path(f"{path}.meta").exists():
        raise error(path, "checkpoint not found")
    meta, prefix = checkpoint_files(path)
    require_file(meta, "meta graph")
    if not Path(f"{prefix}.index").is_file():
        raise error(meta, f"no checkpoint data next to the meta graph ({prefix}.index missing)")

    import tensorflow as tf

    from orchestrator.model import tf_adapter
    graph = tf.Graph()
    with graph.as_default():
        try:
            saver = tf.compat.v1.train.import_meta_graph(str(meta), clear_devices=True)
        except Exception as exc:  # DecodeError, ValueError for unknown ops, ...
            raise error(meta, f"not a loadable meta graph: {short(exc)}") from exc
    # Check the recipe's names (or detect them) on the full graph, before freezing prunes it.
    full = FrozenSignature(graph.as_graph_def())
    specs, refs, _, _ = resolve_io(meta, full, inputs, outputs)
    with tf.compat.v1.Session(graph=graph) as session:
        try:
            if saver is not None:
                saver.restore(session, prefix)
            graph_def = tf_adapter.convert_to_constants(
            ).convert_variables_to_constants_from_session_graph(
                session, full.graph_def,
                sorted({node_name(r) for r in refs} | {s.name for s in specs}))
        except Exception as exc:  # NotFoundError, DataLossError, InvalidArgumentError, ...
            raise error(Path(prefix), f"cannot restore and freeze the checkpoint: "
                                      f"{short(exc)}") from exc
    return build_artifact(meta, "checkpoint", FrozenSignature(graph_def), specs, list(refs))
