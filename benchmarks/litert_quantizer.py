"""Full-integer LiteRT that keeps float's answers at int8 speed: the stock converter against
the LiteRT Quantizer, each of its int8 methods alone, and its guard, on five models.

Models: the photo mini-Xception (separable convolutions, residual adds, batch norm, 7
classes; benchmarks/testbed/models_photo_xception.py), mtcnn's ONet (the package's own trained
weights; benchmarks/onet.py), the audio front-end model (a 40 dB filterbank, three sigmoid
heads; benchmarks/testbed/models_audio_frontend.py), the digits CNN, and Keras's MobileNetV2
(alpha 0.35, 96x96 RGB) trained here on photo crops (benchmarks/testbed/
models_mobilenet_photos.py). Per model, the variants (every LiteRT one from
`convert_tflite: {mode: fp32}` but the stock converter's):

    fp32:            [freeze, strip, fold, benchmark, evaluate]
    stock_int8:      convert_tflite {mode: int8}          (the converter's full integer)
    aeq_int8:        quantize_tflite                      (min-max ranges)
    aeq_mse:         quantize_tflite {ranges: mse}        (ranges chosen by error)
    aeq_rounding:    quantize_tflite {ranges: mse, rounding: learned}  (AdaRound-style)
    aeq_trained:     quantize_tflite {fine_tune: true}    (trained ranges, QAT, 300 steps)
    stock_dynamic:   convert_tflite {mode: dynamic_range} (int8 weights, float compute)
    aeq_int16_guard: quantize_tflite {guard: true} for a target whose device runs int16
                     activations natively (an inline device, `a16w8: true`): the guard takes
                     the int16 ladder first, as Step 10's guard did
    aeq_guard:       quantize_tflite {guard: true} for the phone-2016 preset (a CPU): the int8
                     methods first, then int16 activations, float, dynamic range

The one-shot variants run in one recipe, each guard in a recipe of its own, every recipe with
a fresh store: nothing is cached, so each "seconds to find" is that variant's own work (the
quantize stage's seconds, the converter's for stock_*, the sum of the trials' seconds for a
guard).

Budget: top-1 agreement 0.99 for the classifiers; 20 dB SQNR on every head for ONet's box and
landmarks (its face_prob: agreement 0.99) and the audio heads. Every benchmark runs with one
thread. Per variant: size, agreement or SQNR per output under LiteRT's default kernels
(XNNPACK where it takes the ops) and under its builtin kernels alone
(BUILTIN_WITHOUT_DEFAULT_DELEGATES), each against the source model's outputs on the
evaluation data (measured here, from the files the run wrote), what the file computes in,
whether the report calls the budget met, host p50, and the seconds it took to find.

Goals (issue 41): the guard's file computes in int8 only and meets the budget (under both
kernel sets) on every model; its host p50 within 1.15x of aeq_int8's and its size within
1.05x; found in under 5 minutes. Exit 1 when one is missed (not judged with --quick).

    .venv/bin/python benchmarks/litert_quantizer.py [--models xception,onet,audio,digits,mobilenet]
        [--variants fp32,aeq_int8,...] [--work DIR] [--board qemu://aarch64?cpu=cortex-a76
        [--board-only]] [--quick]

--board: aeq_int8's and aeq_guard's files also run on that board (one thread), on the whole
evaluation set: their figures there against the float graph's, and the largest difference
from this host's outputs (--board-only: on the files of an earlier run in --work).
--quick: the digits CNN, fp32, aeq_int8 and aeq_guard in one recipe, 20 timed runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mini_xception import ROOT, default_cli, quiet_env, run_recipe  # noqa: E402

DEFAULT_WORK = ROOT / ".orchestrator" / "bench" / "litert_quantizer"
DIGITS = ROOT / "examples" / "digits"
MODELS = ("xception", "onet", "audio", "digits", "mobilenet")
KERNEL_SETS = ("default", "builtin")
MAX_LATENCY_OVER_INT8 = 1.15
MAX_SIZE_OVER_INT8 = 1.05
MAX_FIND_SECONDS = 300.0
EVAL_PER_CLASS = 200  # evaluation crops a class for the photo models (_evaluation)

FLOAT_TFLITE = "{convert_tflite: {mode: fp32}}"
# variant -> (recipe part, its stages after fp32's). A part is one recipe and one run.
VARIANTS: dict[str, tuple[str, str]] = {
    "fp32": ("", ""),
    "stock_int8": ("one_shot", "{convert_tflite: {mode: int8}}"),
    "aeq_int8": ("one_shot", f"{FLOAT_TFLITE}, quantize_tflite"),
    "aeq_mse": ("one_shot", f"{FLOAT_TFLITE}, {{quantize_tflite: {{ranges: mse}}}}"),
    "aeq_rounding": ("one_shot", f"{FLOAT_TFLITE}, {{quantize_tflite: {{ranges: mse, "
                     "rounding: learned}}"),
    "aeq_trained": ("one_shot", f"{FLOAT_TFLITE}, {{quantize_tflite: {{fine_tune: true}}}}"),
    "stock_dynamic": ("one_shot", "{convert_tflite: {mode: dynamic_range}}"),
    "aeq_int16_guard": ("int16_guard", f"{FLOAT_TFLITE}, {{quantize_tflite: {{guard: true}}}}"),
    "aeq_guard": ("guard", f"{FLOAT_TFLITE}, {{quantize_tflite: {{guard: true}}}}"),
}
QUICK_VARIANTS = ("fp32", "aeq_int8", "aeq_guard")
FINDING_STAGES = ("quantize_tflite", "convert_tflite")  # whose seconds found a one-shot file

HEADER = """\
version: 1
name: {name}-litert-quantizer-{part}
model: {{path: {model}{shape}}}
data:
  representative: {{source: {data}, array: x_calib, samples: 200}}
  evaluation: {{source: {eval_data}, inputs: {inputs}{labels}}}
