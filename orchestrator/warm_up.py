"""Start a run's slow imports while the Prefect server boots.

A first run waits seconds for the local Prefect server, and then seconds more for
TensorFlow's import when it loads the model. During that wait a background thread imports
matplotlib (every run draws the report's pictures) and, when the run has stages to
compute, TensorFlow, and calls the `prepare` hooks of the stages still to run (the load
probe's process starts importing TensorFlow on the other core). A run with everything
cached imports no TensorFlow: it needs none.

Nothing here may fail a run: a problem (an unreadable recipe file, a store being written)
is left for the run itself to find and report.
"""

from __future__ import annotations

import importlib
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.recipe import LoadedRecipe

log = logging.getLogger(__name__)


def start(loaded: LoadedRecipe, store_root: Path, variants: list[str] | None,
          use_cache: bool) -> threading.Thread:
    """The warm-up thread, started (a daemon: it never holds the process up)."""
    thread = threading.Thread(target=_warm_up, args=(loaded, store_root, variants, use_cache),
                              name="orchestrator-warm-up", daemon=True)
    thread.start()
    return thread


def _warm_up(loaded: LoadedRecipe, store_root: Path, variants: list[str] | None,
             use_cache: bool) -> None:
    try:
        from orchestrator.executor import prepare_stages
        from orchestrator.plan import build_plan
        from orchestrator.plots import pyplot
        from orchestrator.session import data_fingerprints
        from orchestrator.store import Store

        plan = build_plan(loaded, variants, data_fingerprints(loaded))
        store = Store(store_root) if use_cache else None
        to_compute = prepare_stages(plan, store)
        if store is None or not store.has_model(plan.source_key) or to_compute:
            importlib.import_module("orchestrator.tf_adapter")  # first: TF's env defaults
            importlib.import_module("tensorflow")  # else the run needs no TensorFlow
        pyplot()  # after TensorFlow: the model's load waits for that one first
    except Exception as exc:  # noqa: BLE001 - the run reports its own problems
        log.debug("warm-up stopped early: %s", exc)
