"""Commands for running the tool in a team: `gate` (CI), `deploy` and `serve` (Prefect)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from orchestrator.cli.common import bounded_flag
from orchestrator.errors import OrchestratorError

_DEFAULT = object()  # a limit not given: the documented default applies


def _limit(text: str) -> float | None:
    """A limit on the command line: a number (a trailing % is allowed) or `none`."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', found {text!r}") from None
    if not value >= 0 or value == float("inf"):  # also NaN
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, found {text!r}")
    return value


def _non_negative(text: str) -> float:
    value = _limit(text)
    if value is None:
        raise argparse.ArgumentTypeError("expected a number, found 'none'")
    return value


def _print_gate(result: Any, limits: Any, report: str, baseline: str) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from orchestrator.results.gate import limits_text, verdict

    console = Console(highlight=False)
    if not console.is_terminal:  # a CI log: rich's 80 columns would wrap every row
        console = Console(highlight=False, width=120)
    table = Table(title=f"gate {result.recipe}: {report} against {baseline}",
                  box=box.SIMPLE_HEAD)
    for column, justify in (("variant", "left"), ("figure", "left"), ("baseline", "right"),
                            ("this run", "right"), ("change", "right"), ("limit", "left"),
                            ("status", "left")):
        table.add_column(column, justify=justify, no_wrap=column != "figure")  # type: ignore[arg-type]
    styles = {"broken": "bold red", "ok": "green"}
    for r in result.rows:
        shown = "BROKEN" if r.status == "broken" else r.status
        status = f"[{styles[r.status]}]{shown}[/]" if r.status in styles else shown
        table.add_row(r.variant, r.metric, r.baseline, r.current, r.change, r.limit, status)
    console.print(table)
    console.print(f"limits: {limits_text(limits)}", markup=False)
    for note in result.notes:
        console.print(note, markup=False)
    for r in result.broken:
        console.print(f"broken: {r.variant}: {r.reason}", markup=False, style="red")
    if result.passed:
        console.print(f"gate {verdict(result)}", markup=False, style="green")
    else:
        Console(stderr=True, highlight=False).print(f"gate {verdict(result)}", markup=False,
                                                    style="bold red")


def _registry_report(name: str, alias: str, tracking_uri: str) -> Any:
    from orchestrator.tracking.registry import version_report  # MLflow: only on this path

    return version_report(name, alias, tracking_uri)


def cmd_gate(args: argparse.Namespace) -> int:
    """Compare REPORT with its baseline; write the Markdown; 1 when a limit is broken."""
    from orchestrator.paths import atomic_write_text, describe_os_error
    from orchestrator.results.gate import Limits, compare, load_baseline, load_report, to_markdown

    defaults = Limits()

    def chosen(value: object, default: float | None) -> float | None:
        return default if value is _DEFAULT else value  # type: ignore[return-value]

    accuracy = chosen(args.max_accuracy_drop, defaults.max_accuracy_drop)
    limits = Limits(
        max_size_growth_pct=chosen(args.max_size_growth, defaults.max_size_growth_pct),
        max_accuracy_drop=accuracy,
        # fidelity follows the accuracy limit unless given: the same "quality" budget
        max_fidelity_drop=chosen(args.max_fidelity_drop, accuracy),
        max_latency_growth_pct=chosen(args.max_latency_growth,
                                      defaults.max_latency_growth_pct),
        min_latency_change_ms=(defaults.min_latency_change_ms
                               if args.min_latency_change_ms is None
                               else args.min_latency_change_ms))
    report_path = Path(args.report)
    markdown_path = Path(args.markdown) if args.markdown else report_path.parent / "gate.md"
    report = load_report(report_path)
    baseline = load_baseline(args.baseline, report, report_path, _registry_report)
    result = compare(report, baseline, limits, str(report_path), args.baseline)
    text = to_markdown(result, limits, str(report_path), args.baseline)
    try:
        atomic_write_text(markdown_path, text)
    except OSError as exc:
        raise OrchestratorError(f"cannot write the Markdown: {describe_os_error(exc)}",
                                file=str(markdown_path)) from None
    print(f"markdown: {markdown_path}")
    _print_gate(result, limits, str(report_path), args.baseline)
    return 0 if result.passed else 1


def _server_for(planned: list[Any]) -> Any:
    """The Prefect server the commands talk to: PREFECT_API_URL's, else the local one that
    runs share (started if needed). Call before Prefect is imported."""
    from orchestrator.flow import local_server
    from orchestrator.flow.deployments import store_home
    from orchestrator.flow.prefect_settings import configure_prefect_defaults

    server = local_server.start_if_needed(store_home(planned))
    configure_prefect_defaults()
    if server is not None:
        server.wait_ready()
    return server


def _serve_command(args: argparse.Namespace) -> str:
    """`orchestrator serve` with the same recipes and options: serving registers the
    deployments again, as serve is told."""
    import shlex

    from orchestrator.formatting import command_prefix

    words = [*command_prefix(), "serve", *map(str, args.recipes)]
    for option, value in (("--cron", args.cron), ("--timezone", args.timezone)):
        if value is not None:
            words += [option, value]
    for override in args.set:
        words += ["--set", override]
    return shlex.join(words)


