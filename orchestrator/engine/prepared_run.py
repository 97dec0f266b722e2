"""A run's session: the recipe loaded, its plan built, its model and data checked.

Everything a user can get wrong is found here, before any stage runs and before anything is
written (exit 2). A session is opened from a small `RunRef` (the recipe path, its overrides,
the store), the same way in any process: a task that receives a node and a RunRef can run
in any worker that sees the same store. Each process keeps the sessions it opened until the
run closes them, so the model and the data are loaded once per process and run.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from orchestrator.cache.project import open_store
from orchestrator.cache.store import Store, StoredResult
from orchestrator.engine.node_run import RunData
from orchestrator.engine.plan import Plan, build_plan
from orchestrator.errors import DataError, ModelSourceError, RecipeError
from orchestrator.measure.budgets import check_output_budgets
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.model.kinds import facts as model_facts
from orchestrator.recipe.loading import LoadedRecipe, load_recipe


@dataclass(frozen=True)
class RunRef:
    """What any process needs to open a run's session: plain, hashable, picklable."""

    recipe: str  # the recipe file, absolute
    overrides: tuple[str, ...]
    variants: tuple[str, ...] | None
    store: str  # the store's folder, absolute, or its URL (s3://bucket/prefix)
    use_cache: bool = True
    # a folder of this run's own for models kept out of the cache, where the run's stages
    # run in several processes (Dask); None: they stay in the one process's memory
    scratch: str | None = None


@dataclass
class Session:
    loaded: LoadedRecipe
    plan: Plan
    data: RunData
    devices: dict[str, Any]

    @property
    def store(self) -> Store:
        return self.data.store


_open: dict[RunRef, Session] = {}


def open_session(ref: RunRef, loaded: LoadedRecipe | None = None) -> Session:
    """This process's session for `ref`, opened on first use. `loaded`: the recipe as the
    caller already loaded it from `ref` (spares a second parse)."""
    if ref in _open:
        return _open[ref]
    loaded = loaded or load_recipe(ref.recipe, list(ref.overrides))
    recipe = loaded.recipe
    for name in ref.variants or ():
        if name not in recipe.pipelines:
            raise RecipeError(f"--variant {name!r} is not a pipeline of the recipe; pipelines: "
                              f"{', '.join(recipe.pipelines)}", file=str(loaded.path),
                              field="pipelines")
    devices = loaded.devices()
    store = open_store(ref.store)
    scratch = None if ref.scratch is None else open_store(ref.scratch)
    plan = build_plan(loaded, list(ref.variants or ()) or None, data_fingerprints(loaded))
    key = plan.source_key
    cached = ref.use_cache and store.has_model(key)
    if cached:  # this exact model file was loaded before
        data = RunData(plan, store, lambda: store.get_model(key), devices, scratch)
    else:
        source = load_source(loaded)
        data = RunData(plan, store, lambda: source, devices, scratch)
    preflight_data(loaded, data)
    preflight_devices(loaded, plan, store if ref.use_cache else None)
    if any(t.budgets.outputs for t in recipe.targets):  # their names need the model's outputs
        model = (store.get_signature(key) if cached else
                 {"outputs": source.outputs, "metadata": source.metadata})
        check_output_budgets(loaded, model["outputs"], model.get("metadata") or {})
    if not cached:  # the first write: every check above has passed
        store.put(key, StoredResult(facts=model_facts(data.source)), data.source, {},
                  replace=not ref.use_cache)
    session = _open[ref] = Session(loaded, plan, data, devices)
    return session


def close_session(ref: RunRef) -> None:
    """Let the session's model and data go (a long-lived `serve` process runs many)."""
    _open.pop(ref, None)


