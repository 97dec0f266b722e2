"""`orchestrator benchmark MODEL`: the recipe's `benchmark` stage on any model file, outside a
recipe, printed as TF's `benchmark_model` prints it.

The model is opened as `inspect` and the recipe's model sources open it: a SavedModel
folder, a Keras file or a TF1 checkpoint (frozen in memory by the `freeze` stage, as a
recipe's first stage does), a frozen `.pb`/`.pbtxt`, a memmapped package (`.mmap`), a
LiteRT flatbuffer (`.tflite`, checked by LiteRT's verifier), or an encrypted model (`.enc`,
decrypted in memory with the key from an environment variable or a key file). Then the
`benchmark` stage itself measures it: nothing here times anything.

`--input-shape NAME:d1,d2,...` fixes unknown dimensions of an input, as benchmark_model's
`--input_layer_shape` does: the model's declared input shape is set to it (a Placeholder's
`shape`, a `.tflite` input's shape signature, inside the package or the encryption for
`.mmap`/`.enc`), so the timed runs, the FLOP count and the fresh-process memory probe all
see the same shape. A shape the model cannot take is exit 2, before anything runs.

`--device NAME[:THREADS]` (repeatable) adds the estimate a recipe's target gets for the
file on that device preset (`orchestrator devices` lists them): its operators priced one by
one on the device's cores, for its big cores' threads or THREADS, its costliest ops and the
estimate's expected error (orchestrator.measure.estimates).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import bounded_flag, bounded_list_flag
from orchestrator.errors import ModelSourceError, OrchestratorError, StageError, UsageError
from orchestrator.formatting import SIZE_UNIT, SIZE_UNIT_NOTE, format_mib, format_ms, format_size
from orchestrator.model.files import OpenedModel, open_model
from orchestrator.model.input_shapes import resolve_shapes, shape_text, with_input_shapes

if TYPE_CHECKING:
    from orchestrator.model.artifact import ModelArtifact
    from orchestrator.model.keys import ModelKey
    from orchestrator.stages.base import StageResult

_TOP_ROWS = 10  # benchmark_model prints the top 10 nodes by default


# --------------------------------------------------------------------------- options


def parse_threads(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; every setting at least 1."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise UsageError(f"--threads {text!r}: expected thread counts such as 1,2,4")
    settings = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise UsageError(f"--threads {text!r}: {item!r} is not a whole number") from None
        if value < 1:
            raise UsageError(f"--threads {text!r}: a thread count must be at least 1, "
                             f"got {value}")
        settings.append(value)
    return settings


def parse_input_shapes(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`NAME:d1,d2,...` per value, or several in one value (`a:1,3,b:1,5`, as
    benchmark_model's --input_layer_shape lists them); NAME may be a tensor name (`x:0`)."""
    shapes: dict[str, list[int]] = {}
    for value in values:
        current: list[int] | None = None
        for token in (t.strip() for t in value.split(",")):
            if ":" in token:
                name, _, first = token.rpartition(":")
                if not name:
                    raise UsageError(f"--input-shape {value!r}: an input name must come "
                                     "before ':' (NAME:d1,d2,...)")
                if name in shapes:
                    raise UsageError(f"--input-shape: input {name!r} is given twice")
                current = shapes[name] = []
                if first:
                    current.append(_dim(first, value))
            elif current is None:
                raise UsageError(f"--input-shape {value!r}: expected NAME:d1,d2,... "
                                 "(e.g. image:1,224,224,3)")
            else:
                current.append(_dim(token, value))
    return {name: tuple(dims) for name, dims in shapes.items()}


def _dim(text: str, value: str) -> int:
    try:
        dim = int(text)
    except ValueError:
        raise UsageError(f"--input-shape {value!r}: dimension {text!r} is not a whole "
                         "number") from None
    if dim < 1:
        raise UsageError(f"--input-shape {value!r}: every dimension must be at least 1 "
                         f"(got {dim}); give the size to run with")
    return dim


