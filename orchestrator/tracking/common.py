"""What the tracking worker (tracking.py), its client (tracking_client.py) and the Model
Registry (registry.py) share, below all three: hiding secrets and URL credentials, the quick
reachability probe of a tracking server, MLflow's HTTP defaults, the registry's tag and the
saved view of the runs table.

No MLflow here: importing this module costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Keys that look like secrets are never logged, whatever the recipe holds.
SECRET_WORDS = re.compile(r"(key|secret|password|passwd|token|credential)", re.IGNORECASE)
# ...except the ones that only say where a secret is (encrypt's key_env, key_file)
SECRET_REFERENCE = re.compile(r"(_env|_file|_id)$", re.IGNORECASE)
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

# user:password@, :token@ or token@ after a scheme; a password may hold '/' (cloud secret
# keys do)
_URL_CREDENTIALS = re.compile(r"(?<=://)(?:[^/@\s:]*:[^@\s]*|[^/@\s:]+)@")


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


def redact(value: str) -> str:
    """Credentials inside URLs (scheme://user:password@host) become '***@'."""
    return _URL_CREDENTIALS.sub("***@", value)


def is_secret_key(key: str) -> bool:
    """A key whose value may be a secret (`api_token`, `password`), not one that only names
    where a secret is (`key_env`, `key_file`, `key_id`)."""
    return bool(SECRET_WORDS.search(key)) and not SECRET_REFERENCE.search(key)


def redacted(data: Any) -> Any:
    """`data` with secret-looking keys' values replaced by '***' and URL credentials
    redacted, for what is logged whole (the recipe as loaded)."""
    if isinstance(data, Mapping):
        return {key: "***" if is_secret_key(str(key)) else redacted(value)
                for key, value in data.items()}
    if isinstance(data, list):
        return [redacted(value) for value in data]
    return redact(data) if isinstance(data, str) else data
