"""Issue 9, Ctrl-C: a real SIGINT to the process group of `orchestrator run`, at each phase
of a run: while it loads the model, while stages run, while outputs are written. Each
time: exit 130, no traceback, `-o DIR` holds a whole set of outputs (report.json and every
variant folder it lists) or nothing of this run, the cache holds no partial entry, no
process of the run is left behind, and a re-run afterwards succeeds.

The phase is found by watching the run: the tracking worker it starts before loading the
model, cache entries appearing, the output folder appearing.

The recipe is recipes/digits.yaml cut to what the interrupts need (they are about a run's
phases, not its stages): a float pipeline and an 8-bit one from it (quantize_weights, the
stages after it, a default compact_names), a benchmark in each (its load probe starts as the
model loads) and an evaluation; no guard search, no LiteRT conversion."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.robust_helpers import (
    _NOISE,
    _PROGRESS,
    DIGITS,
    RUN_TIMEOUT_S,
    Started,
    cache_entries,
    dump_stacks_and_kill,
    kill_group,
    output_is_whole_or_absent,
    partial_cache_entries,
    session_processes,
    start_cli,
    tree,
    wait_for,
    without_session_helpers,
    write_yaml,
)

from orchestrator.cache.project import STORE_ENV

pytestmark = pytest.mark.slow

# a benchmark of a few runs, one thread, no profile; memory on (the load probe runs)
BENCHMARK = {"benchmark": {"warmup": 1, "runs": 5, "threads": 1, "profile_runs": 0}}


def recipe(tmp_path: Path) -> Path:
    """The digits model through fp32 and int8 pipelines (module docstring), in tmp_path."""
    path = tmp_path / "recipes" / "interrupts.yaml"
    if path.is_file():
        return path
    data = str(DIGITS / "data.npz")
    return write_yaml(path, {
        "version": 1, "name": "interrupts", "model": {"path": str(DIGITS / "saved_model")},
        "data": {"representative": {"source": data, "array": "x_calib", "samples": 100},
                 "evaluation": {"source": data, "inputs": "x_test", "labels": "y_test"}},
        "pipelines": {
            "fp32": {"stages": ["freeze", "strip", "fold", BENCHMARK]},
            "int8": {"from": "fp32",
                     "stages": ["quantize_weights", "quantize_nodes",
                                {"log_ranges": {"samples": 100}}, "freeze_ranges", BENCHMARK,
                                "evaluate"]}}})


def interrupt_when(condition: Callable[[Started], bool], tmp_path: Path, env: dict[str, str],
                   name: str, delay_s: float = 0.0, interval: float = 0.005,
                   again_s: float | None = None) -> tuple[int | None, str, bool]:
    """Start a run; once `condition` holds (and `delay_s` more), SIGINT its process group
    (and, with `again_s`, once more that much later: a double Ctrl-C). Returns (exit
    code, stderr, whether the signal was sent while it ran)."""
    # the run's own tracking worker, a child whose start marks the loading phase (and
    # which the interrupt must end with the run), and its own load probe, not the session's
    env = without_session_helpers(env)
    run = start_cli(["run", recipe(tmp_path), "-o", tmp_path / "out"], env, tmp_path,
                    tmp_path / name)
    sent = False
    try:
        seen = wait_for(lambda: condition(run) or run.process.poll() is not None,
                        RUN_TIMEOUT_S, interval)
        assert seen, f"{name}: the phase never came:\n{run.stderr()[-3000:]}"
        if delay_s:
            time.sleep(delay_s)
        if run.process.poll() is None:
            os.killpg(run.process.pid, signal.SIGINT)
            sent = True
            if again_s is not None:
                time.sleep(again_s)
                kill_group(run.process, signal.SIGINT)  # unless it has ended meanwhile
        code = run.process.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stacks = dump_stacks_and_kill(run)
        raise AssertionError(f"{name}: still running {RUN_TIMEOUT_S} s after the "
                             f"interrupt; its threads:\n{stacks[-8000:]}") from None
    except BaseException:
        kill_group(run.process)
        run.process.wait()
        raise
    # what the run started ends with it (the tracking worker, a per-run server)
    left = []
    if not wait_for(lambda: not session_processes(run.process.pid), 20, 0.1):
        left = session_processes(run.process.pid)
        kill_group(run.process)
    print(f"{name}: SIGINT {'sent' if sent else 'not sent (the run had ended)'} after "
          f"{time.monotonic() - run.started:.1f} s; exit {code}")
    assert not left, f"{name}: processes of the run left behind: {left}"
    return code, run.stderr(), sent


def check_after_interrupt(code: int | None, err: str, sent: bool, tmp_path: Path) -> str:
    if sent:
        assert code == 130, f"exit {code} after Ctrl-C:\n{err[-3000:]}"
    else:
        assert code == 0, err[-3000:]
    assert "Traceback" not in err, err[-4000:]
    state = output_is_whole_or_absent(tmp_path / "out")
    assert partial_cache_entries(tmp_path / ".orchestrator") == []
    print(f"-o after the interrupt: {state}")
    return state


def rerun_succeeds(tmp_path: Path, env: dict[str, str]) -> None:
    run = start_cli(["run", recipe(tmp_path), "-o", tmp_path / "out"], env, tmp_path,
                    tmp_path / "rerun")
    try:
        code = run.process.wait(timeout=RUN_TIMEOUT_S)
    finally:
        kill_group(run.process)
    assert code == 0, run.stderr()[-3000:]
    assert output_is_whole_or_absent(tmp_path / "out") == "whole"
    assert partial_cache_entries(tmp_path / ".orchestrator") == []


def test_ctrl_c_at_each_phase(digits_example: Path, tmp_path: Path,
                              run_env: dict[str, str]) -> None:
    """One store and `-o DIR`, interrupted in turn while loading (as the tracking worker
    starts, and half a second later, while the model loads), while stages run and while
    outputs are written; then a plain re-run. One test, so that the later phases reuse the
    earlier runs' cache entries (a cold run takes 15-20 s on a 2-core machine); a phase
    that fails is reported with the others at the end."""
    home, out = tmp_path / ".orchestrator", tmp_path / "out"
    failures: list[str] = []

    def phase(name: str, condition: Callable[[Started], bool], delay_s: float = 0.0,
              interval: float = 0.005, expect_absent: bool = False) -> None:
        try:
            code, err, sent = interrupt_when(condition, tmp_path, run_env, name, delay_s,
                                             interval)
            check_after_interrupt(code, err, sent, tmp_path)
            if expect_absent:
                assert output_is_whole_or_absent(out) == "absent"
        except AssertionError as exc:
            failures.append(f"{name}: {str(exc)[:9000]}")

    def loading(run: Started) -> bool:  # the tracking worker starts as the model loads
        return any("orchestrator.tracking.worker" in cmd
                   for _, cmd in session_processes(run.process.pid))

    phase("loading, as the tracking worker starts", loading, interval=0.02,
          expect_absent=True)
    phase("loading the model", loading, delay_s=0.5, interval=0.02, expect_absent=True)
    # once a first stage's entry is in the cache (the source model's may be there)
    already = len(cache_entries(home))
    phase("stages", lambda run: len(cache_entries(home)) > max(already, 1))
    phase("writing outputs", lambda run: out.exists())
    try:
        rerun_succeeds(tmp_path, run_env)
    except AssertionError as exc:
        failures.append(f"re-run: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)


def load_probes(home: Path) -> list[int]:
    """Live load probe processes (a session of their own, so not among the run's) of the
    run whose store is `home`: they inherit its environment."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit()
                    and b"orchestrator.measure.load_probe" in (entry / "cmdline").read_bytes()
                    and f"{STORE_ENV}={home}\0".encode() in (entry / "environ").read_bytes()
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# what a run that did not complete says last: what its output folder (`-o out`) holds
_HELD = re.compile(r"^(nothing was written to out|out still holds the run of "
                   r"\d{4}-\d\d-\d\d \d\d:\d\d UTC)$")


def quiet_interrupt(code: int | None, err: str, sent: bool, run: bool = False) -> None:
    """Exit 130 and one `interrupted` line (for `run`, then what its output folder holds,
    once it is known):
    no traceback, no `Exception ignored in atexit callback` (progress lines and a library's
    timestamped log lines aside), whenever the Ctrl-C came."""
    if sent:
        assert code == 130, f"exit {code} after Ctrl-C:\n{err[-3000:]}"
    assert "Traceback" not in err and "Exception ignored" not in err, err[-4000:]
    lines = [line for line in err.splitlines()
             if line.strip() and not _PROGRESS.match(line) and not _NOISE.match(line)]
    if not sent:
        assert lines == [], err[-4000:]
    elif run:  # what the folder holds, unless the Ctrl-C came before the recipe was read
        assert lines[:1] == ["interrupted"] and len(lines) <= 2, err[-4000:]
        assert all(_HELD.match(line) for line in lines[1:]), err[-4000:]
    else:
        assert lines == ["interrupted"], err[-4000:]


def test_double_ctrl_c_is_as_quiet_as_one(digits_example: Path, tmp_path: Path,
                                          run_env: dict[str, str]) -> None:
    """Issue 24: a second SIGINT to the process group 0.3 s after the first (a double
    Ctrl-C), while the model loads (the load probe still imports TensorFlow: stopping it
    at exit used to wait, and the second Ctrl-C landed in that exit handler) and while
    int8's stages run. Each time, wherever the second lands (issue 39: in the last moments
    of the interpreter's exit it ended the process by the signal, exit -2): exit 130, the
    `interrupted` line and what the output folder holds, the outputs whole or absent, no
    load probe process left behind."""
    home = tmp_path / ".orchestrator"
    failures: list[str] = []

    def loading(run: Started) -> bool:
        return any("orchestrator.tracking.worker" in cmd
                   for _, cmd in session_processes(run.process.pid))

    phases = [("loading", loading, 0.5),
              ("int8 stages", lambda run: "int8 › quantize_weights" in run.stderr(), 0.0)]
    for name, condition, delay_s in phases:
        try:
            code, err, sent = interrupt_when(condition, tmp_path, run_env, name, delay_s,
                                             interval=0.02, again_s=0.3)
            quiet_interrupt(code, err, sent, run=True)
            output_is_whole_or_absent(tmp_path / "out")
            assert partial_cache_entries(home) == []
            assert wait_for(lambda: not load_probes(home), 20, 0.1), (
                f"load probe processes left: {load_probes(home)}")
        except AssertionError as exc:
            failures.append(f"{name}: {str(exc)[:9000]}")
    assert not failures, "\n\n".join(failures)


def test_ctrl_c_while_the_command_exits(digits_example: Path, tmp_path: Path,
                                        load_env: dict[str, str]) -> None:
    """The window of the atexit traceback, made wide: a command ends while its load probe
    still imports TensorFlow (started as a run starts it), and Ctrl-C comes twice as the
    interpreter exits. Quiet: no traceback, one `interrupted` line at most, no probe left."""
    home = tmp_path / ".orchestrator"
    child = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "from orchestrator.measure import load_probe; load_probe.start(); "
             "from orchestrator.cli.main import console_main; "
             "sys.argv = ['orchestrator', 'schema']; console_main()")
    logs = tmp_path / "logs"
    logs.mkdir()
    with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
        process = subprocess.Popen([sys.executable, "-c", child],
                                   env=without_session_helpers(load_env), cwd=tmp_path,
                                   stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        assert wait_for(lambda: (logs / "out").read_bytes().rstrip().endswith(b"}")
                        or process.poll() is not None, 60, 0.01)
        kill_group(process, signal.SIGINT)
        time.sleep(0.3)
        kill_group(process, signal.SIGINT)
        code = process.wait(timeout=60)
    finally:
        kill_group(process)
    err_text = (logs / "err").read_text(errors="replace")
    # never ended by the signal (exit -2), even in the last moments of the interpreter's
    # exit: a Ctrl-C then is ignored (issue 39)
    assert code in (0, 130), f"exit {code}:\n{err_text[-3000:]}"
    quiet_interrupt(code, err_text, code == 130)
    assert wait_for(lambda: not load_probes(home), 20, 0.1), load_probes(home)


def last_line(err: str) -> str:
    """The last line of stderr that is not progress or a library's log line."""
    lines = [line for line in err.splitlines()
             if line.strip() and not _PROGRESS.match(line) and not _NOISE.match(line)]
    return lines[-1] if lines else ""


def test_a_run_that_does_not_complete_keeps_the_last_run(
        digits_example: Path, tmp_path: Path, run_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: `-o DIR` holds a complete run. A re-run interrupted by Ctrl-C while its
    stages run (exit 130), one killed by SIGKILL while it records its outputs, and one
    whose stage fails (exit 3) each leave DIR exactly as it was, and the first and last
    say so in their last line; the killed run's hidden staging folder is removed by the
    next run. `history` calls the interrupted run "interrupted". A run that completes but
    breaks a budget (exit 1) replaces DIR."""
    from orchestrator.results.output_folder import held_by
    from orchestrator.tracking.history import format_table, history_rows

    out = tmp_path / "out"
    env = without_session_helpers(run_env)

    def start(name: str, *extra: str) -> Started:
        return start_cli(["run", recipe(tmp_path), "-o", out, *extra], env, tmp_path,
                         tmp_path / name)

    def finish(run: Started) -> int:
        try:
            return run.process.wait(timeout=RUN_TIMEOUT_S)
        finally:
            kill_group(run.process)

    def visible() -> dict[str, int]:  # DIR, its marker included, without working folders
        return {path: size for path, size in tree(out).items()
                if not path.startswith((".staging-", ".old-"))}

    code = finish(start("first"))
    assert code == 0 and output_is_whole_or_absent(out) == "whole", code
    monkeypatch.chdir(tmp_path)  # the runs' working folder: `out` as they name it
    before, says = visible(), held_by(out)
    assert says.startswith("out still holds the run of 20"), says

    # Ctrl-C while int8's stages run (all of them run again)
    run = start("ctrl-c", "--no-cache")
    assert wait_for(lambda: "int8 › quantize_weights" in run.stderr()
                    or run.process.poll() is not None, RUN_TIMEOUT_S, 0.02)
    kill_group(run.process, signal.SIGINT)
    code = finish(run)
    assert code == 130, run.stderr()[-3000:]
    assert visible() == before
    assert last_line(run.stderr()) == says, run.stderr()[-3000:]
    rows = history_rows(run_env["MLFLOW_TRACKING_URI"], "interrupts", str(recipe(tmp_path)),
                        "accuracy", [], None)
    assert [row.status for row in rows] == ["FINISHED", "KILLED"]
    table = format_table(rows, "interrupts")
    assert "interrupted" in table and "run failed" not in table, table

    # SIGKILL while it records its outputs (written in the hidden staging folder)
    def staging() -> list[Path]:
        return sorted(out.glob(".staging-*"))

    run = start("kill-9")
    assert wait_for(lambda: staging() or run.process.poll() is not None, RUN_TIMEOUT_S)
    kill_group(run.process)
    finish(run)
    left = staging()
    assert left, f"the run ended before its staging folder was seen:\n{run.stderr()[-2000:]}"
    assert visible() == before

    # a stage that fails: exit 3, DIR as it was, the killed run's staging folder gone
    run = start("failing", "--set", "pipelines.int8.stages=[{transform: {transforms: nope}}]")
    code = finish(run)
    assert code == 3, run.stderr()[-3000:]
    assert last_line(run.stderr()) == says, run.stderr()[-3000:]
    assert not any(path.exists() for path in left)
    assert visible() == before and not staging()

    # a budget broken (exit 1): the run completed, and replaces DIR
    run = start("budget", "--set", "targets=[{name: tiny, device: phone-2016, "
                "budgets: {max_size_mb: 0.000001}}]")
    code = finish(run)
    assert code == 1, run.stderr()[-3000:]
    assert output_is_whole_or_absent(out) == "whole"
    assert "tiny" in json.loads((out / "report.json").read_text())["targets"]


def test_ctrl_c_in_the_last_moments_of_exit_keeps_the_exit_code(
        tmp_path: Path, load_env: dict[str, str]) -> None:
    """Issue 39: the interpreter gives SIGINT back to the system as it finalizes (after the
    exit handlers, before it frees the modules), and a Ctrl-C then ended the process by
    the signal (exit -2), the cause of `exit -2 after Ctrl-C` in the double Ctrl-C test.
    Made wide here: an object freed as `sys` is finalized says so and waits; a Ctrl-C
    then is ignored, and the command's own exit code stands."""
    child = ("import os, signal, sys, time\n"
             "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
             "class Slow:\n"
             "    def __del__(self, write=os.write, sleep=time.sleep):\n"
             "        write(2, b'finalizing\\n')\n"
             "        sleep(3)\n"
             "sys.slow_to_free = Slow()\n"
             "from orchestrator.cli.main import console_main\n"
             f"sys.argv = ['orchestrator', 'schema', '-o', {str(tmp_path / 's.json')!r}]\n"
             "console_main()\n")
    err_path = tmp_path / "err"
    with open(err_path, "wb") as err:
        process = subprocess.Popen([sys.executable, "-c", child], env=load_env, cwd=tmp_path,
                                   stdout=subprocess.DEVNULL, stderr=err,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: b"finalizing" in err_path.read_bytes()
                        or process.poll() is not None, 60, 0.01)
        kill_group(process, signal.SIGINT)
        code = process.wait(timeout=60)
    finally:
        kill_group(process)
    text = err_path.read_text(errors="replace")
    assert "finalizing" in text and code == 0, f"exit {code}:\n{text[-3000:]}"


def test_a_ctrl_c_a_library_turned_into_its_error_keeps_the_run_interrupted() -> None:
    """Review of issue 39: a Ctrl-C that a library turned into an error of its own, not
    chaining our KeyboardInterrupt, still closes the MLflow run as interrupted (KILLED):
    the command noted it (orchestrator.errors.interrupts_seen, which cli.main fills)."""
    from orchestrator.errors import interrupts_seen
    from pipelines.recipe_run import was_interrupted

    saved = list(interrupts_seen)
    try:
        interrupts_seen.clear()
        assert not was_interrupted(RuntimeError("model loading failed"))  # a failure
        assert was_interrupted(KeyboardInterrupt())
        interrupts_seen.append(signal.SIGINT)
        assert was_interrupted(RuntimeError("model loading failed"))
    finally:
        interrupts_seen[:] = saved
