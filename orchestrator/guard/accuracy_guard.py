"""The accuracy guard: a closed loop, like NNCF's accuracy control, over declared knobs.

When an 8-bit pipeline breaks a target's quality budget (accuracy drop, fidelity, an
output's SQNR...), the guard moves layers of its quantizing stage up that stage's ladder
(orchestrator/quant/knobs.py: weights-only, int16 activations, float...) until it meets
them, with the search the stage declares (`revert`: the worst layers a few at a time;
`bisect`: every layer a rung up, then the fewest that need it). When that is not enough,
the stage's whole-stage alternatives are tried on the best candidate (bias correction off;
other range percentiles when ranges clip).

The last trial is kept for the answer to "can 8 bits do it at all here?": the stage's
fallback (8-bit weights, float compute). When the eight-bit kernels cannot reach the
budget but that can, it is chosen and a one-line verdict says so; when neither can, the
verdict says that too, instead of a row of silent trials.

Each candidate is the same pipeline with changed params, so its unchanged prefix comes
from the cache, and every stage after the quantizer runs on that candidate's own model;
it is evaluated by the pipeline's own quality stages, tracked as a nested MLflow run, and
tabled in report.json with every decision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from orchestrator.engine.node_run import NodeOutcome, RunData
from orchestrator.engine.plan import Node, Plan, chain_nodes
from orchestrator.formatting import NOT_ON_CONSOLE, shared_scope
from orchestrator.guard.bisect import climb_ladder
from orchestrator.guard.revert import revert_layers
from orchestrator.guard.trials import GuardResult, Search, Trial, chosen_row
from orchestrator.measure.budgets import (
    has_quality_budgets,
    quality_headline,
    quality_violations,
)
from orchestrator.quant.knobs import Candidate, Fallback, LayerSource
from orchestrator.quant.layer_groups import rank_layers
from orchestrator.spec.models import Tune
from orchestrator.stages import all_stages, get_stage

log = logging.getLogger(__name__)


def steered_nodes(nodes: list[Node]) -> list[Node]:
    """The nodes the guard steers: those whose stage declares knobs that apply to their
    params (a converter's float mode quantizes nothing)."""
    found = []
    for node in nodes:
        knobs = get_stage(node.stage).knobs
        if knobs is not None and knobs.steers(node.params):
            found.append(node)
    return found


def guarded_pipelines(plan: Plan) -> list[str]:
    """Pipelines whose quantizing stage asks for the guard (`guard: true`), or all 8-bit
    ones under `tune:`."""
    recipe = plan.recipe.recipe
    tune_on = recipe.tune is not None and recipe.tune.enabled
    found = []
    for name, nodes in plan.pipelines.items():
        steered = steered_nodes(nodes)
        if steered and (tune_on or any(get_stage(n.stage).knobs.guarded(n.params)  # type: ignore[union-attr]
                                       for n in steered)):
            found.append(name)
    return found


def _has_quality_budget(plan: Plan) -> bool:
    return any(has_quality_budgets(t.budgets) for t in plan.recipe.recipe.targets)


def _quality_stage_words() -> str:
    names = [stage.name for stage in all_stages() if stage.judges_quality]
    return " or ".join(names) or "a quality"


def guard_pipeline(name: str, plan: Plan, data: RunData, outcomes: Mapping[str, NodeOutcome],
                   submit: Callable[[Node], NodeOutcome], tune: Tune,
                   on_trial: Callable[[str, dict[str, Any]], Any] | None = None
                   ) -> GuardResult:
    """Search for a candidate that meets the budgets; the best candidate's nodes, never a
    change to `plan` or `outcomes`."""
    nodes = plan.pipelines[name]
    steered = steered_nodes(nodes)[0]
    search = Search(name, plan, data, nodes, steered, submit, tune, on_trial)
    # the recipe's own stages are timed with the run, not as a trial (0 s here)
    baseline = search.measure(0, Candidate(), nodes, {n.id: outcomes[n.id] for n in nodes},
                              0.0)
    search.trials.append(baseline)
    if not any(get_stage(n.stage).judges_quality for n in nodes):
        baseline.violations.append(
            f"the guard needs an {_quality_stage_words()} stage in the pipeline")
        return GuardResult(nodes, baseline.outcomes, [chosen_row(baseline.row(search.options))])
    if baseline.ok or not _has_quality_budget(plan):  # the recipe's own settings: chosen
        return GuardResult(nodes, baseline.outcomes, [chosen_row(baseline.row(search.options))])
    baseline = search.trials[0] = search.judged_as_trials(baseline)
    knobs = search.knobs
    found = knobs.layers(LayerSource(steered.params, outcomes[steered.id].info,
                                     lambda: data.load_model(steered.input_model_key)))
    search.layers, search.inputs_of = found.layers, found.inputs_of
    search.prefix = shared_scope([layer.name for layer in search.layers])
    in_pipeline = [n.stage for n in nodes]
    fallback_possible = knobs.fallback.needs in (None, *in_pipeline)
    search.reserved = 1 if fallback_possible else 0
    rungs = knobs.rungs(in_pipeline)
    # int8 methods first where int16 activations would run on a CPU's reference kernels
    methods_first = search.unit == "cpu"
    start = _try_methods(search, baseline) if methods_first else baseline
    if not start.ok and methods_first:
        start = _ladder_start(search, baseline)
    if not start.ok:
        if knobs.search == "bisect":
            rows = found.ranking_rows if start is baseline and found.ranking_rows is not None \
                else start.layer_errors()
            climb_ladder(search, start, rank_layers(rows, search.layers, set(),
                                                    search.inputs_of), rungs)
        else:
            revert_layers(search, start, rungs)
    best = search.best()
    if not methods_first and not best.ok:
        best = _try_methods(search, best)
    for alternative in knobs.alternatives:  # when moving layers alone did not do it
        if best.ok:
            break
        current = best
        for value in alternative.values(steered.params, tune, current.layer_errors()):
            if search.exhausted or current.ok:
                break
            current = search.try_variation(
                current, current.candidate.with_option(alternative.option, value),
                alternative.change(value), alternative.action(value))
        best = current
    return _conclude(search, search.best(), tune, fallback_possible)


def _try_methods(search: Search, start: Trial) -> Trial:
    """The stage's int8 methods, cheapest to find first, each on top of `start`'s
    candidate: the first that meets the budgets, else the closest to float of them and
    `start`."""
    current = start
    for method in search.knobs.methods:
        if search.exhausted or current.ok:
            break
        current = search.try_variation(current, start.candidate.with_options(method.options),
                                       method.change, method.name)
    return current


def _ladder_start(search: Search, baseline: Trial) -> Trial:
    """Where the ladder climbs from when no method met the budgets: the closest to float
    of the recipe's own settings and the trials of methods a wider rung builds on."""
    stacking = [dict(m.options) for m in search.knobs.methods if m.stacks]
    built_on = [t for t in search.trials if dict(t.candidate.options) in stacking
                and not t.failed]
    return max([baseline, *built_on], key=lambda t: t.closeness)


def _conclude(search: Search, best: Trial, tune: Tune, fallback_possible: bool
              ) -> GuardResult:
    """When no full 8-bit candidate met the budgets: the reserved fallback trial and the
    verdict; then the result with the chosen trial marked."""
    verdict = None
    if not best.ok:
        fallback = None
        if fallback_possible and time.monotonic() - search.started <= tune.timeout_s:
            search.reserved = 0
            fallback = _try_fallback(search, best)
        verdict = _verdict(search.knobs.kernels, search.knobs.fallback, best, fallback,
                           fallback_possible)
        best = search.best()
    return GuardResult(best.nodes, best.outcomes, search.chosen_rows(best), search.decisions,
                       verdict, search.why_chosen(best))


def _try_fallback(search: Search, best: Trial) -> Trial | None:
    """The answer to "can 8-bit weights do it here at all": every layer computes in float
    from its 8-bit weights (the quantizer converts nothing)."""
    trial = search.attempt(Candidate(fallback=True), search.knobs.fallback.change)
    if trial is not None:
        search.decide([layer.name for layer in search.layers], "every layer weights-only",
                      best, trial, "meets budgets" if trial.ok else "no 8-bit candidate meets")
    return trial


def _verdict(kernels: str, fallback: Fallback, best_full: Trial, tried: Trial | None,
             possible: bool) -> str:
    """What the search found, in one line, when no full 8-bit candidate met the budgets."""
    full = (f"{kernels} cannot reach the budget here (closest: trial "
            f"{best_full.index}, {best_full.headline}, logits {best_full.closeness:.1f} dB)")
    if not possible:
        return (f"{full}; add {fallback.needs} to the pipeline to let the guard try "
                f"{fallback.name}")
    if tried is None:
        return f"{full}; {fallback.name} was not tried (tune.timeout_s ran out)"
    if tried.ok:
        return (f"{full}; {fallback.described} can: {tried.headline}, "
                f"{tried.size_bytes:,} bytes (trial {tried.index}), chosen")
    return (f"{full}, and {fallback.name} cannot either ({tried.headline}): no "
            f"{fallback.variant} of this model meets the budget; keep it in float")


def apply_guard(name: str, plan: Plan, data: RunData, outcomes: Mapping[str, NodeOutcome],
                submit: Callable[[Node], NodeOutcome],
                on_trial: Callable[[str, dict[str, Any]], Any] | None = None
                ) -> GuardResult | None:
    """Run the guard on pipeline `name` if it is guarded, else None."""
    if name not in guarded_pipelines(plan):
        return None
    tune = plan.recipe.recipe.tune or Tune()
    result = guard_pipeline(name, plan, data, outcomes, submit, tune, on_trial)
    _confirm_on_held_out(name, plan, result, submit)
    if result.verdict:  # the console shows it with the variant's warnings
        log.warning("%s: %s", name, result.verdict, extra=NOT_ON_CONSOLE)
    _measure_chosen_on_boards(name, plan, result, submit)
    return result


# The figures the confirmation sets side by side, where the judging stage gives them.
CONFIRMED_FIGURES = ("evaluation_samples", "accuracy", "accuracy_drop", "accuracy_drop_low",
                     "accuracy_drop_high", "fidelity", "fidelity_low", "fidelity_high",
                     "min_sqnr_db", "min_sqnr_db_low", "min_logit_sqnr_db")


def _chosen_index(result: GuardResult) -> int:
    return next((row["trial"] for row in result.trials if row.get("chosen")), 0)


def _confirm_on_held_out(name: str, plan: Plan, result: GuardResult,
                         submit: Callable[[Node], NodeOutcome]) -> None:
    """Picking the best of many trials on one evaluation set rewards its noise: where the
    guard searched (trials judged on the search part), the chosen model is judged again on
    the part no trial was selected on, and a budget that part contradicts (missed even at
    the held-out figure's optimistic bound) is said. Then it is judged on every
    evaluation sample, as the recipe's own stage judges a variant the guard did not touch:
    those are the variant's figures."""
    judges = [n for n in result.nodes if get_stage(n.stage).confirm is not None]
    if not judges or len(result.trials) < 2:  # no search, nothing selected
        return
    own = [n for n in plan.pipelines[name] if get_stage(n.stage).confirm is not None]
    searched = _metrics(result, judges)
    held_out = _metrics(result, _chain_after_chosen(name, plan, result, submit, [
        (n.stage, get_stage(n.stage).confirm(n.params)) for n in judges]))  # type: ignore[misc]
    _chain_after_chosen(name, plan, result, submit, [(n.stage, n.params) for n in own])
    targets = plan.recipe.recipe.targets
    broken = [f"{t.name}: {v}" for t in targets
              for v in quality_violations(optimistic(held_out), t.budgets)]
    shown = [t for t in targets if has_quality_budgets(t.budgets)][:1]
    words = (lambda m: quality_headline(m, shown[0].budgets)) if shown else (lambda m: "")
    result.confirmation = {
        "trial": _chosen_index(result), "consistent": not broken, "contradicted": broken,
        **{part: {"quality": words(figures),
                  **{k: figures[k] for k in CONFIRMED_FIGURES if k in figures}}
           for part, figures in (("search", searched), ("held_out", held_out))}}
    chosen = next(row for row in result.trials if row.get("chosen"))
    if broken and chosen["meets_budgets"]:
        said = (f"the chosen trial {chosen['trial']} met the budgets on the search "
                f"part of the evaluation data ({words(searched)}), but the held-out part it "
                f"was not selected on says otherwise ({words(held_out)}; even at its "
                f"optimistic bound: {'; '.join(broken)}): the choice may fit the search "
                "part's noise. Give more evaluation samples, or a budget with a margin")
        result.verdict = f"{result.verdict}; {said}" if result.verdict else said


def _metrics(result: GuardResult, nodes: list[Node]) -> dict[str, float]:
    found: dict[str, float] = {}
    for node in nodes:
        found.update(result.outcomes[node.id].metrics)
    return found


def optimistic(metrics: Mapping[str, float]) -> dict[str, float]:
    """`metrics` with each figure's pessimistic bound (which budgets judge) replaced by its
    optimistic one, or dropped where there is none (the figure itself is judged then): a
    budget missed even so is contradicted by the data."""
    swapped = dict(metrics)
    for key in metrics:
        for worse, better in (("_low", "_high"), ("_high", "_low")):
            if worse in key:
                partner = key.replace(worse, better, 1)
                if partner in metrics:
                    swapped[key] = metrics[partner]
                elif worse == "_low":
                    swapped.pop(key, None)
    return swapped


def _chain_after_chosen(name: str, plan: Plan, result: GuardResult,
                        submit: Callable[[Node], NodeOutcome],
                        stages: list[tuple[str, Any]]) -> list[Node]:
    """Run `stages` on the chosen trial's model, after its own nodes; they join
    `result`'s nodes and outcomes."""
    last = result.nodes[-1]
    made = [n for n in result.nodes if n.kind == "transform"]
    model_key = made[-1].output_model_key if made else plan.start_keys[name]
    chained = chain_nodes(name, stages, model_key, last.id, plan.fingerprints,
                          trial=last.trial, base_dir=plan.recipe.base_dir,
                          float_model_key=last.float_model_key)
    added = []
    for offset, node in enumerate(chained):
        index = len(result.nodes)  # after the chosen trial's own stages
        node = replace(node, index=index, id=node.id.replace(
            f"/{offset}:", f"/{index}:", 1), depends_on=result.nodes[-1].id)
        result.outcomes[node.id] = submit(node)
        result.nodes.append(node)
        added.append(node)
    return added


def _measure_chosen_on_boards(name: str, plan: Plan, result: GuardResult,
                              submit: Callable[[Node], NodeOutcome]) -> None:
    """Trials are not measured on the targets' boards (each would cost a board's time):
    where the guard chose a trial, its model is measured on them now, as the pipeline's
    own board stages would have measured the recipe's."""
    boards = [n for n in plan.pipelines[name] if get_stage(n.stage).per_board]
    if not boards or any(get_stage(n.stage).per_board for n in result.nodes):
        return
    _chain_after_chosen(name, plan, result, submit, [(n.stage, n.params) for n in boards])


class AccuracyGuard:
    """What the engine's scheduler calls (`run_plan(..., guard=GUARD)`): which pipelines
    are guarded, and the guard on one of them once its nodes have run."""

    pipelines = staticmethod(guarded_pipelines)
    apply = staticmethod(apply_guard)


GUARD = AccuracyGuard()
