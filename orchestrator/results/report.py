"""report.json, budget gates, target selection and the console summary.

Every number in the report is measured in this run (or read from the cache entry of the run
that measured it); estimates are labelled as such (`est_latency_ms`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.engine.node_run import NodeOutcome, RunData
from orchestrator.engine.plan import Plan
from orchestrator.formatting import (
    SIZE_UNIT_NOTE,
    format_count,
    format_ms,
    format_number,
    format_size,
)
from orchestrator.guard.trials import GuardResult
from orchestrator.measure.budgets import MB, broken_kinds, check_budgets
from orchestrator.model import kinds
from orchestrator.results.board_figures import print_board_table
from orchestrator.results.selection import (
    ESTIMATE_TIE,
    select,
    selection_reasons,
    timed_beside,
)


def _merged(outcomes: list[NodeOutcome]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Later stages win: the last benchmark/evaluate of a pipeline is its measurement."""
    metrics: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for outcome in outcomes:
        metrics.update(outcome.metrics)
        info.update(outcome.info)
    return metrics, info


RAM_HEAP = ("heap growth, measured: the RssAnon growth of a fresh process that loads the "
            "file and runs it once (what the OS counts against an app)")
RAM_TRACED = ("traced peak: the peak of live tensors in a traced run (weights, inputs, "
              "intermediates); the load probe measured no heap growth")
RAM_SIZE = "model size: add benchmark to measure"
# what the RAM figure is, in a word or two: the column's and the budget message's name
RAM_MEASURES = {RAM_HEAP: "heap growth", RAM_TRACED: "traced peak", RAM_SIZE: "file size"}


def _ram(info: Mapping[str, Any], size_bytes: int) -> dict[str, Any]:
    """The RAM the budgets read, one definition for every kind: the load probe's measured
    heap growth (benchmark runs it for every kind), else the traced peak of live tensors,
    else the file's size; `ram_source` says which, `ram_measure` in a word."""
    growth = (info.get("memory") or {}).get("anon_growth_mb")
    if isinstance(growth, int | float):
        found = {"ram_bytes": max(int(round(growth * MB)), 0), "ram_source": RAM_HEAP}
    elif info.get("peak_memory_bytes"):
        found = {"ram_bytes": int(info["peak_memory_bytes"]), "ram_source": RAM_TRACED}
    else:
        found = {"ram_bytes": size_bytes, "ram_source": RAM_SIZE}
    return {**found, "ram_measure": RAM_MEASURES[found["ram_source"]]}


# The sentence a layer diagnostic (freeze_ranges, convert_tflite) ends with: turn the guard on
GUARD_ADVICE = re.compile(r"\.\s+Where a quality budget breaks, the guard \(.*$", re.DOTALL)
# The keys of a stage's info that its variant in report.json shows as they are (a key may
# share a word with a stage: `memmap` is the memmap stage's table).
INFO_SHOWN = ("ranges", "memmap", "encryption", "outputs", "layer_errors", "float_nodes",
              "computes_in", "bytes_by_kind", "bias_correction", "equalized", "host",
              "threads", "threads_matrix", "profile", "latency_runs_ms", "memory",
              "estimate_basis", "kernel_sets", "worst_kernel_set", "part", "confidence")


def guard_on(nodes: list[Any]) -> bool:
    """Whether a pipeline's own stages turn the accuracy guard on (a quantizing stage's
    `guard: true`, as its knobs read it)."""
    from orchestrator.stages import get_stage

    for node in nodes:
        knobs = get_stage(node.stage).knobs
        if knobs is not None and knobs.guarded(node.params):
            return True
    return False


def without_guard_advice(diagnostic: str) -> str:
    """The diagnostic without its advice to turn the guard on (the pipeline has it on)."""
    return GUARD_ADVICE.sub("", diagnostic)


def _samples(info: Mapping[str, Any]) -> int | None:
    """The data samples a stage used, as its info says: `samples`, or a board's."""
    if isinstance(info.get("samples"), int):
        return int(info["samples"])
    boards = [d.get("samples") for d in (info.get("device") or {}).values()
              if isinstance(d, dict)]
    return next((int(n) for n in boards if isinstance(n, int)), None)