targets: [{{name: phone, device: {device}, budgets: {budgets}{connect}}}]
"""
CPU_DEVICE = "phone-2016"
# phone-2016's figures, on a DSP/NPU that runs int16 activations natively
A16W8_DEVICE = ("{name: a16w8-npu, flops_per_second: 20e9, cores: 4, ram_mb: 2048, "
                "a16w8: true}")
CLASSIFIER = "{min_fidelity: 0.99}"
HEADS = "{min_sqnr_db: 20}"


def _build_test_model(module: str, folder: Path) -> None:
    """A testbed model (trained once, or from committed weights) in a fresh process."""
    if (folder / "model.keras").is_file():
        return
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); "
            f"from testbed import model_builds; from pathlib import Path; "
            f"print(model_builds.build({module!r}, Path({str(folder)!r}), timeout=1800))")
    subprocess.run([sys.executable, "-c", code], env=quiet_env(), check=True)


def _evaluation(module: str, folder: Path) -> str:
    """folder/eval.npz: EVAL_PER_CLASS fresh crops a class for the photo models (a stream
    of their own: neither trained nor calibrated on). The builds' 60 a class are too few for
    a 0.99 agreement budget: the guard confirms its choice on a quarter of the evaluation
    set, and a lower bound at 90% reaches 0.99 only from 163 samples all agreeing."""
    made = folder / "eval.npz"
    if not made.is_file():
        import importlib

        import numpy as np

        builder = importlib.import_module(f"testbed.{module}")
        x, y = builder.crops(builder.photos(), EVAL_PER_CLASS, builder.SEED + 3)
        np.savez(made, x_test=x, y_test=y)
    return str(made)


def model_fields(name: str, root: Path) -> dict[str, str]:
    """The recipe header's fields for the model (its files built once under root/models)."""
    work = root / "models" / name
    work.mkdir(parents=True, exist_ok=True)
    if name == "digits":
        return {"model": str(DIGITS / "saved_model"),
                "shape": ", inputs: [{name: image, dtype: float32, shape: [1, 8, 8, 1]}]",
                "data": str(DIGITS / "data.npz"), "inputs": "x_test",
                "labels": ", labels: y_test", "budgets": CLASSIFIER}
    if name in ("xception", "mobilenet"):
        module = {"xception": "models_photo_xception",
                  "mobilenet": "models_mobilenet_photos"}[name]
        _build_test_model(module, work)
        return {"model": str(work / "model.keras"), "shape": "",
                "data": str(work / "data.npz"), "eval_data": _evaluation(module, work),
                "inputs": "x_test", "labels": ", labels: y_test", "budgets": CLASSIFIER}
    if name == "audio":
        _build_test_model("models_audio_frontend", work)
        return {"model": str(work / "model.keras"), "shape": "",
                "data": str(work / "data.npz"), "inputs": "x_test", "labels": "",
                "budgets": HEADS}
    if name == "onet":
        from onet import build_data

        build_data(work)
        # face_prob is a class score: judged by its agreement, the regressions by SQNR
        return {"model": str(work / "saved_model"), "shape": "",
                "data": str(work / "data.npz"), "inputs": "x_eval", "labels": "",
                "budgets": "{min_sqnr_db: 20, min_fidelity: 0.99}"}
    raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def recipe_text(name: str, part: str, variants: list[str], bench: str, root: Path,
                board: str | None = None) -> str:
    """The recipe of one part (its variants after fp32) for the model."""
    device = A16W8_DEVICE if part == "int16_guard" else CPU_DEVICE
    connect = f", connect: '{board}'" if board and part == "guard" else ""
    fields = model_fields(name, root)
    header = HEADER.format(name=name, part=part.replace("_", "-"), device=device,
                           connect=connect, **{"eval_data": fields["data"], **fields})
    lines = ["pipelines:", "  fp32:",
             f"    stages: [freeze, strip, fold, {{benchmark: {bench}}}, evaluate]"]
    for variant in variants:
        lines += [f"  {variant}:", "    from: fp32",
                  f"    stages: [{VARIANTS[variant][1]}, {{benchmark: {bench}}}, evaluate]"]
    return header + "\n".join(lines) + "\n"


