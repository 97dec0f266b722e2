"""The "revert" search: take the worst layers back up the ladder, a few at a time.

Layers are ranked by how much error each adds (the stage's per-layer errors against float,
normalized MSE), or, without diagnostics, weight layers first. Worst first, a layer (later
a small group) moves up the stage's ladder one rung at a time (weights-only first, which
keeps most of the size gain, then float) until the budgets are met. After a few kept steps
the remaining layers are re-ranked from the latest trial's own errors; when single layers
stop helping, steps grow to small groups.
"""

from __future__ import annotations

from orchestrator.formatting import layer_name
from orchestrator.guard.trials import Search, Trial
from orchestrator.quant.knobs import PRECISIONS, Candidate, Layer, Precision
from orchestrator.quant.layer_groups import rank_layers

# Re-rank the remaining layers from the latest trial's errors after this many kept steps.
RERANK_EVERY = 3
# After this many steps in a row that did not help, revert twice as many layers per step...
STALLED_STEPS = 2
# ... up to this many.
MAX_GROUP = 4


def revert_layers(search: Search, current: Trial, rungs: tuple[Precision, ...]) -> None:
    """Passes over the layers not yet moved, worst first. A pass ends when its queue is
    used up or after RERANK_EVERY kept steps (the errors moved: rank again); a pass in which
    nothing helped doubles the group size for the next."""
    reverted: set[str] = set()
    group = 1
    while not current.ok and not search.exhausted:
        queue = rank_layers(current.layer_errors(), search.layers, reverted, search.inputs_of)
        if not queue:
            return
        size, kept, stalled = len(queue), 0, 0
        while queue and not current.ok and not search.exhausted and kept < RERANK_EVERY:
            layers, queue = queue[:group], queue[group:]
            trial = step(search, current, layers, _group_rungs(search, layers, rungs))
            if trial is None:
                stalled += 1
                if stalled >= STALLED_STEPS:  # single layers do not help: take more
                    group, stalled = max(group, min(group * 2, MAX_GROUP)), 0
                continue
            current, kept, stalled = trial, kept + 1, 0
            reverted.update(layer.name for layer in layers)
        if kept == 0:
            if group >= size:
                return  # even all of them at once did not help
            group *= 2  # the next pass takes bigger groups


def _computes_in_float(search: Search, candidate: Candidate) -> bool:
    """Whether no weight layer would compute in integers: that is the float pipeline, or
    the fallback's answer, not a candidate of the layer search."""
    weights = {n for layer in search.layers if layer.has_weights for n in layer.nodes}
    moved = {node for node, where in candidate.moved if not PRECISIONS[where].integer}
    return bool(weights) and weights <= moved


def short_names(search: Search, layers: list[Layer], limit: int = 3) -> str:
    """Layer names for a console line, shortened as everywhere (formatting.layer_name:
    a LiteRT op fused from several graph nodes is named by its first, without the scope
    all layers share)."""
    names = [layer_name(layer.name, search.prefix) for layer in layers[:limit]]
    return ", ".join(names) + (f" and {len(layers) - limit} more"
                               if len(layers) > limit else "")


def _group_rungs(search: Search, layers: list[Layer], rungs: tuple[Precision, ...]
                 ) -> tuple[Precision, ...]:
    """The rungs a group climbs: those only weights have, when one of its layers has some."""
    if any(layer.has_weights for layer in layers):
        return rungs
    return tuple(r for r in rungs if r.name not in search.knobs.weights_only)


def step(search: Search, current: Trial, layers: list[Layer], rungs: tuple[Precision, ...]
         ) -> Trial | None:
    """Move `layers` one rung at a time (a weight-less layer skips the rungs only weights
    have, to the next one); the trial that was closer to float than `current`, or None when
    none was (stepped back)."""
    nodes = [n for layer in layers for n in layer.nodes]
    for rung in rungs:
        if search.exhausted:
            return None
        candidate = current.candidate
        for layer in layers:
            candidate = candidate.with_nodes(list(layer.nodes),
                                             _rung_for(search, layer, rung, rungs).name)
        if _computes_in_float(search, candidate):  # not a full 8-bit candidate:
            # a smaller group may still leave a weight layer in eight bits
            return step(search, current, layers[:-1], rungs) if len(layers) > 1 else None
        trial = search.attempt(candidate, f"{short_names(search, layers)} -> {rung.words}")
        if trial is None:
            continue
        if trial.better_than(current):
            search.decide(nodes, rung.name, current, trial,
                          "meets budgets" if trial.ok else "kept: closer to float")
            return trial
        search.decide(nodes, rung.name, current, trial,
                      "failed" if trial.failed else "stepped back: no closer")
    return None


def _rung_for(search: Search, layer: Layer, rung: Precision, rungs: tuple[Precision, ...]
              ) -> Precision:
    """`rung`, or for a layer without weights on a rung only weights have, the next rung
    that is not."""
    if layer.has_weights or rung.name not in search.knobs.weights_only:
        return rung
    return next((r for r in rungs[rungs.index(rung):]
                 if r.name not in search.knobs.weights_only), rung)
