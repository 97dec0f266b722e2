"""The MLflow Model Registry: a run registers its selection as the `candidate` version of the
model named like the recipe, and `orchestrator promote` moves an alias (`production`) to it
only through the gates. MLflow is imported inside functions only, as everywhere in
tracking/, the only package that imports it.

A version's source is the parent run's artifact folder `registered_model/`: per target the
selected variant's files (`<target>/model.pb`, `model.enc`...) and the run's `report.json`,
which is all that `promote` and `gate --baseline registry:NAME@ALIAS` read back.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError
from orchestrator.redaction import redact
from orchestrator.tracking.common import REGISTRY_STATUS_TAG
from orchestrator.tracking.common import open_client as open_tracking

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.tracking import MlflowClient

    from orchestrator.spec.models import Target

CANDIDATE = "candidate"
ARTIFACT_PATH = "registered_model"
# per target on a version: the variant and these of its figures
TARGET_FIGURES = ("accuracy", "accuracy_drop", "fidelity", "size_bytes")
COMPARED = ("accuracy", "fidelity")  # promote: no worse than the current holder of the alias
_MAX_TAG = 8000
# MLflow's rule for aliases: letters, digits, '_' and '-', not `latest` nor `v<number>`
_ALIAS = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


class RegistryError(OrchestratorError):
    """The registry cannot answer: no such model or alias, or tracking is unreachable."""


# --- registration (called by the tracking worker at the end of a run)


def refusal(report: Mapping[str, Any] | None) -> str | None:
    """Why a run's selection cannot be registered (targets without a variant, with their
    variants' violations), or None when every target has one."""
    if report is None:
        return "the run has no report"
    selected = report.get("selected") or {}
    if not selected:
        return "the recipe has no targets, so no variant was selected"
    reasons = []
    for target, chosen in selected.items():
        if chosen is not None:
            continue
        why = "; ".join(
            f"{name}: {', '.join(result['violations']) or 'not selected'}"
            for name, variant in (report.get("variants") or {}).items()
            for result in [(variant.get("targets") or {}).get(target)] if result is not None)
        reasons.append(f"{target}: no variant within budgets ({why or 'no variants'})")
    return "; ".join(reasons) or None


def version_tags(report: Mapping[str, Any], run_id: str, commit: str | None) -> dict[str, str]:
    """Tags of a registered version: the recipe's commit, the data fingerprints, the parent
    run, and per target the variant and its figures."""
    tags = {"recipe": str(report.get("recipe")), "git_commit": commit or "none",
            "run_id": run_id}
    for role, digest in (report.get("data_fingerprints") or {}).items():
        tags[f"data_fingerprint.{role}"] = str(digest)
    for target, name in (report.get("selected") or {}).items():
        variant = report["variants"][name]
        tags[f"{target}.variant"] = name
        figures = {k: variant.get(k) for k in TARGET_FIGURES}
        figures["est_latency_ms"] = ((variant.get("targets") or {}).get(target) or {}).get(
            "est_latency_ms")
        tags.update({f"{target}.{k}": f"{v:g}" if isinstance(v, float) else str(v)
                     for k, v in figures.items() if v is not None})
    return tags


def register(client: MlflowClient, run_id: str, report: Mapping[str, Any] | None,
             out_dir: Path | None, commit: str | None) -> dict[str, Any]:
    """Register the run's selection as the `candidate` version when every target has a
    variant; else record why not on the run (`registry.status`). Returns
    {"registered": {"name", "version", "alias"}} or {"refused": why}."""
    reason = refusal(report)
    if reason is None and (out_dir is None or not (out_dir / "report.json").is_file()):
        reason = "the run wrote no outputs to register"
    if reason is not None:
        client.set_tag(run_id, REGISTRY_STATUS_TAG, f"refused: {reason}"[:_MAX_TAG])
        return {"refused": reason}
    assert report is not None and out_dir is not None
    name = str(report["recipe"])
    with tempfile.TemporaryDirectory(prefix="orchestrator-register-") as tmp:
        folder = Path(tmp) / ARTIFACT_PATH
        folder.mkdir()
        for target, variant in report["selected"].items():
            shutil.copytree(out_dir / variant, folder / target)
        shutil.copyfile(out_dir / "report.json", folder / "report.json")
        client.log_artifacts(run_id, str(folder), ARTIFACT_PATH)
    run = client.get_run(run_id)
    _ensure_registered_model(client, name, report)
    selection = ", ".join(f"{t}: {v}" for t, v in report["selected"].items())
    version = client.create_model_version(
        name, f"{run.info.artifact_uri.rstrip('/')}/{ARTIFACT_PATH}", run_id,
        tags=version_tags(report, run_id, commit),
        description=f"{run.info.run_name}: {selection}", await_creation_for=60)
    client.set_registered_model_alias(name, CANDIDATE, version.version)
    client.set_tag(run_id, REGISTRY_STATUS_TAG,
                   f"registered {name} version {version.version} as {CANDIDATE}")
    return {"registered": {"name": name, "version": str(version.version), "alias": CANDIDATE}}


