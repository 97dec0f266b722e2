"""`orchestrator init MODEL [-o RECIPE] [--data NPZ]`: a first recipe from a model.

The model is loaded as `run` loads it (format detected, inputs and outputs as
summarize_graph finds them) and the recipe is written with three pipelines: `fp32`
(freeze, strip, fold, benchmark, evaluate), `int8` (TF's eight-bit kernels, as
recipes/digits.yaml) and `litert_int8` (convert_tflite, full integer, float I/O), plus
commented-out targets with budgets and a commented data section.

A recipe that runs at once: a stage that needs data the recipe does not have is written
commented out, with a note saying which data it needs. With `--data FILE.npz`, the data
section is filled in from the arrays that fit the model's input (and integer labels), and
every stage is live. The recipe is named after the -o file (else the model), a name no
other recipe in its folder has: the name is its output folder and MLflow experiment. The
written recipe is validated before it is kept (nothing is written
when validation fails), an existing file is never overwritten, and the file appears whole
or not at all.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import DataError, OrchestratorError
from orchestrator.paths import plain_file_mode

if TYPE_CHECKING:
    from orchestrator.model.artifact import ModelArtifact, TensorSpec

# Folder and file names that say nothing about the model: its parent names the recipe.
_GENERIC_NAMES = {"saved_model", "savedmodel", "model", "models", "export", "exported",
                  "frozen", "frozen_graph", "graph", "checkpoint", "checkpoints", "ckpt",
                  "keras", "variables", "serving"}
_REPRESENTATIVE_WORDS = ("calib", "repr", "rep", "train")
_EVALUATION_WORDS = ("test", "eval", "val")
REPRESENTATIVE_SAMPLES = 200


class InitError(OrchestratorError):
    """`init` cannot write the recipe asked for (exit 2): the file exists, a bad name."""


@dataclass(frozen=True)
class Array:
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # numpy dtype kind: f, i, u, b, ...


@dataclass(frozen=True)
class DataChoice:
    """The arrays of an .npz that a recipe's data section names."""

    source: Path
    representative: Array
    evaluation: Array
    labels: Array | None


# --------------------------------------------------------------------------- the command


def cmd_init(args: argparse.Namespace) -> int:
    from orchestrator.cache import project
    from orchestrator.model.sources import detect_format, load_model
    from orchestrator.recipe import schema

    model_path = Path(args.model)
    fmt = detect_format(model_path) if args.format == "auto" else args.format
    # the name is the recipe's output folder (out/<name>) and MLflow experiment: after the
    # file the user asked for, else the model; never one another recipe beside it has
    name = args.name or (clean_name(args.output.stem) if args.output is not None
                         else None) or recipe_name(model_path)
    from orchestrator.limits import name_problem

    problem = name_problem(name)
    if problem:
        raise InitError(f"cannot name the recipe {name!r}: {problem}; give --name",
                        field="--name")
    folder = args.output.parent if args.output is not None else Path(".")
    taken = recipe_names(folder)
    renamed = None
    if name in taken and args.name is None:
        renamed, name = (name, taken[name]), unique_name(name, taken)
    output = Path(args.output) if args.output is not None else Path(f"{name}.yaml")
    _refuse_existing(output)
    artifact = load_model(model_path, fmt)  # ModelSourceError (exit 2) names the model
    data = choose_data(Path(args.data), artifact.inputs[0]) if args.data else None
    schema_file = schema.find_schema(output, project.project_root(output))
    new_schema = schema_file is None
    if schema_file is None:  # none in this project yet: one beside the recipe
        schema_file = Path(os.path.abspath(output)).parent / schema.SCHEMA_FILE
    text = recipe_text(output, model_path, fmt, name, artifact, data,
                       schema.modeline(output, schema_file),
                       command=f"orchestrator init {args.model}"
                       + (f" --data {args.data}" if args.data else ""))
    write_new_recipe(output, text)
    if new_schema:
        schema.write_schema(schema_file)
    print(f"wrote {output} ({fmt}: {len(artifact.inputs)} input(s), "
          f"{len(artifact.outputs)} output(s); pipelines fp32, int8"
          f"{', litert_int8' if data else ''})")
    if new_schema:
        print(f"wrote {schema_file} (the recipe's JSON Schema, named on its first line)")
    if renamed is not None:
        print(f"named the recipe {name!r}: {_shown(renamed[1])} is already named "
              f"{renamed[0]!r}, and a name is the recipe's output folder (out/{name}) and "
              "MLflow experiment; give --name to choose another")
    elif args.name is not None and name in taken:
        print(f"warning: {_shown(taken[name])} is also named {name!r}: the two recipes "
              f"would share out/{name} and an MLflow experiment; give another --name",
              file=sys.stderr)
    if data is None:
        print("no data yet: the stages that need it (evaluate, log_ranges, freeze_ranges) and "
              "the litert_int8 pipeline are commented out; fill in the data section (or run "
              "init again with --data FILE.npz) to turn them on")
    from orchestrator.formatting import command_hint

    print(f"next: {command_hint('validate', output)} && {command_hint('run', output)}")
    return 0