# --- per kernel set: each LiteRT file against the source model, measured here ------------

def kernel_figures(out: Path, report: dict[str, Any], data_file: Path, inputs: str
                   ) -> dict[str, dict[str, dict[str, float]]]:
    """variant -> kernel set -> output -> its top-1 agreement (class outputs) or SQNR dB,
    each LiteRT file's outputs against the fp32 variant's (the folded float graph: the
    source model's numbers) on the evaluation inputs."""
    import numpy as np

    from orchestrator.measure.fidelity import CLASS_KINDS, compare, output_kind, output_names
    from orchestrator.measure.litert_runtime import LiteRTRunner
    from orchestrator.measure.tf_runtime import open_runner
    from orchestrator.model import kinds

    x = np.load(data_file)[inputs]

    def load(variant: str) -> Any:
        folder = out / variant
        model = next(p for p in folder.iterdir() if p.name.startswith("model."))
        return kinds.load(model.read_bytes(), (folder / "signature.json").read_text())

    reference_model = load("fp32")
    with open_runner(reference_model) as runner:
        references = runner.predict_all(x, 64)
    # each output judged as evaluate judged it (class scores by agreement, else SQNR)
    judged = {r["name"]: r.get("kind") for r in report["variants"]["fp32"].get("outputs") or []}
    figures: dict[str, dict[str, dict[str, float]]] = {}
    for variant, facts in report["variants"].items():
        if facts.get("kind") != "tflite":
            continue
        model = load(variant)
        names = output_names(model.outputs, model.metadata)
        per_set = {}
        for kernels in KERNEL_SETS:
            with LiteRTRunner(model, num_threads=1, kernels=kernels) as runner:
                outputs = runner.predict_all(x, 64)
            per_set[kernels] = {
                name: compare(o, r, kind)["top1_agreement" if kind in CLASS_KINDS
                                          else "sqnr_db"]
                for name, o, r in zip(names, outputs, references, strict=True)
                for kind in [judged.get(name) or output_kind(r, False)]}
        figures[variant] = per_set
    return figures


