"""What the tracking worker (worker.py), its client (client.py), the Model Registry
(registry.py) and the run history (history.py) share, below all four: the quick
reachability probe of a tracking server, MLflow's HTTP defaults, the client that reads a
tracking store (open_client), the registry's tag and the saved view of the runs table.

MLflow is imported only inside open_client: importing this module costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import OrchestratorError
from orchestrator.redaction import redact

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# The tracking URI the worker checks as soon as it starts (set by client.py).
PROBE_ENV = "ORCHESTRATOR_TRACKING_PROBE"
# How long the worker waits to reach an HTTP tracking server before it says it cannot.
PROBE_TIMEOUT_S = 5.0
# MLflow retries a failing request 7 times with doubling back-off (about 250 s against an
# unreachable server); a run says so within seconds instead. The environment still wins.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
# The parent run's tag saying what the Model Registry did with the run (registry.register).
REGISTRY_STATUS_TAG = "registry.status"
# MLflow 3.17's saved views of an experiment's runs table (its "Views" menu): one experiment
# tag each, `mlflow.sharedViewState.<id>`, holding {name, createdAt, updatedAt, state} with
# `state` the table's settings as JSON (the columns shown, the sort); a link with
# `viewStateShareKey=<id>` opens the table that way. The tracking worker keeps one view per
# recipe's experiment: its key metrics as columns (tracking.key_metrics_view).
SAVED_VIEW_TAG = "mlflow.sharedViewState."
VIEW_QUERY = "viewStateShareKey"
KEY_METRICS_VIEW = "orchestrator-key-metrics"
KEY_METRICS_VIEW_NAME = "Key metrics per target (orchestrator)"


def probe(tracking_uri: str) -> str | None:
    """Why an HTTP(S) tracking server cannot be reached (within PROBE_TIMEOUT_S), or None."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname, port), timeout=PROBE_TIMEOUT_S):
            return None
    except TimeoutError:
        return f"no answer from {parts.hostname}:{port} within {PROBE_TIMEOUT_S:.0f} s"
    except (OSError, ValueError) as exc:
        return f"cannot connect to {parts.hostname}: {exc}"


def open_client(tracking_uri: str, error: type[OrchestratorError],
                no_store: Callable[[Path], OrchestratorError]) -> MlflowClient:
    """A client of a tracking store that exists and answers, to read it (history, promote,
    gate): `no_store(database)` when a local SQLite store does not exist (it is never
    created here), `error` (exit 2) naming the URI when a server is unreachable. MLflow's
    HTTP retries are bounded (a failing server says so within seconds), and its INFO lines
    and artifact progress bars stay off stderr; the environment still wins."""
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri.removeprefix("sqlite:///").split("?")[0])
        if not database.is_file():
            raise no_store(database)
    unreachable = probe(tracking_uri)
    if unreachable:
        raise error(f"MLflow tracking at {redact(tracking_uri)!r} is unreachable: "
                    f"{unreachable}", field="MLFLOW_TRACKING_URI")
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri)
