"""The digits recipe measured on the emulated Cortex-A76 directly (qemu://), by the
on-device benchmark's quick run. Real Prefect, real MLflow, the real aarch64 LiteRT wheel
under qemu-user. The same board behind a real OpenSSH server on loopback runs the recipe
end to end in tests/robustness/test_device_faults.py (its re-run after the faults)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.device]

ROOT = Path(__file__).resolve().parents[2]

def check_measured(report: dict, connect: str) -> dict:
    """What every device run must show: litert_int8 measured on the aarch64 board, its
    accuracy there within 0.005 of this host's, fp32 not measured with the reason."""
    arm = report["variants"]["litert_int8"]["targets"]["arm"]
    measured = arm["measured"]
    assert measured["measured"] is True and measured["where"] == connect
    assert measured["board"]["machine"] == "aarch64"
    assert measured["board"]["cpu"] == "Cortex-A76"
    assert measured["emulated"] is (connect.startswith("qemu"))
    host_accuracy = report["variants"]["litert_int8"]["accuracy"]
    assert abs(measured["accuracy"] - host_accuracy) <= 0.005
    assert measured["top1_agreement"] >= 0.99
    # one word, one meaning (issue 39): fidelity against the float source model, as the
    # variant's on this host; the agreement with this host's outputs under its own name
    assert abs(measured["fidelity"] - report["variants"]["litert_int8"]["fidelity"]) <= 0.005
    assert measured["agreement_with_host"] >= 0.99
    # phone-modern's 8 cores on a board with fewer: every setting within the board's
    cores = measured["board"]["cores"]
    assert max(row["threads"] for row in measured["threads_matrix"]) == min(cores, 8)
    assert measured.get("threads_capped_from") == (8 if cores < 8 else None)
    assert measured["latency_ms"]["count"] == 50 and measured["latency_ms"]["p50"] > 0
    assert measured["load"]["load_ms"] > 0 and "rss_growth_mb" in measured["load"]
    # selection says which figures it used: an emulated board's timings decide nothing
    assert arm["latency_basis"] == ("estimated" if measured["emulated"]
                                    else "measured on arm's board")
    assert arm["accuracy_basis"].startswith("measured on arm's board")
    assert "accuracy measured on the board" in report["selection_basis"]["arm"]
    fp32 = report["variants"]["fp32"]["targets"]["arm"]["measured"]
    assert fp32["measured"] is False and "tensorflow" in fp32["reason"]
    return measured


def test_emulated_board_measures_and_validates_litert_int8(
        workspace: Path, prefect_server: None, emulated_board: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/on_device.py --quick, whole: the digits recipe's LiteRT files measured
    on qemu://aarch64?cpu=cortex-a76 by `orchestrator run` (a process of its own, as a
    user runs it), then the overhead of a measurement over SSH on loopback."""
    import sys

    from prefect.settings import PREFECT_API_URL

    monkeypatch.setenv("PREFECT_API_URL", str(PREFECT_API_URL.value()))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import on_device
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert on_device.main(["--quick", "--work", str(workspace)]) == 0
    printed = capsys.readouterr().out
    out = workspace / "digits" / "out"
    report = json.loads((out / "report.json").read_text())
    measured = check_measured(report, "qemu://aarch64?cpu=cortex-a76")
    assert measured["emulated"] is True
    # the console and the page show the board's figures, labelled apart
    console = (workspace / "digits" / "console.txt").read_text()
    assert "measured on arm's board: qemu://aarch64?cpu=cortex-a76, aarch64 Cortex-A76 " \
           "(emulated)" in console
    assert "its timings are qemu's, not the core's" in console
    if measured.get("threads_capped_from"):
        assert (f"litert_int8: threads capped at the board's {measured['board']['cores']} "
                "cores (asked up to 8") in console
    page = (out / "report.html").read_text()
    assert "Measured on the targets' boards" in page and "Cortex-A76" in page
    # the benchmark's tables: each LiteRT variant on the board, and the SSH overhead
    row = next(line for line in printed.splitlines() if line.startswith("| litert_int8 |"))
    assert "(emulated)" in row
    assert "first connection" in printed and "per measurement beyond" in printed
