"""Issue 19, the store on an object store (ORCHESTRATOR_HOME=s3://bucket/prefix) under
faults, end to end: the real CLI in subprocesses against moto's standalone S3 server on
loopback. Each run has its own local mirror (XDG_CACHE_HOME), as a run on another machine
would: what it reads comes from the bucket, verified.

- a recipe runs on the bucket, and a re-run is fully cached;
- a truncated object in the bucket: the re-run recomputes that entry (warning naming it),
  the report is the same, and every entry in the bucket verifies afterwards;
- a bucket that refuses writes (missing) or an endpoint that is down: exit 2, one line
  naming the store, no traceback, nothing written;
- two runs at once on the same bucket: both exit 0 with the same report and selections,
  and every entry verifies.

The recipe is the digits example cut to one pipeline per kind of artifact a store entry
keeps (a GraphDef; a memory-mapped, encrypted model with its ops header; a LiteRT file),
without the guard's search and the benchmarks: what is under test is the store, not the
stages (the whole digits recipe runs on an S3 store in tests/e2e/test_scale_out.py). One S3
server serves the module, one bucket per test; the first run on a bucket is made once and
shared: the cached re-run reads its bucket, the truncation test a copy of it."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.robust_helpers import (
    RUN_TIMEOUT_S,
    base_env,
    check_clean_error,
    cli_subprocess,
    comparable_report,
    digits_recipe,
    output_is_whole_or_absent,
    start_cli,
    wait_all,
)
from support.s3_entries import all_entries_verify, client, objects
from support.s3_server import S3Server, free_port, s3_server_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.servers]

PREFIX = "orchestrator/home"
PIPELINES = {
    "fp32": {"stages": ["freeze", "strip", "fold", "evaluate"]},
    "mobile": {"from": "fp32",
               "stages": ["quantize_weights", "memmap", "encrypt", "ops_header", "evaluate"]},
    "litert_dynamic": {"from": "fp32",
                       "stages": [{"convert_tflite": {"mode": "dynamic_range"}}, "evaluate"]},
}
_BUCKETS = itertools.count()


def store_url(bucket: str) -> str:
    return f"s3://{bucket}/{PREFIX}"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server_or_skip() as server:
        yield server


@pytest.fixture
def bucket(s3: S3Server) -> str:
    """A new bucket's name, for one test (not created: the test does, or not)."""
    return f"team-store-{next(_BUCKETS)}"


@pytest.fixture(scope="module")
def recipe(digits_example: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("recipe") / "stores.yaml"
    data = digits_recipe(pipelines=PIPELINES)
    for target in data["targets"]:  # no benchmark stage: no measured latency to hold
        target["budgets"].pop("max_latency_ms")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def s3_env(tmp_path: Path, prefect_api_url: str, s3: S3Server, machine: str,
           store: str) -> dict[str, str]:
    """A run's environment: the store on the bucket, MLflow in its own sqlite under tmp,
    and a local mirror of its own (`machine`)."""
    (tmp_path / "mlruns").mkdir(parents=True, exist_ok=True)
    env = base_env(Path("unused"), f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}",
                   prefect_api_url, XDG_CACHE_HOME=str(tmp_path / machine / "cache"),
                   **s3.env())
    env["ORCHESTRATOR_HOME"] = store
    return env


def run_recipe(recipe: Path, tmp_path: Path, env: dict[str, str], out: str
               ) -> tuple[dict[str, Any], str]:
    done = cli_subprocess(["run", recipe, "-o", tmp_path / out], env, tmp_path,
                          timeout=RUN_TIMEOUT_S * 2)
    assert done.code == 0, f"exit {done.code}:\n{done.err[-4000:]}"
    assert "Traceback" not in done.err, done.err[-4000:]
    assert env["ORCHESTRATOR_HOME"] in done.out  # "store: s3://..." in the closing lines
    return json.loads((tmp_path / out / "report.json").read_text()), done.out + done.err


