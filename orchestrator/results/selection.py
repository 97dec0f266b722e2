"""Which variant each target ships, and why, in the words of one rule.

Per target, among the variants that meet every budget:
1. the lowest latency the target reads (its board's measurement, else the estimate); those
   within ESTIMATE_TIE of the lowest, or within the spread of the timings behind them where
   that is wider (an estimate's runtime overhead is calibrated on this host's runs), cannot
   tell variants apart;
2. among those, the fastest measured on this host, where it is faster beyond the noise of
   both measurements: the larger of the two's median run over its fastest, at least
   NOISE_FLOOR (not the coefficient of variation: one preempted run among fifty pushes
   that over 1). Each file's fastest timed run is compared (its p50 where no run is
   recorded): other processes only ever add time, so a loaded host moves a p50 by far more
   than its own runs' spread says, and the fastest run hardly. Timings this run took while
   another of its stages ran (a parallel runner: `timed_beside`) are not compared: that
   stage shares the cores, and on a runner of threads the interpreter, for the whole
   window, so every run is slowed, the fastest too. Within the noise (or where a variant
   has no comparable host measurement) it is a tie;
3. a tie is broken by a stable rule, the same on every run: the smaller file, then the
   simpler kind (KIND_ORDER), then recipe order.

So a loaded host, whose timings spread, leaves more to the stable rule instead of letting
its noise pick the file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.formatting import apart, format_ms, format_size

# Estimates within this share of the lowest cannot tell variants apart: the measured host
# latency decides among them (then the size).
ESTIMATE_TIE = 0.10
# Two host timings closer than this share are a tie, however tight their spread.
NOISE_FLOOR = 0.05
# The estimate is slower but this host measures a variant faster by more than this share
# (and beyond the timings' noise): the reasons say the two disagree.
MEASURED_NOISE = 0.10
# Simpler first: a plain file before one that needs a memory-mapped loader, before one that
# needs a key.
KIND_ORDER = {"graphdef": 0, "tflite": 0, "memmapped": 1, "encrypted": 2}


def _estimate(variant: Mapping[str, Any], target: str) -> float:
    """The latency selection reads for a target: its board's measurement where a real
    board measured it, else the estimate (`latency_basis` says which)."""
    result = variant["targets"][target]
    est = result.get("latency_ms", result["est_latency_ms"])
    return float("inf") if est is None else float(est)


def _noise(p50: Any, fastest: Any, cv: Any) -> float:
    """The share by which timings are moved by noise: how far the median run sits above the
    fastest (other processes only ever add time, and a single preempted run among fifty
    cannot move it, where it pushes the coefficient of variation over 1); the cv where the
    fastest run is not recorded."""
    if isinstance(p50, int | float) and isinstance(fastest, int | float) and fastest > 0:
        return max(0.0, float(p50) / float(fastest) - 1.0)
    return float(cv or 0.0)


def _latency_spread(variant: Mapping[str, Any], target: str) -> float:
    """The share of the latency a target reads that the noise of timings can move: a
    board's p50, by its runs' noise; an estimate, by that of this host's runs times the
    share of the estimate calibrated on them (its runtime overhead: the compute term is
    FLOPs at the device's speed, no timing in it); 0.0 for FLOPs only."""
    result = variant["targets"][target]
    if result.get("latency_basis", "estimated") != "estimated":
        timings = (result.get("measured") or {}).get("latency_ms") or {}
        return _noise(timings.get("p50"), timings.get("min"), timings.get("cv"))
    made = result.get("estimate") or {}
    noise = _noise(made.get("host_p50_ms"), made.get("host_fastest_ms"), made.get("host_cv"))
    overhead, compute = made.get("overhead_ms"), made.get("compute_ms")
    if not noise or not overhead or compute is None or compute + overhead <= 0:
        return 0.0
    return noise * float(overhead) / (float(compute) + float(overhead))


def _tag(variant: Mapping[str, Any], target: str) -> str:
    """How a latency is marked: "est." or "measured"."""
    basis = variant["targets"][target].get("latency_basis", "estimated")
    return "est." if basis == "estimated" else "measured"


def timed_beside(variants: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Per variant whose host timing (its stage marked `timed`) this run took while another
    of the run's stages ran, those stages ("<variant> › <stage>"), from the stages' start
    and end (report.json's `stages`); a stage taken from the cache ran in no window of this
    run."""
    def window(stage: Mapping[str, Any]) -> tuple[str, float, float] | None:
        if stage.get("cached") or stage.get("started") is None:
            return None
        return str(stage["name"]), float(stage["started"]), float(stage["finished"])

    ran: dict[tuple[str, float, float], str] = {}  # a parent's stage: once, under its first
    for name, variant in variants.items():
        for stage in variant.get("stages") or []:
            if (span := window(stage)) is not None:
                ran.setdefault(span, name)
    found: dict[str, list[str]] = {}
    for name, variant in variants.items():
        for stage in variant.get("stages") or []:
            timed = window(stage)
            if timed is None or not stage.get("timed"):
                continue
            beside = sorted(f"{where} › {other}" for (other, start, end), where in ran.items()
                            if (other, start, end) != timed and start < timed[2]
                            and timed[1] < end)
            if beside:
                found[name] = beside
    return found


def _measured(variant: Mapping[str, Any]) -> float:
    """The host timing selection compares: the fastest timed run, else the p50; none where
    this run took it beside another stage (`timed_beside`)."""
    if variant.get("timed_beside"):
        return float("inf")
    timings = variant.get("latency_ms") or {}
    value = timings.get("min", timings.get("p50"))
    return float("inf") if value is None else float(value)


def _what(variant: Mapping[str, Any]) -> str:
    """What `_measured` is, for the reasons."""
    return "fastest run" if (variant.get("latency_ms") or {}).get("min") is not None \
        else "p50"


def host_noise(first: Mapping[str, Any], second: Mapping[str, Any]) -> float:
    """The share within which two host timings are a tie: the larger noise of the two (the
    median run over the fastest), at least NOISE_FLOOR."""
    noises = [_noise(t.get("p50"), t.get("min"), t.get("cv"))
              for t in ((v.get("latency_ms") or {}) for v in (first, second))]
    return max(NOISE_FLOOR, *noises)


def _kind_rank(variant: Mapping[str, Any]) -> int:
    return KIND_ORDER.get(str(variant.get("kind", "graphdef")), len(KIND_ORDER))


@dataclass
class _Decision:
    """How the rule went for one target: `close` the variants whose latencies tie with the
    lowest (recipe order), `slower` those of them this host measured slower beyond noise,
    `tied` the rest (a tie the stable rule broke when more than one), `by` what decided."""

    chosen: str
    lowest: str
    close: list[str]
    slower: list[str]
    tied: list[str]
    by: str  # "only", "latency", "host", "size", "kind", "order"
    est_share: float  # the share within which estimates tied here


def _decide(ok: Mapping[str, Mapping[str, Any]], target: str) -> _Decision:
    names = list(ok)  # recipe order
    if len(names) == 1:
        return _Decision(names[0], names[0], names, [], [], "only", ESTIMATE_TIE)
    order = {n: i for i, n in enumerate(names)}
    lowest = min(names, key=lambda n: (_estimate(ok[n], target), order[n]))
    floor = _estimate(ok[lowest], target)

    def share(name: str) -> float:
        return max(ESTIMATE_TIE, _latency_spread(ok[name], target),
                   _latency_spread(ok[lowest], target))

    close = [n for n in names if not math.isfinite(floor)
             or _estimate(ok[n], target) <= floor * (1 + share(n))]
    est_share = max(share(n) for n in close)
    if len(close) == 1:
        return _Decision(lowest, lowest, close, [], close, "latency", est_share)
    timed = [n for n in close if math.isfinite(_measured(ok[n]))]
    slower: list[str] = []
    if timed:
        fastest = min(timed, key=lambda n: (_measured(ok[n]), order[n]))
        best = _measured(ok[fastest])
        slower = [n for n in timed if _measured(ok[n])
                  > best * (1 + host_noise(ok[n], ok[fastest]))]
    tied = [n for n in close if n not in slower]
    if len(tied) == 1:
        return _Decision(tied[0], lowest, close, slower, tied, "host", est_share)
    key = {n: (ok[n]["size_bytes"], _kind_rank(ok[n]), order[n]) for n in tied}
    chosen = min(tied, key=key.__getitem__)
    runner_up = min((n for n in tied if n != chosen), key=key.__getitem__)
    by = ("size" if key[chosen][0] != key[runner_up][0]
          else "kind" if key[chosen][1] != key[runner_up][1] else "order")
    return _Decision(chosen, lowest, close, slower, tied, by, est_share)


def _passing(variants: Mapping[str, Mapping[str, Any]], target: str
             ) -> dict[str, Mapping[str, Any]]:
    return {name: v for name, v in variants.items() if v["targets"][target]["budgets_ok"]}


def select(variants: Mapping[str, Mapping[str, Any]], target_names: list[str]
           ) -> dict[str, str | None]:
    """Per target: among the variants meeting every budget, those whose latency ties with
    the lowest (ESTIMATE_TIE, or the spread of the timings behind them); of these the
    fastest measured on this host beyond the noise of the timings; a tie broken by the
    smaller file, the simpler kind, then recipe order. None when no variant meets the
    budgets."""
    selected: dict[str, str | None] = {}
    for target in target_names:
        ok = _passing(variants, target)
        selected[target] = _decide(ok, target).chosen if ok else None
    return selected


def selection_reasons(variants: Mapping[str, Mapping[str, Any]],
                      selected: Mapping[str, str | None]) -> dict[str, dict[str, str]]:
    """Per target and variant, why it was or was not selected, in the words of the rule
    `select` applies: every budget met, the lowest latency, the measured host latency among
    latencies that tie, a tie broken by size, kind, recipe order. Where the estimate and
    this host's measurement rank two variants the opposite way beyond noise, the reason
    says so. Timings and sizes as formatting shows them everywhere (µs/ms, MiB)."""
    reasons: dict[str, dict[str, str]] = {}
    for target, chosen in selected.items():
        why: dict[str, str] = {}
        ok = _passing(variants, target)
        decision = _decide(ok, target) if ok else None
        for name, variant in variants.items():
            result = variant["targets"][target]
            if not result["budgets_ok"]:
                why[name] = "breaks a budget: " + "; ".join(result["violations"])
            elif decision is not None and chosen is not None:
                why[name] = (_chosen_reason(name, ok, target, decision) if name == chosen
                             else _other_reason(name, ok, target, decision, chosen))
        reasons[target] = why
    return reasons


def _share_words(share: float) -> str:
    return f"{share:.0%}" + ("" if share <= ESTIMATE_TIE
                             else " (the spread of the timings behind them)")


def _chosen_reason(name: str, ok: Mapping[str, Mapping[str, Any]], target: str,
                   decision: _Decision) -> str:
    """Why `select` chose `name`, naming only the steps of its rule that decided."""
    if decision.by == "only":
        return "selected: meets every budget; the only variant that does"
    est = _estimate(ok[name], target)
    floor = _estimate(ok[decision.lowest], target)
    parts = ["selected: meets every budget"]
    if not math.isfinite(est):
        parts.append("no variant has an estimated latency (add benchmark to the pipelines)")
    elif est <= floor:
        parts.append(f"lowest {'estimated' if _tag(ok[name], target) == 'est.' else 'measured'}"
                     f" latency ({format_ms(est)} {_tag(ok[name], target)})")
    else:
        mine, theirs = _ms_pair(est, floor)
        parts.append(f"estimated latency {mine}, within {_share_words(decision.est_share)} "
                     f"of the lowest ({decision.lowest}'s {theirs})")
    if decision.by == "latency":
        return "; ".join(parts)
    others = [n for n in decision.close if n != name]
    if est <= floor and math.isfinite(est) and decision.slower:
        parts.append(f"within {_share_words(decision.est_share)} of it: " + ", ".join(
            f"{n} ({format_ms(_estimate(ok[n], target))} {_tag(ok[n], target)})"
            for n in others))
    measured = _measured(ok[name])
    if decision.slower:
        vs = ", ".join(f"{n}'s {format_ms(_measured(ok[n]))}" for n in decision.slower)
        noise = max(host_noise(ok[name], ok[n]) for n in decision.slower)
        parts.append(f"{'the fastest' if decision.by == 'host' else 'faster'} measured on "
                     f"this host ({format_ms(measured)} {_what(ok[name])} vs {vs}; beyond "
                     f"the {noise:.0%} noise of the timings)")
    if decision.by != "host":
        parts.append(_tie_words(name, ok, decision))
    return "; ".join(parts)


def _tie_words(name: str, ok: Mapping[str, Mapping[str, Any]], decision: _Decision) -> str:
    """The tie among `decision.tied` and how the stable rule broke it for `name`."""
    rivals = [n for n in decision.tied if n != name]
    timed = [n for n in [name, *rivals] if math.isfinite(_measured(ok[n]))]
    beside = [n for n in [name, *rivals] if ok[n].get("timed_beside")]
    if len(timed) >= 2:
        noise = max(host_noise(ok[a], ok[b]) for a in timed for b in timed if a != b)
        host = (f"this host's timings ({_what(ok[name])}: " + ", ".join(
            f"{n} {format_ms(_measured(ok[n]))}" for n in timed)
                + f") are within the {noise:.0%} noise of their runs")
        unmeasured = [n for n in decision.tied if n not in timed and n not in beside]
        if unmeasured:
            host += f"; {', '.join(unmeasured)} not measured on this host"
    elif timed:
        host = f"only {timed[0]} {'timed alone' if beside else 'measured'} on this host"
    else:
        host = "no host timing to compare" if beside else "none measured on this host"
    if beside:
        host += (f"; {' and '.join(beside)} timed while other stages ran on a parallel "
                 "runner, not compared")
    broken = " and ".join(_broken_words(name, ok, decision))
    return f"a tie ({host}), broken by {broken}"


def _tie_key(ok: Mapping[str, Mapping[str, Any]], name: str) -> tuple[int, int, int]:
    """The stable rule's key: size, kind, recipe order (the order of `ok`)."""
    return (int(ok[name]["size_bytes"]), _kind_rank(ok[name]), list(ok).index(name))


def _lost_by(name: str, chosen: str, ok: Mapping[str, Mapping[str, Any]]) -> str:
    """Which step of the stable rule put `chosen` before `name`, from their own keys:
    "size", "kind" or "order"."""
    mine, theirs = _tie_key(ok, name), _tie_key(ok, chosen)
    return "size" if mine[0] != theirs[0] else "kind" if mine[1] != theirs[1] else "order"


def _broken_words(name: str, ok: Mapping[str, Mapping[str, Any]], decision: _Decision
                  ) -> list[str]:
    """How the stable rule put `name` before each rival in the tie, each rival named only
    under the step that separated it from `name`: size, then kind, then recipe order."""
    rivals = [n for n in decision.tied if n != name]
    by: dict[str, list[str]] = {"size": [], "kind": [], "order": []}
    for rival in rivals:
        by[_lost_by(rival, name, ok)].append(rival)
    words = []
    if by["size"]:
        nearest = min(by["size"], key=lambda n: ok[n]["size_bytes"])
        mine = apart(ok[name]["size_bytes"], ok[nearest]["size_bytes"], format_size)[0]
        words.append(f"the smaller file ({mine} vs " + ", ".join(
            f"{n}'s {apart(ok[name]['size_bytes'], ok[n]['size_bytes'], format_size)[1]}"
            for n in by["size"]) + ")")
    if by["kind"]:
        words.append(f"the simpler kind ({ok[name].get('kind', 'graphdef')} vs " + ", ".join(
            f"{n}'s {ok[n].get('kind', 'graphdef')}" for n in by["kind"])
            + ", the same size)")
    if by["order"]:
        words.append(f"recipe order (the same size and kind as {', '.join(by['order'])})")
    return words


def _other_reason(name: str, ok: Mapping[str, Mapping[str, Any]], target: str,
                  decision: _Decision, chosen: str) -> str:
    """Why `name`, which meets every budget, was not chosen."""
    variant, best = ok[name], ok[chosen]
    est, best_est = _estimate(variant, target), _estimate(best, target)
    measured, best_measured = _measured(variant), _measured(best)
    if name not in decision.close:
        mine, theirs = _ms_pair(est, best_est)
        why = (f"meets every budget, but {name}'s estimated latency {mine} > {chosen}'s "
               f"{theirs}")
        noise = max(MEASURED_NOISE, host_noise(variant, best))
        if math.isfinite(measured) and math.isfinite(best_measured) \
                and measured < best_measured * (1 - noise):
            mine, theirs = _ms_pair(measured, best_measured)
            why += (f". Measured on this host it is the faster one ({mine} vs {theirs} "
                    f"{_what(variant)}): "
                    "the estimate for the device and this host's measurement disagree")
        return why
    mine, theirs = _ms_pair(est, best_est)
    if name in decision.slower:
        host_mine, host_theirs = _ms_pair(measured, best_measured)
        return (f"meets every budget, estimated latency close to {chosen}'s ({mine} vs "
                f"{theirs}), but slower measured on this host ({host_mine} vs {host_theirs} "
                f"{_what(variant)})")
    lost_by = _lost_by(name, chosen, ok)
    if lost_by == "size":
        size_mine, size_theirs = apart(variant["size_bytes"], best["size_bytes"], format_size)
        lost = f"larger ({size_mine} vs {size_theirs})"
    elif lost_by == "kind":
        lost = f"the same size, a less simple kind ({variant.get('kind', 'graphdef')})"
    else:
        lost = "the same size and kind, later in the recipe"
    host = ""
    if math.isfinite(measured) and math.isfinite(best_measured):
        host_mine, host_theirs = _ms_pair(measured, best_measured)
        host = f"; host {_what(variant)} {host_mine} vs {host_theirs}, within noise"
    elif variant.get("timed_beside") or best.get("timed_beside"):
        host = "; host timings taken while other stages ran on a parallel runner, not compared"
    return (f"meets every budget, a tie with {chosen} (estimated latency {mine} vs "
            f"{theirs}{host}), but {lost}")


def _ms_pair(first: float, second: float) -> tuple[str, str]:
    """Two timings, 3 significant digits, more where 3 would print them equal."""
    if not (math.isfinite(first) and math.isfinite(second)):
        return format_ms(first if math.isfinite(first) else None), format_ms(
            second if math.isfinite(second) else None)
    return apart(first, second, format_ms)
