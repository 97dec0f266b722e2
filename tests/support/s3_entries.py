"""Reads a store's entries straight from the bucket with boto3, independently of
orchestrator.cache.object_store: the layout contract (cache/<key[:2]>/<key>/manifest.json naming
its payload folder) and each entry's check against its manifest."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from support.s3_server import CREDENTIALS, S3Server


def client(server: S3Server) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=server.endpoint,
                        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                        region_name=CREDENTIALS["AWS_DEFAULT_REGION"])


def objects(server: S3Server, bucket: str, prefix: str = "") -> dict[str, int]:
    """Every object under `prefix` with its size."""
    found: dict[str, int] = {}
    for page in client(server).get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            found[item["Key"]] = item["Size"]
    return found


def manifests(server: S3Server, bucket: str, prefix: str) -> dict[str, dict[str, Any]]:
    """key -> manifest of every entry under <prefix>/cache/."""
    s3 = client(server)
    found = {}
    for name in objects(server, bucket, f"{prefix}/cache/"):
        if name.endswith("/manifest.json"):
            parts = name.split("/")
            key = parts[-2]
            assert parts[-3] == key[:2], name
            found[key] = json.loads(s3.get_object(Bucket=bucket, Key=name)["Body"].read())
    return found


def entry_problem(server: S3Server, bucket: str, prefix: str, key: str,
                  manifest: dict[str, Any]) -> str | None:
    """Why the entry does not verify against its manifest, or None."""
    s3 = client(server)
    if manifest.get("format") != 1 or manifest.get("key") != key:
        return f"bad manifest header: {manifest}"
    for name, expected in manifest["files"].items():
        path = f"{prefix}/cache/{key[:2]}/{key}/{manifest['payload']}/{name}"
        try:
            data = s3.get_object(Bucket=bucket, Key=path)["Body"].read()
        except s3.exceptions.NoSuchKey:
            return f"{path} is missing"
        if len(data) != expected["bytes"] or hashlib.sha256(data).hexdigest() != (
                expected["sha256"]):
            return f"{path} does not match its manifest"
    return None


def all_entries_verify(server: S3Server, bucket: str, prefix: str) -> dict[str, dict]:
    """Every entry's manifest, after asserting that each entry verifies."""
    found = manifests(server, bucket, prefix)
    problems = {key: entry_problem(server, bucket, prefix, key, manifest)
                for key, manifest in found.items()}
    assert not any(problems.values()), {k: p for k, p in problems.items() if p}
    return found