def _refuse_existing(output: Path) -> None:
    if os.path.lexists(output):
        raise InitError("the file exists, and init never overwrites one: choose another -o, "
                        "or remove it first", file=str(output))


def write_new_recipe(output: Path, text: str) -> None:
    """Validate `text` as a recipe at `output`, then write it there whole, never replacing a
    file: a temp file in the same folder (so relative paths resolve as they will), checked
    by the loader, then linked into place (which fails if the name was taken meanwhile)."""
    from orchestrator.recipe.loading import load_recipe

    folder = Path(os.path.abspath(output)).parent
    created = [f for f in (folder, *folder.parents) if not f.exists()]  # deepest first
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{output.name}.", suffix=".yaml")
    except OSError as exc:
        raise InitError(f"cannot write in {folder}: {exc.strerror or exc}",
                        file=str(output)) from None
    try:
        os.fchmod(fd, plain_file_mode())  # a recipe as any new file (mkstemp: 0600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            load_recipe(tmp)
        except OrchestratorError as exc:  # said of the file the user asked for
            file = exc.file
            if file is not None and os.path.abspath(file) == os.path.abspath(tmp):
                file = str(output)
            raise InitError(f"the recipe init made does not validate, so it was not "
                            f"written: {exc.message}", file=file, line=exc.line,
                            column=exc.column, field=exc.field) from exc
        try:
            os.link(tmp, output)
        except FileExistsError:
            _refuse_existing(output)
            raise
        created = []
    finally:
        Path(tmp).unlink(missing_ok=True)
        for made in created:  # not written: leave no folder made for it either
            try:
                made.rmdir()
            except OSError:
                break


# --------------------------------------------------------------------------- naming


def clean_name(text: str) -> str:
    """`text` as a recipe name: letters, digits, `_.-` (others become `-`), at most 64."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    return re.sub(r"\.{2,}", ".", cleaned)[:64].rstrip("-_.")


def recipe_name(model: Path) -> str:
    """A recipe name from the model's path: its file or folder name, or its parent's when
    that name says nothing (saved_model, model.keras, a version number)."""
    path = Path(os.path.abspath(model))
    if path.name in ("saved_model.pb", "saved_model.pbtxt"):
        path = path.parent
    for candidate in (path, *path.parents):
        stem = candidate.name
        for suffix in (".keras", ".h5", ".hdf5", ".pbtxt", ".pb", ".meta", ".index", ".ckpt"):
            if stem.lower().endswith(suffix):
                stem = stem[: -len(suffix)]
        cleaned = clean_name(stem)
        if cleaned and cleaned.lower() not in _GENERIC_NAMES and not cleaned.isdigit():
            return cleaned
    return "model"


def recipe_names(folder: Path) -> dict[str, Path]:
    """The names of the recipes in `folder` (its .yaml/.yml files with a top-level `name`),
    each with its file; files that are no recipe, or unreadable, are skipped."""
    import yaml

    names: dict[str, Path] = {}
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    except OSError:
        return names
    for path in files:
        try:
            with path.open(encoding="utf-8") as handle:
                raw = yaml.safe_load(handle.read(1 << 20))  # a recipe is small
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("name"), str) and "version" in raw:
            names.setdefault(raw["name"], path)
    return names


def unique_name(name: str, taken: Mapping[str, object]) -> str:
    """`name-2`, `name-3`...: the first that `taken` lacks (within the 64 characters)."""
    number = 2
    while True:
        suffix = f"-{number}"
        candidate = name[:64 - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        number += 1


def _shown(path: Path) -> str:
    """`path` relative to the working directory when that is shorter."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return relative if len(relative) < len(str(path)) else str(path)


