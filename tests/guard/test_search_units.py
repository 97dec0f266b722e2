"""The guard's searches on their own (orchestrator/guard/): the bisection for the fewest
layers that need a wider rung, and the choice among trials that meet the budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.guard.bisect import bisect_layers, climb_ladder
from orchestrator.guard.trials import Search as GuardSearch
from orchestrator.guard.trials import Trial as GuardTrial
from orchestrator.quant.knobs import FLOAT, INT16_ACTIVATIONS, Candidate, Layer

LADDER = (INT16_ACTIVATIONS, FLOAT)


@dataclass
class Trial:
    index: int
    candidate: Candidate
    ok: bool
    size_bytes: int = 100


@dataclass
class Search:
    """What the searches use of guard.trials.Search: each candidate meets the budget when
    `meets(candidate)` says so."""

    meets: Any
    max_trials: int = 16
    trials: list[Trial] = field(default_factory=list)
    decisions: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def exhausted(self) -> bool:
        return len(self.trials) >= self.max_trials

    def attempt(self, candidate: Candidate, change: str) -> Trial:
        trial = Trial(len(self.trials) + 1, candidate, self.meets(candidate))
        self.trials.append(trial)
        return trial

    def decide(self, *args: Any) -> None:
        self.decisions.append(args)


def layers(count: int) -> list[Layer]:
    return [Layer(f"layer{i}", (f"layer{i}",), True) for i in range(count)]


def wide(candidate: Candidate) -> set[str]:
    return set(candidate.nodes_in(INT16_ACTIVATIONS.name))


def best(trials: list[Trial], unit: str = "cpu") -> GuardTrial:
    """guard.trials.Search.best over real trials built from these, for a target whose
    precisions are priced on `unit`."""
    search = GuardSearch.__new__(GuardSearch)
    search.unit, search.target = unit, "phone"
    search.trials = [GuardTrial(t.index, t.candidate, [], {}, {}, [] if t.ok else ["no"],
                                0.0, "", t.size_bytes) for t in trials]
    return search.best()


def test_bisection_finds_the_fewest_wide_layers_in_log_trials() -> None:
    ranked = layers(32)
    critical = {"layer0", "layer13"}  # ranked 1st and 14th: K = 14 is the answer
    search = Search(lambda c: critical <= wide(c))
    climb_ladder(search, Trial(0, Candidate(), False), ranked, LADDER)  # type: ignore[arg-type]
    first = search.trials[0]
    assert first.ok and len(wide(first.candidate)) == 32  # every layer first
    assert wide(best(search.trials).candidate) == {f"layer{i}" for i in range(14)}
    assert len(search.trials) <= 1 + 5  # all int16, then log2(32) bisection steps
    assert not any(t.candidate.nodes_in(FLOAT.name) for t in search.trials)


def test_the_next_rung_only_where_the_first_everywhere_does_not_hold() -> None:
    ranked = layers(8)
    # only taking layer1 to float helps (int16 on it is not enough)
    search = Search(lambda c: "layer1" in c.nodes_in(FLOAT.name))
    climb_ladder(search, Trial(0, Candidate(), False), ranked, LADDER)  # type: ignore[arg-type]
    assert not search.trials[0].ok
    chosen = best(search.trials).candidate
    assert set(chosen.nodes_in(FLOAT.name)) == {"layer0", "layer1"}
    assert wide(chosen) == {f"layer{i}" for i in range(2, 8)}


def test_bisection_stops_when_trials_run_out() -> None:
    search = Search(lambda c: "layer0" in wide(c), max_trials=2)
    found = bisect_layers(search, layers(64), Candidate(), INT16_ACTIVATIONS,  # type: ignore[arg-type]
                          Trial(1, Candidate(), True))  # type: ignore[arg-type]
    assert len(search.trials) == 2 and found is not None


def test_the_choice_prices_precisions_on_the_targets_unit_then_size() -> None:
    int8 = Candidate()
    trials = [Trial(1, int8.with_nodes(["a", "b", "c"], INT16_ACTIVATIONS.name), True, 90),
              Trial(2, int8.with_nodes(["a"], FLOAT.name), True, 80),
              Trial(3, int8.with_nodes(["a", "b"], INT16_ACTIVATIONS.name), True, 120),
              Trial(4, Candidate(fallback=True), True, 10),
              Trial(5, int8.with_nodes(["a"], INT16_ACTIVATIONS.name), False, 50)]
    # on a CPU one float layer costs as much as two int16 ones: a tie with trial 3,
    # broken by size
    assert best(trials).index == 2
    # on an a16w8 accelerator float runs on the CPU beside it: two int16 layers are cheaper
    assert best(trials, unit="npu").index == 3
    # none meets: the closest to float (no metrics here: all equally far; the first)
    assert best([trials[4]]).index == 5


def test_a_candidate_moves_a_node_to_one_precision_and_lists_its_settings() -> None:
    candidate = Candidate().with_nodes(["b", "a"], INT16_ACTIVATIONS.name)
    candidate = candidate.with_nodes(["a"], FLOAT.name).with_option("percentile", 99.9)
    assert candidate.nodes_in(FLOAT.name) == ("a",)
    assert candidate.nodes_in(INT16_ACTIVATIONS.name) == ("b",)
    assert candidate.describe(["bias_correction", "percentile"]) == {
        "weights_only": [], "float": ["a"], "int16_activations": ["b"],
        "bias_correction": None, "percentile": 99.9}
    assert Candidate(fallback=True).describe([])["eight_bit_ops"] is False


def test_int8_methods_come_before_the_ladder_on_a_cpu_and_stop_at_the_first_that_holds(
        ) -> None:
    from orchestrator.guard.accuracy_guard import _try_methods
    from orchestrator.quant.knobs import Method

    methods = tuple(Method(name, name, ((name, True),)) for name in ("m1", "m2", "m3"))

    class MethodSearch(Search):
        knobs = type("K", (), {"methods": methods})

        def try_variation(self, current: Trial, candidate: Candidate, change: str,
                          action: str) -> Trial:
            trial = self.attempt(candidate, change)
            return trial if trial.ok else current

    search = MethodSearch(lambda c: c.option("m2") is True)
    chosen = _try_methods(search, Trial(0, Candidate(), False))  # type: ignore[arg-type]
    assert chosen.ok and dict(chosen.candidate.options) == {"m2": True}
    assert [dict(t.candidate.options) for t in search.trials] == [{"m1": True}, {"m2": True}]
    # each method on top of the start's candidate: its moved layers are kept
    start = Trial(0, Candidate().with_nodes(["a"], FLOAT.name), False)
    search = MethodSearch(lambda c: False)
    assert _try_methods(search, start) is start  # type: ignore[arg-type]
    assert all(t.candidate.nodes_in(FLOAT.name) == ("a",) for t in search.trials)
    assert len(search.trials) == 3


def test_only_an_a16w8_device_prices_int16_as_native() -> None:
    from orchestrator.spec.devices import PRESETS, Device

    assert {d.compute_unit for d in PRESETS.values()} == {"cpu"}
    npu = Device(flops_per_second=1e9, cores=1, ram_mb=64, a16w8=True)
    assert npu.compute_unit == "npu"
    assert FLOAT.costs("npu") > FLOAT.costs("cpu")


def test_the_ladder_climbs_from_the_closest_method_it_can_build_on() -> None:
    from orchestrator.guard.accuracy_guard import _ladder_start
    from orchestrator.quant.knobs import Method

    def trial(index: int, options: dict, closeness: float) -> GuardTrial:
        made = GuardTrial(index, Candidate().with_options(tuple(options.items())), [], {},
                          {"min_logit_sqnr_db": closeness}, ["no"], 1.0, "", 100)
        return made

    search = GuardSearch.__new__(GuardSearch)
    search.knobs = type("K", (), {"methods": (
        Method("ranges", "ranges", (("ranges", "mse"),)),
        Method("trained", "trained", (("fine_tune", True),), stacks=False))})
    baseline = trial(0, {}, 10.0)
    search.trials = [baseline, trial(1, {"ranges": "mse"}, 12.0),
                     trial(2, {"fine_tune": True}, 17.0)]
    # trained ranges were closest, but int16 on top of ranges trained for int8 clips
    assert _ladder_start(search, baseline).index == 1
    search.trials[1] = trial(1, {"ranges": "mse"}, 9.0)
    assert _ladder_start(search, baseline).index == 0


def test_among_equal_compute_the_fastest_within_noise_then_the_smallest_ships() -> None:
    def timed(index: int, ms: float, size: int) -> GuardTrial:
        outcome = type("O", (), {"metrics": {"est_latency_ms.phone": ms}})()
        return GuardTrial(index, Candidate(), [], {"b": outcome}, {}, [], 0.0, "", size)

    search = GuardSearch.__new__(GuardSearch)
    search.unit, search.target = "cpu", "phone"
    # 1.16 ms is within 10% of 1.08, and 1.08 of 1.00, but not 1.16 of the fastest
    search.trials = [timed(1, 1.00, 300), timed(2, 1.08, 200), timed(3, 1.16, 100)]
    assert search.best().index == 2
    assert "smaller: 200 bytes against 300" in search.why_chosen(search.best())
    search.trials = [timed(1, 1.00, 300), timed(2, 1.5, 100)]
    assert search.best().index == 1
    assert "faster on phone: 1 ms against 1.5 ms" in search.why_chosen(search.best())
