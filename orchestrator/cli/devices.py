"""`orchestrator devices [NAME]`: the device catalogue, each figure with what it rests on.

A target's estimate is only as good as its device's figures: this lists every preset's
clusters (cores, clocks, FLOPs per cycle, dot product), its DRAM bandwidth, the threads
its estimates assume, and the estimate's expected error on published devices of its class
of core; with a NAME, the sources of each figure.
"""

from __future__ import annotations

import argparse
import difflib
import json
from typing import Any

from orchestrator.errors import UsageError


def _clusters(device: Any) -> str:
    parts = []
    for c in device.cpu_clusters:
        extras = [x for x, on in (("dot product", c.dotprod), ("in order", c.in_order),
                                  ("little", not c.big)) if on]
        parts.append(f"{c.count}x {c.core} {c.ghz:g} GHz, {c.fp32_flops_per_cycle:g} "
                     f"FLOP/cycle" + (f" ({', '.join(extras)})" if extras else ""))
    return "; ".join(parts)


def _facts(device: Any) -> dict[str, Any]:
    from orchestrator.measure.estimates import expected_error

    error = expected_error(device)
    return {"name": device.name, "soc": device.soc, "clusters": _clusters(device),
            "threads": device.default_threads, "memory_gbs": device.memory_gbs,
            "ram_mb": device.ram_mb, "app_ram_limit_mb": device.app_ram_limit_mb,
            "expected_error": None if error is None else error["text"],
            "sources": list(device.sources)}


def cmd_devices(args: argparse.Namespace) -> int:
    from orchestrator.spec.devices import PRESETS, resolve_device

    if args.name:
        try:
            chosen = [resolve_device(args.name)]
        except ValueError:
            # resolve_device's message offers an inline spec: no use to this command
            close = difflib.get_close_matches(args.name, list(PRESETS), n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise UsageError(f"unknown device {args.name!r}{hint}; the catalogue's devices: "
                             f"{', '.join(sorted(PRESETS))}") from None
    else:
        chosen = list(PRESETS.values())
    facts = [_facts(d) for d in chosen]
    if args.json:
        print(json.dumps(facts if not args.name else facts[0], indent=2))
        return 0
    for fact in facts:
        memory = (f"{fact['memory_gbs']:g} GB/s DRAM" if fact["memory_gbs"]
                  else "DRAM bandwidth not catalogued")
        print(f"{fact['name']}: {fact['soc'] or 'SoC not catalogued'}; {fact['clusters']}; "
              f"{memory}; {fact['ram_mb']:g} MB RAM")
        print(f"  estimates assume {fact['threads']} threads (its big cores; a target's "
              "`threads:` sets them)")
        if fact["expected_error"]:
            print(f"  expected error: {fact['expected_error']}")
        if args.name:
            for source in fact["sources"]:
                print(f"  source: {source}")
        elif fact["sources"]:
            print(f"  rests on {len(fact['sources'])} sources: `orchestrator devices "
                  f"{fact['name']}` lists them")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `devices`."""
    devices = sub.add_parser("devices", help="the device catalogue: clusters, bandwidth, "
                             "threads, expected error, and what each figure rests on")
    devices.add_argument("name", nargs="?", help="one preset, with its sources")
    devices.add_argument("--json", action="store_true", help="print the facts as JSON")
    devices.set_defaults(fn=cmd_devices)