def _ensure_registered_model(client: MlflowClient, name: str,
                             report: Mapping[str, Any]) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(
            name, tags={"orchestrator.recipe": str(report.get("recipe_path"))},
            description=f"The deployable files of recipe {name}, one folder per target.")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":  # a run before (or beside) this one
            raise


# --- reading the registry (promote, gate)


def open_client(tracking_uri: str) -> MlflowClient:
    """A client of a registry that exists and answers (common.open_client); RegistryError
    (exit 2) otherwise. A local store is never created here."""
    return open_tracking(tracking_uri, RegistryError, lambda database: RegistryError(
        f"no MLflow store at {database}: run the recipe with `register: true` first",
        field="MLFLOW_TRACKING_URI"))


def alias_version(client: MlflowClient, name: str, alias: str,
                  required: bool = True) -> ModelVersion | None:
    """The version `alias` points to; RegistryError (or None when not `required`) when the
    model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise _mlflow_error(exc, client) from None
        raise RegistryError(f"no registered model {name!r} in MLflow at "
                            f"{redact(client.tracking_uri)!r}: run the recipe with "
                            "`register: true` first", field="register") from None
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise _mlflow_error(exc, client) from None
        if not required:
            return None
        hint = (": run the recipe with `register: true` until every budget gate passes"
                if alias == CANDIDATE else "")
        raise RegistryError(f"registered model {name!r} has no {alias!r} alias{hint}",
                            field="register") from None


def _mlflow_error(exc: Exception, client: MlflowClient) -> RegistryError:
    return RegistryError(redact(f"MLflow at {client.tracking_uri!r} failed: {exc}"),
                         field="MLFLOW_TRACKING_URI")


def read_report(client: MlflowClient, version: ModelVersion) -> dict[str, Any]:
    """The report.json a version's folder holds."""
    from mlflow.artifacts import download_artifacts

    with tempfile.TemporaryDirectory(prefix="orchestrator-report-") as tmp:
        try:
            path = download_artifacts(artifact_uri=f"{version.source.rstrip('/')}/report.json",
                                      dst_path=tmp, tracking_uri=client.tracking_uri)
            return json.loads(Path(path).read_text(encoding="utf-8"))
        except Exception as exc:  # noqa: BLE001  (MLflow's, OSError, bad JSON: all say so)
            raise RegistryError(redact(f"cannot read report.json of {version.name} version "
                                       f"{version.version} at {version.source}: {exc}"),
                                field="MLFLOW_TRACKING_URI") from None


def version_report(name: str, alias: str, tracking_uri: str) -> dict[str, Any]:
    """The report.json of the version `alias` points to in registered model `name`;
    RegistryError (exit 2) when the model or the alias does not exist."""
    client = open_client(tracking_uri)
    version = alias_version(client, name, alias)
    assert version is not None
    return read_report(client, version)


# --- promotion


@dataclass
class TargetCheck:
    """One target of a promotion: the candidate's variant, broken gates, regressions."""

    target: str
    variant: str | None
    violations: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    compared: str = ""  # what it was compared with, for the summary

    @property
    def ok(self) -> bool:
        return not self.violations and not self.regressions


@dataclass
class Promotion:
    """The outcome of `promote`: what was checked and whether the alias moved."""

    name: str
    alias: str
    version: str
    previous: str | None  # the version that held the alias before
    checks: list[TargetCheck]
    promoted: bool
    already: bool = False  # the alias already points to the candidate

    @property
    def reasons(self) -> list[str]:
        return [f"{c.target}: {'; '.join([*c.violations, *c.regressions])}"
                for c in self.checks if not c.ok]


def _selected(report: Mapping[str, Any] | None, target: str
              ) -> tuple[str | None, Mapping[str, Any] | None]:
    if report is None:
        return None, None
    name = (report.get("selected") or {}).get(target)
    return name, (report.get("variants") or {}).get(name) if name else None


