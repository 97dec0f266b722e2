"""The accuracy guard: a closed loop, like NNCF's accuracy control.

When an 8-bit pipeline breaks a target's quality budget (accuracy drop, fidelity, an
output's SQNR...), the guard takes layers back from eight bits until it meets them. A layer
is what a user means by one: a Conv2D/MatMul with the BiasAdd and Relu/Relu6 that follow it
(its quantize/dequantize boundary is placed once, around all of them), or a lone op such as
a MaxPool. Layers are ranked by how much error each adds (the per-layer errors
freeze_ranges measured against float, normalized MSE), or, without diagnostics, weight
layers first. Worst first, a layer (later a small group) at a time is taken back:

1. weights-only, for layers with weights: the layer computes in float from its 8-bit
   weights, which keeps most of the size gain (needs quantize_weights in the pipeline);
2. float: its weights stay float32 too.

Candidates are ranked and kept by a continuous measure that sees small moves: the lowest
over the outputs of the SQNR of their logits against float (evaluate's
`min_logit_sqnr_db`); a top-1 agreement or a thresholded figure is too coarse to rank
trials. A step is kept only when it moves that measure towards float by more than
NOISE_DB; the budget itself is judged by the recipe's own measure. After a few kept steps
the remaining layers are re-ranked from the latest trial's own errors; when single layers
stop helping, steps grow to small groups. When that is not enough, the best candidate is
tried with quantize_nodes' bias correction off, and, when activation ranges clip, with
other range percentiles.

The last trial is kept for the answer to "can 8 bits do it at all here?": every layer
weights-only (8-bit weights, float compute). When the eight-bit kernels cannot reach the
budget but that can, it is chosen and a one-line verdict says so; when neither can, the
verdict says that too, instead of a row of silent trials.

Each candidate is the same pipeline with changed params, so its unchanged prefix comes
from the cache, and every stage after quantize_nodes (log_ranges included) runs on that
candidate's own graph; it is evaluated by the pipeline's own `evaluate`, tracked as a
nested MLflow run, and tabled in report.json with every decision.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from orchestrator.engine.node_run import NodeOutcome, RunData
from orchestrator.engine.plan import Node, Plan, chain_nodes
from orchestrator.errors import OrchestratorError
from orchestrator.formatting import NOT_ON_CONSOLE, layer_name, shared_scope
from orchestrator.measure.budgets import (
    has_quality_budgets,
    quality_against_budgets,
    quality_headline,
    quality_shortfall,
    quality_violations,
)
from orchestrator.quant.layer_errors import worst_first
from orchestrator.quant.ranges import QUANTIZABLE_OPS, WEIGHT_OPS
from orchestrator.recipe.defaults import DEVICE_STAGE
from orchestrator.spec.models import Tune

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

# Re-rank the remaining layers from the latest trial's errors after this many kept steps.
RERANK_EVERY = 3
# After this many steps in a row that did not help, revert twice as many layers per step...
STALLED_STEPS = 2
# ... up to this many.
MAX_GROUP = 4
# A layer whose activations clip on more than this share of values makes range percentiles
# worth trying.
CLIPPING_WORTH_PERCENTILES = 0.01
# A candidate must move the continuous measure (dB) at least this much to count as better.
NOISE_DB = 0.05
# Ops that follow a Conv2D/MatMul into one layer, in this order...
LAYER_TAIL_OPS = ("BiasAdd", "Relu", "Relu6")
# ... also behind these, which only reshape (a Conv1D is ExpandDims, Conv2D, Squeeze).
PASS_THROUGH_OPS = ("Squeeze", "ExpandDims", "Identity")

# What a candidate without any eight-bit op leaves out: quantize_weights stays.
EIGHT_BIT_OP_STAGES = ("quantize_nodes", "log_ranges", "freeze_ranges")
# The LiteRT path's quantizer: its int8 mode keeps named ops float (float_nodes), and its
# weights-only counterpart is dynamic range (int8 weights, float activations).
LITERT_STAGE = "convert_tflite"
# The LiteRT Quantizer's stage: per layer, int8 -> int16 activations (a16w8) -> float; its
# weights-only counterpart is dynamic range too.
AEQ_STAGE = "quantize_tflite"
WIDE_SCHEME, DYNAMIC_SCHEME = "static_wi8_ai16", "dynamic_wi8_afp32"
# LiteRT ops whose weights make them a weight layer.
LITERT_WEIGHT_OPS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED",
                               "TRANSPOSE_CONV", "CONV_3D", "BATCH_MATMUL"})

WEIGHTS_ONLY = "weights_only"
FLOAT = "float"
INT16 = "int16_activations"
ACTION_WORDS = {WEIGHTS_ONLY: "weights-only 8-bit", FLOAT: "float",
                INT16: "int16 activations (a16w8)"}


@dataclass(frozen=True)
class Settings:
    """One candidate: nodes computed in float from 8-bit weights, nodes fully in float,
    and the range percentile."""

    weights_only: tuple[str, ...] = ()
    float_layers: tuple[str, ...] = ()
    int16_layers: tuple[str, ...] = ()  # LiteRT Quantizer: int16 activations, int8 weights
    percentile: float | None = None  # None: the recipe's own freeze_ranges setting
    no_bias_correction: bool = False  # True: quantize_nodes' bias correction turned off
    # False: no eight-bit op at all (quantize_nodes and its range stages left out)
    eight_bit_ops: bool = True

    def with_nodes(self, nodes: list[str], action: str) -> Settings:
        sets = {WEIGHTS_ONLY: set(self.weights_only) - set(nodes),
                FLOAT: set(self.float_layers) - set(nodes),
                INT16: set(self.int16_layers) - set(nodes)}
        sets[action].update(nodes)
        return replace(self, weights_only=tuple(sorted(sets[WEIGHTS_ONLY])),
                       float_layers=tuple(sorted(sets[FLOAT])),
                       int16_layers=tuple(sorted(sets[INT16])))

    def describe(self) -> dict[str, Any]:
        return {"weights_only": list(self.weights_only), "float": list(self.float_layers),
                **({"int16_activations": list(self.int16_layers)} if self.int16_layers
                   else {}),
                "percentile": self.percentile,
                "bias_correction": False if self.no_bias_correction else None,
                **({} if self.eight_bit_ops else {"eight_bit_ops": False})}


@dataclass(frozen=True)
class Layer:
    """What the guard takes back as one: `name` (the weight op, or the lone op) and every
    node of it."""

    name: str
    nodes: tuple[str, ...]
    has_weights: bool


def layers_of(graph: GraphDef, convertible: set[str]) -> list[Layer]:
    """The convertible nodes as layers, weight layers first (graph order): a Conv2D/MatMul
    takes the BiasAdd, then the Relu/Relu6, that are its only consumers (looking through a
    Squeeze or ExpandDims); every other convertible node is a layer of its own."""
    consumers: dict[str, list[str]] = {}
    for node in graph.node:
        for inp in node.input:
            consumers.setdefault(inp.split(":")[0].lstrip("^"), []).append(node.name)
    ops = {n.name: n.op for n in graph.node}
    taken: set[str] = set()
    layers = []
    for node in graph.node:
        if node.name not in convertible or node.op not in WEIGHT_OPS:
            continue
        members, tail, last = [node.name], list(LAYER_TAIL_OPS), node.name
        while len(consumers.get(last, [])) == 1:
            last = consumers[last][0]
            if ops[last] in PASS_THROUGH_OPS:  # a Conv1D's Squeeze: the layer goes on
                continue
            if ops[last] not in tail:
                break
            tail = tail[tail.index(ops[last]) + 1:]
            if last in convertible:  # (a BiasAdd left float for its kernel is passed)
                members.append(last)
        taken.update(members)
        layers.append(Layer(node.name, tuple(members), True))
    layers += [Layer(n.name, (n.name,), False) for n in graph.node
               if n.name in convertible and n.name not in taken]
    return layers


@dataclass
class Trial:
    index: int
    settings: Settings
    nodes: list[Node]
    outcomes: dict[str, NodeOutcome]
    metrics: dict[str, float]
    violations: list[str]
    shortfall: float
    headline: str
    size_bytes: int | None
    seconds: float = 0.0
    failed: bool = False
    # each quality budget's figure beside its bound ("output_0 SQNR 41.2 dB ≥ 39 dB")
    against: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.failed

    @property
    def closeness(self) -> float:
        """The continuous measure, higher is closer to float: the lowest logit SQNR over
        the outputs (dB); without it, the fidelity in dB of lost share."""
        if self.failed:
            return -math.inf
        value = self.metrics.get("min_logit_sqnr_db")
        if value is not None:
            return float(value)
        fidelity = self.metrics.get("fidelity")
        return -math.inf if fidelity is None else -10 * math.log10(max(1 - fidelity, 1e-12))

    def better_than(self, other: Trial) -> bool:
        """Meets the budgets, or is closer to float than `other` by more than noise."""
        return self.ok or self.closeness > other.closeness + NOISE_DB

    def layer_errors(self) -> list[dict[str, Any]]:
        for outcome in self.outcomes.values():
            if outcome.node.stage in ("freeze_ranges", LITERT_STAGE, AEQ_STAGE):
                return list(outcome.info.get("layer_errors") or [])
        return []

    @property
    def computes_in(self) -> str | None:
        """What the LiteRT Quantizer's file computes in (int8, int8+int16, ...)."""
        return next((o.info.get("computes_in") for o in self.outcomes.values()
                     if o.node.stage == AEQ_STAGE), None)

    def row(self) -> dict[str, Any]:
        errors = worst_first(self.layer_errors())
        closeness = self.closeness
        return {"trial": self.index, "settings": self.settings.describe(),
                "worst_layer": errors[0]["node"] if errors else None,
                "accuracy": self.metrics.get("accuracy"),
                "accuracy_drop": self.metrics.get("accuracy_drop"),
                "fidelity": self.metrics.get("fidelity"), "quality": self.headline,
                "budget_figures": list(self.against),
                "logit_sqnr_db": round(closeness, 3) if math.isfinite(closeness) else None,
                "shortfall": round(self.shortfall, 6), "size_bytes": self.size_bytes,
                **({"computes_in": self.computes_in} if self.computes_in else {}),
                "meets_budgets": self.ok, "violations": self.violations,
                "seconds": round(self.seconds, 3)}


