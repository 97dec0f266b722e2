"""`orchestrator promote`: move a Model Registry alias (`production`) to the recipe's
`candidate` version, only through the gates (see registry.promote).

Exit codes: 0 promoted (or already there), 1 refused by a gate, 2 bad input: the recipe, no
registered model or `candidate`, unreachable tracking.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from orchestrator.cli.common import print_error
from orchestrator.errors import OrchestratorError

DEFAULT_TOLERANCE = 0.005


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in [0, 1), e.g. 0.005")
    return value



def cmd_promote(args: argparse.Namespace) -> int:
    from orchestrator.cache.project import project_root, tracking_uri
    from orchestrator.recipe.loading import load_recipe
    from orchestrator.tracking.registry import CANDIDATE, promote

    try:
        loaded = load_recipe(args.recipe, args.set)
        if not loaded.recipe.targets:
            raise loaded.error("the recipe has no targets: there are no gates to promote "
                               "through", ("targets",))
        outcome = promote(tracking_uri(project_root(loaded.path)), loaded.recipe.name,
                          loaded.recipe.targets, loaded.devices(), args.to, args.tolerance)
    except OrchestratorError as exc:
        return print_error(exc)
    name, version = outcome.name, outcome.version
    if outcome.already:
        print(f"{name} version {version} is {CANDIDATE} and already {outcome.alias}: "
              "nothing to do")
        return 0
    against = (f"{outcome.alias} version {outcome.previous}" if outcome.previous
               else f"no {outcome.alias} version yet")
    print(f"{name} version {version} ({CANDIDATE}) against {against}, tolerance "
          f"{args.tolerance:g}:")
    for check in outcome.checks:
        status = "meets its budgets" if not check.violations else "; ".join(check.violations)
        compared = f"; {check.compared}" if check.compared else ""
        print(f"  {check.target}: {check.variant or '-'}: {status}{compared}")
        for regression in check.regressions:
            print(f"    worse: {regression}")
    if outcome.promoted:
        was = f"was version {outcome.previous}" if outcome.previous else "the first"
        print(f"promoted {name} version {version} to {outcome.alias} ({was})")
        return 0
    kept = (f"{outcome.alias} stays version {outcome.previous}" if outcome.previous
            else f"no version is {outcome.alias}")
    print(f"refused: {name} version {version} was not promoted ({kept}); the reasons are on "
          f"the version, tag promote.{outcome.alias}.refused", file=sys.stderr)
    return 1


def add_parsers(sub: Any) -> None:
    """Register `promote` on the `orchestrator` command's subparsers."""
    promote = sub.add_parser(
        "promote", help="move a Model Registry alias to the recipe's candidate version, "
        "when it still meets the recipe's gates and is no worse than the current one")
    promote.add_argument("recipe")
    promote.add_argument("--to", required=True, metavar="ALIAS",
                         help="the alias to move, e.g. production")
    promote.add_argument("--tolerance", type=_tolerance, default=DEFAULT_TOLERANCE,
                         help="how much lower accuracy or fidelity may be than the current "
                         f"version's, per target (default {DEFAULT_TOLERANCE})")
    promote.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                         help="override a recipe field (a budget, say) by its dotted path")
    promote.set_defaults(fn=cmd_promote)