def build_variant(name: str, plan: Plan, data: RunData, outcomes: Mapping[str, NodeOutcome],
                  devices: Mapping[str, Any], board_factors: Mapping[str, float] | None = None
                  ) -> dict[str, Any]:
    """One variant of report.json. `board_factors`: per target with a real board, its
    measured latency over the estimate for the variants it measured (geometric mean): the
    estimates of the variants it did not measure are scaled by it."""
    from orchestrator.measure.estimates import estimate
    from orchestrator.spec.devices import precision_of

    nodes = plan.pipelines[name]
    own = [outcomes[n.id] for n in nodes if n.id in outcomes]
    metrics, info = _merged(own)
    # diagnostics: what a stage found that changed nothing (report.json and the page);
    # advice to turn the guard on is dropped where the pipeline has it on already
    guarded = guard_on(nodes)
    diagnostics = [without_guard_advice(d) if guarded else d
                   for o in own for d in o.info.get("diagnostics") or []]
    facts = data.model_facts(plan.final_model_key(name))
    accuracy = metrics.get("accuracy")
    source_accuracy = metrics.get("source_accuracy") if accuracy is not None else None
    variant: dict[str, Any] = {
        "artifact": f"{name}/{kinds.file_name(facts.get('kind', kinds.DEFAULT_KIND))}",
        **facts,
        "flops": info.get("flops"),
        "latency_ms": info.get("latency_ms"),
        "accuracy": accuracy,
        "source_accuracy": source_accuracy,
        "accuracy_drop": (None if accuracy is None or source_accuracy is None
                          else round(source_accuracy - accuracy, 6)),
        "fidelity": metrics.get("fidelity"),
        **_ram(info, int(facts["size_bytes"])),
        # benchmark knows the runtime's precision (a tflite's mode); else the graph's ops
        "precision": info.get("precision") or precision_of(facts["ops"]),
        "metrics": {k: v for k, v in metrics.items() if isinstance(v, int | float)},
        "warnings": [w for o in own for w in o.warnings],
        "diagnostics": diagnostics,
        "stages": [{"name": o.node.stage, "seconds": round(o.seconds, 4), "cached": o.cached,
                    # when this run's task ran it (epoch s): overlaps show parallel stages
                    "started": round(o.started, 3), "finished": round(o.finished, 3),
                    # it timed the file on this host (the variant's latency_ms)
                    **({"timed": True} if "latency_ms" in o.info else {}),
                    # the data samples it used (calibration, evaluation, a board's run)
                    **({"samples": _samples(o.info)} if _samples(o.info) else {}),
                    **({"warnings": o.warnings} if o.warnings else {})} for o in own],
    }
    for key in INFO_SHOWN:
        if key in info:
            variant[key] = info[key]
    keyed = [n for n in nodes if n.key_id is not None and n.key_id in plan.keys]
    if keyed:  # where this run's key came from (a cached result may have had another source)
        variant["encryption"] = {**variant.get("encryption", {}), "key_id": keyed[-1].key_id,
                                 "key_source": plan.keys[keyed[-1].key_id].source}
    on_device: dict[str, Any] = {}  # target -> what its board measured
    for outcome in own:
        on_device.update(outcome.info.get("device") or {})
    variant.pop("device", None)
    targets: dict[str, Any] = {}
    for target in plan.recipe.recipe.targets:
        device = devices[target.name]
        # the file's operators priced on the device's cores (orchestrator.measure.estimates)
        made = estimate(variant["flops"], device, variant["precision"],
                        info.get("estimate_basis"))
        measured = on_device.get(target.name)
        factor = (board_factors or {}).get(target.name)
        if made is not None and factor and not _board_measured(measured):
            made = made.scaled_by_board(factor, target.name)
        est = None if made is None else round(made.latency_ms, 4)
        judged, figures = judged_on_device(variant, target.name, est, measured)
        violations = check_budgets(judged, target.budgets, figures["latency_ms"], device,
                                   figures["latency_basis"], measured)
        error = ({"estimate_error": round(est / measured["latency_ms"]["p50"], 4)}
                 if est and _board_measured(measured) and measured["latency_ms"].get("p50")
                 else {})
        targets[target.name] = {"device": device.name, "est_latency_ms": est,
                                **({"estimate": made.to_json()} if made else {}), **error,
                                **figures, **({"measured": measured} if measured else {}),
                                "budgets_ok": not violations, "violations": violations}
    variant["targets"] = targets
    return variant