def parse_devices(values: Sequence[str]) -> dict[str, Any]:
    """`--device NAME[:THREADS]` per value -> {the value: its Device}, THREADS set as a
    recipe target's `threads:` sets it (at most the device's cores)."""
    from orchestrator.spec.devices import resolve_device

    devices: dict[str, Any] = {}
    for value in values:
        name, colon, count = value.partition(":")
        try:
            device = resolve_device(name.strip())
        except ValueError as exc:
            raise UsageError(f"--device {value!r}: {exc}") from None
        if colon:  # `NAME:` with no count is a typo, not the default threads
            if not count.strip().isdigit() or int(count) < 1:
                raise UsageError(f"--device {value!r}: threads {count!r} is not a whole "
                                 "number of at least 1 (NAME:THREADS, e.g. pixel-4:1)")
            if int(count) > device.cores:
                raise UsageError(f"--device {value!r}: {int(count)} threads is more than "
                                 f"the {device.cores} cores of {device.name}: threads beyond "
                                 "its cores only share them")
            device = device.model_copy(update={"threads": int(count)})
        if value in devices:
            raise UsageError(f"--device {value!r} is given twice")
        devices[value] = device
    return devices


def _counts(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark stage's params from the options (argparse's `bounded_flag` has
    checked each count against its bound, named by its option)."""
    params: dict[str, Any] = {key: getattr(args, key) for key in ("runs", "warmup",
                                                                   "profile_runs")
                              if getattr(args, key) is not None}
    if args.threads is not None:
        params["threads"] = parse_threads(args.threads)
    return params


# --------------------------------------------------------------------------- running


def run_benchmark(artifact: ModelArtifact, params: Any, key: ModelKey | None,
                  path: Path, devices: Mapping[str, Any] | None = None) -> StageResult:
    """The benchmark stage on `artifact`, estimating it on `devices` as a recipe's targets.
    A model that TensorFlow cannot run is exit 2 (the file is at fault); any other failure
    of the stage is exit 3, as in a recipe."""
    from orchestrator.errors import DataError
    from orchestrator.stages import get_stage
    from orchestrator.stages.base import StageContext

    def lookup(wanted: str | None) -> ModelKey:
        if key is None:
            from orchestrator.model.keys import KeyMaterialError

            raise KeyMaterialError("the model is encrypted and no key was given")
        return key

    ctx = StageContext(pipeline="cli", stage="benchmark", model_key=lookup,
                       devices=dict(devices or {}))
    try:
        return get_stage("benchmark").run(artifact, params, ctx)
    except (DataError, ModelSourceError) as exc:
        if exc.file is None:
            exc.file = str(path)
        raise
    except OrchestratorError as exc:
        raise StageError(str(exc), stage="benchmark") from exc
    except Exception as exc:
        import tensorflow as tf

        from orchestrator.model.sources._common import short

        if isinstance(exc, tf.errors.OpError):  # the graph itself does not run
            raise ModelSourceError(f"TensorFlow cannot run this model: {_op_error(exc)}",
                                   file=str(path)) from exc
        raise StageError(f"{type(exc).__name__}: {short(exc)}", stage="benchmark") from exc


def _op_error(exc: Any) -> str:
    """`InvalidArgumentError at node 'w': <the reason>` from TF's many-line message."""
    reasons = [line.strip() for line in str(exc.message).splitlines() if line.strip()
               and not line.startswith(("Graph execution error", "Detected at node", "Node:"))]
    reason = reasons[0] if reasons else "no reason given"
    node = getattr(exc.node_def, "name", "") if exc.node_def is not None else ""
    where = f" at node {node!r}" if node else ""
    return f"{type(exc).__name__}{where}: {reason[:300]}"


# --------------------------------------------------------------------------- printing


def _latency_line(threads: int, stats: Mapping[str, Any]) -> str:
    values = " ".join(f"{key if key != 'mean' else 'avg'}={format_ms(stats[key])}" for key in
                      ("first", "curr", "min", "max", "mean", "std", "p50", "p90", "p99"))
    return f"  threads={threads}: count={stats['count']} {values}"


