"""The progress display: a line per stage as it finishes (with its warnings, said once),
and a live bar while it runs."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from orchestrator.engine.node_run import NodeOutcome
from orchestrator.engine.plan import Node


class ConsoleProgress:
    """A hook (see flows.Hook) drawing progress with rich."""

    def __init__(self, total: int, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console or Console(stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
        self.task = self.progress.add_task("starting", total=total)
        self.cached_trials: dict[str, int] = {}  # pipeline -> guard trials from the cache

    def __enter__(self) -> ConsoleProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_node_start(self, node: Node) -> None:
        trial = "" if node.trial is None else f" › guard trial {node.trial}"
        self.progress.update(self.task, description=f"{node.pipeline}{trial} › {node.stage}")

    def on_node_end(self, outcome: NodeOutcome) -> None:
        node = outcome.node
        if node.trial is not None:  # a guard trial: one line per trial (on_guard_trial)
            return
        status = "[dim]cached[/]" if outcome.cached else f"{outcome.seconds:.2f} s"
        self.progress.console.print(f"  [green]✓[/] {node.pipeline} › {node.stage}  {status}")
        # a stage's warnings, said here once (the summary does not repeat them); its
        # diagnostics (per-layer errors, ops that stay float) changed nothing and call for
        # no action: report.json and report.html have them, the console does not
        for warning in outcome.warnings:  # names are long words: wrap, never cut them
            self.progress.console.print(f"    [yellow]warning:[/] {escape(warning)}",
                                        soft_wrap=True, highlight=False)
        self.progress.advance(self.task)

    def on_guard_trial(self, pipeline: str, trial: dict[str, Any]) -> None:
        """A trial that ran: its line. One whose every stage came from the cache ran
        nothing: counted, and said once in on_guard_end."""
        if trial.get("cached"):
            self.cached_trials[pipeline] = self.cached_trials.get(pipeline, 0) + 1
            return
        verdict = ("[green]meets budgets[/]" if trial["meets_budgets"]
                   else f"[dim]best so far {trial['best']}[/]")
        self.progress.console.print(
            f"  [cyan]guard[/] {pipeline}: trial {trial['trial']}/{trial['of']}  "
            f"{escape(trial['change'])}: {escape(trial['quality'])}  {verdict}", highlight=False,
            soft_wrap=True)

    def on_guard_end(self, pipeline: str, result: Any) -> None:
        """One line when the guard tried anything: how many trials came from the cache,
        which one it chose, and how much of that one the cache gave (the stage lines above
        are trial 0, the recipe's own settings; the table's `cached` is the chosen one's)."""
        tried = len(result.trials) - 1  # trial 0 is the recipe's own settings
        if tried <= 0:
            return
        chosen = next((row["trial"] for row in result.trials if row.get("chosen")), 0)
        from_cache = self.cached_trials.pop(pipeline, 0)
        trials = f"{tried} trial{'s' if tried != 1 else ''}"
        done = (f"{trials} from the cache" if from_cache == tried else f"{trials} run"
                if from_cache == 0 else f"{trials} ({from_cache} from the cache)")
        outcomes = list(result.outcomes.values())
        stages = sum(o.cached for o in outcomes)
        if chosen == 0:
            which = "chose trial 0 (the recipe's own settings)"
        elif from_cache == tried:
            which = f"chose trial {chosen}"
        else:
            which = (f"chose trial {chosen}: {stages}/{len(outcomes)} of its stages from the "
                     "cache")
        self.progress.console.print(f"  [cyan]guard[/] {pipeline}: {done}, {which}",
                                    highlight=False, soft_wrap=True)

    def on_node_error(self, node: Node, error: BaseException) -> None:
        self.progress.console.print(f"  [red]✗[/] {node.pipeline} › {node.stage}")