def quantizer_nodes(nodes: list[Node]) -> list[Node]:
    """The nodes the guard steers: quantize_nodes, convert_tflite in int8 mode, or
    quantize_tflite."""
    return [n for n in nodes if n.stage in ("quantize_nodes", AEQ_STAGE) or (
        n.stage == LITERT_STAGE and getattr(n.params, "mode", None) == "int8")]


def guarded_pipelines(plan: Plan) -> list[str]:
    """Pipelines with `quantize_nodes: {guard: true}` or `convert_tflite: {mode: int8,
    guard: true}`, or all 8-bit ones under `tune:`."""
    recipe = plan.recipe.recipe
    tune_on = recipe.tune is not None and recipe.tune.enabled
    found = []
    for name, nodes in plan.pipelines.items():
        quantize = quantizer_nodes(nodes)
        if quantize and (tune_on or any(getattr(n.params, "guard", False) for n in quantize)):
            found.append(name)
    return found


def _has_quality_budget(plan: Plan) -> bool:
    return any(has_quality_budgets(t.budgets) for t in plan.recipe.recipe.targets)


def _with(params: BaseModel, **update: Any) -> BaseModel:
    """Params with changes, validated like the recipe's own."""
    return type(params).model_validate({**params.model_dump(), **update})


def _stages_with(nodes: list[Node], settings: Settings) -> list[tuple[str, BaseModel]]:
    """The pipeline's stages with the candidate's settings on top of the user's own."""
    stages: list[tuple[str, BaseModel]] = []
    for node in nodes:
        if not settings.eight_bit_ops and node.stage in EIGHT_BIT_OP_STAGES:
            continue
        if node.stage == DEVICE_STAGE:  # a board measures the chosen model, not each trial
            continue
        params = node.params
        own = list(getattr(params, "exclude_nodes", []) or [])
        if node.stage == "quantize_nodes":
            update: dict[str, Any] = {}
            if settings.weights_only or settings.float_layers:
                update["exclude_nodes"] = sorted(
                    {*own, *settings.weights_only, *settings.float_layers})
            if settings.no_bias_correction:
                update["bias_correction"] = False
            params = _with(params, **update) if update else params
        elif node.stage == LITERT_STAGE and getattr(params, "mode", None) == "int8":
            if not settings.eight_bit_ops:  # LiteRT's weights-only: dynamic range
                params = _with(params, mode="dynamic_range", float_nodes=[], float_ops=[])
            elif settings.float_layers:
                params = _with(params, float_nodes=sorted(
                    {*params.float_nodes, *settings.float_layers}))
        elif node.stage == AEQ_STAGE:
            params = _aeq_params(params, settings)
        elif node.stage == "quantize_weights" and settings.float_layers:
            params = _with(params, exclude_nodes=sorted({*own, *settings.float_layers}))
        elif node.stage == "freeze_ranges" and settings.percentile is not None:
            params = _with(params, min_percentile=settings.percentile,
                           max_percentile=settings.percentile)
        stages.append((node.stage, params))
    return stages


