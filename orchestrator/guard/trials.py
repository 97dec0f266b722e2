"""One guarded pipeline's search state: its trials, how each is judged, and its decisions.

A trial is the pipeline with a candidate's params (each stage's `Stage.candidate`), so its
unchanged prefix comes from the cache; it is judged by the pipeline's own quality stages
(`Stage.judges_quality`) against the recipe's budgets. Candidates are ranked by a
continuous measure that sees small moves: the lowest over the outputs of the SQNR of their
logits against float (`min_logit_sqnr_db`); a top-1 agreement or a thresholded figure is
too coarse to rank trials. A step counts only when it moves that measure towards float by
more than NOISE_DB.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from orchestrator.engine.node_run import NodeOutcome, RunData
from orchestrator.engine.plan import Node, Plan, chain_nodes
from orchestrator.errors import OrchestratorError
from orchestrator.measure.budgets import (
    has_quality_budgets,
    quality_against_budgets,
    quality_headline,
    quality_shortfall,
    quality_violations,
)
from orchestrator.quant.knobs import PRECISIONS, Candidate, Knobs, Layer
from orchestrator.quant.layer_errors import worst_first
from orchestrator.spec.devices import resolve_device
from orchestrator.spec.models import Tune
from orchestrator.stages import all_stages, get_stage

# A candidate must move the continuous measure (dB) at least this much to count as better.
NOISE_DB = 0.05
# The fallback (no eight-bit op at all) costs more than any mix of layer precisions.
FALLBACK_COST = 1000
# Two trials' latencies closer than this ratio are the same speed (host timings' noise).
LATENCY_NOISE = 1.1


def option_names() -> list[str]:
    """Every whole-stage knob the registered quantizers declare: each trial's settings list
    them all (None where the recipe's own), so the trials table has the same columns
    whatever the backend."""
    names: list[str] = []
    for stage in all_stages():
        knobs = stage.knobs
        declared = [] if knobs is None else [
            *(a.option for a in knobs.alternatives),
            *(option for method in knobs.methods for option, _ in method.options)]
        names += [name for name in dict.fromkeys(declared) if name not in names]
    return names


@dataclass
class Trial:
    index: int
    candidate: Candidate
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
    computes_in: str | None = None  # what the file computes in, where the knobs show it

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

    def cost(self, unit: str = "cpu") -> int:
        """What the candidate's compute costs on `unit`: its moved layers, the fallback
        most."""
        return self.candidate.cost(unit) + (FALLBACK_COST if self.candidate.fallback else 0)

    def latency_ms(self, target: str) -> float | None:
        """The trial's latency on `target`: the benchmark's estimate for it, else this
        host's p50 (None when the pipeline has no benchmark)."""
        for outcome in self.outcomes.values():
            value = outcome.metrics.get(f"est_latency_ms.{target}")
            if value is not None:
                return float(value)
        return next((float(o.metrics["latency_p50_ms"]) for o in self.outcomes.values()
                     if "latency_p50_ms" in o.metrics), None)

    def better_than(self, other: Trial) -> bool:
        """Meets the budgets, or is closer to float than `other` by more than noise."""
        return self.ok or self.closeness > other.closeness + NOISE_DB

    def layer_errors(self) -> list[dict[str, Any]]:
        """The per-layer rows of the first stage that measured them."""
        for outcome in self.outcomes.values():
            if "layer_errors" in outcome.info:
                return list(outcome.info.get("layer_errors") or [])
        return []

    def row(self, options: list[str]) -> dict[str, Any]:
        errors = worst_first(self.layer_errors())
        closeness = self.closeness
        return {"trial": self.index, "settings": self.candidate.describe(options),
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


def finite(value: float) -> float | None:
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
    why: str = ""  # why the chosen trial ships, where several met the budgets
    # the chosen trial judged again on the held-out part of the evaluation data
    confirmation: dict[str, Any] | None = None


class Search:
    """The state of one pipeline's search: the steered stage's knobs, the layers they move,
    the trials run and the decisions taken."""

    def __init__(self, name: str, plan: Plan, data: RunData, nodes: list[Node],
                 steered: Node, submit: Callable[[Node], NodeOutcome], tune: Tune,
                 on_trial: Callable[[str, dict[str, Any]], Any] | None) -> None:
        self.name, self.plan, self.data, self.nodes = name, plan, data, nodes
        self.steered = steered
        knobs = get_stage(steered.stage).knobs
        assert knobs is not None
        self.knobs: Knobs = knobs
        self.submit, self.tune, self.on_trial = submit, tune, on_trial
        self.options = option_names()
        self.trials: list[Trial] = []
        self.decisions: list[dict[str, Any]] = []
        self.seen: set[str] = {nodes[-1].key}
        self.started = time.monotonic()
        parent = plan.recipe.recipe.pipelines[name].from_
        self.previous = plan.pipelines[parent][-1].id if parent and plan.pipelines[parent] \
            else None
        self.float_key = plan.final_float_key(parent)
        self.layers: list[Layer] = []
        self.inputs_of: dict[str, list[str]] = {}  # node -> its data inputs
        self.prefix = ""  # the scope all layer names share (formatting.shared_scope)
        self.reserved = 0  # trials kept back for the fallback's answer
        targets = plan.recipe.recipe.targets
        # what prices a precision: a CPU unless every target runs a16w8 natively
        units = {resolve_device(t.device).compute_unit for t in targets}
        self.unit = "cpu" if "cpu" in units or not units else units.pop()
        self.target = targets[0].name if targets else ""

    @property
    def exhausted(self) -> bool:
        return (len(self.trials) > self.tune.max_trials - self.reserved
                or time.monotonic() - self.started > self.tune.timeout_s)

    def measure(self, index: int, candidate: Candidate, nodes: list[Node],
                outcomes: dict[str, NodeOutcome], seconds: float) -> Trial:
        metrics: dict[str, float] = {}
        for node in nodes:
            if get_stage(node.stage).judges_quality:
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
        computes_in = next((o.info.get("computes_in") for o in outcomes.values()
                            if o.node.stage == self.steered.stage), None) \
            if self.knobs.shows_compute else None
        return Trial(index, candidate, nodes, outcomes, metrics, violations, shortfall,
                     headline, size, seconds, against=against, computes_in=computes_in)

    def best(self) -> Trial:
        """Of the candidates that meet the budgets, the first in `shipping_order`; else the
        one closest to float."""
        met = self.shipping_order()
        return met[0] if met else max(self.trials, key=lambda t: t.closeness)

    def shipping_order(self) -> list[Trial]:
        """The trials that meet the budgets, the one to ship first: the cheapest compute on
        the target's unit (the layers out of int8, priced by `Precision.cost`); among those,
        the ones as fast as the fastest on the first target within LATENCY_NOISE (where the
        pipeline measures a latency); then the smallest, then the first tried."""
        met = [t for t in self.trials if t.ok]
        if not met:
            return []
        cheapest = min(t.cost(self.unit) for t in met)
        tied = [t for t in met if t.cost(self.unit) == cheapest]
        latencies = [t.latency_ms(self.target) for t in tied]
        fastest = min((ms for ms in latencies if ms), default=None)
        fast = [t for t, ms in zip(tied, latencies, strict=True)
                if fastest is None or ms is None or ms <= LATENCY_NOISE * fastest]
        first = sorted(fast, key=lambda t: (t.size_bytes or 0, t.index))
        return first + sorted((t for t in met if t not in first),
                              key=lambda t: (t.cost(self.unit), t.latency_ms(self.target)
                                             or 0.0, t.size_bytes or 0, t.index))

    def why_chosen(self, chosen: Trial) -> str:
        """Why the chosen trial ships, in one line: what decided it over the runner-up."""
        met = self.shipping_order()
        if not chosen.ok or len(met) < 2 or met[0] is not chosen:
            return ""
        runner_up = met[1]
        unit = "a CPU" if self.unit == "cpu" else "an a16w8 accelerator"
        mine, theirs = chosen.latency_ms(self.target), runner_up.latency_ms(self.target)
        if chosen.cost(self.unit) != runner_up.cost(self.unit):
            prices = ", ".join(f"{p.words} {p.costs(self.unit)}" for p in PRECISIONS.values()
                               if p.costs(self.unit))
            why = (f"the cheapest compute on {unit}, its layers out of int8 costing "
                   f"{chosen.cost(self.unit)} against trial {runner_up.index}'s "
                   f"{runner_up.cost(self.unit)} (per layer: {prices})")
        elif mine and theirs and theirs > LATENCY_NOISE * mine:
            why = (f"as cheap to compute as trial {runner_up.index}, and faster on "
                   f"{self.target}: {mine:.3g} ms against {theirs:.3g} ms")
        elif (chosen.size_bytes or 0) < (runner_up.size_bytes or 0):
            why = (f"as cheap and as fast as trial {runner_up.index}, and smaller: "
                   f"{chosen.size_bytes or 0:,} bytes against {runner_up.size_bytes or 0:,}")
        else:
            why = f"as cheap, as fast and as small as trial {runner_up.index}, and tried first"
        return f"trial {chosen.index} ships, of the {len(met)} that meet the budgets: {why}"

    def stages_with(self, candidate: Candidate) -> list[tuple[str, BaseModel]]:
        """The pipeline's stages with the candidate on top of the recipe's own params; a
        board measures the chosen model, not each trial."""
        stages: list[tuple[str, BaseModel]] = []
        for node in self.nodes:
            stage = get_stage(node.stage)
            if stage.per_board:
                continue
            params = node.params if stage.candidate is None \
                else stage.candidate(node.params, candidate)
            if params is not None:
                stages.append((node.stage, params))
        return stages

    def _nodes(self, candidate: Candidate, index: int) -> list[Node]:
        return chain_nodes(self.name, self.stages_with(candidate),
                           self.plan.start_keys[self.name], self.previous,
                           self.plan.fingerprints, trial=index,
                           base_dir=self.plan.recipe.base_dir, float_model_key=self.float_key)

    def _run(self, index: int, candidate: Candidate, nodes: list[Node]) -> Trial:
        started = time.monotonic()
        try:
            outcomes = {n.id: self.submit(n) for n in nodes}
        except OrchestratorError as exc:  # a candidate that cannot be built is a failed trial
            return Trial(index, candidate, nodes, {}, {}, [f"trial failed: {exc}"],
                         float("inf"), "failed", None, time.monotonic() - started, failed=True)
        return self.measure(index, candidate, nodes, outcomes, time.monotonic() - started)

    def judged_as_trials(self, baseline: Trial) -> Trial:
        """The recipe's own settings judged as every trial is (a judging stage's
        `candidate` judges on the search part of the evaluation data), so that trials
        compare on the same samples; its transforms come from the cache."""
        nodes = self._nodes(Candidate(), baseline.index)
        if [n.params for n in nodes] == [n.params for n in self.stages_nodes(baseline)]:
            return baseline
        self.seen.add(nodes[-1].key)
        judged = self._run(baseline.index, Candidate(), nodes)
        return baseline if judged.failed else judged

    def stages_nodes(self, trial: Trial) -> list[Node]:
        """The trial's nodes a candidate's stages would make (board stages left out)."""
        return [n for n in trial.nodes if not get_stage(n.stage).per_board]

    def attempt(self, candidate: Candidate, change: str) -> Trial | None:
        """Run one candidate (None when it is the same as one already tried)."""
        index = len(self.trials)
        nodes = self._nodes(candidate, index)
        if nodes[-1].key in self.seen:
            return None
        self.seen.add(nodes[-1].key)
        trial = self._run(index, candidate, nodes)
        self.trials.append(trial)
        if self.on_trial is not None:
            self.report_trial(trial, change)
        return trial

    def report_trial(self, trial: Trial, change: str) -> None:
        assert self.on_trial is not None
        best = self.best()
        row = trial.row(self.options)
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

    def decide(self, layers: list[str], action: str, before: Trial, trial: Trial | None,
               outcome: str) -> None:
        self.decisions.append({
            "step": len(self.decisions) + 1, "layers": layers, "action": action,
            "trial": None if trial is None else trial.index,
            "quality_before": before.headline,
            "quality_after": None if trial is None else trial.headline,
            "logit_sqnr_db_before": finite(before.closeness),
            "logit_sqnr_db_after": None if trial is None else finite(trial.closeness),
            "size_after_bytes": None if trial is None else trial.size_bytes,
            "outcome": outcome})

    def try_variation(self, current: Trial, candidate: Candidate, change: str, action: str
                      ) -> Trial:
        """One candidate that is not about layers; the better of it and `current`."""
        trial = self.attempt(candidate, change)
        if trial is None:
            return current
        better = trial.better_than(current)
        self.decide([], action, current, trial, "meets budgets" if trial.ok else
                    "kept: closer to float" if better else "stepped back: no closer")
        return trial if better else current

    def chosen_rows(self, chosen: Trial) -> list[dict[str, Any]]:
        return [chosen_row(t.row(self.options), t.index == chosen.index) for t in self.trials]


def chosen_row(row: dict[str, Any], chosen: bool = True) -> dict[str, Any]:
    """A trials-table row with its `chosen` mark: every row has one, a lone trial too."""
    return {**row, "chosen": chosen}