# --------------------------------------------------------------------------- data


def npz_arrays(path: Path) -> list[Array]:
    """Every array of an .npz by its header alone (nothing is loaded). DataError when the
    file is not an .npz."""
    import numpy as np

    arrays = []
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    continue
                with archive.open(member) as stream:
                    version = np.lib.format.read_magic(stream)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
                    else:
                        shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
                arrays.append(Array(member[:-4], tuple(shape), str(dtype), dtype.kind))
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise DataError(f"cannot read the .npz: {exc}", file=str(path), field="--data") from None
    return arrays


def _fits(array: Array, spec: TensorSpec) -> bool:
    """The array is a batch of the model's input (the batch dimension free; a missing
    trailing channel of 1 is added by the loader, as data/fitting.py does)."""
    if array.kind not in "fiub" or not array.shape:
        return False
    if spec.shape is None:
        return True
    want = list(spec.shape[1:])
    have = list(array.shape[1:])
    if len(have) == len(want) - 1 and want and want[-1] == 1:
        want = want[:-1]
    return len(have) == len(want) and all(w in (None, -1) or w == h
                                          for w, h in zip(want, have, strict=True))


def _score(name: str, words: tuple[str, ...]) -> int:
    lowered = name.lower()
    return sum(word in lowered for word in words)


def choose_data(path: Path, spec: TensorSpec) -> DataChoice:
    """Representative inputs, evaluation inputs and labels from an .npz, by shape (the
    model's input), then by name (x_calib/x_train for calibration, x_test/x_val for
    evaluation, y_<same suffix> or *label* for labels)."""
    if path.is_dir() or path.suffix.lower() != ".npz":
        raise DataError("init --data takes an .npz file (arrays by name); for a folder of "
                        "images or module:function, fill in the recipe's data section by hand",
                        file=str(path), field="--data")
    if not path.is_file():
        raise DataError("data file not found", file=str(path), field="--data")
    arrays = npz_arrays(path)
    inputs = [a for a in arrays if _fits(a, spec)]
    if not inputs:
        shape = "?" if spec.shape is None else ", ".join(
            "N" if i == 0 else ("?" if d is None else str(d)) for i, d in enumerate(spec.shape))
        found = "; ".join(f"{a.name} {list(a.shape)} {a.dtype}" for a in arrays) or "none"
        raise DataError(f"no array fits the model input {spec.name!r} [{shape}]; arrays: "
                        f"{found}", file=str(path), field="--data")
    representative = max(inputs, key=lambda a: (_score(a.name, _REPRESENTATIVE_WORDS)
                                                - _score(a.name, _EVALUATION_WORDS)))
    others = [a for a in inputs if a is not representative] or inputs
    evaluation = max(others, key=lambda a: (_score(a.name, _EVALUATION_WORDS)
                                            - _score(a.name, _REPRESENTATIVE_WORDS)))
    suffix = re.sub(r"^(x|inputs?|images?|features?)", "", evaluation.name, flags=re.I)
    labels = [a for a in arrays if a.kind in "iu" and len(a.shape) == 1
              and a.shape[0] == evaluation.shape[0] and a is not evaluation]
    best = max(labels, default=None, key=lambda a: (
        bool(suffix) and a.name.lower().endswith(suffix.lower()),
        _score(a.name, ("label", "target", "y")), _score(a.name, _EVALUATION_WORDS)))
    return DataChoice(path, representative, evaluation, best)


# --------------------------------------------------------------------------- the text


