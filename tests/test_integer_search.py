"""The guard's search on the LiteRT Quantizer's path (orchestrator.engine.integer_search),
on its own: layers grouped with the pass-through ops that feed them, the bisection for
the fewest layers that need int16 activations, and the choice among trials that meet."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.engine.guard import FLOAT, INT16, Layer, Settings
from orchestrator.engine.integer_search import (
    bisect_layers,
    fewest_out_of_int8,
    grouped_layers,
    search_integer,
)


def row(node: str, op: str, *inputs: str) -> dict[str, Any]:
    return {"node": node, "op": op, "inputs": list(inputs)}


def test_pass_through_ops_go_with_the_layer_they_feed() -> None:
    rows = [row("front", "CONV_2D", "audio"), row("squeeze", "RESHAPE", "front"),
            row("expand", "RESHAPE", "squeeze"), row("conv0", "CONV_2D", "expand"),
            row("shared", "RESHAPE", "conv0"), row("head_a", "FULLY_CONNECTED", "shared"),
            row("head_b", "FULLY_CONNECTED", "shared")]
    layers = {layer.name: layer for layer in grouped_layers(rows)}
    assert layers["conv0"].nodes == ("conv0", "expand", "squeeze")
    assert layers["front"].nodes == ("front",) and layers["front"].has_weights
    assert "squeeze" not in layers and "expand" not in layers
    assert layers["shared"].nodes == ("shared",)  # two layers read it: its own layer
    assert list(layers) == ["front", "conv0", "shared", "head_a", "head_b"]


@dataclass
class Trial:
    index: int
    settings: Settings
    ok: bool
    size_bytes: int = 100


@dataclass
class Search:
    """What the search functions use of the guard's _Search: each candidate meets the
    budget when `meets(settings)` says so."""

    meets: Any
    max_trials: int = 16
    trials: list[Trial] = field(default_factory=list)
    decisions: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def exhausted(self) -> bool:
        return len(self.trials) >= self.max_trials

    def attempt(self, settings: Settings, change: str) -> Trial:
        trial = Trial(len(self.trials) + 1, settings, self.meets(settings))
        self.trials.append(trial)
        return trial

    def decide(self, *args: Any) -> None:
        self.decisions.append(args)


def layers(count: int) -> list[Layer]:
    return [Layer(f"layer{i}", (f"layer{i}",), True) for i in range(count)]


def test_bisection_finds_the_fewest_int16_layers_in_log_trials() -> None:
    ranked = layers(32)
    critical = {"layer0", "layer13"}  # ranked 1st and 14th: K = 14 is the answer
    search = Search(lambda s: critical <= set(s.int16_layers))
    search_integer(search, Trial(0, Settings(), False), ranked)  # type: ignore[arg-type]
    first = search.trials[0]
    assert first.ok and len(first.settings.int16_layers) == 32  # every layer first
    chosen = fewest_out_of_int8(search.trials, lambda t: t.size_bytes)  # type: ignore[arg-type]
    assert chosen is not None
    assert set(chosen.settings.int16_layers) == {f"layer{i}" for i in range(14)}
    assert len(search.trials) <= 1 + 5  # all int16, then log2(32) bisection steps
    assert not any(t.settings.float_layers for t in search.trials)


def test_float_only_where_int16_everywhere_does_not_hold() -> None:
    ranked = layers(8)
    # only taking layer1 to float helps (int16 on it is not enough)
    search = Search(lambda s: "layer1" in s.float_layers)
    search_integer(search, Trial(0, Settings(), False), ranked)  # type: ignore[arg-type]
    assert not search.trials[0].ok
    chosen = fewest_out_of_int8(search.trials, lambda t: t.size_bytes)  # type: ignore[arg-type]
    assert chosen is not None
    assert set(chosen.settings.float_layers) == {"layer0", "layer1"}
    assert set(chosen.settings.int16_layers) == {f"layer{i}" for i in range(2, 8)}


def test_bisection_stops_when_trials_run_out() -> None:
    search = Search(lambda s: "layer0" in s.int16_layers, max_trials=2)
    found = bisect_layers(search, layers(64), Settings(), INT16,  # type: ignore[arg-type]
                          Trial(1, Settings(), True))  # type: ignore[arg-type]
    assert len(search.trials) == 2 and found is not None


def test_the_choice_prefers_integer_then_fewer_layers_then_size() -> None:
    int8 = Settings()
    trials = [Trial(1, int8.with_nodes(["a", "b", "c"], INT16), True, 90),
              Trial(2, int8.with_nodes(["a"], FLOAT), True, 80),
              Trial(3, int8.with_nodes(["a", "b"], INT16), True, 120),
              Trial(4, Settings(eight_bit_ops=False), True, 10),
              Trial(5, int8.with_nodes(["a"], INT16), False, 50)]
    chosen = fewest_out_of_int8(trials, lambda t: t.size_bytes)  # type: ignore[arg-type]
    assert chosen is trials[1] or chosen is trials[2]
    # one float layer counts as two int16 ones: a tie with trial 3, broken by size
    assert chosen is trials[1]
    assert fewest_out_of_int8([trials[4]], lambda t: t.size_bytes) is None  # type: ignore
