"""report.json, budget gates, target selection and the console summary.

Every number in the report is measured in this run (or read from the cache entry of the run
that measured it); estimates are labelled as such (`est_latency_ms`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import kinds
from orchestrator.budgets import check_budgets
from orchestrator.errors import OutputError
from orchestrator.executor import NodeOutcome, RunData
from orchestrator.limits import name_problem
from orchestrator.paths import describe_os_error
from orchestrator.plan import Plan
from orchestrator.store import interrupts_deferred


def _merged(outcomes: list[NodeOutcome]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Later stages win: the last benchmark/evaluate of a pipeline is its measurement."""
    metrics: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for outcome in outcomes:
        metrics.update(outcome.metrics)
        info.update(outcome.info)
    return metrics, info


def build_variant(name: str, plan: Plan, data: RunData, outcomes: Mapping[str, NodeOutcome],
                  devices: Mapping[str, Any]) -> dict[str, Any]:
    from orchestrator.devices import precision_of
    from orchestrator.estimates import estimate

    nodes = plan.pipelines[name]
    own = [outcomes[n.id] for n in nodes if n.id in outcomes]
    metrics, info = _merged(own)
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
        "ram_bytes": int(info.get("peak_memory_bytes") or facts["size_bytes"]),
        "ram_source": ("measured peak (benchmark)" if info.get("peak_memory_bytes")
                       else "model size: add benchmark to measure"),
        # benchmark knows the runtime's precision (a tflite's mode); else the graph's ops
        "precision": info.get("precision") or precision_of(facts["ops"]),
        "metrics": {k: v for k, v in metrics.items() if isinstance(v, int | float)},
        "warnings": [w for o in own for w in o.warnings],
        "stages": [{"name": o.node.stage, "seconds": round(o.seconds, 4), "cached": o.cached,
                    # when this run's task ran it (epoch s): overlaps show parallel stages
                    "started": round(o.started, 3), "finished": round(o.finished, 3),
                    **({"warnings": o.warnings} if o.warnings else {})} for o in own],
    }
    for key in ("ranges", "memmap", "encryption", "outputs", "layer_errors", "float_nodes",
                "bias_correction", "equalized", "host", "threads", "threads_matrix",
                "profile", "latency_runs_ms", "memory", "estimate_basis"):
        if key in info:
            variant[key] = info[key]
    keyed = [n for n in nodes if n.key_id is not None and n.key_id in plan.keys]
    if keyed:  # where this run's key came from (a cached result may have had another source)
        variant["encryption"] = {**variant.get("encryption", {}), "key_id": keyed[-1].key_id,
                                 "key_source": plan.keys[keyed[-1].key_id].source}
    targets: dict[str, Any] = {}
    for target in plan.recipe.recipe.targets:
        device = devices[target.name]
        # FLOPs at the device's speed + the runtime's cost measured on this host (estimates)
        made = estimate(variant["flops"], device, variant["precision"],
                        info.get("estimate_basis"))
        est = None if made is None else round(made.latency_ms, 4)
        violations = check_budgets(variant, target.budgets, est, device)
        targets[target.name] = {"device": device.name, "est_latency_ms": est,
                                **({"estimate": made.to_json()} if made else {}),
                                "budgets_ok": not violations, "violations": violations}
    variant["targets"] = targets
    return variant


# Estimates within this share of the lowest cannot tell variants apart: the measured host
# latency decides among them (then the size).
ESTIMATE_TIE = 0.10


# A host measurement this much faster than another's is a real difference, not noise.
MEASURED_NOISE = 0.10


def _estimate(variant: Mapping[str, Any], target: str) -> float:
    est = variant["targets"][target]["est_latency_ms"]
    return float("inf") if est is None else float(est)


def _measured(variant: Mapping[str, Any]) -> float:
    p50 = (variant.get("latency_ms") or {}).get("p50")
    return float("inf") if p50 is None else float(p50)


