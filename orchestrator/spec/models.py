"""Pydantic models of the recipe (version 1). Loading, locations and wiring checks live in
recipe/loading.py and the recipe/ modules it calls; this module is only the shape of the data,
so it stays light to import."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    field_validator,
    model_validator,
)

from orchestrator.limits import MAX_PIPELINES, MAX_STAGES_PER_PIPELINE, MAX_TARGETS, bounded
from orchestrator.spec.devices import Device

# Counts, each bounded as orchestrator/limits.py says and why (the schema states the bounds)
Dimension = bounded("dimension")
Samples = bounded("samples")
Batch = bounded("batch")
ImageSide = bounded("image_side")
Trials = bounded("trials")
Timeout = bounded("timeout_s")
Workers = bounded("workers")
Threads = bounded("threads")


class Strict(BaseModel):
    """Unknown keys are errors everywhere in a recipe."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class InputSpec(Strict):
    name: str = Field(description="Input node name (or the SavedModel signature's input name).")
    dtype: str = Field("float32", description="Input dtype, e.g. float32, uint8.")
    shape: list[Dimension | None] | None = Field(
        None, description="Input shape; -1 or null for an unknown dimension.")


class ModelSpec(Strict):
    path: str = Field(description="Model path, relative to the recipe file.")
    format: Literal["auto", "saved_model", "keras", "frozen_graph", "checkpoint"] = Field(
        "auto", description="Model format; auto detects it from the path.")
    inputs: list[InputSpec] | None = Field(
        None, description="Inputs; detected like summarize_graph when omitted.")
    outputs: list[str] | None = Field(
        None, description="Output node names; detected when omitted.")


class DataSource(Strict):
    """Where data comes from: an .npz file, a folder of images, or `module:function`."""

    source: str = Field(description="An .npz file or an image folder (relative to the recipe), "
                        "or `module:function` returning an iterable of numpy batches.")
    array: str | None = Field(None, description="Representative: the .npz array to read.")
    inputs: str | None = Field(None, description="Evaluation: the .npz array of inputs.")
    labels: str | None = Field(None, description="Evaluation: the .npz array of integer labels; "
                               "for an image folder, a labels.txt of class names (an image's "
                               "label is the line index of its parent folder's name).")
    samples: Samples | None = Field(
        None, description="Use at most this many samples.")
    batch_size: Batch = Field(32, description="Samples per batch when the graph allows.")
    resize: tuple[ImageSide, ImageSide] | None = Field(
        None, description="Image folders: resize to [height, width].")
    mean: float = Field(0.0, description="Image folders: subtract this (label_image's "
                        "--input_mean).")
    std: PositiveFloat = Field(1.0, description="Image folders: then divide by this "
                               "(--input_std).")
    channels: Literal[1, 3] | None = Field(None, description="Image folders: 1 (grey) or 3 "
                                           "(RGB); default from the model input.")


class DataSpec(Strict):
    representative: DataSource | None = Field(
        None, description="Inputs for calibrating quantization ranges.")
    evaluation: DataSource | None = Field(
        None, description="Labelled inputs for accuracy (labels optional: fidelity only).")


# A budget number: finite (a NaN would pass every comparison).
Finite = Annotated[float, Field(allow_inf_nan=False)]


class OutputBudgets(Strict):
    """Fidelity budgets of one model output, compared with the source model's same output
    (see the evaluate stage)."""

    min_sqnr_db: Finite | None = Field(
        None, description="Smallest SQNR against the source's output, in dB.")
    min_cosine: float | None = Field(
        None, ge=-1, le=1, description="Smallest cosine similarity with the source's output.")
    max_abs_error: float | None = Field(
        None, ge=0, description="Largest absolute difference from the source's output.")
    min_agreement: float | None = Field(
        None, ge=0, le=1, description="Smallest agreement with the source's output: top-1 "
        "for class scores, values on the same side of 0.5 for probabilities.")


