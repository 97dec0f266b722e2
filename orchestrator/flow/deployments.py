"""Recipes as Prefect deployments of `pipelines/recipe_flow.py:recipe_flow`.

`orchestrator deploy` registers one deployment per recipe, named by the recipe, with the
recipe's absolute path, its `--set` overrides and its output folder as parameters, and its
`schedule:` (or `--cron`) as a Prefect cron schedule. `orchestrator serve` runs them from
one process with Prefect's own `serve`. Every recipe is validated before anything is
created: a recipe that would fail at 3 a.m. fails at deploy time (exit 2).

Prefect is imported only after the recipes are checked and the server is chosen
(orchestrator.flow.local_server must run first, before Prefect reads its settings).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError, RecipeError

log = logging.getLogger("orchestrator")

RECIPE_SUFFIXES = (".yaml", ".yml")
TAG = "orchestrator"
# pipelines/recipe_flow.py's flow, as deployments are named on the server (FLOW/DEPLOYMENT)
FLOW_NAME = "orchestrator-recipe"
# The local server runs no scheduler service (it is Prefect's ephemeral server): while
# `serve` runs, it asks that server to schedule its deployments' next runs this often.
SCHEDULE_EVERY_S = 300.0


@dataclass(frozen=True)
class RecipeDeployment:
    """What one recipe's deployment holds, checked."""

    name: str  # the recipe's name: the deployment's name
    recipe: Path  # absolute
    overrides: tuple[str, ...]
    output: Path  # absolute: the run's report.json and models land here
    cron: str | None
    timezone: str
    description: str | None

    @property
    def parameters(self) -> dict[str, Any]:
        """The flow run's parameters (recipe_flow's signature)."""
        return {"recipe": str(self.recipe), "overrides": list(self.overrides),
                "output": str(self.output)}

    def schedule_text(self) -> str:
        return f"cron '{self.cron}' ({self.timezone})" if self.cron else "no schedule"