def select(variants: Mapping[str, Mapping[str, Any]], target_names: list[str]
           ) -> dict[str, str | None]:
    """Per target: among the variants meeting every budget, those whose estimated latency
    is within ESTIMATE_TIE of the lowest; of these the fastest measured on this host, then
    the smallest. None when no variant meets the budgets."""
    selected: dict[str, str | None] = {}
    for target in target_names:
        ok = {name: v for name, v in variants.items() if v["targets"][target]["budgets_ok"]}
        if not ok:
            selected[target] = None
            continue
        lowest = min(_estimate(v, target) for v in ok.values())
        close = [(name, v) for name, v in ok.items()
                 if _estimate(v, target) <= lowest * (1 + ESTIMATE_TIE)]
        selected[target] = min(close, key=lambda item: (_measured(item[1]),
                                                        item[1]["size_bytes"], item[0]))[0]
    return selected


def selection_reasons(variants: Mapping[str, Mapping[str, Any]],
                      selected: Mapping[str, str | None]) -> dict[str, dict[str, str]]:
    """Per target and variant, why it was or was not selected, in the words of the rule
    `select` applies: every budget met, the lowest estimated latency, the measured host
    latency among estimates that tie, then the size. Where the estimate and this host's
    measurement rank two variants the opposite way, the reason says so."""
    reasons: dict[str, dict[str, str]] = {}
    for target, chosen in selected.items():
        why: dict[str, str] = {}
        best = variants[chosen] if chosen is not None else None
        for name, variant in variants.items():
            result = variant["targets"][target]
            if not result["budgets_ok"]:
                why[name] = "breaks a budget: " + "; ".join(result["violations"])
                continue
            est, measured = _estimate(variant, target), _measured(variant)
            if best is None:
                continue
            if name == chosen:
                others = [n for n in variants if n != name
                          and variants[n]["targets"][target]["budgets_ok"]]
                host = (f"; within {ESTIMATE_TIE:.0%}, the fastest measured on this host, "
                        f"{measured:.3f} ms p50" if math.isfinite(measured) else "")
                why[name] = ("selected: meets every budget" + (
                    f"; lowest estimated latency ({_fmt(result['est_latency_ms'], '.3f')} ms "
                    f"est.{host}), then smallest size, among {', '.join([name, *others])}"
                    if others else "; the only variant that does"))
                continue
            best_est, best_measured = _estimate(best, target), _measured(best)
            both_measured = math.isfinite(measured) and math.isfinite(best_measured)
            if est > best_est * (1 + ESTIMATE_TIE):
                why[name] = (f"meets every budget, but {name}'s estimated latency "
                             f"{est:.3f} ms > {chosen}'s {best_est:.3f} ms")
                if both_measured and measured < best_measured * (1 - MEASURED_NOISE):
                    why[name] += (f". Measured on this host it is the faster one "
                                  f"({measured:.3f} vs {best_measured:.3f} ms p50): the "
                                  "estimate (FLOPs on the device) and the measurement (this "
                                  "host's kernels) disagree")
            elif both_measured and measured > best_measured:
                why[name] = (f"meets every budget, estimated latency close to {chosen}'s "
                             f"({est:.3f} vs {best_est:.3f} ms), but slower measured on this "
                             f"host ({measured:.3f} vs {best_measured:.3f} ms p50)")
            else:
                why[name] = (f"meets every budget, same estimated latency as {chosen}, "
                             f"but larger ({_kib(variant['size_bytes'])} vs "
                             f"{_kib(best['size_bytes'])})")
        reasons[target] = why
    return reasons


def _kib(size_bytes: int) -> str:
    return f"{size_bytes / 1024:,.1f} KiB"


def build_report(plan: Plan, data: RunData, outcomes: Mapping[str, NodeOutcome],
                 devices: Mapping[str, Any], variants: list[str], run_id: str | None
                 ) -> dict[str, Any]:
    built = {name: build_variant(name, plan, data, outcomes, devices) for name in variants}
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
            "selection_reasons": selection_reasons(built, selected)}


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