def interleaved_p50(files: dict[str, Path], sample: Any, rounds: int, runs: int
                    ) -> dict[str, float]:
    """variant -> p50 ms of Invoke() at one thread under LiteRT's default kernels, the files
    timed in turn, `rounds` times `runs` invokes each: on a shared, loaded host every file
    meets the same load, so their ratios hold where each run's own benchmark may not."""
    import time

    import numpy as np

    from orchestrator.measure.litert_runtime import LiteRTRunner
    from orchestrator.model import kinds

    runners = {}
    for variant, folder in files.items():
        model = next(p for p in folder.iterdir() if p.name.startswith("model."))
        artifact = kinds.load(model.read_bytes(), (folder / "signature.json").read_text())
        runner = LiteRTRunner(artifact, num_threads=1)
        runner.set_inputs(sample)
        for _ in range(5):  # warm-up
            runner.interpreter.invoke()
        runners[variant] = runner
    times: dict[str, list[float]] = {v: [] for v in runners}
    for _ in range(rounds):
        for variant, runner in runners.items():
            for _ in range(runs):
                started = time.perf_counter()
                runner.interpreter.invoke()
                times[variant].append((time.perf_counter() - started) * 1e3)
    for runner in runners.values():
        runner.close()
    return {v: float(np.median(t)) for v, t in times.items()}


# --- rows, table, goals -------------------------------------------------------------------

def find_seconds(variant: dict[str, Any]) -> float | None:
    """What finding the file cost: for a one-shot file, its quantizing (or converting)
    stage's seconds; for a guard, its pipeline's own stages (trial 0: convert, quantize,
    benchmark, evaluate) plus every later trial's seconds. None for the float graph."""
    stages = {s["name"]: s["seconds"] for s in variant.get("stages") or []}
    trials = variant.get("trials") or []
    if trials:
        return float(sum(stages.values()) + sum(t.get("seconds") or 0.0 for t in trials))
    return next((float(stages[s]) for s in FINDING_STAGES if s in stages), None)


def figures(name: str, report: dict[str, Any], out: Path, per_kernels: dict[str, Any],
            fp32_bytes: int, meets_budget: Any) -> list[dict[str, Any]]:
    rows = []
    for variant_name, variant in report["variants"].items():
        outputs = variant.get("outputs") or []
        sets = per_kernels.get(variant_name) or {
            "tensorflow": {o["name"]: (o.get("top1_agreement") if o.get("top1_agreement")
                                       is not None else o.get("sqnr_db")) for o in outputs}}
        rows.append({
            "variant": variant_name, "bytes": variant["size_bytes"],
            "folder": str(out / variant_name), "kind": variant.get("kind"),
            "p50_run_ms": (variant.get("latency_ms") or {}).get("p50"),
            "ratio": variant["size_bytes"] / fp32_bytes,
            "kernel_sets": sets,
            "computes_in": variant.get("computes_in") or (
                "float (GraphDef)" if variant.get("kind") != "tflite" else "?"),
            "p50_ms": (variant.get("latency_ms") or {}).get("p50"),
            "find_s": find_seconds(variant) if variant_name != "fp32" else None,
            "trials": len(variant.get("trials") or []),
            "board": _board(variant["targets"]["phone"].get("measured") or {}),
            "meets_report": not any(t.get("violations") for t in variant["targets"].values()),
            "meets_both": all(meets_budget(name, s) for s in sets.values())})
    return rows


def meets_budget(name: str, figures_of: dict[str, float]) -> bool:
    """The benchmark's budget on one kernel set's figures (point values)."""
    for output, value in figures_of.items():
        if value is None:
            return False
        agreement = name not in ("audio", "onet") or output == "face_prob"
        if (agreement and value < 0.99) or (not agreement and value < 20.0):
            return False
    return True