def _relative(path: Path, recipe: Path) -> str:
    """`path` as the recipe names it: relative to the recipe's folder when both are in one
    project (the recipe moves with it), else absolute."""
    from orchestrator.cache.project import project_root

    target, folder = Path(os.path.abspath(path)), Path(os.path.abspath(recipe)).parent
    if not target.is_relative_to(project_root(recipe)):
        return target.as_posix()
    return Path(os.path.relpath(target, folder)).as_posix()


def _yaml_str(value: str) -> str:
    """A YAML scalar that reads back as this string: plain when that is safe (no YAML
    syntax, not a number, bool or null), else double-quoted (JSON's quoting is YAML's)."""
    import json

    import yaml

    if re.fullmatch(r"[A-Za-z0-9_./][A-Za-z0-9_./-]*", value) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)


def _dims(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("null" if d is None or d < 0 else str(d) for d in shape) + "]"


def _input_lines(artifact: ModelArtifact) -> tuple[list[str], list[str]]:
    """The model.inputs entries and the notes about them."""
    friendly = {node: name for name, node in
                (artifact.metadata.get("input_names") or {}).items()}
    entries, notes = [], []
    for spec in artifact.inputs:
        name = friendly.get(spec.name, spec.name)
        fields = [f"name: {_yaml_str(name)}", f"dtype: {spec.dtype}"]
        if spec.shape is None:
            notes.append(f"Input {name}: shape unknown; add shape: [1, ...] to benchmark it")
        else:
            shape = tuple(spec.shape)
            if shape and shape[0] in (None, -1):
                shape = (1, *shape[1:])
                notes.append(f"Input {name}: batch dimension fixed at 1, as a phone runs it")
            if any(d is None or d < 0 for d in shape):
                notes.append(f"Input {name}: set its unknown (null) dimensions to the size "
                             "you ship")
            fields.append(f"shape: {_dims(shape)}")
        entries.append("{" + ", ".join(fields) + "}")
    return entries, notes


def _size_budget_mb(artifact: ModelArtifact) -> tuple[float, float]:
    """(float model size in MiB, a size budget about a third of it, two digits): MiB, the
    unit of max_size_mb (orchestrator.measure.budgets.MB) and of the report's table."""
    from orchestrator.formatting import MIB

    size_mb = artifact.graph_def.ByteSize() / MIB if artifact.graph_def is not None else 1.0
    budget = max(size_mb / 3, 0.01)
    digits = 1 - int(math.floor(math.log10(budget)))
    return size_mb, math.ceil(budget * 10 ** digits) / 10 ** digits


def recipe_text(recipe: Path, model: Path, fmt: str, name: str, artifact: ModelArtifact,
                data: DataChoice | None, modeline: str, command: str | None = None) -> str:
    """The starter recipe: every line a new user reads, with what to change next."""
    from orchestrator.spec.devices import PRESETS

    inputs, input_notes = _input_lines(artifact)
    output_names = {ref: name for name, ref in
                    (artifact.metadata.get("output_names") or {}).items()}
    outputs = [output_names.get(ref, ref) for ref in artifact.outputs]
    first = artifact.inputs[0]
    size_mb, budget_mb = _size_budget_mb(artifact)
    has_labels = data is not None and data.labels is not None
    L: list[str] = [modeline]
    L.append("# A first recipe, written by")
    L.append(f"#   {command or 'orchestrator init ' + model.as_posix()}")
    L.append("# Edit it and keep it in version control. Then:")
    L.append(f"#   orchestrator validate {recipe.as_posix()}   # checks it without running")
    L.append(f"#   orchestrator run {recipe.as_posix()}        # report.json, MLflow, the "
             "models in out/")
    L.append("# `orchestrator stages` lists every stage with its params.")
    L.append("version: 1")
    L.append(f"name: {_yaml_str(name)}")
    L.append("model:")
    L.append(f"  path: {_yaml_str(_relative(model, recipe))}   # relative to this file "
             "(or absolute)")
    L.append(f"  format: auto                  # detected: {fmt}")
    if len(inputs) == 1:
        L.append(f"  inputs: [{inputs[0]}]")
    else:
        L.append("  inputs:")
        L += [f"    - {entry}" for entry in inputs]
    L += [f"  # {note}" for note in input_notes]
    L.append(f"  outputs: [{', '.join(_yaml_str(o) for o in outputs)}]")
    if fmt in ("frozen_graph", "checkpoint"):
        L.append("  # detected as summarize_graph does (nodes nothing consumes): keep only the "
                 "real outputs")
    L.append("")
    L += _data_lines(recipe, data, first)
    L.append("")
    L += _target_lines(size_mb, budget_mb, has_labels, data is not None, sorted(PRESETS))
    L.append("")
    L += _pipeline_lines(data)
    return "\n".join(L) + "\n"


def _data_lines(recipe: Path, data: DataChoice | None, spec: TensorSpec) -> list[str]:
    shape = "?" if spec.shape is None else _dims((None, *spec.shape[1:])).replace("null", "N", 1)
    if data is not None:
        source = _yaml_str(_relative(data.source, recipe))
        rep, ev = data.representative, data.evaluation
        lines = ["# Data, from the arrays that fit the model's input. A source can also be a "
                 "folder of",
                 "# images (resize, mean, std, channels) or module:function returning numpy "
                 "batches.",
                 "data:",
                 f"  # typical inputs, to calibrate the 8-bit ranges ({rep.name}: "
                 f"{list(rep.shape)} {rep.dtype})",
                 f"  representative: {{source: {source}, array: {_yaml_str(rep.name)}, "
                 f"samples: {representative_samples(data)}}}",
                 f"  # accuracy, and fidelity to this model ({ev.name}: {list(ev.shape)} "
                 f"{ev.dtype})"]
        labels = (f", labels: {_yaml_str(data.labels.name)}" if data.labels is not None
                  else "")
        lines.append(f"  evaluation: {{source: {source}, inputs: {_yaml_str(ev.name)}"
                     f"{labels}}}")
        if data.labels is None:
            lines.append("  # no integer labels found (one per sample): fidelity only; add "
                         "labels: ARRAY for accuracy")
        return lines
    return [
        "# Data: uncomment and point it at your own. Until then, the stages that need it are",
        "# commented out below (each says which data it needs); `orchestrator init MODEL "
        "--data FILE.npz`",
        "# fills this in from an .npz. A source is an .npz file (arrays by name), a folder of",
        "# images (with resize, mean, std, channels), or module:function returning numpy "
        "batches;",
        "# paths are relative to this file.",
        "# data:",
        "#   representative:              # ~200 typical inputs: calibrate the 8-bit ranges",
        f"#     source: data.npz           # an array shaped {shape}, {spec.dtype}",
        "#     array: x_calib",
        f"#     samples: {REPRESENTATIVE_SAMPLES}",
        "#   evaluation:                  # held-out inputs: accuracy and fidelity to this "
        "model",
        "#     source: data.npz",
        "#     inputs: x_test",
        "#     labels: y_test             # one integer class per sample (optional: without, "
        "fidelity only)",
    ]


def _target_lines(size_mb: float, budget_mb: float, has_labels: bool, has_data: bool,
                  presets: list[str]) -> list[str]:
    from orchestrator.formatting import format_mib

    quality = ("max_accuracy_drop: 0.01, " if has_labels
               else "min_fidelity: 0.98, " if has_data else "")
    needs = "" if has_data else "  # with data.evaluation, add max_accuracy_drop: 0.01"
    return [
        "# Targets: the devices you ship to, with budgets. report.json says which pipeline "
        "meets each",
        "# target's budgets and selects one per target; `orchestrator run` exits 1 when none "
        "does.",
        f"# Devices: {', '.join(presets)}, or an inline spec",
        "# {name, flops_per_second, cores, ram_mb}. Latency is estimated from the model's "
        "FLOPs.",
        f"# The float model is about {format_mib(size_mb)}; 8-bit is about a quarter of "
        "that.",
        "# targets:",
        "#   - name: phone",
        "#     device: phone-modern",
        f"#     budgets: {{max_size_mb: {budget_mb:g}, {quality}max_latency_ms: 50}}{needs}",
        "#   - name: pi",
        "#     device: raspberry-pi-3",
        f"#     budgets: {{max_size_mb: {budget_mb:g}, {quality}max_latency_ms: 200}}",
    ]


def representative_samples(data: DataChoice | None) -> int:
    """The samples a written recipe calibrates on: REPRESENTATIVE_SAMPLES, or all the rows
    the representative array has when it has fewer (a recipe says what its data holds)."""
    if data is None or not data.representative.shape:
        return REPRESENTATIVE_SAMPLES
    return max(1, min(REPRESENTATIVE_SAMPLES, data.representative.shape[0]))


def _commented(line: str, comment: str, column: int = 38) -> str:
    """`line` with `# comment` from `column` on (one space at least)."""
    return f"{line:<{column - 1}} # {comment}" if comment else line


def _pipeline_lines(data: DataChoice | None) -> list[str]:
    live = data is not None
    evaluate = ("      - evaluate" if live
                else _commented("      # - evaluate", "needs data.evaluation"))
    lines = [
        "pipelines:",
        _commented("  fp32:", "the float model, flat: no variables or functions,"),
        _commented("    stages:", "no training nodes, batch norms folded in"),
        "      - freeze",
        "      - strip",
        "      - fold",
        "      - benchmark",
        evaluate,
        _commented("  int8:", "TF's eight-bit kernels (a GraphDef)"),
        _commented("    from: fp32", "starts from fp32's folded model"),
        "    stages:",
        "      - quantize_weights",
    ]
    if live:
        lines += [_commented("      - quantize_nodes: {guard: true}", "keeps the layers that "
                             "break a target's"),
                  _commented("", "quality budget in float"),
                  f"      - log_ranges: {{samples: {representative_samples(data)}}}",
                  "      - freeze_ranges: {min_percentile: 5, max_percentile: 5}"]
    else:
        lines += [_commented("      - quantize_nodes", "ranges computed at run time, until:"),
                  _commented(f"      # - log_ranges: {{samples: {REPRESENTATIVE_SAMPLES}}}",
                             "needs data.representative"),
                  "      # - freeze_ranges: {min_percentile: 5, max_percentile: 5}"]
    lines += ["      - benchmark", evaluate]
    litert = [("litert_int8:", "LiteRT (.tflite): int8 kernels, calibrated ranges"),
              ("  from: fp32", ""),
              ("  stages:", ""),
              ("    - convert_tflite: {mode: int8, io: float}", "float in and out"),
              ("    - benchmark", ""),
              ("    - evaluate", "")]
    if live:
        return lines + [_commented("  " + text, comment) for text, comment in litert]
    return lines + [
        "  # litert_int8 calibrates its int8 ranges on data.representative: uncomment it with",
        "  # the data (convert_tflite {mode: dynamic_range} needs none: int8 weights only).",
        *(_commented("  # " + text, comment) for text, comment in litert)]


# --------------------------------------------------------------------------- the parser


def add_parsers(sub: Any) -> None:
    init = sub.add_parser("init", help="write a first recipe for a model (validated; never "
                          "overwrites)",
                          description="Write a starter recipe for MODEL: its detected format, "
                          "inputs and outputs, fp32, int8 and LiteRT int8 pipelines, and "
                          "commented targets and data to fill in.")
    init.add_argument("model", help="a SavedModel folder, .keras/.h5, .pb/.pbtxt, or a TF1 "
                      "checkpoint (.meta, prefix or folder)")
    init.add_argument("-o", "--output", type=Path, default=None,
                      help="the recipe to write (default: <name>.yaml here); never "
                      "overwritten")
    init.add_argument("--format", default="auto",
                      choices=["auto", "saved_model", "keras", "frozen_graph", "checkpoint"])
    init.add_argument("--data", default=None, metavar="FILE.npz",
                      help="fill in the data section from this .npz (arrays that fit the "
                      "model's input; integer labels), so that every stage runs")
    init.add_argument("--name", default=None,
                      help="the recipe's name, which names its output folder and MLflow "
                      "experiment (default: the -o file's name, else from the model's path; "
                      "made unique among the recipes in the recipe's folder)")
    init.set_defaults(fn=cmd_init)
