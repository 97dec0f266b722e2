"""The command's exit codes: a bug is 70 (never 1, "budget gate failed"), with a traceback."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from orchestrator.cli import main as cli
from orchestrator.cli import run as run_commands
from orchestrator.errors import DataError, StageError


def _raising(exc: BaseException) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        raise exc

    return command


def test_internal_error_exits_70_with_traceback(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run_commands, "cmd_schema", _raising(RuntimeError("boom")))
    assert cli.main(["schema"]) == 70
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: boom" in err
    assert "Traceback (most recent call last)" in err
    assert "report" in err


def test_orchestrator_errors_keep_their_codes(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run_commands, "cmd_schema", _raising(StageError("bad", pipeline="p",
                                                               stage="fold")))
    assert cli.main(["schema"]) == 3
    monkeypatch.setattr(run_commands, "cmd_schema", _raising(DataError("no data", file="d.npz")))
    assert cli.main(["schema"]) == 2
    err = capsys.readouterr().err
    assert "stage p/fold failed: bad" in err and "d.npz: no data" in err
    assert "internal error" not in err and "Traceback" not in err


def test_keyboard_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run_commands, "cmd_schema", _raising(KeyboardInterrupt()))
    assert cli.main(["schema"]) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_system_exit_is_not_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_commands, "cmd_schema", _raising(SystemExit(4)))
    with pytest.raises(SystemExit) as info:
        cli.main(["schema"])
    assert info.value.code == 4
    with pytest.raises(SystemExit) as info:  # argparse's usage errors stay exit 2
        cli.main(["no-such-command"])
    assert info.value.code == 2


def test_command_result_is_returned(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schema"]) == 0
    assert '"pipelines"' in capsys.readouterr().out


@pytest.mark.usefixtures("default_sigint")  # also when run with SIGINT ignored
def test_interrupt_that_a_library_wraps_exits_130(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import signal

    def interrupted_mid_import(args: object) -> int:
        try:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C
        except KeyboardInterrupt as exc:  # what pydantic does to it inside an import
            raise ValueError("Error calling function `_ser_model`: KeyboardInterrupt") from exc
        return 0

    monkeypatch.setattr(run_commands, "cmd_validate", interrupted_mid_import)
    assert cli.main(["validate", "any.yaml"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "internal error" not in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored

    def plain_bug(args: object) -> int:
        raise ValueError("a real bug")

    monkeypatch.setattr(run_commands, "cmd_validate", plain_bug)
    assert cli.main(["validate", "any.yaml"]) == 70
    assert "internal error: ValueError: a real bug" in capsys.readouterr().err


@pytest.mark.usefixtures("default_sigint")  # also when run with SIGINT ignored
def test_a_ctrl_c_while_logging_holds_its_lock_comes_once_it_is_let_go(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A KeyboardInterrupt raised inside logging's critical section would leave its lock
    held, and every other thread that logs would then hang (a run's Prefect threads did, in
    test_interrupts). The Ctrl-C is delivered again once the lock is free."""
    import logging
    import signal
    import threading
    import time

    steps: list[str] = []

    def interrupted_inside_logging(args: object) -> int:
        with logging._lock:  # type: ignore[attr-defined]  # the module's lock, as a handler takes it
            signal.raise_signal(signal.SIGINT)  # the handler runs here, with the lock held
            steps.append("the lock was let go by its holder")
        other = threading.Thread(target=logging.getLogger("elsewhere").info, args=("x",))
        other.start()
        other.join(timeout=30)
        steps.append("another thread logged" if not other.is_alive() else "another thread hung")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the Ctrl-C comes again, now as KeyboardInterrupt
            time.sleep(0.01)
        return 0

    monkeypatch.setattr(run_commands, "cmd_validate", interrupted_inside_logging)
    assert cli.main(["validate", "any.yaml"]) == 130
    assert steps == ["the lock was let go by its holder", "another thread logged"]
    assert "interrupted" in capsys.readouterr().err
    assert not logging._lock._is_owned()  # type: ignore[attr-defined]


