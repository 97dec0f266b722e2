"""Helpers shared by the robustness suite (issue 9): recipes built in tmp, the CLI run in
process or as a subprocess, and the checks every hostile input must pass.

The promise under test: a bad recipe, model or data gets exit 2, stderr starting with
`error: ` and naming the file (and line where it comes from YAML), never a traceback or
exit 70, and nothing written to `-o DIR` or the store's cache.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator import zygote
from orchestrator.measure import load_probe

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"
RECIPES = ROOT / "recipes"
PYTHON = sys.executable

# A generous hang detector for commands that must fail while loading (no timed assertion:
# a working loader answers in about a second; this only keeps a hang from stalling CI).
LOAD_TIMEOUT_S = 30
# A whole `orchestrator run` subprocess (TensorFlow, Prefect and MLflow imports included).
RUN_TIMEOUT_S = 180
# Address-space cap for subprocesses fed hostile input (alias bombs, /dev/zero): a bug
# then dies with MemoryError instead of taking the machine's memory. TensorFlow maps
# about 2 GB of address space.
VALIDATE_MEMORY_CAP = 2 << 30
RUN_MEMORY_CAP = 8 << 30

# recipes/digits.yaml's `mobile` pipeline encrypts its model: a throwaway key for the
# session (as `orchestrator keygen` would make), never a real one.
TEST_MODEL_KEY = base64.b64encode(os.urandom(32)).decode()

# Outcomes of every fuzzed example, printed at the end of the session (conftest).
FUZZ_OUTCOMES: Counter[str] = Counter()
FUZZ_FAILURES: list[str] = []


# ---------------------------------------------------------------- recipes


def digits_recipe(**changes: Any) -> dict[str, Any]:
    """recipes/digits.yaml as data, with absolute paths (so it can live in any folder)."""
    data = yaml.safe_load((RECIPES / "digits.yaml").read_text())
    data["model"]["path"] = str(DIGITS / "saved_model")
    for role in ("representative", "evaluation"):
        data["data"][role]["source"] = str(DIGITS / "data.npz")
    data.update(changes)
    return data


def small_recipe(name: str = "robust", stages: Sequence[Any] = ("freeze",),
                 evaluation: bool = False, **extra: Any) -> dict[str, Any]:
    """A fast recipe: the digits SavedModel through a few stages, one pipeline."""
    data: dict[str, Any] = {"version": 1, "name": name,
                            "model": {"path": str(DIGITS / "saved_model")}}
    if evaluation:
        data["data"] = {"evaluation": {"source": str(DIGITS / "data.npz"),
                                       "inputs": "x_test", "labels": "y_test"}}
    data["pipelines"] = {"fp32": {"stages": list(stages)}}
    data.update(extra)
    return data


def write_yaml(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    """1-based line of the `occurrence`-th line containing `needle`."""
    seen = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            seen += 1
            if seen == occurrence:
                return number
    raise AssertionError(f"{needle!r} not in the recipe text")


def mentions_number(text: str, number: int) -> bool:
    """Whether `text` names `number` (as 1000000, 1,000,000 or 1_000_000) as a whole
    number: 32 is not named by 132, which a temporary path such as pytest-132 holds."""
    forms = "|".join(re.escape(form) for form in (str(number), f"{number:,}", f"{number:_}"))
    return re.search(rf"(?<!\d)(?<!\d[,_])(?:{forms})(?!\d|[,_]\d)", text) is not None


# ---------------------------------------------------------------- file system state


def cache_entries(home: Path) -> set[Path]:
    """Visible cache entries (cache/xx/<key>): temporary folders start with a dot."""
    cache = home / "cache"
    if not cache.is_dir():
        return set()
    return {entry for shard in cache.iterdir() if shard.is_dir() and not shard.name.startswith(".")
            for entry in shard.iterdir() if not entry.name.startswith(".")}


def partial_cache_entries(home: Path) -> list[Path]:
    """Entries a reader could mistake for complete: visible, but no result.json."""
    return sorted(e for e in cache_entries(home) if not (e / "result.json").is_file())


def tree(folder: Path, skip: Sequence[str] = ()) -> dict[str, int]:
    """Every path under `folder` (relative) with its size; `skip`: top-level names left out.
    Does not follow symlinks."""
    found: dict[str, int] = {}
    if not os.path.lexists(folder):
        return found
    for dirpath, dirnames, filenames in os.walk(folder):
        rel_dir = Path(dirpath).relative_to(folder)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skip]
            filenames = [f for f in filenames if f not in skip]
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            try:
                size = path.lstat().st_size if not path.is_dir() else -1
            except OSError:
                size = -2
            found[str(rel_dir / name)] = size
    return found


def output_is_whole_or_absent(out: Path) -> str:
    """'absent' (nothing of a run), 'whole' (report.json and every variant folder it lists,
    each with its model.pb), else raises AssertionError describing what is half there."""
    if not out.exists() or not any(out.iterdir()):
        return "absent"
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    hidden = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
    report_path = out / "report.json"
    if not report_path.is_file():
        assert not visible, f"{out} holds {visible} (hidden: {hidden}) but no report.json"
        return "absent"
    report = json.loads(report_path.read_text())  # a half-written report fails here
    for name, variant in report["variants"].items():
        model = out / variant.get("artifact", f"{name}/model.pb")
        assert model.is_file() and model.stat().st_size > 0, f"{model} missing or empty"
    for name in report.get("page_files") or []:  # report.html and its pictures
        assert (out / name).is_file(), f"{out / name} missing"
    extra = set(visible) - {"report.json", *report["variants"], *report.get("page_files", [])}
    assert not extra, f"{out} holds {sorted(extra)} that report.json does not list"
    return "whole"


# ---------------------------------------------------------------- error checks


_NOISE = re.compile(r"^(\d{4}[/-]\d\d[/-]\d\d|\d\d:\d\d:\d\d|[IWE]\d{4} |WARNING|INFO|"
                    r"WARNING:|E0000|W0000|I0000|\s*$)")


_PROGRESS = re.compile(r"^\s+[✓✗·…⠀-⣿]|^\s+\S+ › ")


def check_clean_error(code: int, err: str, *names: str | Path, exit_code: int = 2,
                      progress_ok: bool = False) -> str:
    """The exit code, an `error: ` line naming each of `names`, no traceback. Returns the
    error line. Lines a library logged before ours (timestamps, absl) are tolerated, and
    with `progress_ok` (an error found mid-run) the stage progress lines."""
    assert code != 70, f"internal error (exit 70):\n{err[-4000:]}"
    assert "Traceback" not in err, err[-4000:]
    assert code == exit_code, f"exit {code}, expected {exit_code}:\n{err[-4000:]}"
    lines = err.splitlines()
    index = next((i for i, line in enumerate(lines) if line.startswith("error: ")), None)
    assert index is not None, f"no line starting with 'error: ' in stderr:\n{err[-4000:]}"
    before = [line for line in lines[:index] if not _NOISE.match(line)
              and not (progress_ok and _PROGRESS.match(line))]
    assert not before, f"stderr does not start with 'error: ': {before[:5]}"
    message = "\n".join(lines[index:])
    for name in names:
        assert str(name) in message, f"the error does not name {str(name)!r}:\n{message[:3000]}"
    return message


# ---------------------------------------------------------------- running the CLI


def cli_in_process(args: Sequence[str], capsys: Any) -> tuple[int, str, str]:
    """`orchestrator ARGS` in this process (`cli.main`), with SIGINT at its default."""
    from orchestrator.cli import main as cli
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = cli.main([str(a) for a in args])
    finally:
        signal.signal(signal.SIGINT, previous)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# The child restores SIGINT's default handler itself: pytest (or CI) may have started us
# with SIGINT ignored, which a child would inherit.
_CHILD = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "from orchestrator.cli.main import console_main; sys.argv[0] = 'orchestrator'; "
          "console_main()")


# the sockets of the session's warm processes: the helpers' zygote, the load probe
SESSION_HELPERS = (zygote.SOCKET_ENV, load_probe.SOCKET_ENV)


def without_session_helpers(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a run that starts its own tracking worker, drawing process and load
    probe, as a run anywhere else does (what an interrupt must end with the run)."""
    return {k: v for k, v in env.items() if k not in SESSION_HELPERS}