def _board_measured(measured: Mapping[str, Any] | None) -> bool:
    """A real board (not an emulated one) timed the file."""
    return bool(measured and measured.get("measured") and not measured.get("emulated")
                and (measured.get("latency_ms") or {}).get("p50"))


def board_factors(built: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Per target, its real board's measured p50 over the estimate, as a geometric mean
    over the variants the board ran (report.json `estimate_error` is estimate / measured)."""
    ratios: dict[str, list[float]] = {}
    for variant in built.values():
        for target, result in variant["targets"].items():
            error = result.get("estimate_error")
            if isinstance(error, int | float) and error > 0:
                ratios.setdefault(target, []).append(1.0 / float(error))
    return {target: math.exp(sum(math.log(r) for r in values) / len(values))
            for target, values in ratios.items()}


def judged_on_device(variant: dict[str, Any], target: str, est: float | None,
                     measured: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The figures a target's budgets and selection read: its board's measured latency
    (p50) where a real board measured it, else the estimate; its board's accuracy where
    the board ran the evaluation set (an emulated one too: its numerics are the Arm
    kernels'), else this host's. Returns the variant as judged for this target and the
    figures with what each is (`latency_basis`, `accuracy_basis`)."""
    figures: dict[str, Any] = {"latency_ms": est, "latency_basis": "estimated",
                               "accuracy_basis": "this host"}
    if not measured or not measured.get("measured"):
        return variant, figures
    where = f"{target}'s board"
    if not measured.get("emulated"):
        figures.update(latency_ms=measured["latency_ms"]["p50"],
                       latency_basis=f"measured on {where}")
    judged = variant
    source = variant.get("source_accuracy")
    if measured.get("accuracy") is not None and source is not None:
        figures.update(accuracy=measured["accuracy"],
                       accuracy_basis=f"measured on {where}" + (
                           " (emulated)" if measured.get("emulated") else ""))
        judged = {**variant, "accuracy_drop": round(source - measured["accuracy"], 6)}
    return judged, figures


def build_report(plan: Plan, data: RunData, outcomes: Mapping[str, NodeOutcome],
                 devices: Mapping[str, Any], variants: list[str], run_id: str | None,
                 guarded: Mapping[str, GuardResult] | None = None) -> dict[str, Any]:
    """report.json's content: each variant (with its guard's trials, decisions and verdict
    where the guard ran), which budgets broke, the selection per target and its reasons."""
    built = {name: build_variant(name, plan, data, outcomes, devices) for name in variants}
    factors = board_factors(built)
    if factors:  # a board calibrates its device's estimates for the variants it did not run
        built = {name: build_variant(name, plan, data, outcomes, devices, factors)
                 for name in variants}
    for name, result in (guarded or {}).items():
        if name in built:
            with_guard(built[name], result)
    for variant in built.values():  # which budgets broke: the cells the report marks
        for result in variant["targets"].values():
            result["broken"] = broken_kinds(result["violations"])
    # host timings a parallel runner took beside other stages: selection does not compare them
    for name, stages in timed_beside(built).items():
        built[name]["timed_beside"] = stages
    selected = select(built, [t.name for t in plan.recipe.recipe.targets])
    return {"recipe": plan.recipe.recipe.name,
            "recipe_path": str(plan.recipe.path),
            "targets": {t.name: {"device": devices[t.name].name,
                                 "budgets": t.budgets.model_dump(exclude_none=True)}
                        for t in plan.recipe.recipe.targets},
            "mlflow_run_id": run_id,
            "data": data_summary(plan),
            "data_fingerprints": dict(plan.fingerprints),
            "variants": built,
            "selected": selected,
            "selection_reasons": selection_reasons(built, selected),
            "selection_basis": selection_basis(built, [t.name for t in
                                                       plan.recipe.recipe.targets])}


def selection_basis(variants: Mapping[str, Mapping[str, Any]], target_names: list[str]
                    ) -> dict[str, str]:
    """Per target, which figures its budgets and selection read: the board's measurements
    (for which variants) or estimates and this host's accuracy."""
    basis: dict[str, str] = {}
    for target in target_names:
        results = {name: v["targets"][target] for name, v in variants.items()}
        timed = [n for n, r in results.items() if r.get("latency_basis", "estimated")
                 != "estimated"]
        judged = [n for n, r in results.items() if r.get("accuracy_basis", "this host")
                  != "this host"]
        emulated = any((r.get("measured") or {}).get("emulated") for r in results.values())
        latency = (f"latency measured on the board for {', '.join(timed)}" + (
            ", estimated for the others" if len(timed) < len(results) else "")
            if timed else "latency estimated op by op for the device" + (
                " (the emulated board's timings measure qemu, not the core)"
                if emulated else ""))
        accuracy = (f"accuracy measured on the board{' (emulated)' if emulated else ''} for "
                    f"{', '.join(judged)}" + (", on this host for the others"
                                              if len(judged) < len(results) else "")
                    if judged else "accuracy measured on this host")
        basis[target] = f"{latency}; {accuracy}"
    return basis


def with_guard(variant: dict[str, Any], result: GuardResult) -> None:
    """The guard's trials table and decisions in the variant; its verdict (the search's
    answer) also among the variant's warnings, where the console shows them."""
    variant["trials"] = result.trials
    variant["guard_decisions"] = result.decisions
    if result.verdict:
        variant["guard_verdict"] = result.verdict
        variant.setdefault("warnings", []).append(result.verdict)
    if result.why:
        variant["guard_choice"] = result.why
    if result.confirmation:
        variant["guard_confirmation"] = result.confirmation


def data_summary(plan: Plan) -> dict[str, Any]:
    """Per data role: its source and the inputs skipped (non-image files in a folder)."""
    from orchestrator.data import skipped_files

    summary: dict[str, Any] = {}
    for role in ("representative", "evaluation"):
        source = getattr(plan.recipe.recipe.data, role)
        if source is None:
            continue
        skipped = skipped_files(source, plan.recipe.base_dir)
        summary[role] = {"source": source.source, "skipped_inputs": len(skipped),
                         "skipped_files": skipped}
    return summary


def _min_sqnr(variant: Mapping[str, Any]) -> str:
    """'23.1 (onset)': the lowest SQNR of the outputs that are not class scores."""
    rows = [r for r in variant.get("outputs") or [] if r.get("kind") not in (
        "class_scores", "class_indices") and r.get("sqnr_db") is not None]
    if not rows:
        return "-"
    worst = min(rows, key=lambda r: r["sqnr_db"])
    return f"{worst['sqnr_db']:.1f} ({worst['name']})"


# --- what a person reads: shared by the console summary and the page ---------------------

# the docs page with code that loads each kind of file on Android, iOS and Linux
LOADING_DOC = Path(__file__).resolve().parents[2] / "docs" / "loading.md"
KIND_WORDS = {"graphdef": "TensorFlow GraphDef",
              "memmapped": "TensorFlow memory-mapped GraphDef",
              "encrypted": "AES-256-GCM encrypted",
              "tflite": "LiteRT flatbuffer"}
PARAMS_NOTE = ("params: elements of the constant tensors in the shipped file (weights and "
               "biases after batch norm is folded, shapes, 8-bit ranges)")
TIMING_NOTE = "timings: 3 significant digits, µs below 1 ms"
NO_TARGETS = "no targets: nothing selected (add targets with budgets to pick a file per device)"
# the RAM figure's name -> what it is, for the note under the table
RAM_SOURCE_OF = {measure: source for source, measure in RAM_MEASURES.items()}


def ram_measure(variant: Mapping[str, Any]) -> str:
    """What a variant's RAM figure is (report._ram); a report written before it was named
    says it in `ram_source` only."""
    source = str(variant.get("ram_source") or "")
    return str(variant.get("ram_measure") or RAM_MEASURES.get(source) or (
        "heap growth" if "heap growth" in source else "traced peak"
        if "live tensors" in source else "file size"))


def broken_in(variant: Mapping[str, Any]) -> dict[str, list[str]]:
    """Budget kind -> the targets whose budget of that kind `variant` breaks (the cell
    of that figure is marked, never another)."""
    found: dict[str, list[str]] = {}
    for target, result in (variant.get("targets") or {}).items():
        for kind in result.get("broken") or broken_kinds(result.get("violations") or []):
            found.setdefault(kind, []).append(target)
    return found


def kind_words(variant: Mapping[str, Any]) -> str:
    """What the file is, e.g. "LiteRT flatbuffer", "AES-256-GCM encrypted TensorFlow
    memory-mapped GraphDef"."""
    kind = variant.get("kind", kinds.DEFAULT_KIND)
    words = KIND_WORDS.get(kind, kind)
    inner = (variant.get("encryption") or {}).get("payload_kind")
    return f"{words} {KIND_WORDS.get(inner, inner)}" if kind == "encrypted" and inner else words


def shown_path(path: Path, base: Path | None = None) -> str:
    """`path` relative to `base` (the working directory) when it lies inside it, so that
    it pastes as it is; else absolute."""
    base = Path.cwd() if base is None else base
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path.resolve())


