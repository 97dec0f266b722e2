"""Tracking helpers: flattened params, secrets never logged."""

from __future__ import annotations

from orchestrator.tracking import flatten


def test_flatten_nests_dicts_and_lists() -> None:
    flat = flatten({"model": {"path": "m", "inputs": [{"name": "image", "shape": [1, 8]}]},
                    "version": 1})
    assert flat == {"model.path": "m", "model.inputs.0.name": "image",
                    "model.inputs.0.shape.0": "1", "model.inputs.0.shape.1": "8",
                    "version": "1"}


def test_flatten_drops_secret_looking_keys() -> None:
    flat = flatten({"encrypt": {"key": "s3cret", "key_env": "MODEL_KEY", "password": "p"},
                    "api_token": "t", "name": "ok"})
    assert flat == {"name": "ok"}
    assert "s3cret" not in str(flat)


def test_url_credentials_are_redacted() -> None:
    flat = flatten({"model": {"path": "s3://AKIA123:wJalr/xyz@bucket/models/v7"},
                    "data": "https://user:pa55@host/x.npz", "plain": "https://host/x"})
    assert flat["model.path"] == "s3://***@bucket/models/v7"
    assert flat["data"] == "https://***@host/x.npz"
    assert flat["plain"] == "https://host/x"


def test_token_only_url_credentials_are_redacted() -> None:
    from orchestrator.tracking import redact

    assert redact("https://ghp_tok3n@host/x") == "https://***@host/x"
    assert redact("https://:tok3n@host/x") == "https://***@host/x"
    assert redact("postgresql://u:p@db:5432/prefect") == "postgresql://***@db:5432/prefect"
    assert redact("https://host:8080/x") == "https://host:8080/x"