def write_outputs(out_dir: Path, plan: Plan, data: RunData,
                  outcomes: Mapping[str, NodeOutcome], report: Mapping[str, Any]) -> None:
    """DIR/<pipeline>/ (the model file of its kind, signature.json, stage files) and
    DIR/report.json.

    Everything is built in a staging folder first; then a few renames, with Ctrl-C held,
    swap the variant folders in and report.json last: the outputs appear whole or not at
    all. A folder that cannot be written (full, read-only) is an OutputError naming it.
    """
    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=".staging-"))
    except OSError as exc:
        raise OutputError(f"cannot write the outputs to {out_dir}: {describe_os_error(exc)}",
                          file=str(out_dir)) from exc
    from orchestrator.report_page import report_files

    pictures, warnings = report_files(report)
    for warning in warnings:  # the run succeeded: its pictures are not worth failing it
        print(f"warning: {warning}", file=sys.stderr)
    report["page_files"] = sorted(pictures)  # type: ignore[index]
    try:
        for name in report["variants"]:
            _write_variant(staging / name, name, plan, data, outcomes)
        for name, content in pictures.items():
            (staging / name).write_bytes(content)
        (staging / "report.json").write_text(json.dumps(report, indent=2, default=_jsonable))
        with interrupts_deferred():
            for name in report["variants"]:
                final = out_dir / name
                if final.exists():
                    os.rename(final, staging / f".old-{name}")
                os.rename(staging / name, final)
            for name in pictures:
                os.replace(staging / name, out_dir / name)
            os.rename(staging / "report.json", out_dir / "report.json")
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if created:  # leave no empty folder behind either
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise OutputError(f"cannot write the outputs to {out_dir}: {describe_os_error(exc)}",
                          file=str(out_dir)) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def discard_outputs(out_dir: Path) -> None:
    """After a failed run: report.json and the variant folders it lists go together (Ctrl-C
    held), so that neither a stale report nor models without one pass for this run."""
    report_path = out_dir / "report.json"
    with interrupts_deferred():
        try:
            old = json.loads(report_path.read_text())
            names = [n for n in old["variants"] if name_problem(n) is None]  # never a path
            page_files = [n for n in old.get("page_files") or []
                          if name_problem(n) is None]  # out of DIR
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            names, page_files = [], []
        try:
            report_path.unlink(missing_ok=True)
        except OSError:
            return  # an unwritable folder: nothing of this run is in it either
        for name in names:
            shutil.rmtree(out_dir / name, ignore_errors=True)
        for name in page_files:
            with contextlib.suppress(OSError):
                (out_dir / name).unlink()


def _write_variant(folder: Path, name: str, plan: Plan, data: RunData,
                   outcomes: Mapping[str, NodeOutcome]) -> None:
    """One variant's folder (inside the staging folder: plain writes suffice)."""
    folder.mkdir(parents=True)
    key = plan.final_model_key(name)
    if key in data.unstored_models:
        artifact = data.unstored_models[key]
        (folder / kinds.file_name(artifact.kind)).write_bytes(kinds.to_bytes(artifact))
        (folder / "signature.json").write_text(artifact.signature_json())
    else:  # copy the stored bytes: no need to parse the graph
        stored = data.store.model_path(key)
        shutil.copyfile(stored, folder / stored.name)
        shutil.copyfile(data.store.signature_path(key), folder / "signature.json")
    for node in plan.pipelines[name]:
        outcome = outcomes.get(node.id)
        if outcome is None or not data.store.has(node.key):
            continue
        for file_name in outcome.files:
            target = folder / file_name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(data.store.file_path(node.key, file_name), target)