def recipe_files(paths: Iterable[str | Path]) -> list[Path]:
    """The recipes named, a folder standing for its *.yaml and *.yml files (not recursive).
    A folder without any is exit 2."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            inside = sorted(p for p in path.iterdir()
                            if p.suffix in RECIPE_SUFFIXES and p.is_file())
            if not inside:
                raise RecipeError(f"no recipes (*.yaml, *.yml) in the folder {path}",
                                  file=str(path))
            found.extend(inside)
        else:
            found.append(path)  # load_recipe names what is wrong with it
    return found


def check_schedule_options(cron: str | None, timezone: str | None) -> None:
    """--cron and --timezone as given on the command line (exit 2 naming the option)."""
    from orchestrator.spec.models import valid_cron, valid_timezone

    for option, value, check in (("--cron", cron, valid_cron),
                                 ("--timezone", timezone, valid_timezone)):
        if value is None:
            continue
        try:
            check(value)
        except ValueError as exc:
            raise OrchestratorError(str(exc), field=option) from None


def plan_deployments(paths: Sequence[str | Path], overrides: Sequence[str] = (),
                     cron: str | None = None, timezone: str | None = None
                     ) -> list[RecipeDeployment]:
    """Every recipe loaded and validated whole, with the options applied; exit 2 (an
    OrchestratorError) on the first problem, before anything is created."""
    from orchestrator.cache import project
    from orchestrator.recipe.loading import load_recipe

    check_schedule_options(cron, timezone)
    planned: list[RecipeDeployment] = []
    for path in recipe_files(paths):
        loaded = load_recipe(path, list(overrides))
        recipe = loaded.recipe
        schedule = recipe.schedule
        root = project.project_root(loaded.path)
        planned.append(RecipeDeployment(
            name=recipe.name, recipe=Path(os.path.abspath(loaded.path)),
            overrides=tuple(overrides),
            output=project.output_dir(root, recipe.name, None),
            cron=cron or (schedule.cron if schedule else None),
            timezone=timezone or (schedule.timezone if schedule else "UTC"),
            description=recipe.description))
    by_name: dict[str, Path] = {}
    for item in planned:
        if item.name in by_name:
            raise RecipeError(f"two recipes are named {item.name!r} ({by_name[item.name]} "
                              f"and {item.recipe}): a deployment is named by its recipe",
                              file=str(item.recipe), field="name")
        by_name[item.name] = item.recipe
    return planned


def store_home(planned: Sequence[RecipeDeployment]) -> Path:
    """The folder that records the local Prefect server: the first recipe's store folder
    (its project's .orchestrator when the store is a URL)."""
    from orchestrator.cache import project
    return project.local_home(project.project_root(planned[0].recipe))


def runner_deployments(planned: Sequence[RecipeDeployment], flow: Any,
                       work_pool: str | None = None) -> list[Any]:
    """Prefect RunnerDeployments of `flow` (pipelines.recipe_flow's, which the command
    passes in: pipelines/ sits above this package), one per recipe. The flow is named by
    its module (`pipelines.recipe_flow.recipe_flow`): a worker or a served run imports it
    from the installed package, whatever its working directory."""
    from prefect.deployments.runner import EntrypointType
    from prefect.schedules import Cron

    built = []
    for item in planned:
        schedules = None
        if item.cron:
            try:  # Prefect's own parser too: what the server will run must parse there
                schedules = [Cron(item.cron, timezone=item.timezone)]
            except ValueError as exc:
                reason = " ".join(str(exc).split())  # pydantic's message spans lines
                raise OrchestratorError(f"Prefect refuses the schedule {item.schedule_text()}:"
                                        f" {reason}", file=str(item.recipe),
                                        field="schedule") from None
        built.append(flow.to_deployment(
            name=item.name, schedules=schedules, parameters=item.parameters,
            description=item.description or f"orchestrator recipe {item.recipe}",
            tags=[TAG, f"recipe:{item.name}"], work_pool_name=work_pool,
            entrypoint_type=EntrypointType.MODULE_PATH))
    return built


def api_url() -> str:
    """The Prefect API the deployments went to."""
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


def _api_error(exc: Exception) -> OrchestratorError:
    from prefect.settings import PREFECT_API_URL

    return OrchestratorError(f"the Prefect API at {PREFECT_API_URL.value()} failed: "
                             f"{type(exc).__name__}: {exc}")


def check_work_pool(name: str) -> str:
    """The pool's type; exit 2 when the server has no such pool."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return str(client.read_work_pool(name).type)
        except ObjectNotFound:
            raise OrchestratorError(
                f"no work pool {name!r} on the Prefect server: create it first "
                f"(prefect work-pool create {name} --type process)", field="--work-pool"
            ) from None


def apply(planned: Sequence[RecipeDeployment], flow: Any, work_pool: str | None = None
          ) -> list[str]:
    """Create or update the deployments; their ids. A recipe without a schedule loses a
    schedule an earlier deploy gave it (Prefect keeps the old one on update otherwise)."""
    from prefect.client.orchestration import get_client

    try:
        if work_pool is not None:
            check_work_pool(work_pool)
        deployments = runner_deployments(planned, flow, work_pool)  # every one checked first
        ids = [str(d.apply(work_pool_name=work_pool)) for d in deployments]
        with get_client(sync_client=True) as client:
            for item, deployment_id in zip(planned, ids, strict=True):
                if item.cron is None:
                    for schedule in client.read_deployment_schedules(deployment_id):
                        client.delete_deployment_schedule(deployment_id, schedule.id)
    except OrchestratorError:
        raise
    except Exception as exc:  # the API: unreachable, refused
        if type(exc).__module__.startswith(("prefect", "httpx", "httpcore")):
            raise _api_error(exc) from exc
        raise
    return ids


def _schedule_runs(names: Sequence[str]) -> None:
    """Ask the server to schedule each deployment's next runs: what its scheduler service
    does, which Prefect's ephemeral server does not run. Idempotent."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for name in names:
            deployment = client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
            if deployment.schedules and not deployment.paused:
                client.request("POST", "/deployments/{id}/schedule",
                               path_params={"id": deployment.id}, json={})


def _last_updates(names: Sequence[str]) -> dict[str, Any]:
    """Each deployment's `updated` time on the server; None for one not there yet."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    found: dict[str, Any] = {}
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                found[name] = client.read_deployment_by_name(f"{FLOW_NAME}/{name}").updated
            except ObjectNotFound:
                found[name] = None
    return found


class ScheduleKeeper:
    """A thread scheduling the next runs of the served deployments every `every_s`, for a
    server without a scheduler service (orchestrator's local one). It starts once `serve`
    has registered them: registering a deployment removes the runs scheduled before."""

    def __init__(self, names: Sequence[str], every_s: float = SCHEDULE_EVERY_S) -> None:
        self.names = list(names)
        self.every_s = every_s
        self.stopped = threading.Event()
        self.before = _last_updates(self.names) if self.names else {}
        self.thread = threading.Thread(target=self._loop, name="orchestrator-schedules",
                                       daemon=True)

    def _registered(self) -> bool:
        now = _last_updates(self.names)
        return all(now[n] is not None and (self.before[n] is None or now[n] > self.before[n])
                   for n in self.names)

    def _loop(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                if self._registered():
                    break
            except Exception as exc:  # noqa: BLE001
                log.warning("could not read the served deployments: %s", exc)
        wait = 0.0
        while not self.stopped.wait(wait):
            try:
                _schedule_runs(self.names)
            except Exception as exc:  # noqa: BLE001  (the next round tries again)
                log.warning("could not schedule the next runs: %s", exc)
            wait = self.every_s

    def __enter__(self) -> ScheduleKeeper:
        if self.names:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(timeout=1)  # a request in flight must not hold up Ctrl-C


def serve_deployments(planned: Sequence[RecipeDeployment], flow: Any, limit: int | None = 1,
                      keep_schedules: bool = False) -> None:
    """Serve the deployments from this process with Prefect's `serve` until Ctrl-C or
    SIGTERM; Prefect pauses their schedules when it stops. `limit`: runs at a time (one
    run already uses every core). `keep_schedules`: the server runs no scheduler service."""
    import warnings
    from contextlib import nullcontext

    from prefect import serve as prefect_serve

    # Prefect's SIGTERM handler calls its async stop() without awaiting it; the runner still
    # stops (and pauses the schedules) as the event loop unwinds
    warnings.filterwarnings("ignore", message="coroutine 'Runner.astop' was never awaited")

    deployments = runner_deployments(planned, flow)
    apply(planned, flow)  # serve applies them too, but leaves a schedule dropped from a recipe
    keeper = (ScheduleKeeper([p.name for p in planned if p.cron]) if keep_schedules
              else nullcontext())
    with keeper:
        prefect_serve(*deployments, print_starting_message=False, limit=limit)
