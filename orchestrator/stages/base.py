"""What every stage shares: params base class, context, result, and the Stage record.

A stage is a pure function `(ModelArtifact, Params, StageContext) -> StageResult`.
It never touches files, mlflow or prefect: data comes through the context, and files it
produces go back in `StageResult.files` for the store to write.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.data.source import EvaluationData
from orchestrator.model.kinds import KIND_MODULES

if TYPE_CHECKING:
    import numpy as np

    from orchestrator.model.artifact import ModelArtifact
    from orchestrator.model.keys import ModelKey
    from orchestrator.quant.knobs import ApplyCandidate, Knobs
    from orchestrator.spec.devices import Device


class StageParams(BaseModel):
    """Base of every stage's params: unknown params are errors, every field is documented."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Params that do not change the stage's output, so they stay out of its cache key.
    NOT_IN_KEY: ClassVar[frozenset[str]] = frozenset()

    ignore_errors: bool = Field(
        False, description="On failure, pass the input model through unchanged and warn "
        "(explicit opt-in, as in TF's transforms).")


@dataclass
class StageContext:
    """Everything a stage may know besides its input model and params.

    Data access goes through callables set by the runner, so stages stay free of I/O.
    """

    pipeline: str
    stage: str
    # (samples, batch_size) -> batches of representative inputs; None when the recipe has none.
    representative: Callable[[int | None, int], Iterator[np.ndarray]] | None = None
    # () -> evaluation data; None when the recipe has none.
    evaluation: Callable[[], EvaluationData] | None = None
    # () -> the source model's own outputs on evaluation inputs (for fidelity).
    reference_outputs: Callable[[], Sequence[np.ndarray] | np.ndarray] | None = None
    # () -> the float model of this lineage (the input of its first 8-bit stage), for
    # layer-by-layer comparisons; None before any 8-bit stage.
    float_model: Callable[[], ModelArtifact] | None = None
    # target name -> device spec, for latency estimates.
    devices: dict[str, Device] = field(default_factory=dict)
    # path relative to the recipe -> bytes: files named by `Stage.file_params`.
    read_file: Callable[[str], bytes] | None = None
    # key id (None: the key this stage's own params name) -> the model key, resolved by the
    # runner: keys never travel in params, so they never reach logs, MLflow or cache keys.
    model_key: Callable[[str | None], ModelKey] | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("orchestrator.stage"))


@dataclass
class StageResult:
    """A stage's output.

    - `metrics`: flat name -> number, logged to MLflow and merged into report.json's variant.
    - `info`: JSON-serialisable structures for report.json (latency dict, ops, tables).
    - `files`: relative file name -> bytes, written by the store next to the model.
    - `warnings`: human-readable, shown in the summary and the report.
    """

    artifact: ModelArtifact
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


StageKind = Literal["transform", "measure"]
# Every artifact kind: the measuring stages run any of them (orchestrator.model.kinds.runnable).
ANY_KIND = frozenset(KIND_MODULES)