def _aeq_params(params: BaseModel, settings: Settings) -> BaseModel:
    """quantize_tflite's params for a candidate: the layers it moves, by exact name, on top
    of the recipe's own patterns; without eight-bit ops, dynamic range everywhere."""
    from orchestrator.quant.litert_quantizer import layer_pattern

    if not settings.eight_bit_ops:
        return _with(params, scheme=DYNAMIC_SCHEME, layers={})
    if not (settings.int16_layers or settings.float_layers):
        return params
    layers = dict(getattr(params, "layers", {}) or {})
    layers.update({layer_pattern(n): WIDE_SCHEME for n in settings.int16_layers})
    layers.update({layer_pattern(n): FLOAT for n in settings.float_layers})
    return _with(params, layers=layers)


def upstream_error(node: str, errors: Mapping[str, float],
                   inputs_of: Mapping[str, list[str]]) -> float:
    """The largest error among the nearest measured nodes that feed `node` (0.0 when only
    inputs and constants do): what it was given, before adding its own."""
    seen: set[str] = set()
    stack = list(inputs_of.get(node, []))
    worst = 0.0
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in errors:
            worst = max(worst, errors[name])
        else:
            stack.extend(inputs_of.get(name, []))
    return worst


def rank_layers(layer_errors: list[dict[str, Any]], layers: list[Layer], done: set[str],
                inputs_of: Mapping[str, list[str]] | None = None) -> list[Layer]:
    """Layers still in 8 bits, worst first. With diagnostics: by the normalized MSE a layer
    adds to what it was given (errors pile up downstream, so a layer after a bad one looks
    bad too), then by its own, the worst node of the layer counting; layers without a
    measured node keep their order after the measured ones. Else in the given order
    (weight layers first)."""
    remaining = [layer for layer in layers if layer.name not in done]
    if not layer_errors:
        return remaining
    errors = {row["node"]: row.get("nmse") or 0.0 for row in layer_errors}

    def score(layer: Layer) -> tuple[bool, float, float]:
        measured = [n for n in layer.nodes if n in errors]
        if not measured:
            return (False, 0.0, 0.0)
        added = max(max(errors[n] - upstream_error(n, errors, inputs_of or {}), 0.0)
                    for n in measured)
        return (True, added, max(errors[n] for n in measured))

    return sorted(remaining, key=score, reverse=True)  # stable: ties keep their order


