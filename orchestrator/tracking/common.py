"""What the tracking worker (tracking.py), its client (tracking_client.py) and the Model
Registry (registry.py) share, below all three: the quick
reachability probe of a tracking server, MLflow's HTTP defaults, the registry's tag and the
saved view of the runs table.

No MLflow here: importing this module costs nothing.
"""

from __future__ import annotations

# The tracking URI the worker checks as soon as it starts (set by tracking_client).
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


