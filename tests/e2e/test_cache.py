"""--no-cache recomputes every stage and its output wins over what the store held."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.main import main

pytestmark = pytest.mark.slow


def test_no_cache_replaces_a_tampered_entry(digits_example: Path, workspace: Path,
                                            prefect_server: None) -> None:
    recipe = workspace / "r.yaml"
    recipe.write_text(f"version: 1\nname: cache\nmodel: {{path: {digits_example}/saved_model}}\n"
                      "pipelines:\n  fp32: {stages: [freeze, strip, fold]}\n")
    assert main(["run", str(recipe), "-o", str(workspace / "a")]) == 0
    good = (workspace / "a" / "fp32" / "model.pb").read_bytes()
    # tamper with every stored model (a corrupted disk, or a stale entry)
    stored = {path: path.read_bytes()
              for path in (workspace / ".orchestrator" / "cache").rglob("model.pb")}
    assert stored  # one entry per node that makes a model
    for path, content in stored.items():
        path.write_bytes(content[: len(content) // 2])
    assert main(["run", str(recipe), "-o", str(workspace / "b"), "--no-cache"]) == 0
    assert (workspace / "b" / "fp32" / "model.pb").read_bytes() == good
    # and the store now holds the fresh results again, in the same entries, and no others
    assert {path: path.read_bytes() for path in
            (workspace / ".orchestrator" / "cache").rglob("model.pb")} == stored
    assert good in stored.values()