def _board(measured: dict[str, Any]) -> str:
    """The board's top-1 agreement with this host per class output (else the largest
    abs difference), or why it was not measured."""
    if not measured:
        return ""
    if not measured.get("measured"):
        return f"not measured: {measured.get('reason', '-')}"
    return ", ".join(f"{n} {o['top1_agreement']:.3f}" if "top1_agreement" in o
                     else f"{n} ±{o['max_abs_diff']:.2g}"
                     for n, o in measured["outputs"].items())


def _outputs(values: dict[str, float | None]) -> str:
    return ", ".join("n/a" if v is None else (f"{n} {v:.3f}" if v <= 1.0 else f"{n} {v:.1f}")
                     for n, v in values.items())


def table(name: str, rows: list[dict[str, Any]]) -> str:
    def num(value: Any, form: str) -> str:
        return "" if value is None else format(value, form)

    board = any(r.get("board") for r in rows)
    lines = [f"### {name}", "",
             "| variant | size KiB | / fp32 | XNNPACK (default): agreement or SQNR dB | "
             "builtin kernels | computes in | meets budget (report / both kernel sets) | "
             "host p50 ms, 1 thread (its run's) | seconds to find | guard trials |"
             + (" board vs host |" if board else ""),
             "|---|---:|---:|---|---|---|---|---:|---:|---:|" + ("---|" if board else "")]
    for r in rows:
        if r.get("failed"):
            reason = r["failed"].split("]: ", 1)[-1]  # without the recipe's file and line
            lines.append(f"| {r['variant']} | failed: {reason[:200]} |")
            continue
        sets = r["kernel_sets"]
        default = sets.get("default") or sets.get("tensorflow") or {}
        builtin = sets.get("builtin")
        lines.append(
            f"| {r['variant']} | {r['bytes'] / 1024:,.1f} | {r['ratio']:.3f} | "
            f"{_outputs(default)} | {_outputs(builtin) if builtin else '(TensorFlow)'} | "
            f"{r['computes_in']} | {'yes' if r['meets_report'] else 'no'} / "
            f"{'yes' if r['meets_both'] else 'no'} | {num(r['p50_ms'], '.3f')} "
            f"({num(r.get('p50_run_ms'), '.3f')}) | "
            f"{num(r['find_s'], '.1f')} | {r['trials'] or ''} |"
            + (f" {r['board']} |" if board else ""))
    return "\n".join(lines)


def goals(name: str, rows: list[dict[str, Any]]) -> list[str]:
    by = {r["variant"]: r for r in rows if not r.get("failed")}
    guard, plain = by.get("aeq_guard"), by.get("aeq_int8")
    if guard is None:
        return [f"{name}: aeq_guard failed"] if any(
            r["variant"] == "aeq_guard" for r in rows) else []
    missed = []
    if guard["computes_in"] != "int8":
        missed.append(f"{name}: aeq_guard computes in {guard['computes_in']}, not int8 only")
    if not (guard["meets_report"] and guard["meets_both"]):
        missed.append(f"{name}: aeq_guard breaks the budget (report: "
                      f"{guard['meets_report']}, both kernel sets: {guard['meets_both']})")
    if guard["find_s"] is not None and guard["find_s"] > MAX_FIND_SECONDS:
        missed.append(f"{name}: aeq_guard took {guard['find_s']:.0f} s to find "
                      f"(goal < {MAX_FIND_SECONDS:.0f})")
    if plain is None:
        return missed
    if guard["p50_ms"] and plain["p50_ms"] and \
            guard["p50_ms"] > MAX_LATENCY_OVER_INT8 * plain["p50_ms"]:
        missed.append(f"{name}: aeq_guard's p50 is {guard['p50_ms'] / plain['p50_ms']:.2f}x "
                      f"aeq_int8's (goal <= {MAX_LATENCY_OVER_INT8})")
    if guard["bytes"] > MAX_SIZE_OVER_INT8 * plain["bytes"]:
        missed.append(f"{name}: aeq_guard is {guard['bytes'] / plain['bytes']:.3f}x "
                      f"aeq_int8's size (goal <= {MAX_SIZE_OVER_INT8})")
    return missed


