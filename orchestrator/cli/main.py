"""The `orchestrator` command: run, validate, gate, deploy, serve, promote, ui and more.

Exit codes (SPEC): 0 ok, 1 a budget gate failed, 2 invalid recipe/model/data, 3 a stage
failed. User errors print one clear message, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from orchestrator.cli.common import (
    command_error,
    interrupted_said,
    interrupts_seen,
    say_interrupted,
)
from orchestrator.errors import OrchestratorError


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted: tools and tests swap it,
    and a handler holding an old, closed stream would print logging errors instead."""

    @property
    def stream(self):  # type: ignore[override]  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        # lines the progress display shows already go to Prefect's run logs only
        return getattr(record, "console", True) and bool(super().filter(record))


class _NoInterruptCrash(logging.Filter):
    """Prefect's `Crash detected! Execution was aborted by an interrupt signal.` when a
    Ctrl-C ends a flow: the command says `interrupted` itself, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("Crash detected!") and "interrupt" in text)


def configure_logging() -> None:
    """Our warnings go to stderr through our own handler, not through the root logger:
    Prefect replaces the root handlers when its first flow runs."""
    engine = logging.getLogger("prefect.engine")
    if not any(isinstance(f, _NoInterruptCrash) for f in engine.filters):
        engine.addFilter(_NoInterruptCrash())
    logger = logging.getLogger("orchestrator")
    if not any(isinstance(h, _CurrentStderrHandler) for h in logger.handlers):
        handler = _CurrentStderrHandler()
        handler.setLevel(logging.WARNING)  # INFO lines go to the Prefect run's logs only
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


# The command groups, one module each with `add_parsers(sub)`: the commands it adds, in the
# order `orchestrator --help` lists them
COMMAND_GROUPS = (
    ("orchestrator.cli.run", "run, validate, schema, server"),
    ("orchestrator.cli.stages", "stages: every stage and its params"),
    ("orchestrator.cli.model_files", "keygen, decrypt, inspect"),
    ("orchestrator.cli.operations", "gate, deploy, serve"),
    ("orchestrator.cli.registry", "promote"),
    ("orchestrator.cli.ui", "ui: the dashboards"),
    ("orchestrator.cli.init", "init: a first recipe from a model"),
    ("orchestrator.cli.benchmark", "benchmark: any model file, outside a recipe"),
    ("orchestrator.cli.history", "history: the selected variant across a recipe's runs"),
    ("orchestrator.cli.device", "device check, device prepare: the boards targets measure on"),
    ("orchestrator.cli.devices", "devices: the device catalogue and its sources"),
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module, _commands in COMMAND_GROUPS:
        importlib.import_module(module).add_parsers(sub)
    return parser


# how soon a Ctrl-C that came while logging held a lock is delivered again
_INTERRUPT_RETRY_S = 0.01


def _holds_a_logging_lock() -> bool:
    """Whether this thread holds logging's module lock or one of its handlers' locks."""
    locks = [getattr(logging, "_lock", None)]
    locks += [getattr(ref(), "lock", None) for ref in list(getattr(logging, "_handlerList", []))]
    return any(lock is not None and getattr(lock, "_is_owned", lambda: False)()
               for lock in locks)


@contextmanager
def _interrupts_noted() -> Iterator[Callable[[], bool]]:
    """Remember Ctrl-C while a command runs: some libraries wrap the KeyboardInterrupt it
    raises (pydantic, mid import) into errors of their own, which must not read as our
    bugs."""
    seen = interrupts_seen
    seen.clear()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield lambda: bool(seen)  # someone else handles Ctrl-C here
        return

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        if _holds_a_logging_lock():
            # Python runs this handler right after a C call returns, which can be the lock's
            # acquire() in logging, before its try/finally: raising there leaves the lock
            # held, and every other thread that logs (Prefect's, as it reports the crash)
            # waits forever. Ask again once the lock is let go.
            again = threading.Timer(_INTERRUPT_RETRY_S, os.kill, (os.getpid(), signum))
            again.daemon = True
            again.start()
            return
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield lambda: bool(seen)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    """Run a command. Exit codes: 0 ok, 1 budget gate failed, 2 invalid input, 3 a stage
    failed, 70 an internal error (a bug: EX_SOFTWARE, so that it never reads as 1), 130
    interrupted."""
    args = build_parser().parse_args(argv)
    configure_logging()
    interrupted_said.clear()  # `interrupted` once per command
    try:
        return _run_noting_interrupts(args)
    except KeyboardInterrupt:  # a Ctrl-C as the command ended, while its handler was
        say_interrupted()  # being taken away: still quiet
        return 130


def _run_noting_interrupts(args: argparse.Namespace) -> int:
    """The command, with its errors turned into exit codes and messages."""
    with _interrupts_noted() as interrupted:
        try:
            return args.fn(args)
        except OrchestratorError as exc:  # a command that let one through: still the user's
            return command_error(exc)
        except BrokenPipeError:  # `orchestrator schema | head`: the reader had enough
            # stdout is gone: point it at devnull so the interpreter's final flush is quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except (KeyboardInterrupt, Exception) as exc:
            # also when a library turned our KeyboardInterrupt into an error of its own
            if isinstance(exc, KeyboardInterrupt) or interrupted():
                say_interrupted()
                return 130
            # a bug: never exit 1, which means "budget gate failed"
            import traceback

            print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            print("This is a bug in orchestrator, not in your recipe: please report it with "
                  "the traceback above and the command you ran.", file=sys.stderr)
            return 70


def console_main() -> None:
    """The console script: main(), then exit without the collector's passes over the large
    heap Prefect, MLflow and TensorFlow leave (0.5-1 s that free nothing the OS would not).
    Objects are still finalized by reference counting, and atexit handlers still run."""
    import atexit

    # registered first, so run last: after every exit handler, a Ctrl-C is ignored rather
    # than left to the default action the interpreter restores as it finalizes (the
    # process would end by the signal, exit -2, not 130)
    atexit.register(_ignore_ctrl_c_from_now_on)
    try:
        code = main()
    except KeyboardInterrupt:  # a Ctrl-C as main() returned
        say_interrupted()
        code = 130
    while True:  # a Ctrl-C before the handler below is in place: interrupted all the same
        try:
            _exit_at_once_on_ctrl_c(code)
            break
        except KeyboardInterrupt:
            say_interrupted()
            code = 130
    gc.freeze()
    raise SystemExit(code)


def _ignore_ctrl_c_from_now_on() -> None:
    """The exit handlers have run and the exit code is decided: a Ctrl-C in the last
    moments of the interpreter's exit changes nothing (unless Ctrl-C is not ours here)."""
    if getattr(signal.getsignal(signal.SIGINT), "ours", False):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _exit_at_once_on_ctrl_c(code: int) -> None:
    """The command has ended; the interpreter's exit is left (exit handlers: the load
    probe's process, Prefect's and MLflow's). A Ctrl-C now (a double Ctrl-C: the first
    ended the command) ends the process at once, as quietly as the first, rather than
    interrupting an exit handler with a traceback."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return  # Ctrl-C ignored (a background job) or someone else's to handle

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        probe = sys.modules.get("orchestrator.measure.load_probe")
        if probe is not None:
            probe.kill_now()  # its own session: it would not get the terminal's Ctrl-C
        with contextlib.suppress(Exception):
            say_interrupted()  # once per command: not again if the command said it
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(130)

    on_interrupt.ours = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, on_interrupt)


if __name__ == "__main__":
    console_main()