class _Search:
    """The state of one pipeline's search: its trials and decisions."""

    def __init__(self, name: str, plan: Plan, data: RunData, nodes: list[Node],
                 submit: Callable[[Node], NodeOutcome], tune: Tune,
                 on_trial: Callable[[str, dict[str, Any]], Any] | None) -> None:
        self.name, self.plan, self.data, self.nodes = name, plan, data, nodes
        self.submit, self.tune, self.on_trial = submit, tune, on_trial
        self.trials: list[Trial] = []
        self.decisions: list[dict[str, Any]] = []
        self.seen: set[str] = {nodes[-1].key}
        self.started = time.monotonic()
        parent = plan.recipe.recipe.pipelines[name].from_
        self.previous = plan.pipelines[parent][-1].id if parent and plan.pipelines[parent] \
            else None
        self.float_key = plan.final_float_key(parent)
        self.layers: list[Layer] = []
        self.inputs_of: dict[str, list[str]] = {}  # float graph: node -> its data inputs
        self.prefix = ""  # the scope all layer names share (formatting.shared_scope)
        self.reserved = 0  # trials kept back for the weights-only answer
        self.litert = any(n.stage in (LITERT_STAGE, AEQ_STAGE) for n in quantizer_nodes(nodes))
        self.keeps_integer = False  # the LiteRT Quantizer: orchestrator.engine.integer_search

    @property
    def exhausted(self) -> bool:
        return (len(self.trials) > self.tune.max_trials - self.reserved
                or time.monotonic() - self.started > self.tune.timeout_s)

    def measure(self, index: int, settings: Settings, nodes: list[Node],
                outcomes: dict[str, NodeOutcome], seconds: float) -> Trial:
        metrics: dict[str, float] = {}
        for node in nodes:
            if node.stage == "evaluate":
                metrics.update(outcomes[node.id].metrics)
        targets = self.plan.recipe.recipe.targets
        violations = [f"{t.name}: {v}" for t in targets
                      for v in quality_violations(metrics, t.budgets)]
        shortfall = sum(quality_shortfall(metrics, t.budgets) for t in targets)
        headline = quality_headline(metrics, targets[0].budgets) if targets else ""
        budgeted = [t for t in targets if has_quality_budgets(t.budgets)]
        against: list[str] = []
        for target in budgeted:
            for figure in quality_against_budgets(metrics, target.budgets):
                text = f"{target.name}: {figure}" if len(budgeted) > 1 else figure
                if text not in against:
                    against.append(text)
        transforms = [n for n in nodes if n.kind == "transform"]
        size = (self.data.model_facts(transforms[-1].output_model_key).get("size_bytes")
                if transforms else None)
        return Trial(index, settings, nodes, outcomes, metrics, violations, shortfall,
                     headline, size, seconds, against=against)

    def best(self) -> Trial:
        """The first candidate that meets the budgets (on the LiteRT Quantizer's path, the
        one with the fewest layers out of int8), else the one closest to float."""
        if self.keeps_integer:
            from orchestrator.engine.integer_search import fewest_out_of_int8

            chosen = fewest_out_of_int8(self.trials, lambda t: t.size_bytes or 0)
            if chosen is not None:
                return chosen
        return next((t for t in self.trials if t.ok), None) or max(
            self.trials, key=lambda t: t.closeness)

    def attempt(self, settings: Settings, change: str) -> Trial | None:
        """Run one candidate (None when it is the same as one already tried)."""
        stages = _stages_with(self.nodes, settings)
        index = len(self.trials)
        nodes = chain_nodes(self.name, stages, self.plan.start_keys[self.name], self.previous,
                            self.plan.fingerprints, trial=index,
                            base_dir=self.plan.recipe.base_dir, float_model_key=self.float_key)
        if nodes[-1].key in self.seen:
            return None
        self.seen.add(nodes[-1].key)
        started = time.monotonic()
        try:
            outcomes = {n.id: self.submit(n) for n in nodes}
        except OrchestratorError as exc:  # a candidate that cannot be built is a failed trial
            trial = Trial(index, settings, nodes, {}, {}, [f"trial failed: {exc}"],
                          float("inf"), "failed", None, time.monotonic() - started, failed=True)
        else:
            trial = self.measure(index, settings, nodes, outcomes, time.monotonic() - started)
        self.trials.append(trial)
        if self.on_trial is not None:
            best = self.best()
            row = trial.row()
            # the budgeted figures beside their bounds, then the measure the guard ranks
            # trials by (a logit SQNR far below an output's budgeted SQNR is no failure)
            quality = ("; ".join(trial.against) or row["quality"]) + (
                "" if row["logit_sqnr_db"] is None
                else f"; ranked by logit SQNR {row['logit_sqnr_db']:.1f} dB")
            # a trial whose every stage came from the cache ran nothing: the console sums
            # such trials up in one line (on_guard_end) instead of replaying them
            cached = bool(trial.outcomes) and all(o.cached for o in trial.outcomes.values())
            self.on_trial(self.name, {**row, "quality": quality, "metrics": trial.metrics,
                                      "of": self.tune.max_trials, "change": change,
                                      "cached": cached,
                                      "best": f"trial {best.index}: {best.headline}"})
        return trial

    def decide(self, layers: list[str], action: str, before: Trial, trial: Trial | None,
               outcome: str) -> None:
        self.decisions.append({
            "step": len(self.decisions) + 1, "layers": layers, "action": action,
            "trial": None if trial is None else trial.index,
            "quality_before": before.headline,
            "quality_after": None if trial is None else trial.headline,
            "logit_sqnr_db_before": _finite(before.closeness),
            "logit_sqnr_db_after": None if trial is None else _finite(trial.closeness),
            "size_after_bytes": None if trial is None else trial.size_bytes,
            "outcome": outcome})

    def try_variation(self, current: Trial, settings: Settings, change: str, action: str
                      ) -> Trial:
        """One candidate that is not about layers; the better of it and `current`."""
        trial = self.attempt(settings, change)
        if trial is None:
            return current
        better = trial.better_than(current)
        self.decide([], action, current, trial, "meets budgets" if trial.ok else
                    "kept: closer to float" if better else "stepped back: no closer")
        return trial if better else current

    def try_without_bias_correction(self, current: Trial) -> Trial:
        """Bias correction shifts biases by a mean measured on float activations; where
        activation rounding dominates it can cost more than it saves: measure it off."""
        return self.try_variation(current, replace(current.settings, no_bias_correction=True),
                                  "bias correction off", "bias correction off")

    def try_percentiles(self, current: Trial) -> Trial:
        errors = current.layer_errors()
        clipping = max((row.get("clipped_share") or 0.0 for row in errors), default=1.0)
        if clipping <= CLIPPING_WORTH_PERCENTILES:
            return current
        for percentile in self.tune.percentiles:
            if self.exhausted or current.ok:
                break
            current = self.try_variation(
                current, replace(current.settings, percentile=percentile),
                f"range percentile {percentile:g}", f"percentile {percentile:g}")
        return current

    def try_weights_only_everywhere(self, best: Trial) -> Trial | None:
        """The answer to "can 8-bit weights do it here at all": every layer computes in
        float from its 8-bit weights (quantize_nodes converts nothing)."""
        settings = Settings(eight_bit_ops=False)
        trial = self.attempt(settings, "every layer -> weights-only 8-bit"
                             f"{' (dynamic range)' if self.litert else ''}")
        if trial is not None:
            self.decide([layer.name for layer in self.layers], "every layer weights-only", best,
                        trial, "meets budgets" if trial.ok else "no 8-bit candidate meets")
        return trial

    def revert_layers(self, current: Trial, weights_only_possible: bool) -> None:
        """Passes over the layers still in 8 bits, worst first. A pass ends when its queue
        is used up or after RERANK_EVERY kept steps (the errors moved: rank again); a pass
        in which nothing helped doubles the group size for the next."""
        reverted: set[str] = set()
        group = 1
        while not current.ok and not self.exhausted:
            queue = rank_layers(current.layer_errors(), self.layers, reverted, self.inputs_of)
            if not queue:
                return
            size, kept, stalled = len(queue), 0, 0
            while queue and not current.ok and not self.exhausted and kept < RERANK_EVERY:
                layers, queue = queue[:group], queue[group:]
                trial = self.step(current, layers, weights_only_possible
                                  and any(layer.has_weights for layer in layers))
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

    def all_weights_float(self, settings: Settings) -> bool:
        """Whether no weight layer would compute in eight bits: that is the float pipeline,
        or the weights-only-everywhere answer, not a candidate of the layer search."""
        weights = {n for layer in self.layers if layer.has_weights for n in layer.nodes}
        return bool(weights) and weights <= {*settings.float_layers, *settings.weights_only}

    def short_names(self, layers: list[Layer], limit: int = 3) -> str:
        """Layer names for a console line, shortened as everywhere (formatting.layer_name:
        a LiteRT op fused from several graph nodes is named by its first, without the
        scope all layers share)."""
        names = [layer_name(layer.name, self.prefix) for layer in layers[:limit]]
        return ", ".join(names) + (f" and {len(layers) - limit} more"
                                   if len(layers) > limit else "")

    def step(self, current: Trial, layers: list[Layer], weights_only_first: bool
             ) -> Trial | None:
        """Take `layers` back from 8 bits (weights-only first when some have weights: a
        weight-less layer in the group goes float); the trial that was closer to float
        than `current`, or None when none was (stepped back)."""
        nodes = [n for layer in layers for n in layer.nodes]
        for action in ([WEIGHTS_ONLY, FLOAT] if weights_only_first else [FLOAT]):
            if self.exhausted:
                return None
            settings = current.settings
            for layer in layers:
                settings = settings.with_nodes(
                    list(layer.nodes), action if layer.has_weights else FLOAT)
            if self.all_weights_float(settings):  # not a full 8-bit candidate:
                # a smaller group may still leave a weight layer in eight bits
                return self.step(current, layers[:-1], weights_only_first) \
                    if len(layers) > 1 else None
            change = f"{self.short_names(layers)} -> {ACTION_WORDS[action]}"
            trial = self.attempt(settings, change)
            if trial is None:
                continue
            if trial.better_than(current):
                self.decide(nodes, action, current, trial,
                            "meets budgets" if trial.ok else "kept: closer to float")
                return trial
            self.decide(nodes, action, current, trial,
                        "failed" if trial.failed else "stepped back: no closer")
        return None


