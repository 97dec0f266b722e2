"""Measure the file that ships on the target's own board, and check its outputs there.

Added to every pipeline for each target with `connect:` (recipe/defaults.py), or listed by
hand. On the board (boards/): the shipped file's latency per thread setting after warm-up
runs (first/cold, then count, mean, std, cv, p50, p90, p99, max), the load time and memory
growth of a fresh process, and the evaluation inputs run there. Here, as evaluate judges
the host's outputs: `fidelity` against the float source model's outputs on the same
inputs, and `accuracy` against the labels; and, under its own name, the agreement with
this host's outputs for the same file (`agreement_with_host`; `top1_agreement`, max abs
difference, SQNR per output). An emulated board's timings are marked `emulated`: they
measure qemu, not the core, and never decide a budget or a selection. Thread settings
above the board's cores (its own count) are capped at them: `threads_capped_from` says
what was asked.

`info.device[target]`: `where` (the URL), the board (machine, CPU, cores, memory, Python,
runtimes), `emulated`, `latency_ms` (first thread setting), `threads` and
`threads_matrix`, `load`, `noise` (governor, pinned cores, temperatures, lock wait),
`fidelity`, `accuracy`, `host_accuracy`, `agreement_with_host`, `top1_agreement`,
`outputs` (per output, against this host's), `unlike_source` (outputs left out of
`fidelity`: their shape differs from the source model's; a warning names them),
`seconds`; or `measured: false` and `reason` where the board cannot run this kind of file.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from orchestrator.limits import MAX_THREAD_SETTINGS, bounded
from orchestrator.model.artifact import ModelArtifact
from orchestrator.stages import register
from orchestrator.stages.base import ANY_KIND, Stage, StageContext, StageParams, StageResult

# inputs run on the board when the recipe has no evaluation data
RANDOM_SAMPLES = 16
# timings whose coefficient of variation is above this are called noise
NOISY_CV = 0.15


class Params(StageParams):
    NOT_IN_KEY = frozenset({"timeout_s"})

    target: str = Field(description="The target whose `connect:` board measures the model.")
    connect: str | None = Field(
        None, description="The board's URL; by default the target's `connect:` (set by the "
        "recipe loader: it is part of the cache key, so another board measures again).")
    threads: bounded("threads") | Annotated[list[bounded("threads")], Field(
        min_length=1, max_length=MAX_THREAD_SETTINGS)] | None = Field(
        None, description="Thread settings timed on the board; default 1 and the target "
        "device's cores; each capped at the board's own cores. `latency_ms` is the first.")
    warmup: bounded("warmup") = Field(5, description="Untimed runs first, per setting.")
    runs: bounded("runs") = Field(50, description="Timed runs per setting.")
    samples: bounded("samples") | None = Field(
        None, description="Evaluation samples run on the board (default: all of them).")
    min_agreement: float = Field(
        0.99, ge=0, le=1, description="Warn when the board's top-1 agreement with this host's "
        "outputs is below this (a budget: the target's `min_device_agreement`).")
    timeout_s: bounded("timeout_s") = Field(
        600, description="A measurement not done in this many seconds fails the stage (a "
        "board that hangs), and the board ends its side too.")


def run(given: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.boards import measurement
    from orchestrator.boards.errors import DeviceLost, DeviceUnreachable
    from orchestrator.boards.session import drop_session, shared_session
    from orchestrator.boards.urls import parse_device_url

    assert params.connect is not None, "the recipe loader fills connect from the target"
    url = parse_device_url(params.connect)
    device = ctx.devices.get(params.target)
    settings = (params.threads if isinstance(params.threads, list) else
                [params.threads] if params.threads else
                sorted({1, device.cores if device is not None else 1}))
    try:
        session = shared_session(url, url.text)
        board = session.describe()
        board = {k: v for k, v in board.items() if k not in ("blobs", "protocol")}
        result: dict[str, Any] = {"where": url.text, "emulated": url.emulated, "board": board}
        settings, capped_from = _capped(settings, board.get("cores"))
        why = measurement.why_not_measurable(given, board, url.text)
        if why is not None:  # said once, in the board's table (no warning line as well)
            result.update(measured=False, reason=why)
            return StageResult(artifact=given, info={"device": {params.target: result}})
        inputs, labels = _inputs(given, ctx, params.samples)
        reply = measurement.measure(session, given, ctx.model_key, inputs, settings,
                                    warmup=params.warmup, runs=params.runs,
                                    samples=len(inputs), timeout=params.timeout_s)
    except (DeviceLost, DeviceUnreachable) as exc:  # mid-run: the stage fails (exit 3)
        drop_session(url)
        raise DeviceLost(f"target {params.target}: {exc.message}") from None
    host_outputs = _host_outputs(given, ctx, inputs)
    from orchestrator.measure.fidelity import output_kind, output_names

    # the source model's own outputs on the same inputs (as evaluate gets them): what
    # each output is, and what the board's fidelity is measured against
    kinds = references = None
    if ctx.reference_outputs is not None and ctx.evaluation is not None:
        references = ctx.reference_outputs()
        references = [references] if hasattr(references, "shape") else list(references)
        references = [reference[:len(inputs)] for reference in references]
        kinds = [output_kind(reference, labelled=labels is not None)
                 for reference in references]
    compared = measurement.compare(reply["outputs"], host_outputs,
                                   output_names(list(given.outputs), given.metadata), labels,
                                   kinds, references)
    matrix = [{"threads": int(t), "latency_ms": stats} for t, stats in reply["threads"].items()]
    result.update(measured=True, latency_ms=matrix[0]["latency_ms"], threads_matrix=matrix,
                  threads=matrix[0]["threads"], load=reply["load"], noise=reply["noise"],
                  samples=len(inputs), seconds=reply["seconds"], **compared)
    if capped_from is not None:
        result["threads_capped_from"] = capped_from
    return StageResult(artifact=given, info={"device": {params.target: result}},
                       metrics=_metrics(params.target, result),
                       warnings=_warnings(params, result))


def _capped(settings: list[int], cores: Any) -> tuple[list[int], int | None]:
    """The thread settings the board can run: each at most the board's cores (its own
    count, as it reports it), in their order, once each; and the largest setting asked
    above them (None when none was)."""
    if not isinstance(cores, int) or cores < 1 or max(settings) <= cores:
        return list(settings), None
    return list(dict.fromkeys(min(t, cores) for t in settings)), max(settings)


def _inputs(given: ModelArtifact, ctx: StageContext, samples: int | None) -> tuple[Any, Any]:
    """The evaluation inputs (and labels) to run there; random ones of the input's shape
    when the recipe has no evaluation data."""
    if ctx.evaluation is not None:
        data = ctx.evaluation()
        count = samples or len(data.inputs)
        return data.inputs[:count], None if data.labels is None else data.labels[:count]
    import numpy as np

    from orchestrator.measure.tf_runtime import random_input

    spec = given.inputs[0]
    shape = [None, *(spec.shape or [1])[1:]]  # the batch is the samples, whatever it was
    return np.asarray(random_input(shape, spec.dtype, samples or RANDOM_SAMPLES, seed=0)), None


def _host_outputs(given: ModelArtifact, ctx: StageContext, inputs: Any) -> list[Any]:
    from orchestrator.measure.tf_runtime import open_runner

    with open_runner(given, ctx.model_key) as runner:
        return runner.predict_all(inputs)


def _metrics(target: str, result: dict[str, Any]) -> dict[str, float]:
    metrics = {f"device_latency_p50_ms.{target}": result["latency_ms"]["p50"],
               f"device_agreement_with_host.{target}": result["agreement_with_host"]}
    if result.get("fidelity") is not None:  # against the float source model's outputs
        metrics[f"device_fidelity.{target}"] = result["fidelity"]
    if result.get("top1_agreement") is not None:
        metrics[f"device_top1_agreement.{target}"] = result["top1_agreement"]
    if result.get("accuracy") is not None:
        metrics[f"device_accuracy.{target}"] = result["accuracy"]
    load = result.get("load") or {}
    if "load_ms" in load:
        metrics[f"device_load_ms.{target}"] = load["load_ms"]
    return metrics


def _warnings(params: Params, result: dict[str, Any]) -> list[str]:
    warnings = []
    where = f"{params.target} ({result['where']})"
    disagree = [f"{name} (top-1 agreement {o['top1_agreement']:.4f}, max abs diff "
                f"{o['max_abs_diff']:.3g})" for name, o in result["outputs"].items()
                if o.get("top1_agreement", 1.0) < params.min_agreement]
    if result["agreement_with_host"] < params.min_agreement and not disagree:
        disagree = [f"{name} (SQNR {o['sqnr_db']:.1f} dB, max abs diff "
                    f"{o['max_abs_diff']:.3g})" for name, o in result["outputs"].items()]
    if disagree:
        warnings.append(f"{where}: the board's outputs disagree with this host's for the "
                        f"same file: {', '.join(disagree)}")
    if result.get("unlike_source"):  # fidelity covers the others only, or is None
        shapes = ", ".join(f"{name} ({shape['board']} on the board, {shape['source']} in "
                           f"the source model)"
                           for name, shape in result["unlike_source"].items())
        covered = ("covers the other outputs only" if result.get("fidelity") is not None
                   else "is not measured")
        warnings.append(f"{where}: fidelity to the source model {covered}: these outputs' "
                        f"shapes differ from the source model's: {shapes}")
    cv = result["latency_ms"]["cv"]
    if cv > NOISY_CV and not result["emulated"]:
        warnings.append(f"{where}: the timings vary too much to trust (cv {cv:.2f} > "
                        f"{NOISY_CV}): something else runs on the board, or it throttles")
    if "error" in (result.get("load") or {}):
        warnings.append(f"{where}: load time not measured: {result['load']['error']}")
    return warnings


register(Stage(name="measure_on_device", run=run, params=Params,
               doc="Latency, load time, memory and outputs of the shipped file on the target's "
                   "own board (`connect:`): its fidelity to the source model and accuracy, as "
                   "`evaluate` judges them, and its agreement with this host's outputs; added "
                   "to every pipeline for each connected target.",
               kind="measure", accepts=ANY_KIND, optional_data=("evaluation",),
               variant_metrics=True, per_board=True))