class Budgets(Strict):
    max_size_mb: PositiveFloat | None = Field(None, description="Largest model file, in MB.")
    max_accuracy_drop: float | None = Field(
        None, ge=0, description="Largest drop of accuracy from the source model (0.01 = 1 pt).")
    min_fidelity: float | None = Field(
        None, ge=0, le=1, description="Smallest fidelity to the source model: top-1 "
        "agreement of its first class-score output (else 1 - noise/signal energy).")
    min_sqnr_db: Finite | None = Field(
        None, description="Smallest SQNR in dB against the source model, for every output "
        "that is not class scores (an output's own `outputs.<name>.min_sqnr_db` wins).")
    outputs: dict[str, OutputBudgets] | None = Field(
        None, description="Per model output, by the name evaluate reports it under: "
        "{onset: {min_sqnr_db: 25, min_agreement: 0.99}}.")
    max_latency_ms: PositiveFloat | None = Field(
        None, description="Largest estimated latency on the target device, in ms.")
    max_ram_mb: PositiveFloat | None = Field(None, description="Largest RAM use, in MB.")
    min_device_agreement: float | None = Field(
        None, ge=0, le=1, description="Smallest top-1 agreement between the outputs measured "
        "on the target's board (`connect:`) and this host's outputs for the same file "
        "(0.99: at most 1 sample in 100 gets another class there).")


class Target(Strict):
    name: str = Field(description="Target name, used in report.json and `selected`.")
    device: str | Device = Field(description="A device preset name, or an inline device spec.")
    budgets: Budgets = Field(default_factory=Budgets, description="Budgets to gate on.")
    threads: bounded("threads") | None = Field(
        None, description="Threads the model runs with on this device: its estimate is for "
        "this count. Default: the device's big cores (a Pixel 4: 4; a Pixel XL: 2), as "
        "`orchestrator devices` lists them.")
    connect: str | None = Field(
        None, description="Measure on this board: ssh://[user@]host[:port][?python=PATH] (your "
        "OpenSSH setup; never a password) or qemu://aarch64?cpu=cortex-a76 (an emulated Arm "
        "CPU on this host: its numerics, not its speed). Every variant gets a "
        "`measure_on_device` stage for this target (docs/devices.md).")


# A stage entry as written: "fold" or {"quantize_nodes": {...}}; validated against the
# stage registry in recipe/checks.py (so that params errors carry the stage's own field
# names). The mapping's value stays Any here: recipe/checks.parse_stage_entry checks it (one
# key, a known stage, params a mapping), with messages that name the stage.
StageEntry = str | dict[str, Any]

# A range percentile, as freeze_ranges' min_percentile/max_percentile: 0 <= p < 50, not NaN.
Percentile = Annotated[float, Field(ge=0, lt=50, allow_inf_nan=False)]


class Pipeline(Strict):
    """A chain of stages. A pipeline that converts ops to eight bits ships compact node
    names by default (`compact_names` is added after its last graphdef transform; see
    recipe.add_default_stages); `keep_names: true` keeps the traced names."""

    from_: str | None = Field(None, alias="from", description="Start from this pipeline's "
                              "model (before its measuring stages).")
    stages: list[StageEntry] = Field(min_length=1, max_length=MAX_STAGES_PER_PIPELINE,
                                     description="Stages, in order.")
    keep_names: bool | None = Field(
        None, description="true: ship the graph's own node names. By default (null) a "
        "pipeline with quantize_nodes in its lineage gets compact_names after its last "
        "graphdef transform (inputs and outputs keep their names), unless the lineage "
        "lists compact_names or a from: child transforms the graph further (the child "
        "gets it then). Inherited along from:; a child may set it back to false.")
    measure_on_device: bool | list[str] | None = Field(
        None, description="Which targets' boards (`connect:`) measure this pipeline's file. "
        "By default (null or true) every connected target's: a measure_on_device stage is "
        "added at the pipeline's end per target. false: none (e.g. a GraphDef stepping "
        "stone that no board runs); a list of target names: only those. Not inherited "
        "along from: (each pipeline ships its own file).")


class Tune(Strict):
    """The accuracy guard: search 8-bit settings until the budgets are met."""

    enabled: bool = Field(True, description="Run the guard where a budget is broken.")
    max_trials: Trials = Field(16, description="Stop after this many candidates.")
    timeout_s: Timeout = Field(600, description="Stop after this many seconds.")
    percentiles: list[Percentile] = Field(
        default_factory=lambda: [5.0, 1.0, 0.0],
        description="Range percentiles to try in freeze_ranges (min and max alike); each "
        "0 <= p < 50.")