def _finite(value: float) -> float | None:
    return round(value, 3) if math.isfinite(value) else None


@dataclass
class GuardResult:
    """The pipeline's nodes and outcomes as the guard chose them, its trials table (trial 0
    is the recipe's own settings), its decisions, and a one-line verdict when the search
    ended without a full 8-bit candidate that meets the budgets. The caller puts the nodes
    into its plan."""

    nodes: list[Node]
    outcomes: dict[str, NodeOutcome]
    trials: list[dict[str, Any]]
    decisions: list[dict[str, Any]] = field(default_factory=list)
    verdict: str | None = None


def _verdict(best_full: Trial, everywhere: Trial | None,
             weights_only_possible: bool, litert: bool = False) -> str:
    """What the search found, in one line, when no full 8-bit candidate met the budgets."""
    kernels = "LiteRT's int8 model" if litert else "the GraphDef eight-bit kernels"
    if best_full.computes_in is not None:  # the LiteRT Quantizer's search
        kernels = ("an integer LiteRT file (int8, int16 activations where needed, float "
                   "only where neither held)")
    full = (f"{kernels} cannot reach the budget here (closest: trial "
            f"{best_full.index}, {best_full.headline}, logits {best_full.closeness:.1f} dB)")
    if litert:
        weights = "LiteRT dynamic range (int8 weights, float activations)"
        if everywhere is None:
            return f"{full}; {weights} was not tried (tune.timeout_s ran out)"
        if everywhere.ok:
            return (f"{full}; {weights} can: {everywhere.headline}, "
                    f"{everywhere.size_bytes:,} bytes (trial {everywhere.index}), chosen")
        return (f"{full}, and {weights} cannot either ({everywhere.headline}): no 8-bit "
                "LiteRT variant of this model meets the budget; keep it in float")
    if not weights_only_possible:
        return (f"{full}; add quantize_weights to the pipeline to let the guard try "
                "weights-only 8-bit")
    if everywhere is None:
        return f"{full}; weights-only 8-bit was not tried (tune.timeout_s ran out)"
    if everywhere.ok:
        return (f"{full}; weights-only 8-bit (8-bit weights, float compute) can: "
                f"{everywhere.headline}, {everywhere.size_bytes:,} bytes (trial "
                f"{everywhere.index}), chosen")
    return (f"{full}, and weights-only 8-bit cannot either ({everywhere.headline}): "
            "no 8-bit variant of this model meets the budget; keep it in float")


