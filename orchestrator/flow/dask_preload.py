"""A Dask worker preload: import TensorFlow as soon as the worker starts, in a background
thread, so that its first stage does not wait for it.

The LocalCluster of `executor: dask` preloads it; workers of a scheduler of your own can
too: `dask worker tcp://HOST:8786 --preload orchestrator.flow.dask_preload`. Nothing here may
fail a worker: a failed import is left for the first stage to report.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


def dask_setup(worker: Any) -> None:
    """Dask calls this once in each worker process as it starts."""
    threading.Thread(target=_import_tensorflow, name="orchestrator-worker-warm-up",
                     daemon=True).start()


def _import_tensorflow() -> None:
    try:
        from orchestrator.model.tf_adapter import import_tensorflow

        import_tensorflow()
        importlib.import_module("pipelines.recipe_flow")  # what unpickles a stage task
    except Exception as exc:  # noqa: BLE001 - the first stage reports its own problems
        log.debug("worker warm-up stopped early: %s", exc)