def ship_lines(report: Mapping[str, Any], out_dir: Path) -> dict[str, str]:
    """Per target with a selection: the file to ship, relative to the working directory,
    what it is, and where the loading code is."""
    lines: dict[str, str] = {}
    doc = (f"load it: {shown_path(LOADING_DOC)}" if LOADING_DOC.is_file()
           else "load it: docs/loading.md in the orchestrator repository")
    for target, name in (report.get("selected") or {}).items():
        variant = report["variants"].get(name) or {} if name is not None else {}
        if not variant.get("artifact"):
            continue
        lines[target] = (f"ship {shown_path(out_dir / variant['artifact'])}, a "
                         f"{kind_words(variant)}; {doc}")
    return lines


def _guard_setting(stages: list[str]) -> str:
    """The recipe line that turns the guard on for a variant: its last quantizing stage's
    (the one whose model it ships), else the first registered quantizer's."""
    from orchestrator.stages import all_stages

    # a report read back (`gate`) may name a stage this process does not know: none of those
    knobs = {stage.name: stage.knobs for stage in all_stages() if stage.knobs is not None}
    own = [knobs[name] for name in stages if name in knobs]
    return own[-1].guard_setting if own else next(iter(knobs.values())).guard_setting


def advice(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(variant, warning) the user can act on that no stage could say alone: an 8-bit
    variant that breaks a quality budget without the guard, while its diagnostics flag
    layers the guard would take back from 8 bits."""
    from orchestrator.quant.layer_errors import FLAG_ABOVE, flagged

    found = []
    for name, variant in report["variants"].items():
        broken = broken_in(variant)
        quality = sorted({t for kind in ("accuracy", "fidelity", "sqnr", "output")
                          for t in broken.get(kind, [])})
        bad = flagged(variant.get("layer_errors") or [])
        if not quality or not bad or variant.get("trials"):
            continue
        from orchestrator.formatting import layer_names

        short = layer_names([r["node"] for r in variant["layer_errors"]])
        listed = ", ".join(f"{short[r['node']]} {r['rmse_over_scale']:.2f}" for r in bad[:3])
        setting = _guard_setting([s["name"] for s in variant.get("stages") or []])
        found.append((name, f"breaks the quality budget of {', '.join(quality)}, and "
                            f"{len(bad)} layer(s) are above {FLAG_ABOVE} RMSE/scale "
                            f"({listed}): set {setting} to let the accuracy guard take "
                            "such layers back from 8 bits"))
    return found


# An agreement budget should tell a model at the budget apart from one this much worse.
TELL_APART = 0.01


def sample_advice(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """("data.evaluation", warning) per agreement budget the evaluation set is too small
    to judge: fewer samples than it takes for a model measured at the budget to be told
    apart from one TELL_APART below it, at the figures' confidence."""
    from orchestrator.measure.confidence import samples_needed

    judged = [v for v in report["variants"].values()
              if (v.get("metrics") or {}).get("evaluation_samples")]
    if not judged:
        return []
    samples = int(min(v["metrics"]["evaluation_samples"] for v in judged))
    confidence = next((v["confidence"] for v in judged if v.get("confidence")), 0.9)
    found = []
    for target, facts in (report.get("targets") or {}).items():
        budgets = facts.get("budgets") or {}
        agreements = [("min_fidelity", budgets.get("min_fidelity"))] + [
            (f"outputs.{name}.min_agreement", each.get("min_agreement"))
            for name, each in (budgets.get("outputs") or {}).items()]
        for field_name, budget in agreements:
            if budget is None or not TELL_APART < budget < 1:
                continue
            needed = samples_needed(budget, budget - TELL_APART, confidence)
            if samples < needed:
                found.append(("data.evaluation", (
                    f"{samples} evaluation samples judge {target}'s {field_name} {budget:g}; "
                    f"telling a model at {budget:g} apart from one at "
                    f"{budget - TELL_APART:g} takes {needed} (Wilson, "
                    f"{confidence:.0%} one-sided): a verdict on fewer is mostly noise")))
    return found


def console_warnings(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(where, warning) for under the summary table: what the run's end found (the guard's
    verdict, skipped inputs, advice), never a stage's warning again (the progress display
    printed it beside its stage)."""
    found = []
    for name, variant in report["variants"].items():
        said = {w for stage in variant.get("stages") or [] for w in stage.get("warnings") or []}
        found += [(name, w) for w in variant.get("warnings") or [] if w not in said]
    found += advice(report) + sample_advice(report)
    for role, summary in (report.get("data") or {}).items():
        if summary.get("skipped_inputs"):
            names = ", ".join(Path(f).name for f in summary["skipped_files"][:5])
            found.append((f"data.{role}", f"skipped {summary['skipped_inputs']} non-image "
                                          f"file(s): {names}"))
    return found


def _marked(text: str, broken: bool) -> str:
    """A cell whose budget broke: red, with ✗ (readable without colour in a CI log)."""
    from rich.markup import escape

    return f"[red]{escape(text)} ✗[/]" if broken else escape(text)


def print_summary(report: Mapping[str, Any], out_dir: Path, console: Any = None) -> None:
    """The summary table, one row per variant, its units stated once under it; then per
    target the selection, the file to ship and the reasons.

    A broken budget marks its own cell (size, RAM, drop, fidelity, SQNR, or the target's
    estimated latency) with ✗, and the target's column names what broke."""
    import sys

    from rich.console import Console
    from rich.table import Table

    # a pipe or CI log gets a wide table instead of rich's 80-column default
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    # prose (notes, reasons, method lines) is never broken mid-phrase where the output is
    # not a terminal (make, a pipe, a CI log): one line each, as long as it is
    prose = {"soft_wrap": not console.is_terminal, "highlight": False}
    variants = report["variants"]
    target_names = list(report.get("selected") or {})
    broken = {name: broken_in(v) for name, v in variants.items()}
    budgets = {t: (report.get("targets") or {}).get(t, {}).get("budgets") or {}
               for t in target_names}
    show_ram = any("ram" in b for b in broken.values()) or any(
        "max_ram_mb" in b for b in budgets.values())
    ram_measures = {ram_measure(v) for v in variants.values()}
    # outputs that are not class scores: their lowest SQNR says more than one fidelity figure
    sqnr = any(_min_sqnr(v) != "-" for v in variants.values())
    # the table's units and words, stated once under it; legends only for columns shown
    notes = [f"size, gzip{', RAM' if show_ram else ''}: {SIZE_UNIT_NOTE}", PARAMS_NOTE]
    if show_ram:
        notes.append("RAM: " + "; ".join(f"{RAM_SOURCE_OF[m]}" for m in sorted(
            ram_measures, key=list(RAM_SOURCE_OF).index)))
    if target_names:
        notes += [f"{TIMING_NOTE}; est.: the device's latency, estimated (budgets and "
                  f"selection use it; within {ESTIMATE_TIE:.0%} a tie, which this host's fastest "
                  "runs break beyond their noise, else the smaller file; how, per variant: "
                  "report.html)" + ("; meas.: measured on the target's own board "
                  "(connect:), used instead" if any(
                      r.get("latency_basis", "estimated") != "estimated"
                      for v in variants.values() for r in v["targets"].values()) else ""),
                   "✗: the budget that broke, in its own cell and "
                  "named in its target's column; ✓: selected"]
    else:
        notes += [TIMING_NOTE, NO_TARGETS]
    table = Table(title=f"recipe {report['recipe']}")
    columns = ["variant", "size MiB", "gzip MiB", "params", "host p50\n(measured)"]
    if show_ram:  # what the figure is: one name for all, else per cell
        columns.append("RAM MiB\n(" + (next(iter(ram_measures)) if len(ram_measures) == 1
                                       else "see cells") + ")")
    columns += ["accuracy", "drop", "fidelity"]
    if sqnr:
        columns.append("min SQNR dB\n(output)")
    devices = {t: r.get("device", "") for v in variants.values()
               for t, r in v["targets"].items()}
    timed_on_board = {t for v in variants.values() for t, r in v["targets"].items()
                      if r.get("latency_basis", "estimated") != "estimated"}
    columns += [f"{t} ({devices.get(t, '')})\n" + ("latency" if t in timed_on_board
                                                    else "est. latency")
                for t in target_names]
    columns.append("cached")
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for name, v in variants.items():
        cells = broken[name]
        per_target = []
        for target in target_names:
            result = v["targets"][target]
            kinds_broken = result.get("broken") or broken_kinds(result.get("violations") or [])
            shown = result.get("latency_ms", result["est_latency_ms"])
            measured = result.get("latency_basis", "estimated") != "estimated"
            est = _marked(format_ms(shown) + (" meas." if measured else ""),
                          "latency" in kinds_broken)
            verdict = ("[green]ok[/]" if result["budgets_ok"]
                       else "[red]✗ " + ", ".join(k.upper() if k == "ram" else k
                                                  for k in kinds_broken or ["budget"]) + "[/]")
            chosen = " [bold]✓[/]" if report["selected"].get(target) == name else ""
            per_target.append(f"{est} {verdict}{chosen}")
        cached = sum(s["cached"] for s in v["stages"])
        row = [name, _marked(format_size(v["size_bytes"], unit=False), "size" in cells),
               format_size(v.get("gzip_size_bytes"), unit=False),
               format_count(v.get("params")), format_ms((v.get("latency_ms") or {}).get("p50"))]
        if show_ram:
            ram = format_size(v.get("ram_bytes"), unit=False)
            row.append(_marked(ram if len(ram_measures) == 1 else f"{ram} {ram_measure(v)}",
                               "ram" in cells))
        row += [format_number(v.get("accuracy"), ".4f"),
                _marked(format_number(v.get("accuracy_drop"), "+.4f"), "accuracy" in cells),
                _marked(format_number(v.get("fidelity"), ".4f"), "fidelity" in cells)]
        if sqnr:
            row.append(_marked(_min_sqnr(v), "sqnr" in cells))
        table.add_row(*row, *per_target, f"{cached}/{len(v['stages'])}")
    console.print(table)
    from rich.markup import escape

    from orchestrator.results.host_comparison import below_host_lines

    for line in below_host_lines(report):  # an estimate below the host's own figure: why
        console.print(f"  {escape(line)}", **prose)
    for note in notes:
        console.print(f"  [dim]{escape(note)}[/]", **prose)
    print_board_table(report, console, prose)

    for where, warning in console_warnings(report):
        console.print(f"  [yellow]warning[/] {escape(where)}: {escape(warning)}", **prose)
    reasons = report.get("selection_reasons") or {}
    ships = ship_lines(report, out_dir)
    for target, variant in report.get("selected", {}).items():
        console.print(f"selected for {escape(target)}: "
                      + (f"[bold green]{escape(variant)}[/]" if variant else "[bold red]none "
                         "meets its budgets[/]"), **prose)
        if target in ships:
            console.print(f"  {escape(ships[target])}", **prose)
            made = variants[variant]["targets"][target].get("estimate") or {}
            short = made.get("summary") or made.get("method")  # older reports: no summary
            if short:
                console.print(f"  its estimate: {escape(short)}; every figure: report.html",
                              **prose)
        for name, why in (reasons.get(target) or {}).items():
            console.print(f"  {escape(name)}: {escape(why)}", **prose)
    for name, v in variants.items():
        if v.get("encryption"):  # where the key came from; never the key
            console.print(f"{escape(name)}: encrypted with key id "
                          f"{escape(str(v['encryption'].get('key_id')))} from "
                          f"{escape(str(v['encryption'].get('key_source')))}", **prose)
    page = " and report.html (open it in a browser)" if "report.html" in (
        report.get("page_files") or []) else ""
    console.print(escape(f"results: {out_dir}/report.json{page}, the models in "
                         f"{out_dir}/<variant>/"), **prose)
