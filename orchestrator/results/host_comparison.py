"""Where an estimate for a target is below what this host measured for the same file, and
why (the device is faster, the host's runs were slowed, the host's kernels are slow): the
words the console summary (`report.print_summary`) and the page (`page.py`) share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def below_host(variant: Mapping[str, Any], target: str, short: bool = False) -> str | None:
    """Why the estimate for `target` is below what this host measured for the same file
    (a sentence; `short`: a few words, for a table cell); None where it is not below."""
    from orchestrator.measure.estimates import timings_spread

    result = (variant.get("targets") or {}).get(target) or {}
    made = result.get("estimate") or {}
    est = result.get("est_latency_ms")
    p50 = ((variant.get("latency_ms") or {}).get("p50") or made.get("host_p50_ms"))
    if not isinstance(est, int | float) or not isinstance(p50, int | float) or est >= p50:
        return None
    int8_tf = variant.get("precision") == "int8" and made.get("runtime") == "tensorflow"
    if made.get("ceiling_applied") or int8_tf:
        if short:
            return ("below host: x86's 8-bit kernels are slow" if int8_tf
                    else "below host: host kernel time left out")
        kernels = ("TF's classic 8-bit kernels, slow on x86 and fast (NEON) on Arm" if int8_tf
                   else "kernels slower than its matmul probe, which does not carry over "
                        "to another CPU")
        return (f"below this host's p50: this host spends most of it in {kernels}; the "
                "estimate counts the device's own compute instead")
    if made.get("top_ops"):  # a per-op estimate: the host's runs do not enter it
        return "below host: the device's kernels are faster" if short else (
            "below this host's p50: the device's cores, priced op by op, run this file "
            "faster than this host did")
    fastest = made.get("host_fastest_ms")
    if isinstance(fastest, int | float) and timings_spread(p50, fastest):
        return "below host: its runs were slowed" if short else (
            f"below this host's p50: the host's runs were slowed (p50 {p50 / fastest:.3g}× "
            "the fastest run); the estimate reads the fastest")
    return "below host: a faster device" if short else (
        "below this host's p50: the device's catalogued speed is above this host's")


def below_host_lines(report: Mapping[str, Any]) -> list[str]:
    """For under the console's table: per reason, the variants whose estimate is below
    this host's measured p50, and why ("int8, mobile: est. latency below this host's p50
    (6.36 ms, 4.84 ms): ...")."""
    from orchestrator.formatting import format_ms

    grouped: dict[str, list[str]] = {}
    for name, variant in report["variants"].items():
        reasons = {below_host(variant, t) for t in report.get("selected") or {}} - {None}
        for reason in sorted(r for r in reasons if r):
            grouped.setdefault(reason, []).append(name)
    lines = []
    for reason, names in grouped.items():
        p50s = ", ".join(format_ms((report["variants"][n].get("latency_ms") or {}).get("p50"))
                         for n in names)
        lines.append(f"{', '.join(names)}: est. latency "
                     + reason.replace("below this host's p50", f"below this host's p50 ({p50s})",
                                      1))
    return lines