class Execution(Strict):
    """Where the stage tasks run. `orchestrator run --executor/--dask-address` win over it."""

    executor: Literal["local", "dask"] = Field(
        "local", description="local: the stages one at a time in the run's own process "
        "(TensorFlow already uses every core). dask: Prefect's DaskTaskRunner (prefect-dask) "
        "runs every stage whose input is ready, so pipelines that do not depend on each "
        "other run in parallel.")
    workers: Workers | None = Field(
        None, description="dask without `address`: worker processes of the LocalCluster it "
        "starts (default: Dask's own choice for this machine).")
    threads_per_worker: Threads = Field(
        1, description="dask without `address`: threads per worker process.")
    processes: bool = Field(
        True, description="dask without `address`: workers as processes of their own "
        "(each imports TensorFlow and opens the run's session once), or false: as threads "
        "of the run's own process (no start-up cost; stages share one Python process).")
    address: str | None = Field(
        None, min_length=1, description="dask: an existing scheduler's address, e.g. "
        "tcp://10.0.0.5:8786, instead of a LocalCluster. Its workers must see the same "
        "store (ORCHESTRATOR_HOME) and the recipe's files at the same paths.")

    @model_validator(mode="after")
    def _cluster_or_address(self) -> Execution:
        if self.address is not None and (self.workers is not None or not self.processes):
            raise ValueError("give either `address` (an existing scheduler) or `workers` / "
                             "`processes` (a LocalCluster to start), not both")
        return self


class Schedule(Strict):
    """When `orchestrator deploy` runs the recipe unattended (a Prefect cron schedule)."""

    cron: str = Field(description="A cron expression, e.g. '0 3 * * *' (03:00 daily).")
    timezone: str = Field("UTC", description="An IANA time zone, e.g. Europe/Berlin.")

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        return valid_cron(value)

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str) -> str:
        return valid_timezone(value)


def valid_cron(value: str) -> str:
    """A standard 5-field cron expression (checked without importing Prefect, which must
    not be imported before the run picks its server; `deploy` checks it with Prefect's own
    parser as well)."""
    from datetime import datetime

    from cronsim import CronSim, CronSimError

    try:
        CronSim(value, datetime(2020, 1, 1))
    except CronSimError as exc:
        raise ValueError(f"invalid cron expression {value!r} ({exc}): expected 5 fields, "
                         "minute hour day-of-month month day-of-week, e.g. '0 3 * * *'"
                         ) from None
    return value


def valid_timezone(value: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r}: use an IANA name such as UTC or "
                         "Europe/Berlin") from None
    return value


class Retrain(Strict):
    """A training step that runs first and yields the model the pipelines start from."""

    callable: str = Field(description="`module:function`, importable from the recipe's "
                          "folder; called with `params` as keywords and an `output_dir`; "
                          "returns the new model's path.")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="Keyword arguments for the callable.")

    @field_validator("callable")
    @classmethod
    def _module_function(cls, value: str) -> str:
        module, _, function = value.partition(":")
        if not module or not function or not all(
                part.isidentifier() for part in [*module.split("."), function]):
            raise ValueError(f"{value!r} is not `module:function`")
        return value


class Recipe(Strict):
    version: Literal[1] = Field(description="Recipe format version; 1.")
    name: str = Field(min_length=1, description="Recipe name, used in reports and MLflow.")
    description: str | None = Field(None, description="Free text.")
    model: ModelSpec
    data: DataSpec = Field(default_factory=DataSpec)
    targets: list[Target] = Field(default_factory=list, max_length=MAX_TARGETS)
    pipelines: dict[str, Pipeline] = Field(min_length=1, max_length=MAX_PIPELINES)
    tune: Tune | None = Field(None, description="Accuracy guard settings for 8-bit pipelines.")
    schedule: Schedule | None = Field(None, description="When `orchestrator deploy` runs it.")
    execution: Execution | None = Field(None, description="Where the stage tasks run (local "
                                        "by default, or on Dask).")
    retrain: Retrain | None = Field(None, description="Train a new model first; the "
                                    "pipelines run on the model it returns.")
    # `register` as written; the attribute name avoids ABCMeta.register
    register_candidate: bool = Field(
        False, alias="register", description="Register the selected models as the "
        "`candidate` version in the MLflow Model Registry when every budget gate passes.")

    @model_validator(mode="after")
    def _unique_target_names(self) -> Recipe:
        names = [t.name for t in self.targets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate target names: {', '.join(dupes)}")
        return self