def base_env(home: Path, tracking_uri: str | None, prefect_api_url: str | None,
             **extra: str) -> dict[str, str]:
    """A subprocess environment with its own store and tracking, C.UTF-8 and UTC; the
    session's warm processes kept (tests/conftest.py: helper_zygote, load_probe_zygote),
    unless a test needs the run's own (without_session_helpers)."""
    env = {k: v for k, v in os.environ.items() if k in SESSION_HELPERS
           or not k.startswith(("PREFECT_API", "MLFLOW_", "ORCHESTRATOR_"))}
    env.update(LC_ALL="C.UTF-8", LANG="C.UTF-8", TZ="UTC", PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1", ORCHESTRATOR_HOME=str(home),
               TF_CPP_MIN_LOG_LEVEL="2", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_LEVEL="WARNING", ORCHESTRATOR_MODEL_KEY=TEST_MODEL_KEY)
    if tracking_uri is not None:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    if prefect_api_url is not None:
        env["PREFECT_API_URL"] = prefect_api_url
    env.update(extra)
    return env


_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def drop_file_access_override() -> None:
    """Drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set: a root process
    exec'd after this is refused files that chmod 000 (or a folder's mode) forbids, like
    any other user. Raises OSError where the kernel does not allow it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))


def _preexec(memory_cap: int | None, unprivileged: bool = False):  # noqa: ANN202
    def setup() -> None:
        import resource

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        if memory_cap is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))
        if unprivileged:
            drop_file_access_override()

    return setup


@dataclass
class Done:
    code: int | None  # None: killed after the timeout (a hang)
    out: str
    err: str
    seconds: float


def cli_subprocess(args: Sequence[str | Path], env: Mapping[str, str], cwd: Path,
                   timeout: float = LOAD_TIMEOUT_S, memory_cap: int | None = None,
                   unprivileged: bool = False) -> Done:
    """`orchestrator ARGS` as a child in its own session; on timeout, its whole process
    group is killed and `code` is None. `unprivileged`: without root's power to read and
    write any file (see drop_file_access_override)."""
    started = time.monotonic()
    process = subprocess.Popen([PYTHON, "-c", _CHILD, *map(str, args)], env=dict(env),
                               cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                               preexec_fn=_preexec(memory_cap, unprivileged))
    try:
        out, err = process.communicate(timeout=timeout)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        kill_group(process)
        out, err = process.communicate()
        code = None
    return Done(code, out, err, time.monotonic() - started)


def kill_group(process: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def assert_no_hang(done: Done, what: str) -> None:
    assert done.code is not None, (f"{what}: still running after the hang detector's "
                                   f"{done.seconds:.0f} s; stderr:\n{done.err[-3000:]}")


# ---------------------------------------------------------------- FIFOs


@contextmanager
def fifo_unblocker(path: Path, after_s: float = LOAD_TIMEOUT_S) -> Iterator[list[bool]]:
    """While the block runs: if it is still running after `after_s`, open the FIFO at
    `path` for writing and close it, so a reader stuck on it sees end of file. Yields a
    list that holds True if that had to be done (the code under test hung)."""
    fired: list[bool] = []
    done = threading.Event()

    def watch() -> None:
        if done.wait(after_s):
            return
        fired.append(True)
        for _ in range(3):  # a reader may reopen it
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass
            if done.wait(1.0):
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield fired
    finally:
        done.set()
        thread.join(5)


# ---------------------------------------------------------------- reports


# Fields that differ between two correct runs of the same recipe: timings, measured
# memory, run ids, whether a stage came from the cache (another run may have stored it).
PER_RUN_KEYS = {"latency_ms", "latency_p50_ms", "latency_mean_ms", "seconds", "cached",
                "mlflow_run_id", "run_id", "ram_bytes", "ram_source", "peak_memory_bytes",
                "load_seconds", "started", "finished", "duration_s", "elapsed_s",
                "threads_matrix", "profile", "latency_runs_ms",
                # device estimates are calibrated on this run's host timings of the file
                "est_latency_ms", "estimate", "estimate_basis"}


# ... and by their names: load times, RSS, measured latencies and memory, and the device
# estimates (max_* and min_* are budgets, the same in every run).
_PER_RUN_NAME = re.compile(r"rss|growth|load|seconds|time|peak|memory|_ms$|_s$|_at$")


def is_per_run(key: str) -> bool:
    return (key in PER_RUN_KEYS or key.startswith("est_latency_ms")
            or (bool(_PER_RUN_NAME.search(key.lower())) and not key.startswith(("max_", "min_"))))


# Every timing quoted in text ("6.30 µs p50", "est. 2.13 ms") comes from this run's
# measurements (estimates are calibrated on them), and so does whether a measurement
# disagrees with the estimate by more than noise on a loaded machine.
# The unit goes too: one run's 997 µs is another's 1.01 ms.
_MEASURED_IN_TEXT = re.compile(r"\d+(?:\.\d+)?(?: (?:ms|µs)\b|(?= vs ))")
_DISAGREEMENT = re.compile(r"\. Measured on this host it is the faster one .*? disagree")


def comparable_report(report: Any, out_dir: Path | None = None) -> Any:
    """The report without per-run fields (recursively), output paths made generic, host
    latencies quoted in text masked."""
    if isinstance(report, dict):
        return {k: comparable_report(v, out_dir) for k, v in report.items()
                if not is_per_run(str(k))}
    if isinstance(report, list):
        return [comparable_report(v, out_dir) for v in report]
    if isinstance(report, str):
        masked = _MEASURED_IN_TEXT.sub("<time>", _DISAGREEMENT.sub("", report))
        return masked.replace(str(out_dir), "<OUT>") if out_dir is not None else masked
    return report


# ---------------------------------------------------------------- runs to interrupt


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    stderr_path: Path
    stdout_path: Path
    started: float

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")


def wait_all(runs: Sequence[Started], timeout: float) -> list[int]:
    """The exit codes of runs started together; whatever is left of them killed after."""
    codes = []
    try:
        for run in runs:
            codes.append(run.process.wait(timeout=timeout))
    finally:
        for run in runs:
            kill_group(run.process)
    return codes


def start_cli(args: Sequence[str | Path], env: Mapping[str, str], cwd: Path,
              logs: Path) -> Started:
    """`orchestrator ARGS` started in its own session (process group), SIGINT at its
    default handler; stdout and stderr to files under `logs`. Python's faulthandler is on
    in it, so that a run that hangs can show where (dump_stacks_and_kill)."""
    logs.mkdir(parents=True, exist_ok=True)
    out_path, err_path = logs / "stdout.txt", logs / "stderr.txt"
    env = {**env, "PYTHONFAULTHANDLER": "1"}
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        process = subprocess.Popen([PYTHON, "-c", _CHILD, *map(str, args)], env=env,
                                   cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                   start_new_session=True, preexec_fn=_preexec(RUN_MEMORY_CAP))
    return Started(process, err_path, out_path, time.monotonic())


def dump_stacks_and_kill(run: Started) -> str:
    """A hung run ended: SIGABRT to each process of its session first, so that
    faulthandler writes every thread's Python stack to its stderr, then SIGKILL to what is
    left. Returns the run's stderr, stacks included."""
    for pid, _ in session_processes(run.process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGABRT)
    wait_for(lambda: run.process.poll() is not None, 10, 0.05)
    kill_group(run.process)
    run.process.wait()
    return run.stderr()


def session_processes(sid: int) -> list[tuple[int, str]]:
    """Live processes of session `sid` (pid, command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != sid:
                continue
            status = (entry / "stat").read_text()
            if status.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except (OSError, ProcessLookupError):
            continue
        found.append((int(entry.name), cmdline))
    return found


def wait_for(condition: Any, timeout: float, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())
