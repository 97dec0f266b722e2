"""The store: complete entries or none, never a partial one."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cache.store import Store, StoredResult
from orchestrator.model.artifact import ModelArtifact, TensorSpec


def tiny_artifact() -> ModelArtifact:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        tf.identity(x * 2.0, name="y")
    return ModelArtifact(graph.as_graph_def(), (TensorSpec("x", "float32", (None, 2)),), ("y",),
                         {"note": "kept"})


def test_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path)
    artifact = tiny_artifact()
    store.put("ab" * 32, StoredResult(metrics={"m": 1.5}, seconds=0.2), artifact,
              {"ranges.log": b"x", "sub/table.csv": b"y"})
    assert store.has("ab" * 32) and store.has_model("ab" * 32)
    loaded = store.get_model("ab" * 32)
    assert loaded.graph_bytes() == artifact.graph_bytes()
    assert loaded.inputs == artifact.inputs and loaded.outputs == ("y",)
    assert loaded.metadata == {"note": "kept"}
    result = store.get_result("ab" * 32)
    assert result.metrics == {"m": 1.5} and result.files == ["ranges.log", "sub/table.csv"]
    assert store.file_path("ab" * 32, "sub/table.csv").read_bytes() == b"y"


def test_failed_put_leaves_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(ValueError):
        store.put("cd" * 32, StoredResult(), tiny_artifact(), {"../escape": b"no"})
    assert not store.has("cd" * 32)
    assert not store.entry("cd" * 32).exists()
    assert not list(tmp_path.rglob("*.tmp"))
