"""Runs one plan node: load its input model from the store, call the stage, save the result.

Nothing here knows Prefect or MLflow (pipelines/recipe_flow.py and tracking/ wrap it);
nothing here knows TensorFlow beyond what the stages and sources do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from orchestrator.cache.store import Store, StoredResult
from orchestrator.engine.plan import Node, Plan
from orchestrator.errors import DataError, ModelSourceError, OrchestratorError, StageError
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.kinds import facts as model_facts
from orchestrator.stages import StageContext, get_stage

if TYPE_CHECKING:
    import numpy as np

    from orchestrator.data.source import EvaluationData

log = logging.getLogger("orchestrator")


@dataclass
class NodeOutcome:
    """What a node produced, fresh or from the cache."""

    node: Node
    cached: bool
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    # wall clock (epoch seconds) when this run's task began and ended the node, in whatever
    # process ran it: shows which stages ran at the same time (report.json's stages)
    started: float = 0.0
    finished: float = 0.0


class UnstoredModels:
    """Models kept out of the cache, by model key: a stage skipped by ignore_errors passes
    its input on, and what follows it is computed again next run. Held in this process's
    memory and, when the run's stages run in several processes (Dask), also in the run's
    own scratch store, which a worker elsewhere reads and the run removes at its end."""

    def __init__(self, scratch: Store | None = None) -> None:
        self.scratch = scratch
        self._models: dict[str, ModelArtifact] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._models or (self.scratch is not None and isinstance(key, str)
                                       and self.scratch.has_model(key))

    def __getitem__(self, key: str) -> ModelArtifact:
        if key not in self._models and self.scratch is not None and self.scratch.has_model(
                key):
            self._models[key] = self.scratch.get_model(key)
        return self._models[key]

    def __setitem__(self, key: str, artifact: ModelArtifact) -> None:
        self._models[key] = artifact
        if self.scratch is not None:
            self.scratch.put(key, StoredResult(facts=model_facts(artifact)), artifact, {})


class RunData:
    """The recipe's data, loaded lazily and at most once per run."""

    def __init__(self, plan: Plan, store: Store, load_source: Callable[[], ModelArtifact],
                 devices: dict[str, Any], scratch: Store | None = None) -> None:
        self.plan = plan
        self.store = store
        self.devices = devices
        self._load_source = load_source
        self.recipe = plan.recipe.recipe
        # model key -> artifact kept out of the cache (ignore_errors pass-throughs)
        self.unstored_models = UnstoredModels(scratch)
        self._prepared = False

    def prepare_stages(self, use_cache: bool) -> None:
        """Once, at the run's first computed stage: the `prepare` hooks of the stages still
        to run (their slow setup overlaps the stages before them)."""
        if not self._prepared:
            self._prepared = True
            prepare_stages(self.plan, self.store if use_cache else None)

    def load_model(self, key: str) -> ModelArtifact:
        if key in self.unstored_models:
            return self.unstored_models[key]
        return self.store.get_model(key)

    @cached_property
    def source(self) -> ModelArtifact:
        """The source model; loaded (and TensorFlow imported) only when a stage needs it."""
        return self._load_source()

    @cached_property
    def input_spec(self) -> TensorSpec | None:
        key = self.plan.source_key
        if "source" not in self.__dict__ and self.store.has_model(key):
            inputs = self.store.get_signature(key)["inputs"]  # no TF import needed
            return TensorSpec.from_json(inputs[0]) if inputs else None
        return self.source.inputs[0] if self.source.inputs else None

    def model_facts(self, key: str) -> dict[str, Any]:
        """Facts of a model by key, from its store entry when recorded there."""
        if key in self.unstored_models:
            return model_facts(self.unstored_models[key])
        facts = self.store.get_result(key).facts
        return facts or model_facts(self.store.get_model(key))

    def representative(self, samples: int | None, batch_size: int) -> Iterator[np.ndarray]:
        from orchestrator.data import representative_batches

        source = self.recipe.data.representative
        assert source is not None  # validated: stages that use it require it
        return representative_batches(source, self.plan.recipe.base_dir, self.input_spec,
                                      samples=samples, batch_size=batch_size)

    @cached_property
    def evaluation_data(self) -> EvaluationData:
        from orchestrator.data import load_evaluation

        source = self.recipe.data.evaluation
        assert source is not None
        return load_evaluation(source, self.plan.recipe.base_dir, self.input_spec)

    @cached_property
    def reference(self) -> list[np.ndarray]:
        """The source model's own outputs, every one, on the evaluation inputs."""
        from orchestrator.measure.tf_runtime import predict_all

        return predict_all(self.source, self.evaluation_data.inputs)

    def context(self, node: Node) -> StageContext:
        has_eval = self.recipe.data.evaluation is not None
        return StageContext(
            pipeline=node.pipeline, stage=node.stage,
            representative=self.representative if self.recipe.data.representative else None,
            evaluation=(lambda: self.evaluation_data) if has_eval else None,
            reference_outputs=(lambda: self.reference) if has_eval else None,
            float_model=None if node.float_model_key is None else (
                lambda: self.load_model(node.float_model_key)),
            devices=self.devices, log=logging.getLogger(f"orchestrator.stage.{node.stage}"),
            read_file=lambda path: self.plan.recipe.resolve(path).read_bytes(),
            model_key=lambda key_id: self.plan.model_key(key_id or node.key_id))


