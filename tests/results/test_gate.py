"""`orchestrator gate`: the comparisons on report dicts, the exit-2 cases, and the gate on
real runs of the digits recipe (a change that breaks a limit, and one that does not)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from support.project_env import in_project

from orchestrator.cli.main import main
from orchestrator.errors import OrchestratorError
from orchestrator.results.gate import Limits, check_report, compare, parse_registry_ref, to_markdown

ROOT = Path(__file__).resolve().parents[2]


def variant(size: int = 280_000, accuracy: float | None = 0.99, fidelity: float | None = 1.0,
            p50: float | None = 0.5, est: dict[str, float | None] | None = None
            ) -> dict[str, Any]:
    """One variant as report.json holds it (the fields the gate reads, and a few more)."""
    est = {"phone": 0.03, "pi": 0.12} if est is None else est
    return {"artifact": "int8/model.pb", "size_bytes": size, "gzip_size_bytes": size // 2,
            "accuracy": accuracy, "fidelity": fidelity,
            "latency_ms": None if p50 is None else {"count": 50, "p50": p50, "mean": p50},
            "targets": {t: {"device": "phone-2016", "est_latency_ms": v, "budgets_ok": True,
                            "violations": []} for t, v in est.items()}}


def report(**variants: dict[str, Any]) -> dict[str, Any]:
    return {"recipe": "digits-cnn", "mlflow_run_id": "abc",
            "variants": variants or {"int8": variant()},
            "selected": {"phone": "int8", "pi": "int8"}}


def statuses(result: Any) -> dict[tuple[str, str], str]:
    return {(r.variant, r.metric): r.status for r in result.rows}


# ---- comparisons ---------------------------------------------------------------------

def test_identical_reports_pass_every_figure() -> None:
    result = compare(report(), report(), Limits())
    assert result.passed
    assert set(statuses(result).values()) == {"ok"}
    # per variant: size, accuracy, fidelity, measured p50, and one estimate per target
    assert [r.metric for r in result.rows] == [
        "size", "accuracy", "fidelity", "host p50 (measured)", "phone latency (est.)",
        "pi latency (est.)"]


def test_size_growth_limit_is_inclusive_and_can_be_disabled() -> None:
    base = report(int8=variant(size=100_000))
    assert compare(report(int8=variant(size=110_000)), base, Limits()).passed  # +10.0 %
    grown = report(int8=variant(size=110_001))
    result = compare(grown, base, Limits())
    assert [(r.variant, r.metric) for r in result.broken] == [("int8", "size")]
    assert "+10.0 %" in result.broken[0].reason and "limit of +10 %" in result.broken[0].reason
    assert compare(grown, base, Limits(max_size_growth_pct=None)).passed
    assert compare(grown, base, Limits(max_size_growth_pct=20)).passed
    # shrinking is always fine
    assert compare(report(int8=variant(size=1)), base, Limits()).passed


def test_accuracy_and_fidelity_drops() -> None:
    base = report(int8=variant(accuracy=0.99, fidelity=1.0))
    assert compare(report(int8=variant(accuracy=0.98, fidelity=0.99)), base, Limits()).passed
    worse = report(int8=variant(accuracy=0.9766, fidelity=0.95))
    result = compare(worse, base, Limits())
    assert {r.metric for r in result.broken} == {"accuracy", "fidelity"}
    accuracy = next(r for r in result.broken if r.metric == "accuracy")
    assert "dropped 0.0134" in accuracy.reason and "0.9900 -> 0.9766" in accuracy.reason
    only_fidelity = compare(worse, base, Limits(max_accuracy_drop=0.05))
    assert [r.metric for r in only_fidelity.broken] == ["fidelity"]
    assert compare(worse, base, Limits(max_accuracy_drop=None, max_fidelity_drop=None)).passed
    # better is fine, however much
    assert compare(base, worse, Limits()).passed


def test_measured_latency_growth_needs_more_than_timer_noise() -> None:
    base = report(int8=variant(p50=0.5))
    noisy = report(int8=variant(p50=1.2))  # +140 %, but 0.7 ms: under the 1 ms noise floor
    assert compare(noisy, base, Limits()).passed
    result = compare(noisy, base, Limits(min_latency_change_ms=0))
    assert [r.metric for r in result.broken] == ["host p50 (measured)"]
    assert "measured latency (host p50) grew +140.0 %" in result.broken[0].reason
    slow = report(int8=variant(p50=2.0))  # +300 %, 1.5 ms
    assert [r.metric for r in compare(slow, base, Limits()).broken] == ["host p50 (measured)"]
    assert compare(slow, base, Limits(max_latency_growth_pct=None)).passed


def test_estimated_latency_is_compared_per_target() -> None:
    base = report(int8=variant(est={"phone": 0.03, "pi": 0.12}))
    new = report(int8=variant(est={"phone": 0.03, "pi": 0.2}))
    result = compare(new, base, Limits())
    assert [r.metric for r in result.broken] == ["pi latency (est.)"]
    assert "estimated latency on pi (phone-2016) grew +66.7 %" in result.broken[0].reason
    assert compare(new, base, Limits(max_latency_growth_pct=70)).passed


def test_a_figure_the_change_stops_measuring_breaks_its_limit() -> None:
    base = report()
    unmeasured = report(int8=variant(accuracy=None, p50=None))
    result = compare(unmeasured, base, Limits())
    assert {r.metric for r in result.broken} == {"accuracy", "host p50 (measured)"}
    assert all("not measured in this run" in r.reason for r in result.broken)
    assert compare(unmeasured, base, Limits(max_accuracy_drop=None,
                                            max_latency_growth_pct=None)).passed
    # nothing to compare with: not applicable, not broken
    result = compare(base, unmeasured, Limits())
    assert result.passed
    assert statuses(result)[("int8", "accuracy")] == "n/a"


def test_each_row_has_a_change_a_status_and_when_broken_why() -> None:
    """Growth, drop and a figure no longer measured settle their rows by one rule:
    "broken" with the reason, else "ok", "-" without a limit, "n/a" with nothing to
    compare."""
    base = report(int8=variant(size=100_000, accuracy=0.99))
    new = report(int8=variant(size=120_000, accuracy=0.97, p50=None))
    rows = [(r.metric, r.status, r.change, r.reason) for r in compare(new, base, Limits()).rows]
    assert rows == [
        ("size", "broken", "+20.0 %", "size (shipped file) grew +20.0 % (0.0954 MiB -> "
         "0.114 MiB), over the limit of +10 %"),
        ("accuracy", "broken", "-0.0200", "accuracy dropped 0.0200 (0.9900 -> 0.9700), over "
         "the limit of 0.01"),
        ("fidelity", "ok", "+0.0000", ""),
        ("host p50 (measured)", "broken", "-", "measured latency (host p50) is not measured "
         "in this run (the baseline has 500 µs): keep the stage that measures it"),
        ("phone latency (est.)", "ok", "+0.0 %", ""), ("pi latency (est.)", "ok", "+0.0 %", "")]
    off = Limits(max_size_growth_pct=None, max_accuracy_drop=None, max_fidelity_drop=None,
                 max_latency_growth_pct=None)
    assert [(r.status, r.reason) for r in compare(new, base, off).rows] == [
        ("-", ""), ("-", ""), ("-", ""), ("n/a", ""), ("-", ""), ("-", "")]


def test_new_target_and_dropped_variant_are_noted_not_failed() -> None:
    base = report(int8=variant(est={"phone": 0.03}), fp32=variant(size=1_000_000))
    new = report(int8=variant(est={"phone": 0.03, "watch": 0.5}))
    result = compare(new, base, Limits())
    assert result.passed
    assert statuses(result)[("int8", "watch latency (est.)")] == "n/a"
    assert any("not in this run, not compared: fp32" in n for n in result.notes)


def test_a_baseline_lacking_a_variant_is_bad_input() -> None:
    with pytest.raises(OrchestratorError, match=r"lacks variant 'fp32' of pr\.json.*"
                                                r"the baseline has int8") as info:
        compare(report(int8=variant(), fp32=variant()), report(), Limits(), "pr.json",
                "base.json")
    assert info.value.exit_code == 2


def test_compare_leaves_its_inputs_alone() -> None:
    new, base = report(int8=variant(accuracy=None)), report()
    frozen = copy.deepcopy((new, base))
    compare(new, base, Limits())
    assert (new, base) == frozen


def test_selection_changes_are_noted() -> None:
    new = report()
    new["selected"] = {"phone": None, "pi": "int8"}
    notes = compare(new, report(), Limits()).notes
    assert "phone: selected int8 -> none (no variant within budgets)" in notes
    assert "pi: selected int8" in notes


def test_markdown_holds_the_verdict_the_broken_limits_and_the_table() -> None:
    base = report(int8=variant(size=100_000))
    result = compare(report(int8=variant(size=200_000)), base, Limits())
    text = to_markdown(result, Limits(), "out/pr/report.json", "registry:digits-cnn@production")
    assert text.startswith("## Model gate: digits-cnn: FAILED: 1 limit broken\n")
    assert "`registry:digits-cnn@production`" in text
    # sizes in MiB and timings with 3 significant digits, as the report and page say them
    assert "- int8: size (shipped file) grew +100.0 % (0.0954 MiB -> 0.191 MiB)" in text
    assert ("| int8 | size | 0.0954 MiB | 0.191 MiB | +100.0 % | max +10 % | **BROKEN** |"
            in text)
    assert "| int8 | pi latency (est.) | 120 µs | 120 µs | +0.0 % | max +25 % | ok |" in text
    assert "MiB = 1,048,576 bytes" in text
    # a small growth shows the digits that differ
    small = compare(report(int8=variant(size=272_600)), report(int8=variant(size=272_520)),
                    Limits(max_size_growth_pct=0.01))
    [grown] = small.broken
    assert (grown.baseline, grown.current) == ("0.2599 MiB", "0.2600 MiB")
    assert "*measured*" in text and "*estimated*" in text
    passed = to_markdown(compare(base, base, Limits()), Limits(), "a", "b")
    assert "passed" in passed.splitlines()[0] and "Broken" not in passed


@pytest.mark.parametrize("bad, field", [
    ([], "(top level)"),
    ({"variants": {}}, "variants"),
    ({"variants": []}, "variants"),
    ({"variants": {"int8": {}}}, "variants.int8.size_bytes"),
    ({"variants": {"int8": {"size_bytes": "1 MB"}}}, "variants.int8.size_bytes"),
    ({"variants": {"int8": {"size_bytes": True}}}, "variants.int8.size_bytes"),
    ({"variants": {"int8": {"size_bytes": 1, "accuracy": "high"}}}, "variants.int8.accuracy"),
    ({"variants": {"int8": {"size_bytes": 1, "latency_ms": {"p50": "x"}}}},
     "variants.int8.latency_ms.p50"),
    ({"variants": {"int8": {"size_bytes": 1, "targets": {"pi": {"est_latency_ms": []}}}}},
     "variants.int8.targets.pi.est_latency_ms"),
    ({"variants": {"int8": {"size_bytes": float("nan")}}}, "variants.int8.size_bytes"),
])
def test_malformed_reports_name_the_field(bad: Any, field: str) -> None:
    with pytest.raises(OrchestratorError) as info:
        check_report(bad, "base.json")
    assert info.value.file == "base.json" and info.value.field == field
    assert info.value.exit_code == 2


@pytest.mark.parametrize("ref, says", [
    ("registry:digits-cnn", "expected registry:NAME@ALIAS"),
    ("registry:@production", "model name"),
    ("registry:../x@production", "model name"),
    ("registry:digits-cnn@", "alias ''"),
    ("registry:digits-cnn@prod uction", "alias 'prod uction'"),
])
def test_bad_registry_references(ref: str, says: str) -> None:
    with pytest.raises(OrchestratorError, match=says):
        parse_registry_ref(ref)


def test_registry_reference_parts() -> None:
    assert parse_registry_ref("registry:digits-cnn@production") == ("digits-cnn", "production")


# ---- the command -----------------------------------------------------------------------

def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_command_exit_codes_and_markdown_next_to_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path / "base" / "report.json", report(int8=variant(size=100_000)))
    pr = write(tmp_path / "pr" / "report.json", report(int8=variant(size=115_000)))
    assert main(["gate", str(pr), "--baseline", str(base)]) == 1
    out, err = capsys.readouterr()
    assert "BROKEN" in out and "size (shipped file) grew +15.0 %" in out
    assert "FAILED: 1 limit broken" in err
    markdown = (tmp_path / "pr" / "gate.md").read_text()
    assert "FAILED: 1 limit broken" in markdown
    # a limit given on the command line, as a percentage or `none`
    assert main(["gate", str(pr), "--baseline", str(base), "--max-size-growth", "20%",
                 "--markdown", str(tmp_path / "comment.md")]) == 0
    assert "passed" in (tmp_path / "comment.md").read_text().splitlines()[0]
    assert main(["gate", str(pr), "--baseline", str(base), "--max-size-growth", "none"]) == 0
    assert "size growth none" in (tmp_path / "pr" / "gate.md").read_text()


def test_fidelity_follows_the_accuracy_limit_unless_given(tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", report(int8=variant(fidelity=1.0)))
    pr = write(tmp_path / "pr.json", report(int8=variant(fidelity=0.97)))
    assert main(["gate", str(pr), "--baseline", str(base)]) == 1
    assert main(["gate", str(pr), "--baseline", str(base), "--max-accuracy-drop", "0.05"]) == 0
    assert main(["gate", str(pr), "--baseline", str(base), "--max-accuracy-drop", "0.05",
                 "--max-fidelity-drop", "0.01"]) == 1


@pytest.mark.parametrize("case", ["missing", "folder", "not_json", "malformed",
                                  "lacks_variant", "bad_registry"])
def test_bad_input_is_exit_2_with_nothing_written(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pr = write(tmp_path / "pr" / "report.json", report(int8=variant(), fp32=variant()))
    base = tmp_path / "base" / "report.json"
    baseline = str(base)
    expected = {"missing": f"{base}: cannot read the report: not found",
                "folder": f"{base}: cannot read the report: expected a regular file",
                "not_json": f"{base}:2:1: not JSON",
                "malformed": f"{base} [variants.int8.fidelity]: expected a finite number",
                "lacks_variant": "lacks variant 'fp32'",
                "bad_registry": "bad registry reference"}[case]
    if case == "folder":
        base.mkdir(parents=True)
    elif case == "not_json":
        base.parent.mkdir()
        base.write_text('{"variants":\n}')
    elif case == "malformed":
        bad = report(int8=variant(), fp32=variant())
        bad["variants"]["int8"]["fidelity"] = "1.0"
        write(base, bad)
    elif case == "lacks_variant":
        write(base, report(int8=variant()))
    elif case == "bad_registry":
        baseline = "registry:digits-cnn"
    assert main(["gate", str(pr), "--baseline", baseline]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "pr" / "gate.md").exists()


def test_bad_report_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path / "base.json", report())
    pr = write(tmp_path / "pr.json", {"recipe": "x", "variants": {"int8": {"size_bytes": -0.0,
                                                                          "accuracy": [1]}}})
    assert main(["gate", str(pr), "--baseline", str(base)]) == 2
    assert f"{pr} [variants.int8.accuracy]" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["ten", "-5", "nan", "inf"])
def test_bad_limit_values_are_exit_2(value: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["gate", "r.json", "--baseline", "b.json", "--max-size-growth", value])
    assert info.value.code == 2


def test_unwritable_markdown_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    base = write(tmp_path / "base.json", report())
    (tmp_path / "blocker").write_text("a file, not a folder")
    target = tmp_path / "blocker" / "gate.md"
    assert main(["gate", str(base), "--baseline", str(base), "--markdown", str(target)]) == 2
    assert str(target) in capsys.readouterr().err


# ---- on real runs of the digits recipe -------------------------------------------------

INT8_QUANTIZING = ("      - quantize_weights\n      - quantize_nodes: {guard: true}\n"
                   "      - log_ranges: {samples: 200}\n"
                   "      - freeze_ranges: {min_percentile: 5, max_percentile: 5}\n")
FP32_STAGES = "stages: [freeze, strip, fold, benchmark, evaluate]"
GUARDED = "quantize_nodes: {guard: true}"
REGISTERED = "digits-cnn"  # the recipe's name: the base run registers its selection so


@pytest.fixture(scope="module")
def digits_runs(digits_example: Path, prefect_server: None,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """recipes/digits.yaml run as a user would (`orchestrator run`, fp32 and int8, in this
    process: one store, so each change computes only the stages it changes), then two changes
    of it: int8 without quantize_weights/quantize_nodes, and more benchmark runs. The int8
    guard is off (the guard keeps the recipe's own trial on digits: the same model; the gate
    reads reports, not how the guard found it)."""
    project = tmp_path_factory.mktemp("gate-project")
    (project / "pyproject.toml").write_text("")  # the project root of the recipes
    (project / "examples").symlink_to(ROOT / "examples")
    recipes = project / "recipes"
    recipes.mkdir()
    original = (ROOT / "recipes" / "digits.yaml").read_text()
    assert INT8_QUANTIZING in original and FP32_STAGES in original
    unguarded = original.replace(GUARDED, "quantize_nodes: {guard: false}")
    assert unguarded != original
    changed = {
        "base": unguarded,
        "unquantized": unguarded.replace(INT8_QUANTIZING.replace(GUARDED, "quantize_nodes: "
                                                                 "{guard: false}"), ""),
        "more_runs": unguarded.replace(
            FP32_STAGES, "stages: [freeze, strip, fold, {benchmark: {runs: 80}}, evaluate]"),
    }
    assert len(set(changed.values())) == 3
    env = {"ORCHESTRATOR_HOME": str(project / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlruns' / 'mlflow.db'}"}
    (project / "mlruns").mkdir()
    codes = {}
    with in_project(project, env):
        for name, text in changed.items():
            (recipes / f"{name}.yaml").write_text(text)
            # the base run also registers its selection: the `registry:` baseline
            register = ["--set", "register=true"] if name == "base" else []
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                codes[name] = main(["run", str(recipes / f"{name}.yaml"),
                                    "-o", str(project / "out" / name), "--variant", "fp32",
                                    "--variant", "int8", *register])
            assert (project / "out" / name / "report.json").is_file(), err.getvalue()[-3000:]
    return {"project": project, "codes": codes}


@pytest.mark.slow
def test_gate_fails_a_change_that_grows_the_int8_model(
        digits_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = digits_runs["project"] / "out"
    assert digits_runs["codes"]["base"] == 0
    code = main(["gate", str(out / "unquantized" / "report.json"),
                 "--baseline", str(out / "base" / "report.json")])
    captured = capsys.readouterr()
    assert code == 1, captured.out + captured.err
    markdown = (out / "unquantized" / "gate.md").read_text()
    broken = [line for line in markdown.splitlines() if line.endswith("| **BROKEN** |")]
    # the int8 model is now the float graph: ~4x the bytes. Its estimate follows what this
    # host measured of each file (the float graph runs fewer nodes than the 8-bit one, and
    # x86 runs them faster), so it does not grow; its timer noise, scaled to the device, is
    # below the estimate's noise floor
    assert any(line.startswith("| int8 | size |") for line in broken), markdown
    assert not any("latency (est.)" in line for line in broken), markdown
    assert not any(line.startswith("| fp32 |") and "(measured)" not in line for line in broken)
    assert "int8: size (shipped file) grew +" in captured.out


@pytest.mark.slow
def test_gate_passes_a_change_within_the_limits(
        digits_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = digits_runs["project"] / "out"
    assert digits_runs["codes"]["more_runs"] == 0
    # the default limits, except the host's timings: on a machine shared with other tests
    # they are noise (the rule itself is tested on report dicts above)
    code = main(["gate", str(out / "more_runs" / "report.json"),
                 "--baseline", str(out / "base" / "report.json"),
                 "--min-latency-change-ms", "1000"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    markdown = (out / "more_runs" / "gate.md").read_text()
    assert "passed" in markdown.splitlines()[0]
    rows = [line for line in markdown.splitlines() if line.startswith(("| fp32 |", "| int8 |"))]
    assert len(rows) == 2 * 6 and all(line.endswith("| ok |") for line in rows), markdown


@pytest.mark.slow
def test_gate_against_a_registered_version(
        digits_runs: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`registry:NAME@ALIAS`: the report of the version the base run registered as
    `candidate`, found in the mlruns/ of the reports' project (no MLFLOW_TRACKING_URI)."""
    out = digits_runs["project"] / "out"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(digits_runs["project"].parent)  # not where the project is
    candidate = f"registry:{REGISTERED}@candidate"
    code = main(["gate", str(out / "unquantized" / "report.json"), "--baseline", candidate])
    captured = capsys.readouterr()
    assert code == 1, captured.out + captured.err
    assert "int8: size (shipped file) grew +" in captured.out
    assert f"`{candidate}`" in (out / "unquantized" / "gate.md").read_text()
    code = main(["gate", str(out / "more_runs" / "report.json"), "--baseline", candidate,
                 "--min-latency-change-ms", "1000"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    # no such alias, no such model: exit 2 naming it, nothing written
    (out / "more_runs" / "gate.md").unlink()
    for ref, says in ((f"registry:{REGISTERED}@production", "production"),
                      ("registry:no-such-model@candidate", "no-such-model")):
        assert main(["gate", str(out / "more_runs" / "report.json"), "--baseline", ref]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err, err
    assert not (out / "more_runs" / "gate.md").exists()