def gate_check(report: Mapping[str, Any], target: Target, device: Any) -> TargetCheck:
    """The variant a version selected for `target`, checked against the recipe's current
    budgets and device, as report.build_variant checks a fresh run."""
    from orchestrator.measure.estimates import estimate
    from orchestrator.results.report import check_budgets

    name, variant = _selected(report, target.name)
    if variant is None:
        return TargetCheck(target.name, None, ["the version has no variant for this target "
                                               "(the recipe's targets changed: run it again)"])
    variant = {**variant, "ram_bytes": variant.get("ram_bytes", variant["size_bytes"]),
               "ram_source": variant.get("ram_source", "model size")}
    # the report's model: the operators the version's benchmark recorded, priced anew
    made = estimate(variant.get("flops"), device, variant.get("precision") or "float32",
                    variant.get("estimate_basis"))
    # scaled as the run scaled it where the target's board calibrated the device
    factor = ((variant.get("targets") or {}).get(target.name) or {}).get(
        "estimate", {}).get("board_factor")
    if made is not None and isinstance(factor, int | float) and factor > 0:
        made = made.scaled_by_board(factor, target.name)
    est = None if made is None else round(made.latency_ms, 4)
    return TargetCheck(target.name, name, check_budgets(variant, target.budgets, est, device))


def compare(check: TargetCheck, candidate: Mapping[str, Any],
            current: Mapping[str, Any] | None, current_version: str | None,
            tolerance: float) -> None:
    """Add to `check` where the candidate is worse than the current version's variant for
    the same target on accuracy or fidelity by more than `tolerance`."""
    _, new = _selected(candidate, check.target)
    old_name, old = _selected(current, check.target)
    if new is None or old is None:
        check.compared = "" if current is None else f"version {current_version} has no variant"
        return
    shown = []
    for metric in COMPARED:
        value, before = new.get(metric), old.get(metric)
        if value is None or before is None:
            continue
        shown.append(f"{metric} {value:.4f} vs {before:.4f}")
        if before - value > tolerance + 1e-12:
            check.regressions.append(
                f"{metric} {value:.4f} is below version {current_version}'s {before:.4f} "
                f"({old_name}) by {before - value:.4f}, more than the tolerance {tolerance:g}")
    check.compared = f"{', '.join(shown) or 'nothing to compare'} (version {current_version}, " \
                     f"{old_name})"


def alias_problem(alias: str) -> str | None:
    """Why `alias` cannot be promoted to, or None."""
    if alias == CANDIDATE:
        return f"cannot promote to {CANDIDATE!r}: runs set it"
    if not _ALIAS.match(alias) or alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias):
        return (f"invalid alias {alias!r}: letters, digits, '_' and '-', not 'latest' nor "
                "'v<number>'")
    return None


def promote(tracking_uri: str, name: str, targets: list[Target], devices: Mapping[str, Any],
            to: str, tolerance: float) -> Promotion:
    """Move `to` to the `candidate` version when it meets the recipe's current gates for
    every target and is no worse than `to`'s current version on accuracy or fidelity beyond
    `tolerance`. Else change nothing but a tag on the candidate saying why."""
    from mlflow.exceptions import MlflowException

    problem = alias_problem(to)
    if problem:
        raise RegistryError(problem, field="--to")
    client = open_client(tracking_uri)
    candidate = alias_version(client, name, CANDIDATE)
    assert candidate is not None
    current = alias_version(client, name, to, required=False)
    version = str(candidate.version)
    previous = None if current is None else str(current.version)
    try:
        candidate_report = read_report(client, candidate)
        if previous == version:
            return Promotion(name, to, version, previous, [], promoted=False, already=True)
        current_report = None if current is None else read_report(client, current)
        checks = []
        for target in targets:
            check = gate_check(candidate_report, target, devices[target.name])
            compare(check, candidate_report, current_report, previous, tolerance)
            checks.append(check)
        outcome = Promotion(name, to, version, previous, checks,
                            promoted=all(c.ok for c in checks))
        refused_tag = f"promote.{to}.refused"
        if not outcome.promoted:
            client.set_model_version_tag(name, version, refused_tag,
                                         "; ".join(outcome.reasons)[:_MAX_TAG])
            return outcome
        client.set_registered_model_alias(name, to, version)
        client.set_model_version_tag(name, version, f"promote.{to}.previous_version",
                                     previous or "none")
        if refused_tag in (candidate.tags or {}):  # an earlier refusal no longer holds
            client.delete_model_version_tag(name, version, refused_tag)
        return outcome
    except MlflowException as exc:
        raise _mlflow_error(exc, client) from None
