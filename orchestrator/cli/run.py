"""Running recipes: `run`, `validate`, `schema`, and `server` (the local Prefect server that
runs share)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli.common import command_error, interrupts_seen, say_interrupted
from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.recipe.loading import LoadedRecipe


def cmd_validate(args: argparse.Namespace) -> int:
    from orchestrator.recipe.loading import load_recipe

    code = 0
    for path in args.recipes:
        try:
            loaded = load_recipe(path, args.set)
        except OrchestratorError as exc:
            code = max(code, command_error(exc))
            continue
        print(f"{path}: ok ({validate_summary(loaded)})")
        from orchestrator.recipe.defaults import board_limits

        for line in board_limits(loaded.recipe, loaded.stages):
            print(f"  note: {line}")
    return code


def validate_summary(loaded: LoadedRecipe) -> str:
    """`5 pipelines, 22 stages + 1 added by default: int8 › compact_names; 2 targets`: the
    stages the YAML lists, then those a run adds (the count a run's log shows is their sum)."""
    added = [f"{pipeline} › {loaded.stages[pipeline][index][0]}"
             for pipeline, indices in loaded.added.items() for index in indices]
    listed = sum(len(s) for s in loaded.stages.values()) - len(added)
    stages = f"{listed} stage{'s' if listed != 1 else ''}"
    if added:
        stages += f" + {len(added)} added by default: {', '.join(added)};"
    else:
        stages += ","
    targets = len(loaded.recipe.targets)
    return (f"{len(loaded.stages)} pipeline{'s' if len(loaded.stages) != 1 else ''}, "
            f"{stages} {targets} target{'s' if targets != 1 else ''}")


def cmd_schema(args: argparse.Namespace) -> int:
    from orchestrator.recipe import schema
    if args.output is None:
        print(schema.schema_text(), end="")
        return 0
    try:
        schema.write_schema(args.output)
    except OSError as exc:
        print(f"error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote the recipe schema to {args.output}")
    return 0


class _RunState:
    """How far `run` got: its output folder once known, whether the flow started."""

    def __init__(self) -> None:
        self.out_dir: Path | None = None
        self.flow_started = False
        self.started = datetime.datetime.now(datetime.UTC)


def cmd_run(args: argparse.Namespace) -> int:
    """Run the recipe; a run that fails or is interrupted leaves its output folder as it
    was, and its last line says what the folder holds (output_folder.held_by)."""
    state = _RunState()
    try:
        report = _run(args, state)
    except OrchestratorError as exc:
        code = command_error(exc)
        # a stage that failed, a server lost mid-run, or a Ctrl-C; bad input (exit 2
        # before the flow starts) is one line, as before a run
        if code == 130 or state.flow_started:
            _say_what_the_folder_holds(state)
        return code
    except (KeyboardInterrupt, Exception) as exc:
        # also when a library turned our KeyboardInterrupt into an error of its own
        interrupted = isinstance(exc, KeyboardInterrupt) or bool(interrupts_seen)
        if not interrupted or state.out_dir is None:
            raise
        say_interrupted()
        _say_what_the_folder_holds(state)
        return 130
    from orchestrator.results.report import print_summary

    print_summary(report, Path(report["out_dir"]))
    _print_where(report, args.recipe)
    missing = [target for target, variant in report["selected"].items() if variant is None]
    if missing:
        print(f"budget gate failed: no variant within the budgets of {', '.join(missing)}",
              file=sys.stderr)
        return 1
    return 0


def _say_what_the_folder_holds(state: _RunState) -> None:
    """The last line of a run that failed or was interrupted: what its output folder holds,
    the last good run's, or this one's where the failure came after its outputs were in
    (a second Ctrl-C meanwhile does not cut it short)."""
    from orchestrator.cache.store import interrupts_deferred
    from orchestrator.results.output_folder import held_by

    if state.out_dir is None:
        return
    with contextlib.suppress(KeyboardInterrupt), interrupts_deferred():
        print(held_by(state.out_dir, state.started), file=sys.stderr)


def _run(args: argparse.Namespace, state: _RunState) -> dict:
    """The run, up to its report; `state` says how far it got."""
    from orchestrator.cache import project
    from orchestrator.tracking import client as tracking_client

    server = None
    try:
        # first of all: the tracking worker's MLflow import (1.5 s, on a cached re-run the
        # longest thing left) runs on the other core beside everything below, Prefect's
        # import included; a recipe that fails to load ends it unused (finally)
        _prestart_tracking(args.recipe)
        from orchestrator.flow import local_server, task_runners, warm_up
        from orchestrator.recipe.checks import check_variants
        from orchestrator.recipe.loading import load_recipe
        from orchestrator.results import output_folder

        loaded = load_recipe(args.recipe, args.set)
        check_variants(loaded, args.variant)
        root = project.project_root(loaded.path)
        store_root = project.store_dir(root)
        output = None if args.output is None else os.path.abspath(args.output)
        out_dir = project.output_dir(root, loaded.recipe.name, output)
        # before the server starts: a folder that cannot be written, or that holds another
        # recipe's outputs, is exit 2 at once (the flow checks again: deployments)
        project.check_folders(out_dir, store_root, root)
        output_folder.check_output_owner(out_dir, loaded.recipe.name, loaded.path, root,
                                         args.force)
        state.out_dir = out_dir
        plan = warm_up.plan_first(loaded, args.variant or None)  # a bad key: exit 2 now
        # the tracking worker (for the project's own URI, should it differ from the one
        # guessed above) and a booting Prefect server (~2.5 s, unless an earlier run's is
        # up) run beside Prefect's import and the flow's start
        tracking_client.prestart(project.tracking_uri(root))
        server = local_server.start_if_needed(project.local_home(root))
        # TensorFlow's import (when stages are to run) while the server boots; the stages'
        # helpers (load probe) too, unless the stages run on a scheduler's workers elsewhere
        chosen = task_runners.resolve(loaded, args.executor, args.dask_address)
        warm_up.run(plan, store_root, not args.no_cache, prepare=chosen.address is None)
        from orchestrator.results.progress import ConsoleProgress
        from pipelines import recipe_flow

        if server is not None:
            server.wait_ready()
        total = sum(len(s) for s in loaded.stages.values())
        with ConsoleProgress(total) as progress, recipe_flow.observed_by(progress):
            try:
                state.flow_started = True
                return recipe_flow.run(str(loaded.path), overrides=list(args.set),
                                       variants=args.variant or None,
                                       no_cache=args.no_cache, output=output,
                                       force=args.force,
                                       heartbeats=server is None, executor=args.executor,
                                       dask_address=args.dask_address)
            except Exception as exc:
                # the Prefect server gone mid-run is the user's to fix, not a bug (exit 2)
                lost = local_server.api_lost(exc)
                if lost is None:
                    raise
                raise lost from exc
    finally:
        tracking_client.discard_prestarted()
        _end_helpers()
        if server is not None:
            server.release()
            if server.started_here and server.lingers:  # say so, however the run ended
                print(f"Prefect server {server.api_url.removesuffix('/api')} is kept for "
                      f"later runs; it stops after {local_server.idle_seconds():.0f} s "
                      f"unused ({local_server.IDLE_ENV}=0: one server per run)",
                      file=sys.stderr)


def _end_helpers() -> None:
    """The run is over, and so are the processes warm_up started for it: a drawing process
    that drew nothing now, and the stages' load probe as this process exits: ended then,
    rather than asked to exit, which its TensorFlow teardown makes last a second or more,
    all of it waited for. (A process that runs again, tests or embedding, keeps it until
    then: the next run reuses it.)"""
    import atexit

    plots = sys.modules.get("orchestrator.results.plots")
    if plots is not None:
        plots.stop_drawing()
    probe = sys.modules.get("orchestrator.measure.load_probe")
    if probe is not None and not _ending_probe:
        _ending_probe.append(True)
        # registered after the probe's own exit handler, so it runs before it
        atexit.register(probe.kill_now)


_ending_probe: list[bool] = []  # the probe's end registered already


def _prestart_tracking(recipe: str) -> None:
    """The tracking worker for the project of the recipe at `recipe` (its path resolved as
    `load_recipe` resolves it), before the recipe is read. A path that cannot be looked at
    starts none here: loading the recipe reports it."""
    from orchestrator.cache import project
    from orchestrator.tracking import client as tracking_client

    try:
        root = project.project_root(Path(recipe).resolve())
    except (OSError, RuntimeError, ValueError):
        return
    tracking_client.prestart(project.tracking_uri(root))


def _print_where(report: dict, recipe_arg: str) -> None:
    """Where this run's records are, and how to look at them (URL credentials hidden)."""
    from orchestrator.formatting import command_hint
    from orchestrator.redaction import redact

    where = report["locations"]
    registry = report.get("registry") or {}
    if registry.get("registered"):
        entry = registry["registered"]
        print(f"Registered {entry['name']} version {entry['version']} as "
              f"'{entry.get('alias', 'candidate')}' in the MLflow Model Registry")
    elif registry.get("refused"):
        print(f"Not registered: {registry['refused']}")
    print(f"MLflow run {report['mlflow_run_id']} (tracking: {redact(where['tracking'])}); "
          f"store: {redact(str(where['store']))}")
    print(f"Dashboards: {command_hint('ui', recipe_arg)}")


def cmd_server(args: argparse.Namespace) -> int:
    """The local Prefect server that runs share (see flow/local_server.py): status, or stop."""
    from orchestrator.cache import project
    from orchestrator.flow import local_server
    home = project.local_home(project.project_root())
    if args.action == "stop":
        stopped = local_server.stop_server(home, force=args.force)
        print(f"stopped the Prefect server at {stopped['api_url']} (pid {stopped['pid']})"
              if stopped else f"no local Prefect server for {home}")
        return 0
    found = local_server.describe(home)
    if found is None:
        print(f"no local Prefect server for {home}")
        return 0
    print(f"Prefect server at {found['api_url']} (pid {found['pid']}, Prefect "
          f"{found['prefect']}), {'in use by a run' if found['in_use'] else 'idle'}; it stops "
          f"after {found['idle_s']:.0f} s unused. Log: {home / local_server.LOG_FILE}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `run`, `validate`, `schema` and `server` on the main parser."""
    run = sub.add_parser("run", help="run a recipe as a Prefect flow, tracked in MLflow")
    run.add_argument("recipe")
    run.add_argument("-o", "--output", type=Path, default=None,
                     help="output folder (default: out/<recipe name> in the recipe's project)")
    run.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                     help="override a recipe field by its dotted path")
    run.add_argument("--no-cache", action="store_true", help="run every stage again")
    run.add_argument("--variant", action="append", default=[], metavar="NAME",
                     help="run only this pipeline (and its from: ancestors); repeatable. The "
                     "run still replaces the output folder whole: it then holds this run's "
                     "variants only")
    run.add_argument("--force", action="store_true",
                     help="write to the output folder even if it holds another recipe's "
                     "outputs or other files (they are replaced)")
    run.add_argument("--executor", choices=["local", "dask"], default=None,
                     help="where the stages run (wins over the recipe's execution.executor): "
                     "local, one at a time; dask, pipelines in parallel on Dask")
    run.add_argument("--dask-address", default=None, metavar="ADDR",
                     help="an existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (implies "
                     "--executor dask; without it, dask starts a LocalCluster)")
    run.set_defaults(fn=cmd_run)
    validate = sub.add_parser("validate", help="validate recipes without running them")
    validate.add_argument("recipes", nargs="+")
    validate.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    validate.set_defaults(fn=cmd_validate)
    schema = sub.add_parser("schema", help="print the recipe's JSON Schema (or write it)")
    schema.add_argument("-o", "--output", type=Path, default=None,
                        help="write it to this file (e.g. recipes/recipe.schema.json)")
    schema.set_defaults(fn=cmd_schema)
    server = sub.add_parser("server", help="the local Prefect server that runs share: "
                            "status, or stop it now")
    server.add_argument("action", choices=["status", "stop"], nargs="?", default="status")
    server.add_argument("--force", action="store_true", help="stop it even while a run uses it")
    server.set_defaults(fn=cmd_server)
