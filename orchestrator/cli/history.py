"""`orchestrator history RECIPE [-o FOLDER] [--last N] [--json]`: per target, the variant
each of the recipe's MLflow runs selected, with its size, accuracy (or fidelity) and
measured latency, oldest run first: a table on stdout (or JSON) and `history.png`.

Exit codes: 0 shown, 2 bad input: the recipe, tracking unreachable, no runs recorded yet, a
folder that cannot be written or that holds another recipe's outputs (unless --force).
The work is in orchestrator.tracking.history.
"""

from __future__ import annotations

import argparse
import json
import sys

from orchestrator.cli.common import bounded_flag, print_error
from orchestrator.errors import OrchestratorError


def cmd_history(args: argparse.Namespace) -> int:
    from orchestrator.cache import project
    from orchestrator.errors import OutputError
    from orchestrator.paths import writable_dir_problem
    from orchestrator.recipe.loading import load_recipe
    from orchestrator.results import output_folder
    from orchestrator.tracking import history

    try:
        # the model and data files need not exist today: only the recipe's name, targets
        # and whether its evaluation data has labels matter here
        loaded = load_recipe(args.recipe, check_files=False)
        recipe = loaded.recipe
        root = project.project_root(loaded.path)
        # the recipe's own folder, where `run` writes its outputs (one recipe, one folder)
        folder = project.output_dir(root, recipe.name, args.output)
        problem = writable_dir_problem(folder)  # before MLflow's import, not after
        if problem:
            raise OutputError(f"cannot write to the output folder (-o): {problem}",
                              file=str(folder))
        # not into the store, MLflow's folder or the project, as `run`; nor into another
        # recipe's outputs (its runs would delete the chart anyway)
        output_folder.check_output_owner(folder, recipe.name, loaded.path, root, args.force,
                                   force_does="pass --force to write history.png there "
                                   "(its other files stay)")
        evaluation = recipe.data.evaluation if recipe.data is not None else None
        metric = "accuracy" if evaluation is None or evaluation.labels else "fidelity"
        rows = history.history_rows(project.tracking_uri(root), recipe.name, args.recipe,
                                    metric, [t.name for t in recipe.targets], args.last)
        path = history.write_chart(history.chart(rows, recipe.name), folder)
    except OrchestratorError as exc:
        return print_error(exc)
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
        print(f"chart: {path}", file=sys.stderr)
    else:
        print(history.format_table(rows, recipe.name))
        print(f"chart: {path}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `history` on the `orchestrator` command's subparsers."""
    history = sub.add_parser(
        "history", help="the variant each run of a recipe selected per target, with its "
        "size, accuracy and measured latency, oldest first: a table and history.png")
    history.add_argument("recipe")
    history.add_argument("-o", "--output", default=None, metavar="FOLDER",
                         help="where history.png goes (default: out/<recipe name> in the "
                         "recipe's project)")
    history.add_argument("--force", action="store_true",
                         help="write history.png even into a folder that holds another "
                         "recipe's outputs or other files")
    history.add_argument("--last", type=bounded_flag("last"), default=None, metavar="N",
                         help="only the newest N runs")
    history.add_argument("--json", action="store_true",
                         help="print the rows as JSON instead of the table")
    history.set_defaults(fn=cmd_history)