def _jsonable(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def _fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def _min_sqnr(variant: Mapping[str, Any]) -> str:
    """'23.1 (onset)': the lowest SQNR of the outputs that are not class scores."""
    rows = [r for r in variant.get("outputs") or [] if r.get("kind") not in (
        "class_scores", "class_indices") and r.get("sqnr_db") is not None]
    if not rows:
        return "-"
    worst = min(rows, key=lambda r: r["sqnr_db"])
    return f"{worst['sqnr_db']:.1f} ({worst['name']})"


def print_summary(report: Mapping[str, Any], out_dir: Path, console: Any = None) -> None:
    """The summary table: one row per variant. Sizes are the shipped file in KiB; host p50
    is measured on this machine; each target's column is the device latency that its
    budget and the selection use, an estimate (FLOPs over the device's speed)."""
    import sys

    from rich.console import Console
    from rich.table import Table

    # a pipe or CI log gets a wide table instead of rich's 80-column default
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title=f"recipe {report['recipe']}", caption="KiB: 1,024 bytes of the file "
                  "that ships · est. ms: device latency from FLOPs (budgets and selection; "
                  "host p50 breaks ties within 10%)")
    columns = ["variant", "shipped KiB", "gzip KiB", "params", "host p50 ms\n(measured)",
               "accuracy", "drop", "fidelity"]
    # outputs that are not class scores: their lowest SQNR says more than one fidelity figure
    sqnr = any(_min_sqnr(v) != "-" for v in report["variants"].values())
    if sqnr:
        columns.append("min SQNR dB\n(output)")
    target_names = list(report.get("selected") or {})
    devices = {t: r.get("device", "") for v in report["variants"].values()
               for t, r in v["targets"].items()}
    columns += [f"{t} ({devices.get(t, '')})\nest. ms, budgets" for t in target_names]
    columns.append("cached")
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for name, v in report["variants"].items():
        latency = (v.get("latency_ms") or {}).get("p50")
        per_target = []
        for target in target_names:
            result = v["targets"][target]
            mark = "[green]ok[/]" if result["budgets_ok"] else "[red]FAIL[/]"
            chosen = " [bold]✓[/]" if report["selected"].get(target) == name else ""
            per_target.append(f"{_fmt(result['est_latency_ms'], '.3f')} {mark}{chosen}")
        cached = sum(s["cached"] for s in v["stages"])
        table.add_row(name, f"{v['size_bytes'] / 1024:,.1f}",
                      f"{v['gzip_size_bytes'] / 1024:,.1f}", f"{v['params']:,}",
                      _fmt(latency, ".3f"), _fmt(v.get("accuracy"), ".4f"),
                      _fmt(v.get("accuracy_drop"), "+.4f"), _fmt(v.get("fidelity"), ".4f"),
                      *([_min_sqnr(v)] if sqnr else []), *per_target,
                      f"{cached}/{len(v['stages'])}")
    console.print(table)
    for name, v in report["variants"].items():
        for warning in v.get("warnings", []):
            console.print(f"  [yellow]warning[/] {name}: {warning}")
    for role, summary in (report.get("data") or {}).items():
        if summary.get("skipped_inputs"):
            names = ", ".join(Path(f).name for f in summary["skipped_files"][:5])
            console.print(f"  [yellow]warning[/] data.{role}: skipped "
                          f"{summary['skipped_inputs']} non-image file(s): {names}")
    reasons = report.get("selection_reasons") or {}
    for target, variant in report.get("selected", {}).items():
        console.print(f"selected for {target}: "
                      + (f"[bold green]{variant}[/]" if variant else "[bold red]none meets "
                         "its budgets[/]"))
        for name, why in (reasons.get(target) or {}).items():
            console.print(f"  {name}: {why}", highlight=False)
    for name, v in report["variants"].items():
        if v.get("encryption"):  # where the key came from; never the key
            console.print(f"{name}: encrypted with key id {v['encryption'].get('key_id')} "
                          f"from {v['encryption'].get('key_source')}")
    page = " and report.html (open it in a browser)" if "report.html" in (
        report.get("page_files") or []) else ""
    console.print(f"results: {out_dir}/report.json{page}, the models in {out_dir}/<variant>/")
