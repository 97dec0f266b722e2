"""How each stage writes a guard candidate into its own params (its `Stage.candidate`), and
the revert search's steps on a stand-in search: what the old guard's if-chain over stage
names did, now one declaration per stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.guard.revert import revert_layers
from orchestrator.quant.knobs import FLOAT, WEIGHTS_ONLY, Candidate, Knobs, Layer
from orchestrator.stages import get_stage

MOVED = Candidate().with_nodes(["a"], WEIGHTS_ONLY.name).with_nodes(["b"], FLOAT.name)


def candidate_params(stage: str, candidate: Candidate, **params: Any) -> Any:
    record = get_stage(stage)
    assert record.candidate is not None, stage
    return record.candidate(record.params(**params), candidate)


def test_the_graphdef_quantizer_and_its_neighbours() -> None:
    quantize = candidate_params("quantize_nodes", MOVED.with_option("bias_correction", False),
                                exclude_nodes=["own"], bias_correction=True)
    assert quantize.exclude_nodes == ["a", "b", "own"] and quantize.bias_correction is False
    weights = candidate_params("quantize_weights", MOVED, exclude_nodes=["own"])
    assert weights.exclude_nodes == ["b", "own"]  # weights-only layers keep 8-bit weights
    ranges = candidate_params("freeze_ranges", MOVED.with_option("percentile", 1.0))
    assert ranges.min_percentile == ranges.max_percentile == 1.0
    assert candidate_params("freeze_ranges", MOVED) == get_stage("freeze_ranges").params()
    # the fallback (no eight-bit op): the quantizer and its range stages are left out
    fallback = Candidate(fallback=True)
    for stage in ("quantize_nodes", "log_ranges", "freeze_ranges"):
        assert candidate_params(stage, fallback) is None, stage
    assert candidate_params("quantize_weights", fallback) == get_stage("quantize_weights").params()


def test_the_litert_quantizers() -> None:
    converter = candidate_params("convert_tflite", MOVED, mode="int8", float_nodes=["own"])
    assert converter.float_nodes == ["b", "own"]  # float layers only: it has no other rung
    dynamic = candidate_params("convert_tflite", Candidate(fallback=True), mode="int8",
                               float_nodes=["own"], float_ops=["MEAN"])
    assert dynamic.mode == "dynamic_range" and not dynamic.float_nodes and not dynamic.float_ops
    float16 = get_stage("convert_tflite").params(mode="float16")
    assert get_stage("convert_tflite").candidate(float16, MOVED) == float16  # not its mode
    wide = Candidate().with_nodes(["x"], "int16_activations").with_nodes(["y"], FLOAT.name)
    quantizer = candidate_params("quantize_tflite", wide, layers={"own/": "float"})
    assert quantizer.layers == {"own/": "float", "^x;": "static_wi8_ai16", "^y;": "float"}
    everywhere = candidate_params("quantize_tflite", Candidate(fallback=True),
                                  layers={"own/": "float"})
    assert everywhere.scheme == "dynamic_wi8_afp32" and everywhere.layers == {}


@dataclass
class Trial:
    candidate: Candidate
    ok: bool
    closeness: float

    def better_than(self, other: Trial) -> bool:
        return self.ok or self.closeness > other.closeness + 0.05

    def layer_errors(self) -> list[dict[str, Any]]:
        return []  # no diagnostics: layers in the given order (weight layers first)

    @property
    def failed(self) -> bool:
        return False


@dataclass
class Search:
    """What revert_layers uses of guard.trials.Search; `score(candidate)` says how close to
    float a candidate is, and it meets the budget at `meets` or above."""

    score: Any
    meets: float
    layers: list[Layer]
    knobs: Knobs = field(default_factory=lambda: get_stage("quantize_nodes").knobs)
    inputs_of: dict[str, list[str]] = field(default_factory=dict)
    prefix: str = ""
    tried: list[tuple[Candidate, str]] = field(default_factory=list)
    decisions: list[tuple[Any, ...]] = field(default_factory=list)
    exhausted: bool = False

    def attempt(self, candidate: Candidate, change: str) -> Trial:
        self.tried.append((candidate, change))
        score = self.score(candidate)
        return Trial(candidate, score >= self.meets, score)

    def decide(self, layers: list[str], action: str, *rest: Any) -> None:
        self.decisions.append((tuple(layers), action, rest[-1]))


def test_revert_tries_weights_only_first_and_takes_lone_ops_to_float() -> None:
    layers = [Layer("conv", ("conv", "bias"), True), Layer("pool", ("pool",), False),
              Layer("dense", ("dense",), True)]
    # only dense in float helps; weights-only on it is not enough
    search = Search(lambda c: 10.0 if "dense" in c.nodes_in(FLOAT.name) else 0.0, 5.0, layers)
    rungs = (WEIGHTS_ONLY, FLOAT)
    revert_layers(search, Trial(Candidate(), False, 0.0), rungs)  # type: ignore[arg-type]
    steps = [(d[0], d[1]) for d in search.decisions]
    # conv: weights-only, then float, neither helps; pool skips the weights-only rung
    assert steps[:3] == [(("conv", "bias"), "weights_only"), (("conv", "bias"), "float"),
                         (("pool",), "float")]
    assert steps[-1] == (("dense",), "float") and search.decisions[-1][2] == "meets budgets"
    assert search.tried[-1][0].nodes_in(FLOAT.name) == ("dense",)
    assert all(" -> " in change for _, change in search.tried)


def test_revert_without_the_weights_rung_and_groups_after_stalls() -> None:
    layers = [Layer(f"l{i}", (f"l{i}",), True) for i in range(4)]
    # only l0 and l1 in float together help
    search = Search(lambda c: 10.0 if {"l0", "l1"} <= set(c.nodes_in(FLOAT.name)) else 0.0,
                    5.0, layers)
    revert_layers(search, Trial(Candidate(), False, 0.0), (FLOAT,))  # type: ignore[arg-type]
    assert search.decisions[-1][2] == "meets budgets"
    assert {"l0", "l1"} <= set(search.tried[-1][0].nodes_in(FLOAT.name))
    assert all(d[1] == "float" for d in search.decisions)
    assert any(len(d[0]) > 1 for d in search.decisions)  # single layers stalled: groups
