"""`orchestrator device check TARGET_OR_URL` and `orchestrator device prepare URL`.

`check` says what a board is (machine, CPU, cores, memory, Python, which runtimes) and
whether it can measure; it takes a device URL, or a target's name with `--recipe`.
`--accept-host-key` records an SSH board's unknown host key once (OpenSSH's accept-new):
never silently. `prepare` makes a board ready without internet on the board (see
orchestrator/boards/prepare.py), or builds the emulated board for `qemu://aarch64`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from orchestrator.cli.common import command_error
from orchestrator.errors import OrchestratorError, UsageError


def _url_of(value: str, recipe: str | None) -> Any:
    from orchestrator.boards.urls import DeviceURLError, parse_device_url

    if "://" not in value:
        if recipe is None:
            raise UsageError(f"{value!r} is not a device URL: give ssh://[user@]host[:port], "
                             "qemu://aarch64?cpu=cortex-a76, or a target name with --recipe")
        from orchestrator.recipe.loading import load_recipe

        loaded = load_recipe(recipe)
        targets = {t.name: t for t in loaded.recipe.targets}
        if value not in targets:
            raise UsageError(f"{recipe} has no target {value!r}; targets: "
                             f"{', '.join(targets)}")
        if targets[value].connect is None:
            raise UsageError(f"target {value!r} has no connect: URL in {recipe}")
        value = str(targets[value].connect)
    try:
        return parse_device_url(value)
    except DeviceURLError as exc:
        raise UsageError(str(exc)) from None


def board_lines(board: dict[str, Any]) -> list[str]:
    runtimes = board.get("runtimes") or {}
    have = ", ".join(f"{name} {version}" for name, version in runtimes.items() if version)
    lack = ", ".join(name for name, version in runtimes.items() if not version)
    return [f"machine: {board.get('machine')} ({board.get('system')} {board.get('kernel')}, "
            f"{board.get('libc')})",
            f"CPU: {board.get('cpu')}, {board.get('cores')} cores, "
            f"{board.get('memory_mb')} MiB memory",
            f"Python: {board.get('python')}",
            f"runtimes: {have or 'none'}" + (f"; missing: {lack}" if lack else "")]


def cmd_check(args: argparse.Namespace) -> int:
    from orchestrator.boards.measurement import prepare_command, runtimes_needed
    from orchestrator.boards.prepare import describe_board

    try:
        url = _url_of(args.target, args.recipe)
        board = describe_board(url, accept_new_host_key=args.accept_host_key)
    except OrchestratorError as exc:
        return command_error(exc)
    if args.json:
        print(json.dumps({"where": url.text, "emulated": url.emulated, **board}, indent=1))
        return 0
    print(f"{url.text}" + (" (emulated: its numerics are the Arm kernels', its timings "
                           "qemu's)" if url.emulated else ""))
    for line in board_lines(board):
        print(f"  {line}")
    runtimes = board.get("runtimes") or {}
    for what, kind, encrypted in (("LiteRT .tflite files", "tflite", False),
                                  ("encrypted .tflite files", "tflite", True),
                                  ("GraphDef files", "graphdef", False)):
        missing = [m for m in runtimes_needed(kind, encrypted) if not runtimes.get(m)]
        runtime = "tensorflow" if "tensorflow" in missing else None
        print(f"  {what}: " + ("can measure" if not missing else
                               f"cannot: no {', '.join(missing)} "
                               f"(`{prepare_command(url.text, runtime)}`)"
                               + (" (1.5 GB; its import alone took 62 s under "
                                  "qemu here)" if url.emulated and runtime else "")))
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from orchestrator.boards.prepare import DEFAULT_RUNTIMES, prepare

    try:
        url = _url_of(args.url, None)
        board = prepare(url, [*DEFAULT_RUNTIMES, *args.runtime],
                        say=lambda line: print(line, flush=True))
    except OrchestratorError as exc:
        return command_error(exc)
    print(f"{url.text} is ready:")
    for line in board_lines(board):
        print(f"  {line}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `device check` and `device prepare`."""
    device = sub.add_parser("device", help="the boards targets measure on (connect:): check "
                            "one, or make it ready")
    commands = device.add_subparsers(dest="device_command", required=True)
    check = commands.add_parser("check", help="what a board is and which runtimes it has")
    check.add_argument("target", metavar="TARGET_OR_URL",
                       help="a device URL (ssh://..., qemu://aarch64?cpu=...) or, with "
                       "--recipe, a target's name")
    check.add_argument("--recipe", help="the recipe whose target TARGET_OR_URL names")
    check.add_argument("--accept-host-key", action="store_true",
                       help="record the SSH board's host key if it is not known yet "
                       "(check it first: this trusts whoever answers at that address)")
    check.add_argument("--json", action="store_true", help="print the facts as JSON")
    check.set_defaults(fn=cmd_check)
    prepare = commands.add_parser(
        "prepare", help="install the runtimes on a board from this host (the board needs no "
        "internet), or build the emulated board (qemu://aarch64)")
    prepare.add_argument("url", metavar="URL")
    prepare.add_argument("--runtime", action="append", default=[],
                         choices=["tensorflow"],
                         help="also install TensorFlow (for GraphDef variants; large)")
    prepare.set_defaults(fn=cmd_prepare)
