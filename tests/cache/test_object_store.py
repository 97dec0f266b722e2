"""The store on an object store (orchestrator/cache/object_store.py), against moto's standalone S3
server on loopback (a real HTTP endpoint, no mocks): the bucket layout, manifest last,
verification on read (a truncated or altered object is a miss with a warning, never a
model), first writer wins, --no-cache replaces, refused writes and an unreachable endpoint
are OutputErrors naming the store without secrets. A local path still opens `Store`."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.s3_entries import all_entries_verify, client, objects
from support.s3_server import S3Server, free_port, s3_server_or_skip

from orchestrator.cache.object_store import ObjectStore
from orchestrator.cache.project import open_store
from orchestrator.cache.store import Store, StoredResult
from orchestrator.errors import OutputError
from orchestrator.model.artifact import ModelArtifact, TensorSpec

pytestmark = pytest.mark.servers

KEY = "ab" * 32
_names = itertools.count()


def tiny_artifact(scale: float = 2.0) -> ModelArtifact:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        tf.identity(x * scale, name="y")
    return ModelArtifact(graph.as_graph_def(), (TensorSpec("x", "float32", (None, 2)),), ("y",),
                         {"note": "kept"})


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server_or_skip() as server:
        yield server


@pytest.fixture
def bucket(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh bucket, this process's AWS variables pointing at the server, and the default
    mirrors (open_store's) under tmp."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    name = f"store-{next(_names)}"
    s3.make_bucket(name)
    return name


def remote(bucket: str, mirror: Path) -> ObjectStore:
    """A store on s3://<bucket>/team/store with a mirror of its own (another machine)."""
    return ObjectStore(f"s3://{bucket}/team/store", mirror=mirror)


def put_entry(store: ObjectStore, key: str = KEY, scale: float = 2.0,
              replace: bool = False) -> ModelArtifact:
    artifact = tiny_artifact(scale)
    store.put(key, StoredResult(metrics={"m": scale}, seconds=0.2), artifact,
              {"ranges.log": b"x" * 100, "sub/table.csv": b"y"}, replace=replace)
    return artifact


def payload_objects(s3: S3Server, bucket: str, key: str = KEY) -> dict[str, int]:
    return {name: size for name, size in objects(s3, bucket, f"team/store/cache/{key[:2]}/"
                                                              f"{key}/").items()
            if not name.endswith("/manifest.json")}


