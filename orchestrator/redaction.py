"""Secrets kept out of what a run logs, tracks or prints: credentials inside URLs, and the
values of keys that look like secrets. Below every layer: the cache, the local server and the
tracking code all redact.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Keys that look like secrets are never logged, whatever the recipe holds.
SECRET_WORDS = re.compile(r"(key|secret|password|passwd|token|credential)", re.IGNORECASE)
# ...except the ones that only say where a secret is (encrypt's key_env, key_file)
SECRET_REFERENCE = re.compile(r"(_env|_file|_id)$", re.IGNORECASE)
# user:password@, :token@ or token@ after a scheme; a password may hold '/' (cloud secret
# keys do)
_URL_CREDENTIALS = re.compile(r"(?<=://)(?:[^/@\s:]*:[^@\s]*|[^/@\s:]+)@")


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
