"""Recipe -> Plan: a DAG of (pipeline, stage) nodes with chained cache keys.

The key of a node is hash(input model key, stage name, params, stage code version, data
fingerprint). Measuring stages do not change the model, so the model key passes through
them: inserting a `benchmark` never invalidates the transforms after it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

import orchestrator
from orchestrator.recipe.loading import LoadedRecipe, lineage

if TYPE_CHECKING:
    from orchestrator.model.keys import ModelKey

SOURCE_STAGE = "load"


@dataclass(frozen=True)
class Node:
    """One stage of one pipeline."""

    id: str  # "<pipeline>/<index>:<stage>"
    pipeline: str
    index: int
    stage: str
    params: BaseModel
    kind: str  # "transform" | "measure"
    key: str  # cache key of this node's result
    input_model_key: str
    output_model_key: str
    depends_on: str | None  # node id, or None for the source
    trial: int | None = None  # accuracy-guard trial number; None for the recipe's own nodes
    key_id: str | None = None  # the model key a `uses_key` stage encrypts with
    # the lineage's float model: the input of its first 8-bit stage (None before one), so
    # 8-bit stages can compare layer by layer with float (layer errors, bias correction)
    float_model_key: str | None = None


@dataclass
class Plan:
    recipe: LoadedRecipe
    source_key: str
    pipelines: dict[str, list[Node]] = field(default_factory=dict)
    # pipeline -> model key it starts from (the source key or its parent's final model)
    start_keys: dict[str, str] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)
    # key id -> model key, loaded when the plan is built (never serialized or logged)
    keys: dict[str, ModelKey] = field(default_factory=dict, repr=False)

    def model_key(self, key_id: str | None) -> ModelKey:
        """The model key with this id; KeyMaterialError when the run has none such."""
        from orchestrator.model.keys import KeyMaterialError

        if key_id is None or key_id not in self.keys:
            raise KeyMaterialError(f"no model key with key id {key_id} in this run: the "
                                   "model was encrypted with a key that no encrypt stage of "
                                   "the recipe names")
        return self.keys[key_id]

    @property
    def nodes(self) -> list[Node]:
        """Every node, parents' pipelines first (a topological order)."""
        return [node for nodes in self.pipelines.values() for node in nodes]

    def replan(self, pipeline: str) -> bool:
        """Rebuild a pipeline's nodes when its `from:` parent now ends elsewhere (the
        accuracy guard swapped the parent's model). True if anything changed."""
        parent = self.recipe.recipe.pipelines[pipeline].from_
        if parent is None or self.start_keys[pipeline] == self.final_model_key(parent):
            return False
        start = self.final_model_key(parent)
        previous = self.pipelines[parent][-1].id if self.pipelines[parent] else None
        self.start_keys[pipeline] = start
        self.pipelines[pipeline] = chain_nodes(pipeline, self.recipe.stages[pipeline], start,
                                               previous, self.fingerprints,
                                               base_dir=self.recipe.base_dir, keys=self.keys,
                                               float_model_key=self.final_float_key(parent))
        return True

    def final_float_key(self, pipeline: str | None) -> str | None:
        """The float model key a pipeline hands on to its `from:` children."""
        if pipeline is None:
            return None
        nodes = self.pipelines[pipeline]
        if nodes:
            return nodes[-1].float_model_key
        return self.final_float_key(self.recipe.recipe.pipelines[pipeline].from_)

    def final_model_key(self, pipeline: str) -> str:
        nodes = self.pipelines[pipeline]
        return nodes[-1].output_model_key if nodes else self.start_keys[pipeline]


def digest(*parts: Any) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        blob = part if isinstance(part, bytes) else json.dumps(part, sort_keys=True,
                                                               default=str).encode()
        hasher.update(len(blob).to_bytes(8, "little"))
        hasher.update(blob)
    return hasher.hexdigest()