def load_source(loaded: LoadedRecipe) -> ModelArtifact:
    """Load the recipe's model source; ModelSourceError located at `model.path`, or at the
    `model.inputs`/`model.outputs` entry it names (its `field`)."""
    from orchestrator.model.sources import load_model

    model = loaded.recipe.model
    inputs = None if model.inputs is None else [
        TensorSpec(name=i.name, dtype=i.dtype,
                   shape=None if i.shape is None else tuple(
                       None if d in (None, -1) else d for d in i.shape))
        for i in model.inputs]
    try:
        return load_model(loaded.resolve(model.path), model.format, inputs, model.outputs)
    except ModelSourceError as exc:
        entry = (exc.field or "").split(".")
        loc = tuple(int(p) if p.isdigit() else p for p in entry) if entry[:2] in (
            ["model", "inputs"], ["model", "outputs"]) else ("model", "path")
        raise loaded.relocate(exc, loc) from exc


def preflight_data(loaded: LoadedRecipe, data: RunData) -> None:
    """Evaluation and representative data must fit the model input (exit 2, nothing run)."""
    recipe = loaded.recipe
    try:
        if recipe.data.evaluation is not None:
            data.evaluation_data  # noqa: B018  (loads and checks shapes)
        if recipe.data.representative is not None:
            from orchestrator.data import source_kind

            source = recipe.data.representative
            if source_kind(source, loaded.base_dir, "data.representative") == "npz":
                for _ in data.representative(None, 1024):  # memory-mapped: a cheap scan
                    pass  # NaN anywhere is found now, not after stages ran
            else:
                next(iter(data.representative(1, 1)), None)
    except DataError as exc:
        role = "evaluation" if "evaluation" in (exc.field or "") else (
            "representative" if "representative" in (exc.field or "") else None)
        loc = tuple((exc.field or f"data.{role}").split(".")) if role else ("data",)
        raise loaded.relocate(exc, loc) from exc


def preflight_devices(loaded: LoadedRecipe, plan: Plan, store: Store | None) -> None:
    """Every board a measurement still to run needs is reachable and has the runtimes the
    recipe's files need (exit 2 at the target's `connect:`, naming the fix), before any
    stage runs. Boards whose measurements are all cached are not contacted."""
    from orchestrator.boards.errors import DeviceLost, DeviceUnreachable
    from orchestrator.boards.measurement import prepare_command, runtimes_needed
    from orchestrator.boards.session import drop_session, shared_session
    from orchestrator.boards.urls import parse_device_url
    from orchestrator.engine.node_run import pending_nodes
    from orchestrator.recipe.defaults import shipped_kinds
    from orchestrator.stages import get_stage

    pending = [n for n in pending_nodes(plan, store) if get_stage(n.stage).per_board]
    kinds = shipped_kinds(loaded.recipe, loaded.stages)
    targets = {t.name: i for i, t in enumerate(loaded.recipe.targets)}
    checked: set[str] = set()
    for node in pending:
        url_text = node.params.connect
        if url_text in checked:
            continue
        checked.add(url_text)
        url = parse_device_url(url_text)
        where = ("targets", targets[node.params.target], "connect") if (
            node.params.target in targets) else ("pipelines", node.pipeline, "stages")
        fix = f"check the board with `orchestrator device check {shlex.quote(url_text)}`"
        try:
            board = shared_session(url, url_text).describe()
        except (DeviceUnreachable, DeviceLost) as exc:
            drop_session(url)
            raise loaded.error(f"target {node.params.target}: {exc.message} ({fix})", where,
                               DeviceUnreachable) from None
        have = board.get("runtimes") or {}
        needed = {m for n in pending if n.params.connect == url_text
                  for kind, encrypted in [kinds.get(n.pipeline, ("graphdef", False))]
                  if kind == "tflite" for m in runtimes_needed(kind, encrypted)}
        needed.add("numpy")
        missing = sorted(m for m in needed if not have.get(m))
        if missing:
            raise loaded.error(
                f"target {node.params.target}: the board at {url_text} has no "
                f"{', '.join(missing)}, which the recipe's files need there: run "
                f"`{prepare_command(url_text)}`", where, DeviceUnreachable)


def data_fingerprints(loaded: LoadedRecipe) -> dict[str, str]:
    from orchestrator.data import fingerprint

    result = {}
    for role in ("representative", "evaluation"):
        source = getattr(loaded.recipe.data, role)
        if source is not None:
            result[role] = fingerprint(source, loaded.base_dir)
    return result