def guard_pipeline(name: str, plan: Plan, data: RunData, outcomes: Mapping[str, NodeOutcome],
                   submit: Callable[[Node], NodeOutcome], tune: Tune,
                   on_trial: Callable[[str, dict[str, Any]], Any] | None = None
                   ) -> GuardResult:
    """Search for settings that meet the budgets; the best candidate's nodes, never a
    change to `plan` or `outcomes`."""
    nodes = plan.pipelines[name]
    search = _Search(name, plan, data, nodes, submit, tune, on_trial)
    baseline = search.measure(0, Settings(), nodes, {n.id: outcomes[n.id] for n in nodes}, 0.0)
    search.trials.append(baseline)
    if not any(n.stage == "evaluate" for n in nodes):
        baseline.violations.append("the guard needs an evaluate stage in the pipeline")
        return GuardResult(nodes, baseline.outcomes, [_chosen(baseline.row())])
    if baseline.ok or not _has_quality_budget(plan):  # the recipe's own settings: chosen
        return GuardResult(nodes, baseline.outcomes, [_chosen(baseline.row())])
    quantize = quantizer_nodes(nodes)[0]
    if quantize.stage in (LITERT_STAGE, AEQ_STAGE):
        return _guard_litert(search, baseline, outcomes[quantize.id], tune)
    graph = data.load_model(quantize.input_model_key).graph_def
    allowed = getattr(quantize.params, "ops", None) or QUANTIZABLE_OPS
    excluded = set(getattr(quantize.params, "exclude_nodes", []) or [])
    excluded |= {row["node"] for row in outcomes[quantize.id].info.get("float_nodes") or []}
    convertible = {n.name for n in graph.node if n.op in allowed and n.name not in excluded}
    search.layers = layers_of(graph, convertible)
    search.prefix = shared_scope([layer.name for layer in search.layers])
    search.inputs_of = {n.name: [i.split(":")[0] for i in n.input if not i.startswith("^")]
                        for n in graph.node}
    weights_only_possible = any(n.stage == "quantize_weights" for n in nodes)
    search.reserved = 1 if weights_only_possible else 0
    search.revert_layers(baseline, weights_only_possible)
    best = search.best()
    if not best.ok and getattr(quantize.params, "bias_correction", False) \
            and not search.exhausted:  # layers alone did not do it
        best = search.try_without_bias_correction(best)
    if not best.ok:  # maybe the ranges clip
        search.try_percentiles(best)
    best = search.best()
    return _conclude(search, best, tune, weights_only_possible)