def _failed_variant(console: str, members: list[str]) -> str | None:
    """The variant the run's error names (a stage that failed, a param refused), if one of
    `members`."""
    import re

    for pattern in (r"\[pipelines\.(\w+)\.", r"stage (\w+)/", r"(\w+)/\w+ failed"):
        for found in re.findall(pattern, console):
            if found in members:
                return str(found)
    return None


def run_model(name: str, variants: list[str], bench: str, work: Path, board: str | None,
              one_recipe: bool = False) -> list[dict[str, Any]] | None:
    """Every part's recipe run (a fresh store each), the rows of all its variants;
    `one_recipe`: every variant in one recipe (a guard's trials may then be cached)."""
    parts: dict[str, list[str]] = {}
    for variant in variants:
        if variant != "fp32":
            part = "one_shot" if one_recipe else VARIANTS[variant][0]
            parts.setdefault(part, []).append(variant)
    parts = parts or {"one_shot": []}
    fields = model_fields(name, work)
    rows: dict[str, dict[str, Any]] = {}
    fp32_bytes = None
    for part, members in parts.items():
        while True:  # a variant that fails is a row saying why; the others run again
            # a part run for some of its variants gets its own folder: the files of the
            # others (timed again below with every file of the model) stay
            whole = [v for v, (p, _) in VARIANTS.items() if p == part]
            run_dir = work / "runs" / (f"{name}_{part}" if members == whole or one_recipe
                                       else f"{name}_{part}_{'-'.join(members)}")
            shutil.rmtree(run_dir, ignore_errors=True)  # a fresh store: nothing cached
            run_dir.mkdir(parents=True)
            recipe = run_dir / "recipe.yaml"
            recipe.write_text(recipe_text(name, part, members, bench, work, board))
            out = run_dir / "out"
            code, report, console, seconds = run_recipe(default_cli(), recipe, out, run_dir)
            failed = None if report is not None else _failed_variant(console, members)
            if failed is None:
                break
            error = next((line for line in console.splitlines() if line.startswith("error:")),
                         f"exit {code}")
            print(f"{name} {failed}: FAILED ({error})")
            rows[failed] = {"variant": failed, "failed": error.removeprefix("error: ")}
            members = [m for m in members if m != failed]
        if report is None:
            print(console)
            print(f"{name} ({part}): the run failed (exit {code})")
            return None
        per_kernels = kernel_figures(out, report, Path(fields.get("eval_data", fields["data"])),
                                     fields["inputs"])
        fp32_bytes = fp32_bytes or report["variants"]["fp32"]["size_bytes"]
        for row in figures(name, report, out, per_kernels, fp32_bytes, meets_budget):
            if row["variant"] != "fp32" or "fp32" not in rows:
                rows[row["variant"]] = row
        print(f"({name} {part}: {seconds:.0f} s: orchestrator run {recipe} -o {out})")
    return [rows[v] for v in variants if v in rows]