@pytest.fixture(scope="module")
def first_run(recipe: Path, tmp_path_factory: pytest.TempPathFactory, prefect_api_url: str,
              s3: S3Server) -> dict[str, Any]:
    """The recipe's first run on an empty bucket (machine "a"): its report, its output
    folder and the entries it left, each verified."""
    where = tmp_path_factory.mktemp("first-run")
    name = "first-run"
    s3.make_bucket(name)
    report, _ = run_recipe(recipe, where, s3_env(where, prefect_api_url, s3, "a",
                                                 store_url(name)), "out1")
    assert stage_counts(report)[0] == 0
    entries = all_entries_verify(s3, name, PREFIX)
    assert len(entries) >= stage_counts(report)[1] // 2  # stages and the source model
    assert not (where / ".orchestrator" / "cache").exists()  # nothing local but a mirror
    return {"bucket": name, "report": report, "out": where / "out1", "entries": entries}


def stage_counts(report: dict[str, Any]) -> tuple[int, int]:
    """(cached stages, all stages) over the report's variants."""
    stages = [s for v in report["variants"].values() for s in v["stages"]]
    return sum(bool(s["cached"]) for s in stages), len(stages)


def cached_columns(stdout: str, report: dict[str, Any]) -> dict[str, str]:
    """The summary table's `cached` column ("k/n") for each variant, as the CLI printed it."""
    found = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.replace("┃", "│").split("│") if c.strip()]
        if cells and cells[0] in report["variants"] and "/" in cells[-1]:
            found[cells[0]] = cells[-1]
    return found


def test_runs_on_the_bucket_and_a_rerun_is_cached(
        recipe: Path, tmp_path: Path, prefect_api_url: str, s3: S3Server,
        first_run: dict[str, Any]) -> None:
    first, bucket, entries = first_run["report"], first_run["bucket"], first_run["entries"]
    # another machine: everything from the bucket, nothing computed
    second, printed = run_recipe(recipe, tmp_path, s3_env(
        tmp_path, prefect_api_url, s3, "b", store_url(bucket)), "out2")
    cached, total = stage_counts(second)
    assert cached == total > 0
    columns = cached_columns(printed, second)
    assert set(columns) == set(second["variants"]), printed[-3000:]
    for name, variant in second["variants"].items():
        assert columns[name] == f"{len(variant['stages'])}/{len(variant['stages'])}"
    assert comparable_report(second, tmp_path / "out2") == comparable_report(
        first, first_run["out"])
    assert all_entries_verify(s3, bucket, PREFIX) == entries  # nothing rewritten


def stage_keys(recipe: Path) -> set[str]:
    """The cache key of every stage of the recipe, as the run plans them."""
    from orchestrator.engine.plan import build_plan
    from orchestrator.engine.prepared_run import data_fingerprints
    from orchestrator.recipe.loading import load_recipe

    loaded = load_recipe(recipe)
    return {node.key for node in build_plan(loaded, None, data_fingerprints(loaded)).nodes}


def copy_bucket(s3: S3Server, source: str, target: str) -> None:
    """Every object of `source` into the new bucket `target`, server side."""
    s3.make_bucket(target)
    s3c = client(s3)
    for name in objects(s3, source):
        s3c.copy_object(Bucket=target, Key=name, CopySource={"Bucket": source, "Key": name})


