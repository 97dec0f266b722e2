"""What a quantizing stage lets the accuracy guard change: its knobs, declared by the stage.

The guard (orchestrator/guard/) is a generic search and names no stage and no param field.
A quantizing stage's `Stage.knobs` says what it may move:

- per layer, a ladder of precisions in cost order (int8 is where every layer starts; a
  rung further up computes wider and costs more): `Precision`;
- whole-stage alternatives tried when moving layers was not enough (bias correction off,
  other range percentiles): `Alternative`;
- the whole-model answer kept for last ("can 8-bit weights do it at all here?"):
  `Fallback`;
- how it finds its layers (`Knobs.layers`) and which search walks them.

Every stage (the quantizer and the stages around it: its weights, its ranges) says in
`Stage.candidate` how a `Candidate` changes its own params. A new quantization method is
then one stage module: its Params, its run, and these declarations.

The guard ranks layers by the per-layer rows a stage puts in its result's
`info["layer_errors"]`: each row has `node` (the op, as `Layer.nodes` names it), `op` and
`nmse` (the MSE against float over float's mean square, all earlier layers included);
optional: `rmse_over_scale` (the error in quantization steps: the report flags rows above
0.7 and sorts by it), `clipped_share` (values outside the range: range percentiles are
tried when it is high), `inputs` (the ops it reads, to rank by the error a layer adds),
`added_nmse`, `sqnr_db`. report.json, its page and MLflow show whichever are there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pydantic import BaseModel

    from orchestrator.model.artifact import ModelArtifact
    from orchestrator.spec.models import Tune


@dataclass(frozen=True)
class Precision:
    """A precision a layer can compute in. `cost`: what running a layer in it costs, by
    compute unit, 0 for int8 (higher is costlier; a DSP or NPU runs float on the CPU, so
    float costs most there)."""

    name: str   # the name in report.json's trial settings
    words: str  # on the console and the page
    integer: bool  # computes in integers (a weights-only layer computes in float)
    cost: Mapping[str, int] = field(default_factory=dict)

    def costs(self, unit: str = "cpu") -> int:
        return self.cost.get(unit, 0)


INT8 = Precision("int8", "int8", True, {"cpu": 0, "dsp": 0, "npu": 0})
# On a CPU, LiteRT runs int16 activations on its reference kernels, slower than float
# (the photo mini-Xception: 15.7 ms against 0.79 for int8), which is why the guard tries
# every int8 method (Knobs.methods) first there; among layer moves the ladder keeps its
# order (the bisection assumes each rung costs more than the one before).
INT16_ACTIVATIONS = Precision("int16_activations", "int16 activations (a16w8)", True,
                              {"cpu": 1, "dsp": 1, "npu": 1})
WEIGHTS_ONLY = Precision("weights_only", "weights-only 8-bit", False,
                         {"cpu": 2, "dsp": 4, "npu": 4})
FLOAT = Precision("float", "float", False, {"cpu": 2, "dsp": 4, "npu": 4})
# Listed in every trial's settings, even when empty: the two moves every backend knows.
ALWAYS_LISTED = (WEIGHTS_ONLY.name, FLOAT.name)


@dataclass(frozen=True)
class Layer:
    """What the guard moves as one: `name` (the weight op, or the lone op) and every node of
    it (a Conv2D with its BiasAdd and Relu: their quantize boundary is placed once)."""

    name: str
    nodes: tuple[str, ...]
    has_weights: bool


@dataclass(frozen=True)
class Candidate:
    """One point of the search: the precision of each moved node (the others stay where the
    recipe put them), whole-stage option values (None: the recipe's own), and `fallback`,
    the whole-model answer (no eight-bit op at all)."""

    moved: tuple[tuple[str, str], ...] = ()  # (node, precision name), sorted
    options: tuple[tuple[str, Any], ...] = ()  # (option, value), sorted
    fallback: bool = False

    def nodes_in(self, precision: str) -> tuple[str, ...]:
        return tuple(node for node, where in self.moved if where == precision)

    def option(self, name: str) -> Any:
        return dict(self.options).get(name)

    def with_nodes(self, nodes: Sequence[str], precision: str) -> Candidate:
        moved = {**dict(self.moved), **dict.fromkeys(nodes, precision)}
        return replace(self, moved=tuple(sorted(moved.items())))

    def with_option(self, name: str, value: Any) -> Candidate:
        return self.with_options(((name, value),))

    def with_options(self, options: Sequence[tuple[str, Any]]) -> Candidate:
        return replace(self, options=tuple(sorted({**dict(self.options),
                                                   **dict(options)}.items())))

    def cost(self, unit: str = "cpu") -> int:
        return sum(PRECISIONS[where].costs(unit) for _, where in self.moved)

    def describe(self, options: Sequence[str]) -> dict[str, Any]:
        """report.json's trial settings: the nodes per precision, then every option named
        (None where the recipe's own), then `eight_bit_ops: false` for the fallback."""
        listed = {name: list(self.nodes_in(name)) for name in ALWAYS_LISTED}
        listed |= {p: list(self.nodes_in(p)) for p in sorted({w for _, w in self.moved})
                   if p not in ALWAYS_LISTED}
        return {**listed, **{name: self.option(name) for name in options},
                **({"eight_bit_ops": False} if self.fallback else {})}


PRECISIONS = {p.name: p for p in (INT8, INT16_ACTIVATIONS, WEIGHTS_ONLY, FLOAT)}


@dataclass(frozen=True)
class Alternative:
    """A whole-stage knob: `values(params, tune, layer_errors)` lists what to try, in order,
    on top of the best candidate so far (empty: not worth trying here)."""

    option: str
    values: Callable[[Any, Tune, list[dict[str, Any]]], Sequence[Any]]
    change: Callable[[Any], str]  # the console's words for trying a value
    action: Callable[[Any], str]  # report.json's decision words


@dataclass(frozen=True)
class Method:
    """A whole-stage way to find int8's numbers (ranges chosen by error, learned rounding,
    trained ranges): `options` set on the stage's params keep every layer in int8, so a
    method that meets the budgets costs nothing at run time, only the seconds to find it.
    A stage lists its methods cheapest to find first; on a target whose int16 activations
    run on reference kernels (a CPU), the guard tries them all before any layer leaves
    int8."""

    name: str       # report.json's decision words: "ranges chosen by error"
    change: str     # the console's words for its trial
    options: tuple[tuple[str, Any], ...]
    # whether the ladder's wider rungs may build on it (the stage says why not: a method
    # too slow to run again for every trial, or one whose int8 ranges clip int16's)
    stacks: bool = True


@dataclass(frozen=True)
class Fallback:
    """The whole-model answer kept for the last trial: 8-bit weights, float compute.
    `needs`: a stage that must be in the pipeline for it (None: always possible)."""

    name: str           # "weights-only 8-bit"
    described: str      # "weights-only 8-bit (8-bit weights, float compute)"
    variant: str        # what none of the candidates was: "8-bit variant"
    change: str         # the console's words for its trial
    needs: str | None = None


@dataclass(frozen=True)
class LayerSource:
    """What a stage's `Knobs.layers` finds its layers in: its params, its own outcome's info
    (per-layer rows), and its input model (loaded on demand)."""

    params: Any
    info: Mapping[str, Any]
    input_model: Callable[[], ModelArtifact]


@dataclass(frozen=True)
class FoundLayers:
    """The layers a search moves, worst first once ranked, and each node's data inputs
    (how error flows, for ranking by the error a layer adds)."""

    layers: list[Layer]
    inputs_of: dict[str, list[str]] = field(default_factory=dict)
    # the rows the first ranking uses (None: the baseline trial's own layer errors)
    ranking_rows: list[dict[str, Any]] | None = None


SearchKind = Literal["revert", "bisect"]


@dataclass(frozen=True)
class Knobs:
    """A quantizing stage's declaration (see the module docstring).

    steers(params): whether this entry quantizes (a converter's float mode does not).
    guarded(params): whether the recipe asked for the guard on it (`tune:` asks for all).
    ladder: the precisions a layer moves through, cheapest first; a layer without weights
    skips the rungs in `weights_only`. needs: precision -> a stage that must be in the
    pipeline for that rung (weights-only needs the stage that makes 8-bit weights).
    search: "revert" takes the worst layers back a few at a time, re-ranking as it goes;
    "bisect" moves all layers a rung up, then bisects the number of worst layers that need
    it. kernels: what a full candidate computes with, for the verdict.
    guard_setting: the recipe line that turns the guard on, for the report's advice.
    shows_compute: trials list what the file computes in (its info's `computes_in`).
    methods: int8 methods (`Method`), cheapest to find first: tried before the ladder on a
    CPU target, after it on one whose DSP or NPU runs int16 activations natively.
    """

    layers: Callable[[LayerSource], FoundLayers]
    ladder: tuple[Precision, ...]
    kernels: str
    guard_setting: str
    fallback: Fallback
    steers: Callable[[Any], bool] = lambda params: True
    # a quantizing stage's params carry `guard: bool` (the recipe's `{guard: true}`)
    guarded: Callable[[Any], bool] = lambda params: bool(getattr(params, "guard", False))
    search: SearchKind = "revert"
    needs: Mapping[str, str] = field(default_factory=dict)
    weights_only: frozenset[str] = frozenset({WEIGHTS_ONLY.name})
    alternatives: tuple[Alternative, ...] = ()
    shows_compute: bool = False
    methods: tuple[Method, ...] = ()

    def rungs(self, stages: Sequence[str]) -> tuple[Precision, ...]:
        """The ladder this pipeline allows: a rung whose needed stage is missing is out."""
        return tuple(p for p in self.ladder if self.needs.get(p.name) in (None, *stages))


# How a candidate changes one stage's params: the new params, or None to leave the stage
# out of the candidate (the fallback has no range stages).
ApplyCandidate = Callable[["BaseModel", Candidate], "BaseModel | None"]


def with_params(params: BaseModel, **update: Any) -> BaseModel:
    """Params with changes, validated like the recipe's own."""
    return type(params).model_validate({**params.model_dump(), **update})