def _tsv_rows(data: bytes) -> tuple[list[str], list[dict[str, str]]]:
    lines = data.decode().splitlines()
    columns = lines[0].split("\t")
    return columns, [dict(zip(columns, line.split("\t"), strict=True)) for line in lines[1:]]


# the profile's columns in ms and KB (as its .tsv files hold them), shown as every timing
# and size the command prints: 3 significant digits, µs below 1 ms, sizes in MiB
_MS_COLUMNS = {"start": "start", "first": "first", "avg ms": "avg"}
_KB_COLUMN, _MIB_COLUMN = "mem KB", f"mem {SIZE_UNIT}"


def _readable(columns: list[str], rows: list[dict[str, str]]
              ) -> tuple[list[str], list[dict[str, str]]]:
    """The profile table with its timings by format_ms and its memory in MiB."""
    def cell(column: str, value: str) -> str:
        if column in _MS_COLUMNS:
            return format_ms(float(value))
        if column == _KB_COLUMN:
            return format_size(float(value) * 1024, unit=False)
        return value

    shown = [_MS_COLUMNS.get(c, _MIB_COLUMN if c == _KB_COLUMN else c) for c in columns]
    return shown, [{new: cell(old, row[old]) for old, new in zip(columns, shown, strict=True)}
                   for row in rows]


def _human(count: float) -> str:
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= scale:
            return f"{count / scale:.2f} {prefix}"
    return f"{count:g}"


def flops_text(flops: int | None, precision: str) -> str:
    """The FLOPs line `benchmark` and `inspect` print alike."""
    if flops is None:
        return "  FLOPs: not counted (see the warning)"
    return (f"  FLOPs: {flops:,} ({_human(flops)}) per sample, {precision} (2 per "
            "multiply-add, batch 1)")


def threads_text(params: Any, cores: int | None) -> str:
    """`threads: 2 (the benchmark stage's default: ...)`: the intra-op settings timed, and
    where they came from; a recipe's benchmark stage without `threads:` times the same."""
    settings = params.threads if isinstance(params.threads, list) else (
        [params.threads] if params.threads else None)
    if settings:
        return f"threads: {','.join(map(str, settings))} (--threads)"
    import os

    cores = cores or os.cpu_count() or 1
    return (f"threads: {cores} (the benchmark stage's default, as a recipe's benchmark "
            f"stage times: this host's {cores} cores)")


def spread_warnings(info: Mapping[str, Any]) -> list[str]:
    """The warning a run's estimate gives (measure.estimates.timings_spread), per threads
    setting whose timings are spread: a figure other processes on this host disturbed."""
    from orchestrator.measure.estimates import timings_spread

    warnings = []
    for row in info.get("threads_matrix") or []:
        stats = row["latency_ms"]
        spread = timings_spread(float(stats["p50"]), float(stats["min"]))
        if spread is not None:
            warnings.append(f"threads={row['threads']}: {spread}: rerun on a quiet machine "
                            "for a firmer figure (a recipe's report says the same of its "
                            "estimate)")
    return warnings