def prepare_stages(plan: Plan, store: Store | None) -> bool:
    """Call the `prepare` hook of every stage of `plan` not in `store` yet (every stage:
    no store, as with --no-cache); whether any node is still to compute. Hooks are
    idempotent: a run may call this early (see orchestrator.flow.warm_up) and again at its
    first computed stage."""
    to_compute = pending_nodes(plan, store)
    for node in to_compute:
        prepare = get_stage(node.stage).prepare
        if prepare is not None:
            prepare(node.params)
    return bool(to_compute)


def pending_nodes(plan: Plan, store: Store | None) -> list[Node]:
    """The nodes of `plan` not in `store` yet (every node: no store, as with --no-cache)."""
    return [node for node in plan.nodes if store is None or not store.has(node.key)]


def pending(plan: Plan, store: Store | None) -> bool:
    """Whether any node of `plan` is still to compute."""
    return bool(pending_nodes(plan, store))


def execute_node(node: Node, data: RunData, use_cache: bool = True) -> NodeOutcome:
    """Run (or fetch from the cache) one node. A failing stage raises StageError and leaves
    nothing in the store for this node."""
    began = time.time()
    outcome = _execute(node, data, use_cache)
    outcome.started, outcome.finished = began, time.time()
    return outcome


def _execute(node: Node, data: RunData, use_cache: bool) -> NodeOutcome:
    store = data.store
    if use_cache and store.has(node.key) and node.output_model_key not in data.unstored_models:
        stored = store.get_result(node.key)
        return NodeOutcome(node=node, cached=True, seconds=stored.seconds,
                           metrics=stored.metrics, info=stored.info, warnings=stored.warnings,
                           files=stored.files)
    data.prepare_stages(use_cache)
    stage = get_stage(node.stage)
    artifact = data.load_model(node.input_model_key)
    started = time.perf_counter()
    try:
        result = stage.run(artifact, node.params, data.context(node))
    except (DataError, ModelSourceError) as exc:
        # the user's input (a file a param names, data) is wrong, not the stage: exit 2,
        # located at the stage in the recipe
        raise data.plan.recipe.relocate(exc, ("pipelines", node.pipeline, "stages", node.index),
                                        prefix=f"{node.pipeline}/{node.stage}: ") from exc
    except OrchestratorError as exc:
        if getattr(node.params, "ignore_errors", False):
            return _passthrough(node, data, artifact, exc, time.perf_counter() - started)
        # a StageError already names a stage: its message alone, not "stage … failed" twice
        message = exc.message if isinstance(exc, StageError) else str(exc)
        raise StageError(message, pipeline=node.pipeline, stage=node.stage) from exc
    except Exception as exc:  # a stage's foreign failure: report it, naming the stage
        if getattr(node.params, "ignore_errors", False):
            return _passthrough(node, data, artifact, exc, time.perf_counter() - started)
        raise StageError(f"{type(exc).__name__}: {exc}", pipeline=node.pipeline,
                         stage=node.stage) from exc
    seconds = time.perf_counter() - started
    stored = StoredResult(metrics=dict(result.metrics), info=dict(result.info),
                          warnings=list(result.warnings), seconds=seconds,
                          facts=model_facts(result.artifact) if node.kind == "transform"
                          else {})
    if node.input_model_key in data.unstored_models:  # downstream of a skipped stage
        if node.kind == "transform":
            data.unstored_models[node.output_model_key] = result.artifact
    else:
        store.put(node.key, stored, result.artifact if node.kind == "transform" else None,
                  result.files, replace=not use_cache)
    return NodeOutcome(node=node, cached=False, seconds=seconds, metrics=stored.metrics,
                       info=stored.info, warnings=stored.warnings, files=sorted(result.files))


def _passthrough(node: Node, data: RunData, artifact: ModelArtifact, exc: BaseException,
                 seconds: float) -> NodeOutcome:
    """ignore_errors: the input model goes on unchanged, with a warning. Neither it nor
    anything downstream is cached, so the stage is tried again next run."""
    warning = f"{node.id} failed and was skipped (ignore_errors): {exc}"
    log.warning(warning)
    if node.kind == "transform":
        data.unstored_models[node.output_model_key] = artifact
    return NodeOutcome(node=node, cached=False, seconds=seconds, warnings=[warning])
