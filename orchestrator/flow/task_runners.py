"""Where a run's stage tasks execute: `local` (the run's own process, one at a time) or
`dask` (Prefect's DaskTaskRunner from prefect-dask, on a LocalCluster it starts or on an
existing scheduler).

The recipe's `execution:` block chooses; `orchestrator run --executor/--dask-address` win
over it. Nothing here imports Prefect or Dask before a dask run asks for them, so `local`
runs pay nothing for this module.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from orchestrator.errors import OrchestratorError, StageError

if TYPE_CHECKING:
    from orchestrator.engine.plan import Node
    from orchestrator.recipe.loading import LoadedRecipe

LOCAL, DASK = "local", "dask"
# How long a scheduler address may take to accept a connection before the run gives up.
CONNECT_TIMEOUT_S = 5.0
# Environment that Dask worker processes of a LocalCluster need to open a run's session and
# report to the same Prefect API: passed explicitly, since a test harness or `orchestrator
# serve` may hold them in Prefect's settings rather than in os.environ.
WORKER_ENV_PREFIXES = ("ORCHESTRATOR_", "MLFLOW_", "PREFECT_")


class ExecutionError(OrchestratorError):
    """The executor asked for cannot be used (exit 2: nothing has run)."""


@dataclass(frozen=True)
class Execution:
    """The executor a run uses, with where each setting came from (for messages)."""

    executor: str = LOCAL
    workers: int | None = None
    threads_per_worker: int = 1
    processes: bool = True
    address: str | None = None
    address_from: str = "--dask-address"  # or "<recipe>: execution.address"

    @property
    def parallel(self) -> bool:
        return self.executor == DASK


def resolve(loaded: LoadedRecipe | None, executor: str | None = None,
            address: str | None = None) -> Execution:
    """The recipe's `execution:` block with the command line's choices on top.
    `--dask-address` alone means dask; `--executor local` ignores the recipe's address."""
    block = None if loaded is None else loaded.recipe.execution
    chosen = executor or (DASK if address else None) or (block.executor if block else LOCAL)
    if chosen not in (LOCAL, DASK):
        raise ExecutionError(f"--executor {chosen!r}: expected local or dask")
    if chosen == LOCAL:
        return Execution()
    where = "--dask-address"
    if address is None and block is not None and block.address is not None:
        address = block.address
        where = f"{loaded.path}: execution.address" if loaded is not None else where
    return Execution(executor=DASK, address=address, address_from=where,
                     workers=None if address or block is None else block.workers,
                     threads_per_worker=block.threads_per_worker if block else 1,
                     processes=block.processes if block else True)


def check_address(execution: Execution) -> None:
    """A scheduler address must parse and accept a TCP connection now: exit 2 before the run
    starts (nothing written) rather than a Dask timeout after the flow began."""
    address = execution.address
    if not execution.parallel or address is None:
        return
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("tcp", "tls") or not parts.hostname or port is None:
        raise ExecutionError(f"{execution.address_from} {address!r}: expected a Dask "
                             "scheduler address such as tcp://127.0.0.1:8786")
    try:
        with socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ExecutionError(f"{execution.address_from} {address}: no Dask scheduler "
                             f"answers there ({reason}); start one (`dask scheduler`) or "
                             "leave the address out to start a LocalCluster") from exc


def task_runner(execution: Execution) -> Any | None:
    """The Prefect task runner for `execution`; None for local (the flow's own default)."""
    if not execution.parallel:
        return None
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as exc:  # a broken install, not the user's recipe
        raise ExecutionError(f"executor dask needs the prefect-dask package: {exc}") from exc
    import logging

    # Dask's own lines are not the run's news: start-up and connections (INFO), and a dead
    # worker or a failed stage (WARNING, ERROR), which come back as the stage's error
    # (explain_failure); printed through Prefect's console handler they came before it
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    if execution.address is not None:
        return DaskTaskRunner(address=execution.address)
    kwargs: dict[str, Any] = {
        "threads_per_worker": execution.threads_per_worker,
        "processes": execution.processes,
        # no dashboard; and its scheduler's HTTP routes (health, metrics), which Dask serves
        # on 8787 even without one, on a free port: a second run's cluster at the same time
        # warned "Port 8787 is already in use" on the user's console
        "dashboard_address": None,
        "scheduler_kwargs": {"dashboard_address": ":0"},
        "silence_logs": logging.CRITICAL,
        }
    if execution.processes:
        fork_workers_from_a_warm_server()
        # a worker of a scheduler of the user's own imports TensorFlow as it starts (the
        # preload); these already have it from the fork server
        kwargs.update(preload=["orchestrator.flow.dask_preload"], env=worker_env())
    if execution.workers is not None:
        kwargs["n_workers"] = execution.workers
    return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)


# What the fork server of a LocalCluster's workers imports once, for every worker it forks:
# Dask's worker, TensorFlow (fork_server_imports), what unpickles a stage task.
FORK_SERVER_PRELOAD = ["distributed", "orchestrator.flow.fork_server_imports",
                       "pipelines.recipe_flow"]


def fork_workers_from_a_warm_server() -> None:
    """A LocalCluster's worker processes forked by Python's fork server (Dask's
    `distributed.worker.multiprocessing-method: forkserver`) once it has imported
    TensorFlow, rather than each spawned fresh to import it again: about 10 s of CPU per
    worker on a 2-core machine, and their pages of TensorFlow shared. The fork server
    starts with the first worker and lasts as long as this process, so later runs of a
    long-lived process (`orchestrator serve`, a test session) start theirs at once. What a
    worker needs of this run's environment it gets from the Nanny (worker_env)."""
    import dask
    from distributed.utils import get_mp_context

    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    # Dask sets its own preload list the first time; ours replaces it, before the fork
    # server starts (it reads the list once, as it starts)
    get_mp_context().set_forkserver_preload(FORK_SERVER_PRELOAD)


def worker_env() -> dict[str, str]:
    """What a LocalCluster's worker processes must share with this one: the store and key
    variables, MLflow's, Prefect's (with the API URL this process uses, even when only
    Prefect's settings hold it), and the socket of this process's load probe."""
    env = {k: v for k, v in os.environ.items() if k.startswith(WORKER_ENV_PREFIXES)}
    try:
        from prefect.settings import get_current_settings

        api_url = get_current_settings().api.url
    except Exception:  # noqa: BLE001  (no Prefect settings: the environment decides)
        api_url = None
    if api_url:
        env["PREFECT_API_URL"] = str(api_url)
    from orchestrator.measure import load_probe
    probe = load_probe.shared_address()  # the run's load probe, started by the warm-up
    if probe is not None:
        env[load_probe.SOCKET_ENV] = probe
    return env


def explain_failure(node: Node, error: BaseException) -> BaseException:
    """A stage whose Dask worker died (killed, out of memory) or whose scheduler went away
    as the stage's own error (exit 3, naming it), not a traceback; other errors as they
    are. Dask runs such a stage again on another worker first (`allowed-failures`)."""
    if "distributed" not in sys.modules:
        return error
    from distributed import KilledWorker
    from distributed.comm.core import CommClosedError

    if isinstance(error, KilledWorker):
        why = ("the Dask worker running it died (killed, or out of memory), and Dask gave "
               "up on it (distributed.scheduler.allowed-failures)")
    elif isinstance(error, CommClosedError | ConnectionError):
        why = "the connection to the Dask scheduler was lost"
    else:
        return error
    return StageError(f"{why}: {type(error).__name__}: {error}; the stages stored before "
                      "are reused by the next run", pipeline=node.pipeline, stage=node.stage)