def _conclude(search: _Search, best: Trial, tune: Tune, weights_only_possible: bool,
              litert: bool = False) -> GuardResult:
    """When no full 8-bit candidate met the budgets: the reserved weights-only trial and
    the verdict; then the result with the chosen trial marked."""
    verdict = None
    if not best.ok:
        everywhere = None
        if weights_only_possible and time.monotonic() - search.started <= tune.timeout_s:
            search.reserved = 0
            everywhere = search.try_weights_only_everywhere(best)
        verdict = _verdict(best, everywhere, weights_only_possible, litert)
        best = search.best()
    rows = [_chosen(t.row(), t.index == best.index) for t in search.trials]
    return GuardResult(best.nodes, best.outcomes, rows, search.decisions, verdict)


def _chosen(row: dict[str, Any], chosen: bool = True) -> dict[str, Any]:
    """A trials-table row with its `chosen` mark: every row has one, a lone trial too."""
    return {**row, "chosen": chosen}


def _guard_litert(search: _Search, baseline: Trial, converted: NodeOutcome, tune: Tune
                  ) -> GuardResult:
    """The LiteRT path: layers are the int8 model's ops the quantization debugger measured
    (convert_tflite's layer_errors), each taken back to float through float_nodes, worst
    own error first; the reserved last trial is dynamic range."""
    rows = list(converted.info.get("layer_errors") or [])
    search.layers = [Layer(r["node"], (r["node"],), r.get("op") in LITERT_WEIGHT_OPS)
                     for r in rows if r.get("op") not in ("QUANTIZE", "DEQUANTIZE")]
    search.prefix = shared_scope([layer.name for layer in search.layers])
    search.reserved = 1
    if converted.node.stage == AEQ_STAGE:  # the quantizer's rows name each layer's inputs
        from orchestrator.engine.integer_search import grouped_layers, search_integer

        search.layers = grouped_layers(rows)
        search.inputs_of = {r["node"]: list(r.get("inputs") or []) for r in rows}
        search.keeps_integer = True
        search_integer(search, baseline, rank_layers(rows, search.layers, set(),
                                                     search.inputs_of))
    else:
        search.revert_layers(baseline, weights_only_possible=False)
    return _conclude(search, search.best(), tune, weights_only_possible=True, litert=True)


