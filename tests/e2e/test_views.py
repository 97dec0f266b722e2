"""ops_header and graph_view in a real run: their files land next to the model in -o DIR and
in the pipeline's MLflow run, the TensorBoard log dir included."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from orchestrator.cli.main import main

RECIPE = Path(__file__).resolve().parents[1] / "fixtures" / "recipes" / "views.yaml"

pytestmark = pytest.mark.slow

FILES = {"ops_to_register.h", "ops.json", "ops.txt", "ops_list.json", "graph.dot",
         "graph_nodes.dot", "tensorboard/events.out.tfevents.0.orchestrator"}
SVGS = {"graph.svg", "graph_nodes.svg"}


def test_stage_files_reach_the_output_folder_and_mlflow(digits_example: Path, workspace: Path,
                                                        prefect_server: None) -> None:
    from mlflow.tracking import MlflowClient
    from tensorflow.core.framework import graph_pb2

    assert main(["run", str(RECIPE), "-o", str(workspace / "out")]) == 0
    folder = workspace / "out" / "fp32"
    expected = FILES | (SVGS if shutil.which("dot") else set())
    written = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert written == expected | {"model.pb", "signature.json"}

    graph = graph_pb2.GraphDef.FromString((folder / "model.pb").read_bytes())
    header = (folder / "ops_to_register.h").read_text()
    assert set(re.findall(r'isequal\(op, "([^"]+)"\)', header)) == {n.op for n in graph.node}

    report = json.loads((workspace / "out" / "report.json").read_text())
    fp32 = report["variants"]["fp32"]
    assert [s["name"] for s in fp32["stages"]][-2:] == ["ops_header", "graph_view"]
    if not shutil.which("dot"):
        assert any("apt-get install graphviz" in w for w in fp32["warnings"])

    client = MlflowClient(f"sqlite:///{workspace / 'mlruns' / 'mlflow.db'}")
    parent = client.get_run(report["mlflow_run_id"])
    (run,) = client.search_runs([parent.info.experiment_id],
                                f"tags.mlflow.parentRunId = '{parent.info.run_id}'")

    def artifacts(path: str) -> set[str]:
        found = set()
        for item in client.list_artifacts(run.info.run_id, path):
            found |= artifacts(item.path) if item.is_dir else {item.path}
        return found

    assert artifacts("model") == {f"model/{name}" for name in expected} | {
        "model/model.pb", "model/signature.json"}
    assert run.data.metrics["ops_header.op_types"] == len({n.op for n in graph.node})