def cmd_deploy(args: argparse.Namespace) -> int:
    """Create or update one Prefect deployment per recipe."""
    from orchestrator.flow import deployments

    planned = deployments.plan_deployments(args.recipes, args.set, args.cron, args.timezone)
    server = _server_for(planned)
    try:
        from pipelines.recipe_flow import recipe_flow  # after the server: Prefect's settings

        ids = deployments.apply(planned, recipe_flow, args.work_pool)
        api = deployments.api_url()
        flow = deployments.FLOW_NAME
    finally:
        if server is not None:
            server.release()
    for item, deployment_id in zip(planned, ids, strict=True):
        print(f"deployed {flow}/{item.name} ({deployment_id}): {item.recipe}, "
              f"{item.schedule_text()}")
        print(f"    parameters: overrides {list(item.overrides)}, output {item.output}")
    print(f"Prefect API: {api}"
          + (" (orchestrator's local server)" if server is not None else ""))
    env = f"PREFECT_API_URL={api} " if server is not None else ""
    if args.work_pool:
        print(f"Runs go to work pool {args.work_pool!r}: start a worker for it, in an "
              f"environment where orchestrator is installed:\n    {env}prefect worker start "
              f"--pool {args.work_pool}")
        if server is not None:
            print("The local server stops when idle and runs no scheduler: for a work pool, "
                  "run `prefect server start` and set PREFECT_API_URL to it.")
    else:
        print(f"No work pool: nothing runs these deployments until a process serves them:"
              f"\n    {_serve_command(args)}\n(or deploy with --work-pool NAME and start "
              "`prefect worker start --pool NAME`)")
    print(f"Run one now: {env}prefect deployment run '{flow}/{planned[0].name}'")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve every recipe's deployment from this process until Ctrl-C."""
    from orchestrator.flow import deployments

    planned = deployments.plan_deployments(args.recipes, args.set, args.cron, args.timezone)
    server = _server_for(planned)
    try:
        from pipelines.recipe_flow import recipe_flow  # after the server: Prefect's settings

        flow = deployments.FLOW_NAME
        api = deployments.api_url()
        print(f"serving {len(planned)} deployment{'s' if len(planned) != 1 else ''} "
              f"(Prefect API {api}), {args.limit} run{'s' if args.limit != 1 else ''} at "
              "a time; Ctrl-C stops:")
        for item in planned:
            print(f"    {flow}/{item.name}: {item.recipe}, {item.schedule_text()}")
        env = f"PREFECT_API_URL={api} " if server is not None else ""
        print(f"Run one now: {env}prefect deployment run '{flow}/{planned[0].name}'",
              flush=True)
        deployments.serve_deployments(planned, recipe_flow, limit=args.limit,
                                      keep_schedules=server is not None)
    finally:  # also on SIGTERM, which Prefect's runner turns into SystemExit(0)
        if server is not None:
            server.release()
        print("stopped serving; Prefect paused the deployments' schedules until they are "
              "served again", flush=True)
    return 0



def _deployment_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipes", nargs="+", metavar="RECIPE_OR_FOLDER",
                        help="recipe files, or folders of *.yaml recipes")
    parser.add_argument("--cron", default=None, metavar="EXPR",
                        help="a cron schedule for every recipe, instead of its "
                             "schedule: cron (e.g. '0 3 * * *')")
    parser.add_argument("--timezone", default=None, metavar="TZ",
                        help="the schedule's IANA time zone (default: the recipe's, else UTC)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a recipe field in every run of the deployment")


def add_parsers(sub: Any) -> None:
    """Register `gate` (and the deployment commands) on the main parser."""
    gate = sub.add_parser(
        "gate", help="compare a run's report.json with a baseline; exit 1 when a limit breaks",
        description="Compare REPORT with a baseline per variant and target: shipped size, "
                    "accuracy and fidelity, latency (host p50, measured; each target's, "
                    "estimated). Prints a diff table, writes it as Markdown for a pull "
                    "request, exits 1 when a limit is broken. A limit given as 'none' is off.")
    gate.add_argument("report", help="the run's report.json")
    gate.add_argument("--baseline", required=True, metavar="REPORT|registry:NAME@ALIAS",
                      help="a baseline report.json, or the report of the model version an "
                           "MLflow registry alias points to")
    gate.add_argument("--max-size-growth", type=_limit, default=_DEFAULT, metavar="PCT",
                      help="shipped bytes may grow this many percent (default 10)")
    gate.add_argument("--max-accuracy-drop", type=_limit, default=_DEFAULT, metavar="X",
                      help="accuracy may drop this much, e.g. 0.01 (default 0.01)")
    gate.add_argument("--max-fidelity-drop", type=_limit, default=_DEFAULT, metavar="X",
                      help="fidelity may drop this much (default: the accuracy limit)")
    gate.add_argument("--max-latency-growth", type=_limit, default=_DEFAULT, metavar="PCT",
                      help="measured and estimated latency may grow this many percent "
                           "(default 25)")
    gate.add_argument("--min-latency-change-ms", type=_non_negative, default=None,
                      metavar="MS", help="a measured p50 change under this many ms is timer "
                                         "noise and never breaks the limit (default 1)")
    gate.add_argument("--markdown", default=None, metavar="PATH",
                      help="write the comparison as Markdown here (default: gate.md next to "
                           "REPORT)")
    gate.set_defaults(fn=cmd_gate)
    deploy = sub.add_parser("deploy", help="create a Prefect deployment per recipe (its "
                            "schedule: applies)")
    _deployment_options(deploy)
    deploy.add_argument("--work-pool", default=None, metavar="NAME",
                       help="a Prefect work pool whose workers run the deployments "
                            "(default: none; `orchestrator serve` runs them)")
    deploy.set_defaults(fn=cmd_deploy)
    serve = sub.add_parser("serve", help="serve every recipe's deployment from this process "
                           "(Prefect's serve) until Ctrl-C")
    _deployment_options(serve)
    serve.add_argument("--limit", type=bounded_flag("concurrent_runs"), default=1, metavar="N",
                       help="runs at a time (default 1: a run already uses every core)")
    serve.set_defaults(fn=cmd_serve)
