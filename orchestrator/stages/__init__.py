"""The stage registry: one explicit list, looked up by snake_case name.

Stage modules import TensorFlow only inside their functions, so loading a module for its
Params (validate, stages, schema) stays fast.
"""

from __future__ import annotations

import difflib
import importlib

from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult

__all__ = ["Stage", "StageContext", "StageParams", "StageResult", "STAGE_MODULES",
           "get_stage", "all_stages", "suggest", "register"]

# name -> module. Adding a stage means adding one line here and one module.
STAGE_MODULES: dict[str, str] = {
    "freeze": "orchestrator.stages.freeze",
    "strip": "orchestrator.stages.strip",
    "fold": "orchestrator.stages.fold",
    "sort_by_execution_order": "orchestrator.stages.sort_by_execution_order",
    "transform": "orchestrator.stages.transform",
    "summarize": "orchestrator.stages.summarize",
    "benchmark": "orchestrator.stages.benchmark",
    "evaluate": "orchestrator.stages.evaluate",
    "equalize": "orchestrator.stages.equalize",
    "quantize_weights": "orchestrator.stages.quantize_weights",
    "round_weights": "orchestrator.stages.round_weights",
    "quantize_nodes": "orchestrator.stages.quantize_nodes",
    "log_ranges": "orchestrator.stages.log_ranges",
    "freeze_ranges": "orchestrator.stages.freeze_ranges",
    "compact_names": "orchestrator.stages.compact_names",
    "memmap": "orchestrator.stages.memmap",
    "encrypt": "orchestrator.stages.encrypt",
    "ops_header": "orchestrator.stages.ops_header",
    "graph_view": "orchestrator.stages.graph_view",
    "convert_tflite": "orchestrator.stages.convert_tflite",
    "quantize_tflite": "orchestrator.stages.quantize_tflite",
    "measure_on_device": "orchestrator.stages.measure_on_device",
}

_REGISTRY: dict[str, Stage] = {}


def register(stage: Stage) -> Stage:
    """Called on the last line of each stage module. A duplicate name is an error."""
    existing = _REGISTRY.get(stage.name)
    if existing is not None and existing.run.__module__ != stage.run.__module__:
        raise RuntimeError(f"stage {stage.name!r} registered twice "
                           f"({existing.run.__module__} and {stage.run.__module__})")
    _REGISTRY[stage.name] = stage
    return stage


def get_stage(name: str) -> Stage:
    """The stage registered under `name`. KeyError for unknown names (see `suggest`)."""
    if name not in _REGISTRY:
        if name not in STAGE_MODULES:
            raise KeyError(name)
        importlib.import_module(STAGE_MODULES[name])
    return _REGISTRY[name]


def all_stages() -> list[Stage]:
    """Every stage: the listed modules' in their order, then any registered otherwise (a
    plug-in registered by its own code)."""
    listed = [get_stage(name) for name in STAGE_MODULES]
    return listed + [stage for name, stage in _REGISTRY.items() if name not in STAGE_MODULES]


def suggest(name: str) -> str:
    """' (did you mean "fold"?)' or ''."""
    close = difflib.get_close_matches(name, list(STAGE_MODULES), n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""
