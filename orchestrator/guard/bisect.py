"""The "bisect" search: keep integer compute where it can hold.

Quantization noise on a deep CNN piles up a little in every layer (a mini-Xception's 33
layers each add about the same), so taking the worst layer or two out of int8 moves the
output little, and a search that tries layers a few at a time runs out of trials before
it helps. What does help is a wider rung on many layers at once (int16 activations keep
the int8 weights, the size, and integer compute). So, along the stage's ladder:

1. every layer on the first rung (a16w8): can it meet the budget at all?
2. if so, the fewest layers that need it: the K that add the most error (ranked by the
   stage's own per-layer figures), K found by bisection, the others back to int8 (int8
   kernels are the fastest, and what every NPU runs);
3. if not, the next rung for the K worst layers, the others on the rung before, K bisected
   (all layers on the last rung is the float model: assumed to meet, not run);
4. the fallback, when nothing else held (the caller's last trial).

Of the candidates that meet the budgets, the cheapest compute is chosen (Search.best).
"""

from __future__ import annotations

from orchestrator.guard.trials import Search, Trial
from orchestrator.quant.knobs import Candidate, Layer, Precision


def bisect_layers(search: Search, ranked: list[Layer], base: Candidate, rung: Precision,
                  start: Trial) -> Trial | None:
    """The trial with the smallest K such that `rung` on ranked[:K] (on top of `base`)
    meets the budgets, given that K = len(ranked) does (`start`); None when no smaller K
    was found (or trials ran out)."""
    low, high, found = 0, len(ranked), None
    while high - low > 1 and not search.exhausted:
        middle = (low + high) // 2
        candidate = base.with_nodes([n for layer in ranked[:middle] for n in layer.nodes],
                                    rung.name)
        trial = search.attempt(candidate, f"the {middle} layer(s) adding the most error -> "
                               f"{rung.words}")
        if trial is None:
            break
        search.decide([layer.name for layer in ranked[:middle]], rung.name, start, trial,
                      "meets budgets" if trial.ok else "stepped back: budget not met")
        if trial.ok:
            high, found = middle, trial
        else:
            low = middle
    return found


def climb_ladder(search: Search, baseline: Trial, ranked: list[Layer],
                 rungs: tuple[Precision, ...]) -> None:
    """Steps 1-3 of the module's docstring (the caller adds the fallback and picks the
    chosen trial)."""
    everything = [n for layer in ranked for n in layer.nodes]
    base, previous = baseline.candidate, baseline
    for index, rung in enumerate(rungs):
        if index == len(rungs) - 1:  # every layer up here is the float model: not run
            if not search.exhausted:
                bisect_layers(search, ranked, base, rung, previous)
            return
        moved = base.with_nodes(everything, rung.name)
        trial = search.attempt(moved, f"every layer -> {rung.words}")
        if trial is None:
            return
        short = "integer compute" if rung.integer else rung.words
        search.decide(everything, rung.name, previous, trial,
                      "meets budgets" if trial.ok else f"{short} does not meet")
        if trial.ok:
            bisect_layers(search, ranked, base, rung, trial)
            return
        base, previous = moved, trial
