"""The Model Registry with real MLflow (sqlite in a temp project): a run registers its
selection as `candidate` through the tracking worker, or says why not; `orchestrator
promote` moves `production` only through the gates; version_report reads a version back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.project_env import new_mlflow_database
from support.registry_helpers import report, write_outputs, write_project

from orchestrator.cache.project import project_root
from orchestrator.cli.main import main
from orchestrator.engine.node_run import NodeOutcome
from orchestrator.engine.plan import build_plan
from orchestrator.recipe.loading import load_recipe
from orchestrator.tracking.client import TrackingClient
from orchestrator.tracking.registry import (
    CANDIDATE,
    RegistryError,
    TargetCheck,
    alias_problem,
    compare,
    gate_check,
    refusal,
    version_report,
    version_tags,
)


@pytest.fixture
def project_without_mlflow(tmp_path: Path, digits_example: Path,
                           monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose tracking is the default: sqlite in <root>/mlruns (no env var), where
    nothing was tracked yet: no mlruns/."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return write_project(tmp_path / "models", digits_example)


@pytest.fixture
def project(project_without_mlflow: Path, mlflow_template: Path) -> Path:
    """The same, its MLflow database made (empty), as the first run in it would make it."""
    new_mlflow_database(mlflow_template, project_root(project_without_mlflow) / "mlruns")
    return project_without_mlflow


def mlflow_client(recipe: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{project_root(recipe) / 'mlruns' / 'mlflow.db'}")


def tracked_run(recipe: Path, run_report: dict[str, Any], out_dir: Path,
                register: bool = True) -> tuple[dict[str, Any], str]:
    """One run as the flow drives the tracking worker: start, a hook per node, finish."""
    loaded = load_recipe(recipe)
    plan = build_plan(loaded, None, run_report["data_fingerprints"])
    client = TrackingClient(root=project_root(recipe))
    client.start(plan, {"orchestrator": "test"})
    for node in plan.nodes:
        client.on_node_end(NodeOutcome(node, False, 0.01, metrics={"quantized_ops": 12.0}))
    written = write_outputs(out_dir, {**run_report, "mlflow_run_id": client.run_id,
                                      "recipe_path": str(recipe)})
    outcome = client.finish(written, out_dir, recipe, register=register)
    return outcome, client.run_id


# --- pure parts: no MLflow


def test_refusal_names_each_target_without_a_variant_and_the_violations() -> None:
    assert refusal(report()) is None
    failing = report(int8_accuracy=0.95)  # a 4-point drop: no variant for the phone
    reason = refusal(failing)
    assert failing["selected"] == {"phone": None, "pi": "fp32"}  # fp32 fits the Pi
    assert reason is not None and reason.startswith("phone: no variant within budgets (")
    assert "fp32: size 1.027 MiB > max_size_mb 1.0" in reason
    assert "int8: accuracy drop 0.0433 > max_accuracy_drop 0.01" in reason
    assert "pi:" not in reason
    assert refusal({**report(), "selected": {}}) == (
        "the recipe has no targets, so no variant was selected")


def test_version_tags_carry_commit_fingerprints_run_and_each_targets_figures() -> None:
    tags = version_tags(report(), "run123", "0123456789abcdef-dirty")
    assert tags["git_commit"] == "0123456789abcdef-dirty"
    assert tags["run_id"] == "run123"
    assert tags["data_fingerprint.representative"] == "a1" * 32
    assert tags["phone.variant"] == "int8" and tags["pi.variant"] == "int8"
    assert tags["phone.size_bytes"] == "283539"
    assert tags["phone.est_latency_ms"] == "0.0296" and tags["pi.est_latency_ms"] == "0.1184"
    assert {"phone.accuracy", "phone.accuracy_drop", "phone.fidelity"} <= set(tags)
    without = version_tags({k: v for k, v in report().items() if k != "data_fingerprints"},
                           "run123", None)
    assert without["git_commit"] == "none"
    assert not any(k.startswith("data_fingerprint") for k in without)


def test_gate_check_uses_the_recipes_current_budgets_and_device(project: Path) -> None:
    from orchestrator.spec.devices import resolve_device

    run_report = report()
    loaded = load_recipe(project)
    phone = loaded.recipe.targets[0]
    assert gate_check(run_report, phone, resolve_device(phone.device)).violations == []
    tight = load_recipe(project, ["targets.0.budgets.max_size_mb=0.25"]).recipe.targets[0]
    check = gate_check(run_report, tight, resolve_device(tight.device))
    assert check.variant == "int8"
    assert check.violations == ["size 0.270 MiB > max_size_mb 0.25 MiB"]
    # a slower device: the latency estimate is recomputed from the variant's FLOPs
    slow = load_recipe(project, ["targets.0.device=raspberry-pi-3",
                                 "targets.0.budgets.max_latency_ms=0.1"]).recipe.targets[0]
    check = gate_check(run_report, slow, resolve_device(slow.device))
    assert check.violations == ["estimated latency 118 µs > max_latency_ms 0.1 ms"]


def test_compare_flags_only_drops_beyond_the_tolerance() -> None:
    current = report(int8_accuracy=0.9933, int8_fidelity=1.0)
    slightly = TargetCheck("phone", "int8")
    compare(slightly, report(int8_accuracy=0.99, int8_fidelity=0.997), current, "1", 0.005)
    assert slightly.regressions == []
    assert slightly.compared == ("accuracy 0.9900 vs 0.9933, fidelity 0.9970 vs 1.0000 "
                                 "(version 1, int8)")
    worse = TargetCheck("phone", "int8")
    compare(worse, report(int8_accuracy=0.985, int8_fidelity=0.99), current, "1", 0.005)
    assert worse.regressions == [
        "accuracy 0.9850 is below version 1's 0.9933 (int8) by 0.0083, more than the "
        "tolerance 0.005",
        "fidelity 0.9900 is below version 1's 1.0000 (int8) by 0.0100, more than the "
        "tolerance 0.005"]
    exact = TargetCheck("phone", "int8")  # exactly the tolerance is not beyond it
    compare(exact, report(int8_accuracy=0.9883), current, "1", 0.005)
    assert exact.regressions == []
    first = TargetCheck("phone", "int8")
    compare(first, report(), None, None, 0.005)
    assert first.regressions == [] and first.compared == ""


def test_alias_problems() -> None:
    assert alias_problem("production") is None
    assert alias_problem("staging-2") is None
    assert "runs set it" in (alias_problem(CANDIDATE) or "")
    for bad in ("latest", "v3", "two words", ""):
        assert alias_problem(bad) is not None, bad


# --- with MLflow: the tracking worker registers


def test_a_run_where_every_gate_passes_registers_a_candidate(project: Path,
                                                             tmp_path: Path) -> None:
    outcome, run_id = tracked_run(project, report(), tmp_path / "out")
    assert outcome == {"registered": {"name": "digits-test", "version": "1",
                                      "alias": CANDIDATE}}
    client = mlflow_client(project)
    version = client.get_model_version_by_alias("digits-test", CANDIDATE)
    assert str(version.version) == "1" and version.run_id == run_id
    assert version.tags["run_id"] == run_id
    assert version.tags["git_commit"] == "none"  # the project is not in git
    assert version.tags["data_fingerprint.evaluation"] == "b2" * 32
    assert version.tags["phone.variant"] == "int8"
    assert float(version.tags["pi.accuracy"]) == pytest.approx(0.9933)
    parent = client.get_run(run_id)
    assert version.description == f"{parent.info.run_name}: phone: int8, pi: int8"
    assert parent.data.tags["registry.status"] == (
        f"registered digits-test version 1 as {CANDIDATE}")
    # the version's folder: per target the selected variant's files, and report.json
    assert version.source.startswith((project.parents[1] / "mlruns" / "artifacts").as_uri())
    folder = Path(version.source.removeprefix("file://"))
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == ["phone/model.pb", "phone/ops/ops_to_register.h", "phone/signature.json",
                     "pi/model.pb", "pi/ops/ops_to_register.h", "pi/signature.json",
                     "report.json"]
    assert (folder / "phone" / "model.pb").read_bytes() == (
        tmp_path / "out" / "int8" / "model.pb").read_bytes()
    assert version_report("digits-test", CANDIDATE, client.tracking_uri) == json.loads(
        (tmp_path / "out" / "report.json").read_text())


def test_a_failing_gate_registers_nothing_and_says_why(project: Path, tmp_path: Path) -> None:
    outcome, run_id = tracked_run(project, report(int8_accuracy=0.95), tmp_path / "out")
    assert set(outcome) == {"refused"}
    assert outcome["refused"].startswith("phone: no variant within budgets (fp32: size")
    client = mlflow_client(project)
    assert client.search_registered_models() == []
    assert client.get_run(run_id).data.tags["registry.status"] == (
        f"refused: {outcome['refused']}")


def test_without_register_the_registry_is_not_touched(project: Path, tmp_path: Path) -> None:
    outcome, run_id = tracked_run(project, report(), tmp_path / "out", register=False)
    assert outcome == {}
    client = mlflow_client(project)
    assert client.search_registered_models() == []
    assert "registry.status" not in client.get_run(run_id).data.tags
    assert "registered_model" not in {a.path for a in client.list_artifacts(run_id)}


# --- promote and version_report


def test_promote_moves_production_and_keeps_it_from_a_worse_candidate(
        project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tracked_run(project, report(), tmp_path / "v1")
    assert main(["promote", str(project), "--to", "production"]) == 0
    out = capsys.readouterr().out
    assert "digits-test version 1 (candidate) against no production version yet" in out
    assert "  phone: int8: meets its budgets" in out
    assert "promoted digits-test version 1 to production (the first)" in out
    client = mlflow_client(project)
    assert client.get_model_version_by_alias("digits-test", "production").version == 1
    assert client.get_model_version("digits-test", "1").tags[
        "promote.production.previous_version"] == "none"
    assert main(["promote", str(project), "--to", "production"]) == 0  # nothing to do
    assert "already production: nothing to do" in capsys.readouterr().out

    # version 2 passes its budgets but is 0.83 points less accurate than production
    outcome, _ = tracked_run(project, report(int8_accuracy=0.985, int8_fidelity=0.99),
                             tmp_path / "v2")
    assert outcome["registered"]["version"] == "2"
    assert main(["promote", str(project), "--to", "production"]) == 1
    shown = capsys.readouterr()
    assert "against production version 1" in shown.out
    assert ("worse: accuracy 0.9850 is below version 1's 0.9933 (int8) by 0.0083, more than "
            "the tolerance 0.005") in shown.out
    assert "refused: digits-test version 2 was not promoted (production stays version 1)" in (
        shown.err)
    assert client.get_model_version_by_alias("digits-test", "production").version == 1
    refused = client.get_model_version("digits-test", "2").tags["promote.production.refused"]
    assert refused.startswith("phone: accuracy 0.9850 is below version 1's 0.9933")
    assert "pi: accuracy 0.9850" in refused

    # a looser tolerance lets it through; the refusal no longer holds and goes
    assert main(["promote", str(project), "--to", "production", "--tolerance", "0.01"]) == 0
    assert "promoted digits-test version 2 to production (was version 1)" in (
        capsys.readouterr().out)
    tags = client.get_model_version("digits-test", "2").tags
    assert tags["promote.production.previous_version"] == "1"
    assert "promote.production.refused" not in tags


def test_promote_refuses_a_candidate_that_a_tightened_budget_breaks(
        project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tracked_run(project, report(), tmp_path / "v1")
    code = main(["promote", str(project), "--to", "production",
                 "--set", "targets.0.budgets.max_size_mb=0.25"])
    shown = capsys.readouterr()
    assert code == 1
    assert "  phone: int8: size 0.270 MiB > max_size_mb 0.25" in shown.out
    assert "  pi: int8: meets its budgets" in shown.out
    assert "no version is production" in shown.err
    client = mlflow_client(project)
    registered = client.get_registered_model("digits-test")
    assert "production" not in registered.aliases
    assert client.get_model_version("digits-test", "1").tags[
        "promote.production.refused"] == "phone: size 0.270 MiB > max_size_mb 0.25 MiB"


def test_promote_without_a_candidate_is_exit_2(
        project_without_mlflow: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    project = project_without_mlflow
    mlruns = project.parents[1] / "mlruns"
    # no MLflow store at all: said so, and none is created
    assert main(["promote", str(project), "--to", "production"]) == 2
    err = capsys.readouterr().err
    assert f"no MLflow store at {mlruns / 'mlflow.db'}: run the recipe with `register: true`" \
        in err
    assert not mlruns.exists()
    # runs, but none registered: no registered model
    tracked_run(project, report(int8_accuracy=0.95), tmp_path / "out")
    assert main(["promote", str(project), "--to", "production"]) == 2
    assert "no registered model 'digits-test'" in capsys.readouterr().err
    # a registered model without the alias
    client = mlflow_client(project)
    client.create_registered_model("digits-test")
    assert main(["promote", str(project), "--to", "production"]) == 2
    assert ("registered model 'digits-test' has no 'candidate' alias: run the recipe with "
            "`register: true` until every budget gate passes") in capsys.readouterr().err
    with pytest.raises(RegistryError, match="has no 'production' alias") as caught:
        version_report("digits-test", "production", client.tracking_uri)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(("args", "message"), [
    (["--to", "candidate"], "cannot promote to 'candidate'"),
    (["--to", "v2"], "invalid alias 'v2'"),
    (["--to", "production", "--set", "targets.0.budgets.max_size_mb=-1"], "max_size_mb"),
])
def test_promote_bad_input_is_exit_2(project: Path, tmp_path: Path, args: list[str],
                                     message: str, capsys: pytest.CaptureFixture[str]) -> None:
    tracked_run(project, report(), tmp_path / "out")
    assert main(["promote", str(project), *args]) == 2
    assert message in capsys.readouterr().err
    assert "production" not in mlflow_client(project).get_registered_model(
        "digits-test").aliases


def test_promote_with_an_unreachable_tracking_server_is_exit_2(
        project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:pa55@127.0.0.1:{port}")
    assert main(["promote", str(project), "--to", "production"]) == 2
    err = capsys.readouterr().err
    assert f"MLflow tracking at 'http://***@127.0.0.1:{port}' is unreachable" in err
    assert "pa55" not in err