def hash_path(path: Path, suffix: str | None = None) -> str:
    """Content hash of a file, or of every file under a folder (names and bytes)."""
    hasher = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and (suffix is None or p.suffix == suffix)
        and "__pycache__" not in p.parts)
    for file in files:
        hasher.update(str(file.relative_to(path) if file != path else file.name).encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                hasher.update(block)
    return hasher.hexdigest()


@cache
def code_version() -> str:
    """The orchestrator package's own source plus the TensorFlow release: stages share
    helpers (runtime, quantization, graph rewriting), so any code change invalidates."""
    from importlib.metadata import PackageNotFoundError, version

    package = Path(orchestrator.__file__).parent
    try:
        tf_version = version("tensorflow-cpu")
    except PackageNotFoundError:
        tf_version = version("tensorflow")
    return digest(orchestrator.__version__, tf_version, hash_path(package, suffix=".py"))[:16]


def model_files(path: Path) -> Path:
    """What to hash for a model path: the whole model, even where the recipe names one of
    its files (saved_model.pb inside a SavedModel, one file of a checkpoint)."""
    if path.is_file() and path.name in ("saved_model.pb", "saved_model.pbtxt"):
        return path.parent
    return path


def source_key(loaded: LoadedRecipe) -> str:
    model = loaded.recipe.model
    path = model_files(loaded.resolve(model.path))
    if path.is_file() and path.suffix in (".meta", ".index") or not path.exists():
        # a checkpoint: its prefix's files and the folder's `checkpoint` index
        stem = path.with_suffix("") if path.suffix in (".meta", ".index") else path
        content = [hash_path(p) for p in sorted(path.parent.glob(stem.name + "*"))]
        if not content:
            raise FileNotFoundError(path)
        weights = digest(*content)
    else:
        weights = hash_path(path)
    return digest("source", weights, model.model_dump(mode="json", exclude={"path"}),
                  code_version())


def build_plan(loaded: LoadedRecipe, variants: list[str] | None = None,
               data_fingerprints: dict[str, str] | None = None) -> Plan:
    """The DAG for the chosen variants (all pipelines by default, plus their ancestors)."""
    recipe = loaded.recipe
    wanted = list(recipe.pipelines) if not variants else variants
    needed: list[str] = []
    for name in wanted:
        for ancestor in lineage(recipe.pipelines, name):
            if ancestor not in needed:
                needed.append(ancestor)
    fingerprints = data_fingerprints or {}
    root = source_key(loaded)
    plan = Plan(recipe=loaded, source_key=root, fingerprints=fingerprints)
    for name in needed:  # lineage order puts parents first
        parent = recipe.pipelines[name].from_
        model_key = root if parent is None else plan.final_model_key(parent)
        plan.start_keys[name] = model_key
        previous = None if parent is None or not plan.pipelines[parent] else (
            plan.pipelines[parent][-1].id)
        try:
            nodes = chain_nodes(name, loaded.stages[name], model_key, previous, fingerprints,
                                base_dir=loaded.base_dir, keys=plan.keys,
                                float_model_key=plan.final_float_key(parent))
        except StageKeyError as exc:  # a missing or bad key: exit 2 at the stage's line
            raise loaded.error(exc.cause.message, ("pipelines", name, "stages", exc.index),
                               type(exc.cause)) from exc.cause
        plan.pipelines[name] = nodes
    return plan


class StageKeyError(Exception):
    """A stage's model key could not be loaded (carries the stage's index)."""

    def __init__(self, index: int, cause: Any) -> None:
        super().__init__(str(cause))
        self.index, self.cause = index, cause


def stage_model_key(params: BaseModel, base_dir: Path | None) -> ModelKey:
    """Load the key a `uses_key` stage's params name (`key_file` wins over `key_env`)."""
    from orchestrator.model.keys import DEFAULT_ENV, load_key

    key_file = getattr(params, "key_file", None)
    path = None if key_file is None else (base_dir or Path.cwd()) / Path(key_file).expanduser()
    return load_key(getattr(params, "key_env", None) or DEFAULT_ENV,
                    None if path is None else path.resolve())


def chain_nodes(pipeline: str, stages: list[tuple[str, BaseModel]], model_key: str,
                previous: str | None, fingerprints: dict[str, str], trial: int | None = None,
                base_dir: Path | None = None, keys: dict[str, ModelKey] | None = None,
                float_model_key: str | None = None) -> list[Node]:
    """Nodes for `stages` starting from `model_key`, each key chained from the one before.
    A `uses_key` stage's key is loaded into `keys`; its key id (never the key) is part of
    its cache key, so an artifact encrypted with one key is never served for another."""
    from orchestrator.model.keys import KeyMaterialError
    from orchestrator.stages import get_stage

    nodes: list[Node] = []
    for index, (stage_name, params) in enumerate(stages):
        stage = get_stage(stage_name)
        kid = None
        if stage.uses_key:
            try:
                loaded_key = stage_model_key(params, base_dir)
            except KeyMaterialError as exc:
                raise StageKeyError(index, exc) from exc
            kid = loaded_key.key_id
            if keys is not None:
                keys[kid] = loaded_key
        # measuring stages may read any of the data (benchmark feeds what there is)
        roles = sorted(fingerprints) if stage.kind == "measure" else (
            stage.uses_data + stage.optional_data)
        data = {role: fingerprints.get(role, "") for role in roles}
        for param in stage.file_params:  # a changed file must change the key
            value = getattr(params, param, None)
            if value is not None and base_dir is not None:
                data[f"file:{param}"] = hash_path((base_dir / value).resolve())
        in_key = params.model_dump(mode="json", exclude=set(getattr(params, "NOT_IN_KEY", ())))
        # targets are not in the key: the report estimates device latency from the
        # measured FLOPs, so editing a budget re-runs nothing
        if kid is not None:
            data["key_id"] = kid
        key = digest(model_key, stage_name, in_key, code_version(), data)
        output_key = key if stage.kind == "transform" else model_key
        suffix = "" if trial is None else f"~trial{trial}"
        if float_model_key is None and stage.eight_bit:  # its input is the float model
            float_model_key = model_key
        node = Node(id=f"{pipeline}/{index}:{stage_name}{suffix}", pipeline=pipeline,
                    index=index, stage=stage_name, params=params, kind=stage.kind, key=key,
                    input_model_key=model_key, output_model_key=output_key,
                    depends_on=previous, trial=trial, key_id=kid,
                    float_model_key=float_model_key)
        nodes.append(node)
        previous = node.id
        model_key = output_key
    return nodes