def board_figures(name: str, rows: list[dict[str, Any]], work: Path, board: str,
                  variants: tuple[str, ...] = ("aeq_int8", "aeq_guard")) -> None:
    """Each of `variants`' files run on `board` on the whole evaluation set (one thread):
    row["board"] holds its figures there against the float graph's (as on this host) and
    against this host's outputs for the same file."""
    import numpy as np

    from orchestrator.boards import measurement
    from orchestrator.boards.session import shared_session
    from orchestrator.boards.urls import parse_device_url
    from orchestrator.measure.fidelity import CLASS_KINDS, compare, output_names
    from orchestrator.measure.litert_runtime import LiteRTRunner
    from orchestrator.measure.tf_runtime import open_runner
    from orchestrator.model import kinds

    fields = model_fields(name, work)
    x = np.load(fields.get("eval_data", fields["data"]))[fields["inputs"]]
    by = {r["variant"]: r for r in rows if not r.get("failed")}

    def load(folder: Path) -> Any:
        model = next(p for p in folder.iterdir() if p.name.startswith("model."))
        return kinds.load(model.read_bytes(), (folder / "signature.json").read_text())

    with open_runner(load(Path(by["fp32"]["folder"]))) as runner:
        references = runner.predict_all(x, 64)
    url = parse_device_url(board)
    session = shared_session(url, url.text)
    for variant in variants:
        if variant not in by:
            continue
        model = load(Path(by[variant]["folder"]))
        names = output_names(model.outputs, model.metadata)
        with LiteRTRunner(model, num_threads=1) as runner:
            host = runner.predict_all(x, 64)
        reply = measurement.measure(session, model, None, x, [1], warmup=1, runs=3,
                                    samples=len(x), timeout=1800)
        there = [np.asarray(o, np.float32) for o in reply["outputs"]]
        figures, with_host = {}, {}
        for output, mine, ref, own in zip(names, there, references, host, strict=True):
            kind = "class_scores" if (name not in ("audio", "onet")
                                      or output == "face_prob") else "values"
            key = "top1_agreement" if kind in CLASS_KINDS else "sqnr_db"
            figures[output] = compare(mine, ref, kind)[key]
            with_host[output] = float(np.max(np.abs(mine - own)))
        by[variant]["board"] = (f"{_outputs(figures)} (max abs diff with this host: "
                                + ", ".join(f"{o} {d:.2g}" for o, d in with_host.items())
                                + ")")


def retime(name: str, rows: list[dict[str, Any]], work: Path, rounds: int, runs: int
           ) -> None:
    """Every LiteRT row's p50_ms from one interleaved timing of all the model's files (the
    float graph keeps its run's benchmark)."""
    import numpy as np

    fields = model_fields(name, work)
    files = {r["variant"]: Path(r["folder"]) for r in rows if not r.get("failed")
             if r.get("kind") == "tflite" and Path(r["folder"]).is_dir()}
    sample = np.load(fields.get("eval_data", fields["data"]))[fields["inputs"]][:1]
    p50 = interleaved_p50(files, sample, rounds, runs)
    for row in rows:
        row["p50_ms"] = p50.get(row["variant"], row.get("p50_run_ms"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"a subset of {', '.join(VARIANTS)}")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--board", help="also run aeq_int8's and aeq_guard's files on this "
                        "board (a connect: URL, e.g. qemu://aarch64?cpu=cortex-a76) on the "
                        "evaluation set")
    parser.add_argument("--board-only", action="store_true",
                        help="run nothing again: the rows of an earlier run in --work, on "
                        "--board")
    parser.add_argument("--quick", action="store_true",
                        help="digits, fp32, aeq_int8 and aeq_guard, 20 timed runs: proves "
                        "the script still works (its goals are not judged)")
    args = parser.parse_args(argv)
    models = ["digits"] if args.quick else args.models.split(",")
    variants = list(QUICK_VARIANTS) if args.quick else args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    variants = ["fp32", *(v for v in VARIANTS if v in variants and v != "fp32")]
    bench = "{threads: 1, runs: 20}" if args.quick else "{threads: 1, runs: 100}"
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    results_file = work / "litert_quantizer.json"
    # rows of earlier runs in this --work stay: a run of some variants replaces only theirs
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    missed = []
    for name in models:
        rows = [] if args.board_only else run_model(name, variants, bench, work, None,
                                                     one_recipe=args.quick)
        if rows is None:
            return 1
        merged = {r["variant"]: r for r in results.get(name, [])} | {r["variant"]: r
                                                                      for r in rows}
        rows = [merged[v] for v in VARIANTS if v in merged]
        if not args.board_only:
            retime(name, rows, work, rounds=2 if args.quick else 10,
                   runs=10 if args.quick else 50)
        if args.board:
            board_figures(name, rows, work, args.board)
        results[name] = rows
        results_file.write_text(json.dumps(results, indent=2))
        print(table(name, rows) + "\n")
        missed += goals(name, rows)
    if args.quick:
        return 0
    for line in missed:
        print(f"MISSED {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