def test_a_ctrl_c_as_the_command_ends_is_quiet(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C can come as the command's own handler is being taken away (the command has
    returned): exit 130 and one line, not a traceback (test_interrupts met it)."""
    from contextlib import contextmanager

    @contextmanager
    def interrupted_on_the_way_out():  # noqa: ANN202
        yield lambda: False
        raise KeyboardInterrupt  # where signal.signal() restores Python's own handler

    monkeypatch.setattr(cli, "_interrupts_noted", interrupted_on_the_way_out)
    monkeypatch.setattr(run_commands, "cmd_validate", lambda args: 0)
    assert cli.main(["validate", "any.yaml"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_a_run_started_with_sigint_ignored_leaves_it_ignored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A background job (nohup, `cmd &` from a script) inherits SIGINT ignored: the CLI
    neither installs a Ctrl-C handler nor leaves one behind."""
    import signal

    seen: list[object] = []

    def validate(args: object) -> int:
        seen.append(signal.getsignal(signal.SIGINT))
        return 0

    monkeypatch.setattr(run_commands, "cmd_validate", validate)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert cli.main(["validate", "any.yaml"]) == 0
        assert seen == [signal.SIG_IGN]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_reader_that_stops_early_is_no_internal_error() -> None:
    """`orchestrator schema | head -1`: the closed pipe ends the command quietly, exit 0."""
    import subprocess
    import sys

    command = (f"{sys.executable} -m orchestrator schema | head -1; "
               "exit ${PIPESTATUS[0]}")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{"
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


def test_validate_counts_the_stages_the_recipe_lists_then_those_added_by_default() -> None:
    """`validate recipes/digits.yaml` counts the stages its YAML lists (22), and names the
    one a run adds by default (int8 › compact_names) apart from them, as the user runs it."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "digits.yaml"
    raw = yaml.safe_load(recipe.read_text())
    listed = sum(len(p["stages"]) for p in raw["pipelines"].values())
    done = subprocess.run([sys.executable, "-m", "orchestrator", "validate", str(recipe)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"{recipe}: ok ({len(raw['pipelines'])} pipelines, {listed} stages + 1 added by "
        f"default: int8 › compact_names; {len(raw['targets'])} targets)")


def test_validate_without_added_stages_says_none(tmp_path: object) -> None:
    """A recipe that gets no default stage: the plain count, singular where it is one."""
    from pathlib import Path

    from orchestrator.recipe.loading import load_recipe

    folder = Path(str(tmp_path))
    recipe = folder / "r.yaml"
    model = Path(__file__).resolve().parents[2] / "examples" / "digits" / "saved_model"
    recipe.write_text(f"version: 1\nname: r\nmodel: {{path: {model}}}\n"
                      "targets: [{name: t, device: phone-2016}]\n"
                      "pipelines: {fp32: {stages: [freeze]}}\n")
    assert run_commands.validate_summary(load_recipe(recipe)) == "1 pipeline, 1 stage, 1 target"


def test_ctrl_c_as_the_process_exits_says_interrupted_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Review of issue 39: a Ctrl-C while the interpreter exits (a double Ctrl-C) says
    `interrupted` by the one rule, once per command (say_interrupted), whatever the code:
    a command that exited 130 without saying it says it now, one that said it not again."""
    import os
    import signal

    from orchestrator.cli.common import interrupted_said

    def exits(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exits)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for code, said_before, printed in ((130, False, "interrupted\n"), (0, True, ""),
                                           (0, False, "interrupted\n")):
            interrupted_said[:] = [True] if said_before else []
            signal.signal(signal.SIGINT, signal.default_int_handler)
            cli._exit_at_once_on_ctrl_c(code)
            with pytest.raises(SystemExit) as ended:
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            assert ended.value.code == 130
            assert capsys.readouterr().err == printed, (code, said_before)
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupted_said.clear()
