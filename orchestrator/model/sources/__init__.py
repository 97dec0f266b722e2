"""Model sources: one loader per format, each returning a ModelArtifact without variables.

The loaders read files (weights included); the freeze stage flattens what they leave (function
calls, the function library). Every problem a user can cause raises ModelSourceError naming
the file.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

from orchestrator import paths
from orchestrator.errors import ModelSourceError
from orchestrator.model import tf_adapter  # noqa: F401  (sets TF env defaults before TF is imported)
from orchestrator.model.artifact import ModelArtifact, TensorSpec

__all__ = ["FORMATS", "detect_format", "load_model"]

# format name -> loader module, each with `load(path, inputs, outputs) -> ModelArtifact`.
FORMATS: dict[str, str] = {
    "saved_model": "orchestrator.model.sources.saved_model",
    "keras": "orchestrator.model.sources.keras",
    "frozen_graph": "orchestrator.model.sources.frozen_graph",
    "checkpoint": "orchestrator.model.sources.checkpoint",
}


def _checkpoint_like(path: Path) -> bool:
    from orchestrator.model.sources.checkpoint import is_checkpoint

    return is_checkpoint(path)


def detect_format(path: Path) -> str:
    """The format of a model path, judged by its layout and suffix (no TF import).

    "saved_model": a dir with saved_model.pb/pbtxt; "keras": .keras/.h5; "frozen_graph":
    .pb/.pbtxt; "checkpoint": a .meta file, or a dir/prefix with a checkpoint and .meta.
    """
    from orchestrator.model.sources import frozen_graph, keras, saved_model

    path = Path(path)
    if path.is_dir():
        if saved_model.is_saved_model(path):
            return "saved_model"
        if _checkpoint_like(path):
            return "checkpoint"
        raise ModelSourceError("directory is neither a SavedModel (no saved_model.pb) nor a "
                               "TF1 checkpoint (no checkpoint or .meta file)", file=str(path))
    if not path.exists():
        if _checkpoint_like(path):
            return "checkpoint"
        raise ModelSourceError("model path not found", file=str(path))
    if path.name in ("saved_model.pb", "saved_model.pbtxt"):
        return "saved_model"
    suffix = path.suffix.lower()
    if suffix in keras.SUFFIXES:
        return "keras"
    if suffix in frozen_graph.SUFFIXES:
        return "frozen_graph"
    if suffix in (".meta", ".index"):
        return "checkpoint"
    raise ModelSourceError(
        f"cannot tell the model format from {path.name!r}; expected a SavedModel directory, "
        ".keras/.h5, .pb/.pbtxt, or a checkpoint .meta; or set model.format", file=str(path))


def load_model(path: Path, format: str = "auto", inputs: Sequence[TensorSpec] | None = None,
               outputs: Sequence[str] | None = None) -> ModelArtifact:
    """Load a model of any supported format as a ModelArtifact whose graph has no variables.

    `inputs`/`outputs` (from the recipe) are validated against the graph; when absent they
    come from the signature (SavedModel, Keras) or are detected as summarize_graph does.
    """
    path = Path(path)
    problem = paths.path_problem(path, "file_or_dir")
    if problem and problem != "not found":  # a FIFO or a device would hang the reader
        raise ModelSourceError(f"cannot read the model: {problem}", file=str(path))
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in FORMATS:
        raise ModelSourceError(f"unknown model format {format!r}; expected auto or one of "
                               f"{', '.join(FORMATS)}", file=str(path), field="model.format")
    if fmt == "saved_model" and path.name in ("saved_model.pb", "saved_model.pbtxt"):
        path = path.parent
    loader = importlib.import_module(FORMATS[fmt])
    return loader.load(path, inputs=list(inputs) if inputs else None,
                       outputs=list(outputs) if outputs else None)