def test_a_truncated_object_is_recomputed_never_served(
        recipe: Path, tmp_path: Path, prefect_api_url: str, s3: S3Server, bucket: str,
        first_run: dict[str, Any]) -> None:
    first, out1 = first_run["report"], first_run["out"]
    copy_bucket(s3, first_run["bucket"], bucket)  # the first run's entries, to damage
    entries = all_entries_verify(s3, bucket, PREFIX)
    assert entries == first_run["entries"]
    # truncate the model of one stage's entry (not the source model's)
    key, manifest = next((k, m) for k, m in sorted(entries.items())
                         if "model.pb" in m["files"] and k in stage_keys(recipe))
    name = f"{PREFIX}/cache/{key[:2]}/{key}/{manifest['payload']}/model.pb"
    s3c = client(s3)
    data = s3c.get_object(Bucket=bucket, Key=name)["Body"].read()
    s3c.put_object(Bucket=bucket, Key=name, Body=data[: len(data) // 3])

    second, printed = run_recipe(recipe, tmp_path, s3_env(
        tmp_path, prefect_api_url, s3, "b", store_url(bucket)), "out2")
    warnings = [line for line in printed.splitlines() if key in line and "corrupt" in line]
    assert warnings and store_url(bucket) in warnings[0], printed[-3000:]
    cached, total = stage_counts(second)
    assert 0 < total - cached <= total and cached > 0  # that entry again, the rest cached
    assert comparable_report(second, tmp_path / "out2") == comparable_report(first, out1)
    after = all_entries_verify(s3, bucket, PREFIX)  # the bad entry was replaced
    assert set(after) == set(entries) and after[key]["payload"] != manifest["payload"]
    assert all(m == entries[k] for k, m in after.items() if k != key)
    # the output's models are the first run's, byte for byte
    for variant in first["variants"]:
        for model in (out1 / variant).glob("model.*"):
            assert (tmp_path / "out2" / variant / model.name).read_bytes() == model.read_bytes()


@pytest.mark.parametrize("fault", ["missing bucket", "endpoint down"])
def test_a_store_that_refuses_writes_is_exit_2_naming_it(
        recipe: Path, tmp_path: Path, prefect_api_url: str, s3: S3Server, bucket: str,
        fault: str) -> None:
    store = store_url(bucket)
    env = s3_env(tmp_path, prefect_api_url, s3, "a", store)
    if fault == "endpoint down":
        s3.make_bucket(bucket)
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"  # nothing listens
    done = cli_subprocess(["run", recipe, "-o", tmp_path / "out"], env, tmp_path,
                          timeout=RUN_TIMEOUT_S)
    assert done.code is not None, "the run hung"
    message = check_clean_error(done.code, done.err, store)
    assert len(message.strip().splitlines()) == 1, message
    assert "testing" not in message  # the credentials
    assert output_is_whole_or_absent(tmp_path / "out") == "absent"
    if fault == "endpoint down":
        assert objects(s3, bucket) == {}
    else:
        assert bucket not in [b["Name"] for b in client(s3).list_buckets()["Buckets"]]


def test_two_runs_at_once_on_the_bucket(
        recipe: Path, tmp_path: Path, prefect_api_url: str, s3: S3Server,
        bucket: str) -> None:
    s3.make_bucket(bucket)
    runs = [start_cli(["run", recipe, "-o", tmp_path / f"out{i}"],
                      s3_env(tmp_path / f"m{i}", prefect_api_url, s3, "mirror",
                             store_url(bucket)), tmp_path, tmp_path / f"logs{i}")
            for i in range(2)]
    codes = wait_all(runs, RUN_TIMEOUT_S * 2)
    reports = []
    for i, (run, code) in enumerate(zip(runs, codes, strict=True)):
        assert code == 0, f"run {i} exit {code}:\n{run.stderr()[-3000:]}"
        assert "Traceback" not in run.stderr()
        assert "corrupt" not in run.stderr()  # a racing writer is never a bad entry
        out = tmp_path / f"out{i}"
        assert output_is_whole_or_absent(out) == "whole"
        reports.append(json.loads((out / "report.json").read_text()))
    assert reports[0]["selected"] == reports[1]["selected"]
    assert comparable_report(reports[0], tmp_path / "out0") == comparable_report(
        reports[1], tmp_path / "out1")
    entries = all_entries_verify(s3, bucket, PREFIX)
    assert entries
    # every payload folder in the bucket is one a manifest names, or an orphan of the race
    # that nothing points at: never a manifest without its payload
    for key, manifest in entries.items():
        named = f"{PREFIX}/cache/{key[:2]}/{key}/{manifest['payload']}/"
        assert any(name.startswith(named) for name in objects(s3, bucket, named))
