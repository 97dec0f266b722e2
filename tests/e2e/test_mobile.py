"""The digits recipe's mobile pipeline end to end (int8 -> memmap -> encrypt -> measured),
and the key: it never appears in any artifact, log, report or MLflow param; without a
valid key the run stops at exit 2 with nothing written."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from orchestrator import load_encrypted
from orchestrator.cli.main import main
from orchestrator.model import kinds
from orchestrator.model.keys import key_id

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def copy_recipe(workspace: Path) -> Path:
    recipe = workspace / "recipes" / "digits.yaml"
    recipe.parent.mkdir()
    shutil.copy(ROOT / "recipes" / "digits.yaml", recipe)
    (workspace / "examples").symlink_to(ROOT / "examples")
    return recipe


def key_forms(key: bytes) -> list[bytes]:
    b64 = base64.b64encode(key)
    return [key, b64, b64.rstrip(b"="), base64.urlsafe_b64encode(key).rstrip(b"="),
            key.hex().encode(), key.hex().upper().encode()]


def test_mobile_pipeline_and_the_key_never_leaks(digits_example: Path, workspace: Path,
                                                 prefect_server: None,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    key = os.urandom(32)
    monkeypatch.setenv("ORCHESTRATOR_MODEL_KEY", base64.b64encode(key).decode())
    recipe = copy_recipe(workspace)
    out = workspace / "out"
    code = main(["run", str(recipe), "-o", str(out), "--variant", "int8", "--variant",
                 "mobile"])
    shown = capsys.readouterr()
    assert code in (0, 1), shown.err
    report = json.loads((out / "report.json").read_text())
    mobile = report["variants"]["mobile"]
    assert mobile["artifact"] == "mobile/model.enc" and mobile["kind"] == "encrypted"
    assert mobile["size_bytes"] == (out / "mobile" / "model.enc").stat().st_size
    assert mobile["encryption"]["key_id"] == key_id(key)
    assert mobile["encryption"]["key_source"] == "environment variable ORCHESTRATOR_MODEL_KEY"
    assert f"key id {key_id(key)} from environment variable ORCHESTRATOR_MODEL_KEY" in \
        shown.out.replace("\n", " ")
    memmap = mobile["memmap"]
    for field in ("load_ms", "rss_growth_mb", "frozen_load_ms", "frozen_rss_growth_mb"):
        assert isinstance(memmap[field], float)
    assert memmap["converted_nodes"] >= 1 and memmap["outputs_identical"] is True
    assert mobile["fidelity"] == 1.0 and mobile["accuracy"] == report["variants"]["int8"][
        "accuracy"]
    assert mobile["latency_ms"]["count"] > 0 and mobile["flops"] > 0
    # the shipped file runs through load_encrypted, like the int8 model it came from
    data = np.load(ROOT / "examples" / "digits" / "data.npz")
    x = data["x_test"][:32]
    from orchestrator.measure.tf_runtime import predict

    int8 = kinds.load((out / "int8" / "model.pb").read_bytes(),
                      (out / "int8" / "signature.json").read_text())
    model = load_encrypted(out / "mobile" / "model.enc", key=key)
    assert np.array_equal(predict(model, x), predict(int8, x))

    # ops_to_register.h names exactly the op types of the graph the app loads: the
    # package's own, ImmutableConst included (decrypted in memory to read it)
    from orchestrator.model.encryption import decrypt
    from orchestrator.model.memmap_format import read_package

    _, package = decrypt((out / "mobile" / "model.enc").read_bytes(), key)
    shipped_ops = {node.op for node in read_package(package).graph_def.node}
    header = (out / "mobile" / "ops_to_register.h").read_text()
    body = header.split("ShouldRegisterOp(const char op[]) {", 1)[1].split("}", 1)[0]
    assert "ImmutableConst" in shipped_ops
    assert set(re.findall(r'isequal\(op, "([^"]+)"\)', body)) == shipped_ops

    # the key, in any form, in no file of the run: outputs, cache, MLflow db and artifacts
    forms = key_forms(key)
    files = [p for p in workspace.rglob("*") if p.is_file() and not p.is_symlink()
             and "examples" not in p.relative_to(workspace).parts]
    assert any(p.name == "mlflow.db" for p in files) and any(p.suffix == ".enc" for p in files)
    for path in files:
        blob = path.read_bytes()
        assert not [f for f in forms if f in blob], path
    for form in forms:
        assert form.decode("latin-1") not in shown.out + shown.err
    from mlflow.tracking import MlflowClient

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    parent = client.get_run(report["mlflow_run_id"])
    runs = [parent, *client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")]
    for run in runs:
        text = json.dumps([run.data.params, run.data.tags]).encode()
        assert not [f for f in forms if f in text]
    names = {run.info.run_name for run in runs}
    assert "mobile" in names
    mobile_run = next(r for r in runs if r.info.run_name == "mobile")
    assert "model/model.enc" in [a.path for a in client.list_artifacts(mobile_run.info.run_id,
                                                                        "model")]


@pytest.mark.parametrize("value", [None, "c2hvcnQ=", "not-a-key!"], ids=["missing", "short",
                                                                        "not-base64"])
def test_without_a_valid_key_nothing_is_written(value: str | None, digits_example: Path,
                                                workspace: Path, prefect_server: None,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    if value is None:
        monkeypatch.delenv("ORCHESTRATOR_MODEL_KEY", raising=False)
    else:
        monkeypatch.setenv("ORCHESTRATOR_MODEL_KEY", value)
    recipe = copy_recipe(workspace)
    code = main(["run", str(recipe), "-o", str(workspace / "out"), "--variant", "mobile"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"{recipe}:" in err and "pipelines.mobile.stages.1" in err
    assert ("no model key" if value is None else "ORCHESTRATOR_MODEL_KEY") in err
    if value is not None:
        assert value not in err
    assert not (workspace / "out").exists()
    assert not (workspace / ".orchestrator" / "cache").exists()