def format_report(opened: OpenedModel, artifact: ModelArtifact, params: Any,
                  result: StageResult) -> str:
    """benchmark_model's report: what was run, the measured figures (timings per threads
    setting, fresh-process memory, the host, the per-node profile), then the estimates."""
    from orchestrator.measure import profiling
    info = result.info
    host = info["host"]
    lines = [f"Model: {opened.path} ({opened.how})",
             *(f"Input: {s.name} {s.dtype} {shape_text(s.shape)} (random values)"
               for s in artifact.inputs),
             f"Outputs: {', '.join(artifact.outputs)}",
             "",
             "Measured on this host: "
             f"{host['cpu']}, {host['cores']} cores, {host['machine']}, {host['system']}, "
             f"Python {host['python']}, TensorFlow {host['tensorflow']}",
             threads_text(params, host.get("cores")),
             f"Latency, batch {info['batch_size']}, {params.warmup} warm-up + "
             f"{params.runs} timed runs per setting, inter-op threads 1 "
             "(first: the cold run; curr: the last):"]
    lines += [_latency_line(row["threads"], row["latency_ms"]) for row in info["threads_matrix"]]
    memory = info.get("memory")
    if memory:
        lines.append(f"Memory of a fresh process that loads the file and runs it once: load "
                     f"{format_ms(memory['load_ms'])}, resident "
                     f"+{format_mib(memory['rss_growth_mb'])}, heap (RssAnon) "
                     f"+{format_mib(memory['anon_growth_mb'])}")
    profile = info.get("profile")
    lines.append("")
    if profile is None:
        lines.append("Per-node profile: none (--profile-runs 0)")
    elif profile.get("source") is None:
        lines.append(f"Per-node profile: none: {profile.get('note')}")
    else:
        lines.append(f"Per-node profile, measured over {profile['runs']} traced runs at "
                     f"threads={info['threads']} (not part of the timings above):")
        columns, top = _readable(*_tsv_rows(result.files[profiling.TOP_FILE]))
        lines.append(profiling.text_table("Top by Computation Time", top, columns,
                                          limit=_TOP_ROWS))
        if len(top) > _TOP_ROWS:
            rest = sum(float(r["%"]) for r in top[_TOP_ROWS:])
            lines.append(f"... {len(top) - _TOP_ROWS} more nodes, {rest:.3f}% of the time")
        columns, by_type = _readable(*_tsv_rows(result.files[profiling.BY_TYPE_FILE]))
        lines += ["", profiling.text_table("Summary by node type", by_type, columns)]
    lines += ["", "Estimated (computed from the graph, not measured):",
              flops_text(info.get("flops"), info["precision"])]
    peak = info.get("peak_memory_bytes")
    if peak is not None:
        lines.append(f"  Peak memory: {format_size(peak)}: weights + inputs + the peak of "
                     "live tensors, an upper estimate")
    elif artifact.kind == "tflite" or (opened.inner is not None
                                       and opened.inner.kind == "tflite"):
        lines.append("  Peak memory: not estimated for a .tflite (no traced run)")
    lines += estimate_lines(info)
    lines += ["", f"Sizes in {SIZE_UNIT_NOTE}; timings in ms, or µs below 1 ms."]
    return "\n".join(lines)


def estimate_lines(info: Mapping[str, Any]) -> list[str]:
    """Per --device: its estimate in one line (threads, time by kind of op, the runtime's
    overhead, the expected error), the costliest ops, and the error's basis; without
    --device, how to ask for one."""
    made = info.get("estimate") or {}
    if not made:
        return ["  Latency on a device: " + (
            "not estimated: the FLOPs were not counted (see the warning)"
            if info.get("flops") is None else "give --device NAME[:THREADS] (`orchestrator "
            "devices` lists them)")]
    lines = []
    for target, estimate in made.items():
        lines.append(f"  Latency on {target}: {estimate['summary']}")
        if estimate.get("threads"):
            lines.append(f"    threads: {estimate['threads']} ("
                         + ("--device NAME:THREADS" if estimate.get("threads_from") == "target"
                            else "the device's big cores; --device NAME:THREADS sets them")
                         + ")")
        top = estimate.get("top_ops") or []
        whole = (info.get("est_latency_ms") or {}).get(target)
        if top and whole:  # shares of the whole estimate (a TF session's per-run cost too)
            lines.append("    costliest ops: " + ", ".join(
                f"{op['name']} ({op['op']}) {format_ms(op['ms'])} {op['ms'] / whole:.0%}"
                for op in top))
        error = estimate.get("expected_error")
        if error:
            lines.append(f"    expected error: {error['text']}")
    return lines


# --------------------------------------------------------------------------- the command


