"""Issue 19, the store on an object store (ORCHESTRATOR_HOME=s3://bucket/prefix) under
faults, end to end: the real CLI in subprocesses against moto's standalone S3 server on
loopback. Each run has its own local mirror (XDG_CACHE_HOME), as a run on another machine
would: what it reads comes from the bucket, verified.

- the digits recipe runs on the bucket, and a re-run is fully cached;
- a truncated object in the bucket: the re-run recomputes that entry (warning naming it),
  the report is the same, and every entry in the bucket verifies afterwards;
- a bucket that refuses writes (missing) or an endpoint that is down: exit 2, one line
  naming the store, no traceback, nothing written;
- two runs at once on the same bucket: both exit 0 with the same report and selections,
  and every entry verifies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from robust_helpers import (
    RECIPES,
    RUN_TIMEOUT_S,
    base_env,
    check_clean_error,
    cli_subprocess,
    comparable_report,
    output_is_whole_or_absent,
    start_cli,
    wait_all,
)
from s3_entries import all_entries_verify, client, objects
from s3_server import S3Server, free_port, s3_server_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.servers]

BUCKET, PREFIX = "team-store", "orchestrator/home"
STORE_URL = f"s3://{BUCKET}/{PREFIX}"


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with s3_server_or_skip() as server:
        yield server


def s3_env(tmp_path: Path, prefect_api_url: str, s3: S3Server, machine: str,
           store: str = STORE_URL) -> dict[str, str]:
    """A run's environment: the store on the bucket, MLflow in its own sqlite under tmp,
    and a local mirror of its own (`machine`)."""
    (tmp_path / "mlruns").mkdir(parents=True, exist_ok=True)
    env = base_env(Path("unused"), f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}",
                   prefect_api_url, XDG_CACHE_HOME=str(tmp_path / machine / "cache"),
                   **s3.env())
    env["ORCHESTRATOR_HOME"] = store
    return env


def run_digits(tmp_path: Path, env: dict[str, str], out: str) -> tuple[dict[str, Any], str]:
    done = cli_subprocess(["run", RECIPES / "digits.yaml", "-o", tmp_path / out], env,
                          tmp_path, timeout=RUN_TIMEOUT_S * 2)
    assert done.code == 0, f"exit {done.code}:\n{done.err[-4000:]}"
    assert "Traceback" not in done.err, done.err[-4000:]
    assert STORE_URL in done.out  # "store: s3://..." in the closing lines
    return json.loads((tmp_path / out / "report.json").read_text()), done.out + done.err


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
        digits_example: Path, tmp_path: Path, prefect_api_url: str, s3: S3Server) -> None:
    s3.make_bucket(BUCKET)
    first, _ = run_digits(tmp_path, s3_env(tmp_path, prefect_api_url, s3, "a"), "out1")
    assert stage_counts(first)[0] == 0
    entries = all_entries_verify(s3, BUCKET, PREFIX)
    assert len(entries) >= stage_counts(first)[1] // 2  # stages and the source model
    assert not (tmp_path / ".orchestrator" / "cache").exists()  # nothing local but a mirror
    # another machine: everything from the bucket, nothing computed
    second, printed = run_digits(tmp_path, s3_env(tmp_path, prefect_api_url, s3, "b"), "out2")
    cached, total = stage_counts(second)
    assert cached == total > 0
    columns = cached_columns(printed, second)
    assert set(columns) == set(second["variants"]), printed[-3000:]
    for name, variant in second["variants"].items():
        assert columns[name] == f"{len(variant['stages'])}/{len(variant['stages'])}"
    assert comparable_report(second, tmp_path / "out2") == comparable_report(
        first, tmp_path / "out1")
    assert all_entries_verify(s3, BUCKET, PREFIX) == entries  # nothing rewritten


def test_a_truncated_object_is_recomputed_never_served(
        digits_example: Path, tmp_path: Path, prefect_api_url: str, s3: S3Server) -> None:
    s3.make_bucket(BUCKET)
    first, _ = run_digits(tmp_path, s3_env(tmp_path, prefect_api_url, s3, "a"), "out1")
    entries = all_entries_verify(s3, BUCKET, PREFIX)
    # truncate the model of one stage's entry (not the source model's)
    source_models = {k for k, m in entries.items() if set(m["files"]) == {
        "model.pb", "signature.json", "result.json"}}
    key, manifest = next((k, m) for k, m in sorted(entries.items())
                         if "model.pb" in m["files"] and k not in source_models)
    name = f"{PREFIX}/cache/{key[:2]}/{key}/{manifest['payload']}/model.pb"
    s3c = client(s3)
    data = s3c.get_object(Bucket=BUCKET, Key=name)["Body"].read()
    s3c.put_object(Bucket=BUCKET, Key=name, Body=data[: len(data) // 3])

    second, printed = run_digits(tmp_path, s3_env(tmp_path, prefect_api_url, s3, "b"), "out2")
    warnings = [line for line in printed.splitlines() if key in line and "corrupt" in line]
    assert warnings and STORE_URL in warnings[0], printed[-3000:]
    cached, total = stage_counts(second)
    assert 0 < total - cached <= total and cached > 0  # that entry again, the rest cached
    assert comparable_report(second, tmp_path / "out2") == comparable_report(
        first, tmp_path / "out1")
    after = all_entries_verify(s3, BUCKET, PREFIX)  # the bad entry was replaced
    assert set(after) == set(entries) and after[key]["payload"] != manifest["payload"]
    assert all(m == entries[k] for k, m in after.items() if k != key)
    # the output's models are the first run's, byte for byte
    for variant in first["variants"]:
        for model in (tmp_path / "out1" / variant).glob("model.*"):
            assert (tmp_path / "out2" / variant / model.name).read_bytes() == model.read_bytes()


@pytest.mark.parametrize("fault", ["missing bucket", "endpoint down"])
def test_a_store_that_refuses_writes_is_exit_2_naming_it(
        digits_example: Path, tmp_path: Path, prefect_api_url: str, s3: S3Server,
        fault: str) -> None:
    env = s3_env(tmp_path, prefect_api_url, s3, "a")
    if fault == "endpoint down":
        s3.make_bucket(BUCKET)
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"  # nothing listens
    done = cli_subprocess(["run", RECIPES / "digits.yaml", "-o", tmp_path / "out"], env,
                          tmp_path, timeout=RUN_TIMEOUT_S)
    assert done.code is not None, "the run hung"
    message = check_clean_error(done.code, done.err, STORE_URL)
    assert len(message.strip().splitlines()) == 1, message
    assert "testing" not in message  # the credentials
    assert output_is_whole_or_absent(tmp_path / "out") == "absent"
    if fault == "endpoint down":
        assert objects(s3, BUCKET) == {}
    else:
        assert BUCKET not in [b["Name"] for b in client(s3).list_buckets()["Buckets"]]


def test_two_runs_at_once_on_the_bucket(
        digits_example: Path, tmp_path: Path, prefect_api_url: str, s3: S3Server) -> None:
    s3.make_bucket(BUCKET)
    runs = [start_cli(["run", RECIPES / "digits.yaml", "-o", tmp_path / f"out{i}"],
                      s3_env(tmp_path / f"m{i}", prefect_api_url, s3, "mirror"), tmp_path,
                      tmp_path / f"logs{i}") for i in range(2)]
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
    entries = all_entries_verify(s3, BUCKET, PREFIX)
    assert entries
    # every payload folder in the bucket is one a manifest names, or an orphan of the race
    # that nothing points at: never a manifest without its payload
    for key, manifest in entries.items():
        named = f"{PREFIX}/cache/{key[:2]}/{key}/{manifest['payload']}/"
        assert any(name.startswith(named) for name in objects(s3, BUCKET, named))
