"""Shared fixtures: the digits example, one Prefect server per session, MLflow in tmp."""

from __future__ import annotations

import base64
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import prefect_session_server
from support.project_env import new_mlflow_database

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# recipes/digits.yaml encrypts its mobile variant: a fresh test key for this session (tests
# that need no key, or another one, set or delete it with monkeypatch)
os.environ.setdefault("ORCHESTRATOR_MODEL_KEY", base64.b64encode(os.urandom(32)).decode())


@pytest.fixture(scope="session")
def digits_example() -> Path:
    """examples/digits with saved_model/, model.keras and data.npz (built once if missing)."""
    if not (DIGITS / "data.npz").is_file() or not (DIGITS / "saved_model").is_dir():
        sys.path.insert(0, str(DIGITS))
        import make_model

        make_model.main([])
    return DIGITS


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Python's own Ctrl-C handler (KeyboardInterrupt) for one test, restored after.

    A process started in the background by a non-interactive shell inherits SIGINT
    ignored, and Python then installs no handler: a test that raises SIGINT and expects a
    KeyboardInterrupt must install the handler it relies on."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def pytest_configure(config: pytest.Config) -> None:
    """On xdist's controlling process: start the session's one Prefect server, which its
    workers share (prefect_session_server), before it starts them (they inherit the
    variables that name it). On each worker: a Prefect home of its own (worker_prefect_home)."""
    import tempfile

    if hasattr(config, "workerinput"):
        if os.environ.get(prefect_session_server.TEMPLATE_ENV):
            folder = Path(tempfile.mkdtemp(prefix="orchestrator-prefect-home-"))
            config.stash[_WORKER_PREFECT_HOME] = folder
            os.environ["PREFECT_HOME"] = str(folder)  # before this worker imports Prefect
        return
    if (not config.getoption("numprocesses", None)
            or os.environ.get(prefect_session_server.SHARED_URL_ENV)):
        return

    folder = Path(tempfile.mkdtemp(prefix="orchestrator-prefect-"))
    process, url = prefect_session_server.start(folder)
    config.stash[_SHARED_PREFECT] = (process, folder)
    os.environ[prefect_session_server.SHARED_URL_ENV] = url
    os.environ[prefect_session_server.SHARED_LOG_ENV] = str(folder / "server.log")
    os.environ[prefect_session_server.TEMPLATE_ENV] = str(folder / "template.db")


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    home = config.stash.get(_WORKER_PREFECT_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
    shared = config.stash.get(_SHARED_PREFECT, None)
    if shared is not None:
        process, folder = shared
        prefect_session_server.stop(process)
        shutil.rmtree(folder, ignore_errors=True)
        for name in (prefect_session_server.SHARED_URL_ENV,
                     prefect_session_server.SHARED_LOG_ENV,
                     prefect_session_server.TEMPLATE_ENV):
            os.environ.pop(name, None)


_SHARED_PREFECT = pytest.StashKey[tuple]()
_WORKER_PREFECT_HOME = pytest.StashKey[Path]()


@pytest.fixture(scope="session", autouse=True)
def worker_prefect_home(request: pytest.FixtureRequest) -> None:
    """The Prefect home of an xdist worker, where the local Prefect servers that its tests'
    runs start keep their database (not the user's ~/.prefect, which tests would fill): a
    copy of the session server's freshly made database, so that the first such server
    does not run Prefect's migrations. Made before the worker's first test, so before any
    server opens it."""
    home = request.config.stash.get(_WORKER_PREFECT_HOME, None)
    if home is not None and not (home / "prefect.db").exists():
        prefect_session_server.new_prefect_home(home)


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """One temporary Prefect server for the whole session (it takes ~15 s to start): with
    xdist, the one its controlling process started for every worker; else
    prefect_test_harness's. Either way this process's Prefect client points at it."""
    url = os.environ.get(prefect_session_server.SHARED_URL_ENV)
    if not url:
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=120):
            yield
        return
    import prefect.context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    prefect_session_server.wait_until_ready(
        url, os.environ.get(prefect_session_server.SHARED_LOG_ENV, ""))
    # as the harness does: the settings, also as the process-wide context (for code whose
    # context was copied before this fixture), and its logs and events sent at the end
    with temporary_settings(updates={PREFECT_API_URL: url}), \
            prefect.context._temporary_global_settings_context(  # noqa: SLF001
                prefect.context.get_settings_context()):
        yield
        _send_what_prefect_holds()