def apply_guard(name: str, plan: Plan, data: RunData, outcomes: Mapping[str, NodeOutcome],
                submit: Callable[[Node], NodeOutcome],
                on_trial: Callable[[str, dict[str, Any]], Any] | None = None
                ) -> GuardResult | None:
    """Run the guard on pipeline `name` if it is guarded, else None."""
    if name not in guarded_pipelines(plan):
        return None
    tune = plan.recipe.recipe.tune or Tune()
    result = guard_pipeline(name, plan, data, outcomes, submit, tune, on_trial)
    if result.verdict:  # the console shows it with the variant's warnings
        log.warning("%s: %s", name, result.verdict, extra=NOT_ON_CONSOLE)
    _measure_chosen_on_boards(name, plan, result, submit)
    return result


def _measure_chosen_on_boards(name: str, plan: Plan, result: GuardResult,
                              submit: Callable[[Node], NodeOutcome]) -> None:
    """Trials are not measured on the targets' boards (each would cost a board's time):
    where the guard chose a trial, its model is measured on them now, as the pipeline's
    own measure_on_device stages would have measured the recipe's."""
    boards = [n for n in plan.pipelines[name] if n.stage == DEVICE_STAGE]
    if not boards or any(n.stage == DEVICE_STAGE for n in result.nodes):
        return
    last = result.nodes[-1]
    made = [n for n in result.nodes if n.kind == "transform"]
    model_key = made[-1].output_model_key if made else plan.start_keys[name]
    chained = chain_nodes(name, [(n.stage, n.params) for n in boards], model_key, last.id,
                          plan.fingerprints, trial=last.trial,
                          base_dir=plan.recipe.base_dir, float_model_key=last.float_model_key)
    for offset, node in enumerate(chained):
        index = len(result.nodes)  # after the chosen trial's own stages
        node = replace(node, index=index, id=node.id.replace(
            f"/{offset}:", f"/{index}:", 1), depends_on=result.nodes[-1].id)
        result.outcomes[node.id] = submit(node)
        result.nodes.append(node)