def test_round_trip_layout_and_manifest(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    writer = remote(bucket, tmp_path / "a")
    artifact = put_entry(writer)
    manifest = all_entries_verify(s3, bucket, "team/store")[KEY]
    assert set(manifest) == {"format", "key", "payload", "files"}
    assert manifest["format"] == 1 and manifest["key"] == KEY
    assert set(manifest["files"]) == {"model.pb", "signature.json", "result.json",
                                      "files/ranges.log", "files/sub/table.csv"}
    # the payload folder is the writer's, the manifest beside it, nothing else
    entry = f"team/store/cache/{KEY[:2]}/{KEY}"
    assert set(objects(s3, bucket, "team/store/cache/")) == {
        f"{entry}/manifest.json",
        *(f"{entry}/{manifest['payload']}/{name}" for name in manifest["files"])}
    # another machine (its own mirror) reads the same bytes
    reader = remote(bucket, tmp_path / "b")
    assert reader.has(KEY) and reader.has_model(KEY)
    loaded = reader.get_model(KEY)
    assert loaded.graph_bytes() == artifact.graph_bytes() and loaded.metadata == {"note": "kept"}
    assert reader.get_result(KEY).metrics == {"m": 2.0}
    assert reader.get_result(KEY).files == ["ranges.log", "sub/table.csv"]
    assert reader.file_path(KEY, "sub/table.csv").read_bytes() == b"y"
    for name, expected in manifest["files"].items():
        data = (reader.entry(KEY) / name).read_bytes()  # the verified mirror, by path
        assert hashlib.sha256(data).hexdigest() == expected["sha256"]
    assert reader.model_path(KEY).is_relative_to(tmp_path / "b")
    assert not reader.has("cd" * 32) and not reader.has_model("cd" * 32)


def test_manifest_last_an_interrupted_put_is_not_visible(
        s3: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    writer = remote(bucket, tmp_path / "a")
    real_pipe_file = writer.fs.pipe_file

    def interrupted(path: str, *args: object, **kwargs: object) -> object:
        if path.endswith("/manifest.json"):  # Ctrl-C after the payload, before the manifest
            raise KeyboardInterrupt
        return real_pipe_file(path, *args, **kwargs)

    monkeypatch.setattr(writer.fs, "pipe_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        put_entry(writer)
    assert not any(name.endswith("manifest.json") for name in objects(s3, bucket))
    reader = remote(bucket, tmp_path / "b")
    with caplog.at_level(logging.WARNING):
        assert not reader.has(KEY)
    assert not caplog.records  # no entry at all: not a corrupt one
    put_entry(remote(bucket, tmp_path / "c"))  # the next put makes it whole
    assert remote(bucket, tmp_path / "d").has_model(KEY)


@pytest.mark.parametrize("damage", ["truncated", "altered", "missing", "bad manifest"])
def test_a_damaged_entry_is_a_miss_with_a_warning_then_replaced(
        s3: S3Server, bucket: str, tmp_path: Path, damage: str,
        caplog: pytest.LogCaptureFixture) -> None:
    put_entry(remote(bucket, tmp_path / "a"))
    s3c = client(s3)
    model = next(name for name in payload_objects(s3, bucket) if name.endswith("model.pb"))
    data = s3c.get_object(Bucket=bucket, Key=model)["Body"].read()
    if damage == "truncated":
        s3c.put_object(Bucket=bucket, Key=model, Body=data[: len(data) // 2])
    elif damage == "altered":  # same size, one byte flipped
        s3c.put_object(Bucket=bucket, Key=model, Body=data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "missing":
        s3c.delete_object(Bucket=bucket, Key=model)
    else:
        s3c.put_object(Bucket=bucket, Key=f"team/store/cache/{KEY[:2]}/{KEY}/manifest.json",
                       Body=b'{"format": 1, "key": ')
    reader = remote(bucket, tmp_path / "b")
    with caplog.at_level(logging.WARNING, logger="orchestrator.cache.object_store"):
        assert not reader.has(KEY) and not reader.has_model(KEY)
    assert not reader.entry(KEY).exists()  # nothing of it in the mirror
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and KEY in warnings[0] and "s3://" in warnings[0], warnings
    with pytest.raises(OutputError, match=KEY):
        reader.get_model(KEY)  # never a model
    # the recomputed result replaces the bad entry; the bad payload is gone
    artifact = put_entry(reader)
    manifests = all_entries_verify(s3, bucket, "team/store")
    if damage != "bad manifest":  # (that one names no payload to remove)
        # team/store/cache/ab/<key>/<writer>/...: only the new payload is left
        assert {name.split("/")[5] for name in payload_objects(s3, bucket)} == {
            manifests[KEY]["payload"]}
    fresh = remote(bucket, tmp_path / "c")
    assert fresh.get_model(KEY).graph_bytes() == artifact.graph_bytes()
    assert list(manifests) == [KEY]


def test_first_writer_wins(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    first, second = remote(bucket, tmp_path / "a"), remote(bucket, tmp_path / "b")
    put_entry(first, scale=2.0)
    before = all_entries_verify(s3, bucket, "team/store")[KEY]
    put_entry(second, scale=3.0)  # computed meanwhile: the stored entry stays
    assert all_entries_verify(s3, bucket, "team/store")[KEY] == before
    assert len(payload_objects(s3, bucket)) == len(before["files"])
    # and the second writer now serves the first one's entry, verified
    assert second.get_result(KEY).metrics == {"m": 2.0}


def test_replace_uploads_again(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    put_entry(remote(bucket, tmp_path / "a"), scale=2.0)
    before = all_entries_verify(s3, bucket, "team/store")[KEY]
    replacer = remote(bucket, tmp_path / "b")
    put_entry(replacer, scale=3.0, replace=True)  # --no-cache: what was computed wins
    after = all_entries_verify(s3, bucket, "team/store")[KEY]
    assert after["payload"] != before["payload"]
    assert all(before["payload"] not in name for name in payload_objects(s3, bucket))
    assert remote(bucket, tmp_path / "c").get_result(KEY).metrics == {"m": 3.0}
    assert replacer.get_result(KEY).metrics == {"m": 3.0}


def test_refused_writes_name_the_store_without_secrets(
        s3: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    url = "s3://user:pa55word@no-such-bucket/team/store"
    store = open_store(url)
    assert isinstance(store, ObjectStore) and store.shown == "s3://***@no-such-bucket/team/store"
    problem = store.check_writable()
    assert problem and "bucket does not exist" in problem
    with pytest.raises(OutputError) as caught:
        store.put(KEY, StoredResult(), None, {"a.txt": b"1"})
    message = str(caught.value)
    assert "s3://***@no-such-bucket/team/store" in message, message
    assert "bucket does not exist" in message
    assert "pa55word" not in message and "s3cr3t" not in message and "\n" not in message
    assert caught.value.exit_code == 2
    assert not store.entry(KEY).exists()  # nothing in the mirror either


def test_deleted_bucket_leaves_no_manifest(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    s3c = client(s3)
    s3c.delete_bucket(Bucket=bucket)
    with pytest.raises(OutputError, match=f"s3://{bucket}/team/store"):
        put_entry(remote(bucket, tmp_path / "a"))
    s3.make_bucket(bucket)
    assert objects(s3, bucket) == {}


def test_an_unreachable_endpoint_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}.items():
        monkeypatch.setenv(name, value)  # nothing listens on that port
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    store = remote("gone", tmp_path / "a")
    assert "connect" in (store.check_writable() or "").lower()
    with pytest.raises(OutputError, match="s3://gone/team/store"):
        store.has(KEY)
    with pytest.raises(OutputError, match="cannot write to the store s3://gone/team/store"):
        put_entry(store)


def test_a_local_path_is_the_local_store(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "home"))
    assert type(store) is Store and store.root == tmp_path / "home"
    artifact = tiny_artifact()
    store.put(KEY, StoredResult(metrics={"m": 1.0}), artifact, {"a.txt": b"1"})
    # the local layout as before: no manifest, no writer folder
    assert sorted(p.name for p in store.entry(KEY).iterdir()) == [
        "files", "model.pb", "result.json", "signature.json"]
    assert json.loads((store.entry(KEY) / "result.json").read_text())["files"] == ["a.txt"]
    assert type(open_store(tmp_path)) is Store


def test_a_scratch_store_under_the_bucket(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    """A Dask run's scratch store beside the cache: pipelines/recipe_flow.py joins its name
    with pathlib (one slash of the URL collapsed); it opens the same remote folder, and
    remove_all deletes its objects and its mirror."""
    from pathlib import PurePosixPath

    joined = str(PurePosixPath(f"s3://{bucket}/team/store") / "scratch" / "run1")
    assert joined.startswith("s3:/") and not joined.startswith("s3://")
    scratch = open_store(joined)
    assert isinstance(scratch, ObjectStore) and scratch.url == (
        f"s3://{bucket}/team/store/scratch/run1")
    put_entry(scratch)
    assert remote(bucket, tmp_path / "b").has(KEY) is False  # not the cache
    assert objects(s3, bucket, "team/store/scratch/run1/cache/")
    assert scratch.entry(KEY).is_dir() and scratch.root.is_relative_to(tmp_path)
    scratch.remove_all()
    assert objects(s3, bucket) == {} and not scratch.root.exists()