def _send_what_prefect_holds() -> None:
    """Prefect's log and event workers send in batches: what they hold goes to the server
    before this worker ends (as prefect_test_harness does before it stops its server)."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            result = APILogWorker.instance().drain()
            if inspect.isawaitable(result):
                await result
        except RuntimeError:  # never started
            pass
        result = EventsWorker.drain_all()
        if inspect.isawaitable(result):
            await result

    run_coro_as_sync(drain())


@contextmanager
def _warm_process(module: list[str], socket_name: str, env_name: str) -> Iterator[str]:
    """`python -m MODULE... SOCKET` for the session, answering on SOCKET (in a short
    private folder: a socket path's limit), named to every run in `env_name`; it ends at
    the end of its stdin."""
    import shutil
    import subprocess
    import tempfile
    import time

    folder = tempfile.mkdtemp(prefix="orchestrator-warm-")
    address = os.path.join(folder, socket_name)
    log = open(os.path.join(folder, "log"), "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen([sys.executable, "-m", *module, address],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log,
                               start_new_session=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(address) and process.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(address), (f"{' '.join(module)} did not start ({process.poll()}): "
                                     f"{Path(folder, 'log').read_text()[-2000:]}")
    os.environ[env_name] = address
    try:
        yield address
    finally:
        os.environ.pop(env_name, None)
        assert process.stdin is not None
        process.stdin.close()  # its loop ends at the end of its input
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def helper_zygote() -> Iterator[str]:
    """One warm process per session (xdist: per worker) that forks the runs' helpers. Every
    run of the session, in this process or in a CLI subprocess that inherits its
    environment, forks its tracking worker and its drawing process from it
    (orchestrator.zygote) instead of importing MLflow and matplotlib anew: about 3 s and 1 s
    of CPU per run, some 150 runs. The robustness tests' clean environments keep it
    (robust_helpers.base_env); the interrupt tests take it away, so that their runs start
    their workers the ordinary way; test_tracking_worker.py runs the worker both ways."""
    from orchestrator.zygote import SOCKET_ENV

    with _warm_process(["orchestrator.zygote"], "helpers.sock", SOCKET_ENV) as address:
        yield address


@pytest.fixture(scope="session", autouse=True)
def load_probe_zygote() -> Iterator[str]:
    """One load probe for the session (xdist: per worker), on the socket a run's Dask
    workers are given (orchestrator/measure/load_probe.py, SOCKET_ENV): every run of the
    session measures load time and memory in children it forks, as it would in children
    of its own probe, without importing TensorFlow and LiteRT in a probe of its own (about
    2 s of CPU per run that benchmarks a model, some 50 runs). The robustness tests keep it
    too; the interrupt tests and test_load_probe.py take it away: their runs start their
    own, whose end they check."""
    from orchestrator.measure.load_probe import SOCKET_ENV

    with _warm_process(["orchestrator.measure.load_probe", "--zygote"], "probe.sock",
                       SOCKET_ENV) as address:
        yield address


@pytest.fixture(params=["forked", "own process"])
def helper_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run's helpers (tracking worker, drawing process) forked by the session's zygote
    (helper_zygote), or started as processes of their own, as in a run with no zygote: a
    test that takes this fixture checks that both behave alike."""
    from orchestrator import zygote

    if request.param == "own process":
        monkeypatch.delenv(zygote.SOCKET_ENV)
    return str(request.param)


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite database with MLflow's tables made, once per session (xdist:
    per worker): making them runs MLflow's ~50 migrations, seconds of CPU per database,
    which every test's run would otherwise pay. MLflow's own code makes it, in a fresh
    process (no MLflow import in the test process)."""
    import subprocess

    database = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    code = ("import sys; from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore; "
            "SqlAlchemyStore('sqlite:///' + sys.argv[1], sys.argv[2])")
    done = subprocess.run([sys.executable, "-c", code, str(database),
                           str(database.parent / "mlruns")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return database


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_template: Path) -> Path:
    """A clean working folder with its own store and MLflow database (empty: no run, no
    experiment but MLflow's Default)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / ".orchestrator"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI",
                       new_mlflow_database(mlflow_template, tmp_path / "mlruns"))
    return tmp_path