def cmd_benchmark(args: argparse.Namespace) -> int:
    from orchestrator.stages import get_stage

    stage = get_stage("benchmark")
    # every OrchestratorError goes to cli.main: `error: ...` on stderr, its exit code
    values = _counts(args)
    given = parse_input_shapes(args.input_shape)
    try:
        params = stage.params(**values)
    except ValueError as exc:  # pydantic's ValidationError; _counts checks first
        raise UsageError(f"bad benchmark option: {exc}") from None
    devices = parse_devices(args.device)
    if devices and args.on:
        raise UsageError("--device estimates the file from its run on this host; --on "
                         "measures it on a board instead: give one of them")
    path = Path(args.model)
    if stage.prepare is not None and path.exists() and not args.on:
        stage.prepare(params)  # the memory probe's TensorFlow import overlaps ours
    opened = open_model(path, args.key_env, args.key_file)
    artifact = with_input_shapes(opened, resolve_shapes(opened, given))
    if args.on:
        return benchmark_on_board(args, opened, artifact, values)
    result = run_benchmark(artifact, params, opened.key, path, devices)
    for warning in [*result.warnings, *spread_warnings(result.info)]:
        print(f"warning: {warning}", file=sys.stderr)
    unknown = [s for s in artifact.inputs if s.shape is None or None in s.shape[1:]]
    for spec in unknown:
        print(f"warning: input {spec.name} has unknown dimensions {shape_text(spec.shape)}, "
              f"fed as 1; give --input-shape {spec.name}:d1,d2,... to set them",
              file=sys.stderr)
    if args.json:
        print(json.dumps(result.info, indent=2, default=str))
    else:
        print(format_report(opened, artifact, params, result))
    return 0


BOARD = "board"  # the measure_on_device stage's target name for a board given by --on


def reach_board(url: Any) -> None:
    """The board at `url` answers (its session opened for the measurement), else exit 2 as
    `device check` and `run` give for the same board, naming the fix."""
    import shlex

    from orchestrator.boards.errors import DeviceLost, DeviceUnreachable
    from orchestrator.boards.session import drop_session, shared_session

    try:
        shared_session(url, url.text).describe()
    except (DeviceUnreachable, DeviceLost) as exc:
        drop_session(url)
        raise DeviceUnreachable(f"--on: {exc.message} (check the board with `orchestrator "
                                f"device check {shlex.quote(url.text)}`)") from None


