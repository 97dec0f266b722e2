"""The guard's search on the LiteRT Quantizer's path: keep integer compute.

Quantization noise on a deep CNN piles up a little in every layer (a mini-Xception's 33
layers each add about the same), so taking the worst layer or two out of int8 moves the
output little, and a search that tries layers a few at a time runs out of trials before
it helps. What does help is wider activations on many layers at once, and int16
activations keep the int8 weights (the size) and integer compute. So:

1. every layer with int16 activations (a16w8): can integer compute meet the budget at all?
2. if so, the fewest layers that need it: the K that add the most error (ranked by the
   quantizer's own per-layer figures, `added_nmse`), K found by bisection, the others
   back to int8 (int8 kernels are the fastest, and what every NPU runs);
3. if not, float for the K worst layers, the others with int16 activations, K bisected;
4. the reserved last trial: dynamic range (float compute), when nothing else held.

Of the candidates that meet the budgets, the one with the fewest layers out of int8 (then
the smallest) is chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.engine.guard import (
    ACTION_WORDS,
    FLOAT,
    INT16,
    LITERT_WEIGHT_OPS,
    Layer,
    Settings,
)

if TYPE_CHECKING:
    from orchestrator.engine.guard import Trial, _Search

# Ops that only move or select values: their output's precision is what the next layer
# reads, so they go with that layer (a Conv1D's EXPAND_DIMS, as a RESHAPE, with its
# CONV_2D: an int16 CONV_2D behind an int8 RESHAPE reads values already rounded to 8 bits).
PASS_THROUGH = frozenset({"RESHAPE", "MAX_POOL_2D", "TRANSPOSE", "PAD", "SQUEEZE",
                          "EXPAND_DIMS", "STRIDED_SLICE", "SLICE"})


def grouped_layers(rows: list[dict[str, Any]]) -> list[Layer]:
    """The quantizer's rows as the guard's layers: each op with the pass-through ops that
    feed it alone (walking back), in the rows' order; a pass-through op nothing claims is
    a layer of its own."""
    by_name = {r["node"]: r for r in rows}
    consumers: dict[str, int] = {}
    for row in rows:
        for name in row.get("inputs") or []:
            consumers[name] = consumers.get(name, 0) + 1
    claimed: set[str] = set()
    groups: dict[str, list[str]] = {}
    for row in rows:
        if row.get("op") in PASS_THROUGH:
            continue
        chain, inputs = [], list(row.get("inputs") or [])
        while len(inputs) == 1 and inputs[0] in by_name and consumers.get(inputs[0]) == 1 \
                and by_name[inputs[0]].get("op") in PASS_THROUGH:
            chain.append(inputs[0])
            inputs = list(by_name[inputs[0]].get("inputs") or [])
        groups[row["node"]] = [row["node"], *chain]
        claimed.update(chain)
    return [Layer(r["node"], tuple(groups.get(r["node"], [r["node"]])),
                  r.get("op") in LITERT_WEIGHT_OPS)
            for r in rows if r["node"] in groups or r["node"] not in claimed]


def bisect_layers(search: _Search, ranked: list[Layer], base: Settings, action: str,
                  start: Trial) -> Trial | None:
    """The trial with the smallest K such that `action` on ranked[:K] (on top of `base`)
    meets the budgets, given that K = len(ranked) does (`start`); None when no smaller K
    was found (or trials ran out)."""
    low, high, found = 0, len(ranked), None
    while high - low > 1 and not search.exhausted:
        middle = (low + high) // 2
        settings = base.with_nodes([n for layer in ranked[:middle] for n in layer.nodes],
                                   action)
        trial = search.attempt(settings, f"the {middle} layer(s) adding the most error -> "
                               f"{ACTION_WORDS[action]}")
        if trial is None:
            break
        search.decide([layer.name for layer in ranked[:middle]], action, start, trial,
                      "meets budgets" if trial.ok else "stepped back: budget not met")
        if trial.ok:
            high, found = middle, trial
        else:
            low = middle
    return found


def search_integer(search: _Search, baseline: Trial, ranked: list[Layer]) -> None:
    """Steps 1-3 of the module's docstring (the caller adds the dynamic-range trial and
    picks the chosen one)."""
    everything = [n for layer in ranked for n in layer.nodes]
    wide = Settings().with_nodes(everything, INT16)
    all_wide = search.attempt(wide, "every layer -> int16 activations (a16w8)")
    if all_wide is None:
        return
    search.decide(everything, INT16, baseline, all_wide,
                  "meets budgets" if all_wide.ok else "integer compute does not meet")
    if all_wide.ok:
        bisect_layers(search, ranked, Settings(), INT16, all_wide)
        return
    if not search.exhausted:  # K = all is the float model: assumed to meet, not run
        bisect_layers(search, ranked, wide, FLOAT, all_wide)


def fewest_out_of_int8(trials: list[Trial], size: Callable[[Trial], int]) -> Trial | None:
    """Of the trials that meet the budgets, the one with the fewest layers out of int8
    (float counts double), then the smallest."""
    met = [t for t in trials if t.ok]
    if not met:
        return None
    return min(met, key=lambda t: (len(t.settings.int16_layers)
                                   + 2 * len(t.settings.float_layers)
                                   + (1000 if not t.settings.eight_bit_ops else 0), size(t)))