@dataclass(frozen=True)
class Stage:
    """A registered stage.

    kind: "transform" changes the model; "measure" only reports on it (benchmark, evaluate,
    summarize). A pipeline's `from:` starts from the parent's last transform.
    requires: stage names that must appear earlier in the same lineage (validated up front),
    unless the param named by `requires_unless` is set (e.g. freeze_ranges' log_file).
    uses_data: which recipe data the stage reads ("representative", "evaluation"); part of
    its cache key, and validated up front. optional_data: data it uses when the recipe has
    it (part of its key too), and does without otherwise.
    file_params: params holding a file path relative to the recipe; checked to exist up
    front, read through `StageContext.read_file`, and their content is part of the key.
    accepts: the artifact kinds (orchestrator.model.kinds) the stage takes; the recipe's wiring
    check rejects any other. produces: the kind it makes (None: the kind it was given).
    uses_key: its params `key_env`/`key_file` name a model key; the plan loads it up front
    (a missing or bad key is exit 2), puts its key id in the cache key, and the stage gets
    it through `StageContext.model_key`.
    refuses: kind -> why the stage does not apply to it; the wiring error gives the reason.
    data_for: params -> {recipe data role: why} the stage needs with these params
    (convert_tflite's int8 mode calibrates on representative data, its other modes need
    none); validated up front.
    prepare: params -> None, called once a run computes its first stage when this stage is
    still to run there: slow setup (a helper process importing TensorFlow) then overlaps
    the stages before it.

    What the layers above need to know of a stage, so that none of them names one:
    knobs: a quantizing stage's declaration of what the accuracy guard may change
    (orchestrator.quant.knobs). candidate: how a guard candidate changes this stage's params
    (None from it: the candidate leaves the stage out); the quantizer and the stages around
    it (its weights, its ranges) declare one. eight_bit: it turns float weights or ops into
    eight bits, so its input is the lineage's float model (layer errors compare with it).
    judges_quality: its metrics are what quality budgets judge (the guard reads a trial's
    quality from it). confirm: a judging stage's params that judge the guard's chosen trial
    on data the search did not select on (its `candidate` judges trials on the rest).
    variant_metrics: its metrics are the variant's own, tracked without the stage's prefix.
    per_board: it measures on a target's board; a recipe gets it once per target with
    `connect:` (its params carry `target` and `connect`), and the guard measures only the
    model it chose there.
    ships_compact_names: a lineage with this stage ships compact node names by default;
    compacts_names: the stage that makes them, added after the lineage's last graph
    transform (recipe/defaults.py). Exactly one stage sets per_board, and one
    compacts_names: a second one is refused when a recipe loads.
    """

    name: str
    run: Callable[[ModelArtifact, Any, StageContext], StageResult]
    params: type[StageParams]
    doc: str
    kind: StageKind = "transform"
    requires: tuple[str, ...] = ()
    requires_unless: str | None = None
    uses_data: tuple[str, ...] = ()
    optional_data: tuple[str, ...] = ()
    file_params: tuple[str, ...] = ()
    accepts: frozenset[str] = frozenset({"graphdef"})
    produces: str | None = None
    uses_key: bool = False
    refuses: Mapping[str, str] = field(default_factory=dict)
    data_for: Callable[[Any], Mapping[str, str]] | None = None
    prepare: Callable[[Any], None] | None = None
    knobs: Knobs | None = None
    candidate: ApplyCandidate | None = None
    eight_bit: bool = False
    judges_quality: bool = False
    confirm: Callable[[Any], Any] | None = None
    variant_metrics: bool = False
    per_board: bool = False
    ships_compact_names: bool = False
    compacts_names: bool = False


def shipped_graph(artifact: ModelArtifact, ctx: StageContext) -> ModelArtifact:
    """The graph inside `artifact` as an app loads it (ImmutableConst nodes for memmapped;
    decrypted in memory for encrypted), as a graphdef artifact: what the stages that
    describe the shipped model (ops_header, graph_view) look at."""
    if artifact.kind == "graphdef":
        return artifact
    from orchestrator.model.artifact import ModelArtifact as Artifact
    from orchestrator.model.kinds import deployed_graph

    return Artifact(graph_def=deployed_graph(artifact, ctx.model_key), inputs=artifact.inputs,
                    outputs=artifact.outputs, metadata=artifact.metadata)


def counting_samples(ctx: StageContext) -> tuple[StageContext, Callable[[], int]]:
    """`ctx` whose representative data counts what it yields, and a function giving the
    most samples one call yielded: the samples the stage used (calibration reads the most;
    diagnostics read a subset), which it reports as `info["samples"]` (report.json's stage
    entry)."""
    given = ctx.representative
    most = [0]
    if given is None:
        return ctx, lambda: most[0]

    def counted(samples: int | None, batch_size: int) -> Iterator[np.ndarray]:
        seen = 0
        for batch in given(samples, batch_size):
            seen += len(batch)
            most[0] = max(most[0], seen)
            yield batch

    return dataclasses.replace(ctx, representative=counted), lambda: most[0]