def benchmark_on_board(args: argparse.Namespace, opened: OpenedModel,
                       artifact: ModelArtifact, values: Mapping[str, Any]) -> int:
    """`--on URL`: the measure_on_device stage on the file, on that board, fed random
    inputs; its outputs there compared with this host's for the same file."""
    from orchestrator.boards.urls import DeviceURLError, parse_device_url
    from orchestrator.stages import StageContext, get_stage

    try:
        url = parse_device_url(args.on)
    except DeviceURLError as exc:
        raise UsageError(f"--on: {exc}") from None
    from orchestrator.boards.session import close_sessions

    stage = get_stage("measure_on_device")
    known = {k: v for k, v in values.items() if k in ("runs", "warmup", "threads")}
    params = stage.params(target=BOARD, connect=url.text, **known)
    key = opened.key
    context = StageContext(pipeline="benchmark", stage=stage.name,
                           model_key=None if key is None else (lambda _kid: key))
    try:
        reach_board(url)
        try:
            result = stage.run(artifact, params, context)
        except OrchestratorError as exc:  # lost mid-measurement: exit 3, as a run's stage
            raise StageError(f"measuring on {url.text} failed: "
                             f"{exc.message.removeprefix(f'target {BOARD}: ')}") from exc
    finally:
        close_sessions()
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    measured = result.info["device"][BOARD]
    if args.json:
        print(json.dumps(measured, indent=2, default=str))
        return 0
    board = measured["board"]
    lines = [f"Model: {opened.path} ({opened.how})",
             f"Measured on {url.text}: {board.get('machine')} {board.get('cpu')}, "
             f"{board.get('cores')} cores, Python {board.get('python')}, LiteRT "
             f"{(board.get('runtimes') or {}).get('ai_edge_litert')}"
             + (" (emulated: these timings are qemu's, not the core's)" if url.emulated
                else "")]
    if not measured.get("measured"):
        lines.append(f"Not measured there: {measured.get('reason')}")
        print("\n".join(lines))
        return 0
    lines.append(f"Latency, {params.warmup} warm-up + {params.runs} timed runs per setting "
                 "(first: the cold run; curr: the last):")
    lines += [_latency_line(row["threads"], row["latency_ms"])
              for row in measured["threads_matrix"]]
    load = measured.get("load") or {}
    if "load_ms" in load:
        lines.append(f"Memory of a fresh process on the board that loads the file and runs "
                     f"it once: load {format_ms(load['load_ms'])}, resident "
                     f"+{format_mib(load['rss_growth_mb'])}, heap (RssAnon) "
                     f"+{format_mib(load['anon_growth_mb'])}")
    lines.append(f"Outputs on {measured['samples']} random inputs against this host's for "
                 "the same file:")
    lines += [f"  {name} ({o['kind'].replace('_', ' ')}): "
              + (f"top-1 agreement {o['top1_agreement']:.4f}, " if "top1_agreement" in o
                 else "") + f"max abs diff {o['max_abs_diff']:.3g}, SQNR {o['sqnr_db']:.1f} dB"
              for name, o in measured["outputs"].items()]
    print("\n".join(lines))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """`orchestrator benchmark`: the benchmark stage on any model file."""
    # no import of the stage here: every command builds this parser (see test_help_defaults)
    bench = sub.add_parser(
        "benchmark", help="benchmark any model file as benchmark_model does (the recipe's "
        "benchmark stage): latency per threads setting, per-node profile, FLOPs, memory",
        description="Runs the recipe's benchmark stage on a model file outside a recipe: a "
        "SavedModel folder, .keras/.h5, .pb/.pbtxt, a checkpoint .meta, .tflite, .mmap or "
        ".enc. Inputs are random data of the model's input shapes.")
    bench.add_argument("model", help="the model file or SavedModel folder")
    bench.add_argument("--input-shape", action="append", default=[],
                       metavar="NAME:D1,D2,...",
                       help="run input NAME with this shape, fixing its unknown dimensions "
                       "(repeatable, or several as a:1,3,b:1,5)")
    bench.add_argument("--runs", type=bounded_flag("runs"), default=None, metavar="N",
                       help="timed runs per threads setting (default 50)")
    bench.add_argument("--warmup", type=bounded_flag("warmup"), default=None, metavar="N",
                       help="untimed runs first (default 5)")
    bench.add_argument("--threads", type=bounded_list_flag("threads"), default=None,
                       metavar="N[,N...]",
                       help="intra-op thread settings, each timed, e.g. 1,2,4 (default: "
                       "this machine's core count); inter-op threads are always 1")
    bench.add_argument("--profile-runs", type=bounded_flag("profile_runs"), default=None,
                       metavar="N",
                       help="traced runs for the per-node profile, 0 for none (default 20)")
    bench.add_argument("--device", action="append", default=[], metavar="NAME[:THREADS]",
                       help="also estimate the file's latency on this device preset "
                       "(`orchestrator devices` lists them), for its big cores or THREADS "
                       "threads, as a recipe's target is estimated (repeatable)")
    bench.add_argument("--key-env", default=None, metavar="VAR",
                       help="environment variable holding the key of an encrypted model "
                       "(default ORCHESTRATOR_MODEL_KEY)")
    bench.add_argument("--key-file", type=Path, default=None,
                       help="file holding the key of an encrypted model (instead of the "
                       "environment variable)")
    bench.add_argument("--on", default=None, metavar="URL",
                       help="measure on a board instead: ssh://[user@]host[:port] or "
                       "qemu://aarch64?cpu=cortex-a76 (latency, load, memory, and its "
                       "outputs against this host's)")
    bench.add_argument("--json", action="store_true",
                       help="print the benchmark stage's info as JSON (as report.json "
                       "holds it) instead of the tables")
    bench.set_defaults(fn=cmd_benchmark)
