"""Do a run's slow imports while the Prefect server boots.

A first run waits seconds for the local Prefect server to boot in its own process, and
used to import TensorFlow only after that, to load the model. `run` does it first, in the
main thread, while the server boots: when the run has stages to compute, it calls the
`prepare` hooks of the stages still to run (the load probe's process starts importing
TensorFlow on the other core), imports TensorFlow, and starts the processes that will draw
the report's pictures (they import matplotlib meanwhile: results/plots.py). A run with
everything cached does neither: it needs no TensorFlow, and its report is the one an
earlier run drew already (plots.py keeps those pictures; should it draw after all, it
imports matplotlib then). The main thread, not a background one: a Ctrl-C during an
import is then the ordinary KeyboardInterrupt (exit 130), never an interpreter torn down
under a thread still loading TensorFlow's libraries.

`plan_first` builds the run's plan before all that: an error of the plan itself (a missing
or bad model key) is then exit 2 at once, with the message the run gives, not after the
server's boot and TensorFlow's import. A problem with the recipe's files or the store is
left for the run itself to find and report; an interrupt is the run's (exit 130).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.engine.plan import Plan
    from orchestrator.recipe.loading import LoadedRecipe

log = logging.getLogger(__name__)


def plan_first(loaded: LoadedRecipe, variants: list[str] | None) -> Plan | None:
    """The run's plan, as its flow builds it; OrchestratorError (exit 2) for the plan's own
    errors. None when its data cannot be read: the run reports that, in its own words."""
    from orchestrator.engine.plan import build_plan
    from orchestrator.engine.prepared_run import data_fingerprints

    try:
        return build_plan(loaded, variants, data_fingerprints(loaded))
    except (OSError, ValueError) as exc:
        log.debug("no plan before the run: %s", exc)
        return None


def run(plan: Plan | None, store_root: Path | str, use_cache: bool, prepare: bool = True
        ) -> None:
    """The warm-up for `plan` (plan_first's); returns once its imports are done (they are
    needed next anyway). `prepare=False`: the stages run in other processes (Dask workers),
    each of which calls the hooks itself; a load probe started here would import TensorFlow
    for nothing."""
    from orchestrator.cache.project import open_store
    from orchestrator.engine.node_run import pending, prepare_stages
    from orchestrator.errors import OrchestratorError
    from orchestrator.model.tf_adapter import import_tensorflow
    from orchestrator.results.plots import start_drawing

    store, to_compute = None, True
    if plan is not None:
        try:
            store = open_store(store_root) if use_cache else None
            to_compute = prepare_stages(plan, store) if prepare else pending(plan, store)
        except (OrchestratorError, OSError, ValueError) as exc:  # the run reports them
            log.debug("warm-up without the store: %s", exc)
            store, to_compute = None, True
    if store is None or plan is None or not store.has_model(plan.source_key) or to_compute:
        import_tensorflow()  # else the run needs no TensorFlow
        start_drawing()  # new results: new pictures (else they are drawn already)