# Test files that take minutes (a trained model, a guard search, servers), longest first, by
# the time each file took in a run of the whole suite on the project's 2-core machine.
# pytest-xdist hands out whole files in collection order (`make test`: --dist loadfile
# --no-loadscope-reorder; without the latter it orders files by their number of tests), so
# these start first and the short files fill in around them, instead of a long file
# starting last and running alone at the end.
LONGEST_FIRST = (
    "e2e/test_guard_photo_xception.py",
    "test_benchmarks_quick.py",
    "robustness/test_server_faults.py",
    "e2e/test_scale_out.py",  # next to the other file of its stack (SAME_WORKER)
    "robustness/test_device_faults.py",
    "flow/test_prefect_server.py",
    "robustness/test_object_store_faults.py",
    "e2e/test_deploy.py",
    "e2e/test_dashboards.py",
    "robustness/test_interrupts.py",
    "robustness/test_fuzz_recipes.py",
    "results/test_gate.py",
    "robustness/test_unsafe_names.py",
    "e2e/test_conv1d_heads.py",
    "results/test_plots.py",
    "e2e/test_mini_xception.py",
    "e2e/test_loading_doc.py",
    "guard/test_stand_in_stage.py",
    "e2e/test_dask.py",
    "robustness/test_dask_faults.py",
    "e2e/test_retrain_to_deploy.py",
    "e2e/test_model_builds.py",
    "robustness/test_concurrency.py",
    "e2e/test_separable_int8.py",
    "robustness/test_output_folder.py",
    "flow/test_warm_up.py",
    "e2e/test_digits.py",
    "e2e/test_device_runs.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of LONGEST_FIRST first, in that order; every other test as collected.
    The same order in every xdist worker (it must be: the workers compare collections)."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}

    def file_rank(item: pytest.Item) -> int:
        relative = Path(str(item.path)).relative_to(Path(__file__).parent).as_posix()
        return rank.get(relative, len(rank))

    items.sort(key=file_rank)  # stable: tests keep their order within a file


# Test files that share one expensive thing a worker starts for them: xdist hands each
# group to one worker as one unit (else each worker running one of them would start its own)
SAME_WORKER = {
    # tests/support/servers.py's stack: PostgreSQL, S3, Prefect and MLflow servers
    "tests/robustness/test_server_faults.py": "scale-out stack",
    "tests/e2e/test_scale_out.py": "scale-out stack",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile` with the files of SAME_WORKER each given out as one unit."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SAME_WORKER.get(file, file)

    return GroupedFileScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The scale-out stack stops after the last test of this worker that uses it, not at
    the end of the session: idle, its servers would keep taking CPU the other tests need."""
    if "stack" in item.fixturenames and (nextitem is None
                                         or "stack" not in nextitem.fixturenames):
        from support import servers

        servers.stop_shared_stack()


@pytest.fixture(scope="session")
def emulated_board() -> Path:
    """The emulated aarch64 board (`make test` builds it: tests/device_setup.sh), or a skip
    that says exactly what is missing."""
    from orchestrator.boards import emulated_board as board

    why = board.missing_setup()
    if why is not None:
        pytest.skip(f"device tests need the emulated board: {why}")
    return board.board_folder()
