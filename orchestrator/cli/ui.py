"""`orchestrator ui`: the MLflow UI on a project's tracking store and the Prefect UI of the
server that its runs share, until Ctrl-C.

    orchestrator ui [RECIPE_OR_FOLDER] [--mlflow-port N] [--prefect-port N]

The project is found as runs find it (orchestrator.cache.project): the nearest folder above the
recipe (or folder, or the working directory) holding `.git` or `pyproject.toml`. MLflow's
UI is `mlflow server` on that project's `mlruns/mlflow.db` (or MLFLOW_TRACKING_URI), one
worker, without telemetry or background jobs. Prefect's UI is served by the local server
runs share (flow/local_server.py), whose database is the project's own
(.orchestrator/prefect.db), so that it lists this project's flow runs only: attached with a
lease, so that it stays up while the UI is open, or started when none runs. Ctrl-C or
SIGTERM stops what this command started and nothing else: the MLflow server, and the
Prefect server unless a run is using it by then.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from orchestrator.errors import OrchestratorError

MLFLOW_DEFAULT_PORT = 5000  # MLflow's own default, when it is free
START_TIMEOUT_S = 180.0  # MLflow imports for ~10 s on a busy 2-core machine
# the classic experiment-tracking view, not the GenAI one MLflow 3 opens by default
CLASSIC_VIEW = "workflowType=machine_learning"


class UiError(OrchestratorError):
    """A dashboard could not be started or stopped answering."""


class _Stop(BaseException):
    """Ctrl-C or SIGTERM: stop what was started."""


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise _Stop while the body runs (a process started in the
    background may inherit SIGINT ignored: install the handler it relies on)."""
    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _signals_held() -> Iterator[None]:
    """While stopping: a second Ctrl-C must not leave a server half stopped."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """Status and body of a GET (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def _tail(log: IO[bytes]) -> str:
    log.flush()
    log.seek(0)
    return log.read().decode(errors="replace").strip()[-1500:]


def _die_with_parent() -> None:
    """In the MLflow server's process: end it if `orchestrator ui` is killed (SIGKILL
    runs no cleanup). Linux only; elsewhere Ctrl-C and SIGTERM still stop it."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1  # noqa: N806  (the name from <sys/prctl.h>)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class MlflowUi:
    """`mlflow server` on a tracking store, in a process group of its own."""

    base_url: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]

    @classmethod
    def start(cls, tracking_uri: str, artifacts: Path | None, port: int,
              cwd: Path) -> MlflowUi:
        env = {**os.environ,
               # the store by environment, not argv: ps shows argv, and a URI may hold a
               # password
               "MLFLOW_BACKEND_STORE_URI": tracking_uri,
               "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
               # no job runner (huey) beside the server: the UI reads, it runs no jobs
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                   "--port", str(port), "--workers", "1"]
        if artifacts is not None:  # our own store: new experiments' artifacts go there too
            command += ["--default-artifact-root", artifacts.as_uri(),
                        "--artifacts-destination", str(artifacts)]
        log = tempfile.TemporaryFile()  # noqa: SIM115  (a file never blocks a chatty server)
        process = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=_die_with_parent)
        return cls(f"http://127.0.0.1:{port}", process, log)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Block until the server answers its health check; UiError if it exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UiError(f"the MLflow UI exited while starting:\n{_tail(self.log)}")
            if _get(f"{self.base_url}/health", timeout=2)[0] == 200:
                return
            time.sleep(0.2)
        raise UiError(f"the MLflow UI did not answer at {self.base_url} in {timeout:.0f} s:"
                      f"\n{_tail(self.log)}")

    def experiment(self, name: str) -> dict[str, Any] | None:
        """The experiment `name` as MLflow's REST API gives it (None when there is none)."""
        query = urllib.parse.urlencode({"experiment_name": name})
        status, body = _get(f"{self.base_url}/api/2.0/mlflow/experiments/get-by-name?{query}")
        return json.loads(body)["experiment"] if status == 200 else None

    def experiment_id(self, name: str) -> str | None:
        """The id of the experiment `name` (None when it has none yet)."""
        found = self.experiment(name)
        return None if found is None else str(found["experiment_id"])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to its process group (the CLI and its uvicorn), SIGKILL what is left."""
        group = self.process.pid  # its own session: the group id is its pid
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(group, signal.SIGKILL)  # a worker that ignored SIGTERM
        except ProcessLookupError:
            pass
        self.process.wait()
        self.log.close()


def mlflow_url(base_url: str, experiment_id: str | None, key_metrics: bool = False) -> str:
    """The runs of `experiment_id` in the classic view (with `key_metrics`, in the saved
    view whose columns are the key metrics: tracking.key_metrics_view), else the
    experiments list."""
    from orchestrator.tracking.common import KEY_METRICS_VIEW, VIEW_QUERY

    if experiment_id is None:
        return f"{base_url}/#/experiments?{CLASSIC_VIEW}"
    view = f"&{VIEW_QUERY}={KEY_METRICS_VIEW}" if key_metrics else ""
    return f"{base_url}/#/experiments/{experiment_id}/runs?{CLASSIC_VIEW}{view}"


def _local_store(uri: str) -> Path | None:
    """The database file of a `sqlite:///` tracking URI (None for other stores)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def recipe_name(path: Path) -> str:
    """The recipe's `name`, read with the recipe loader's limits but not validated: the
    dashboards show the runs of a recipe that no longer validates, too."""
    from orchestrator.spec.yaml_reader import load_yaml

    name = load_yaml(path).data.get("name")
    if not isinstance(name, str) or not name:
        raise OrchestratorError("the recipe has no `name`, which names its MLflow "
                                "experiment", file=str(path), field="name")
    return name


def _check_port(port: int | None, option: str) -> None:
    from orchestrator.flow.local_server import PortTaken, port_is_free

    if port is not None and not port_is_free(port):
        raise PortTaken(port, option)


def _pick_mlflow_port(requested: int | None) -> int:
    from orchestrator.flow.local_server import free_port, port_is_free

    if requested is not None:
        return requested  # checked to be free up front
    return MLFLOW_DEFAULT_PORT if port_is_free(MLFLOW_DEFAULT_PORT) else free_port()


@dataclass
class Dashboards:
    """What `orchestrator ui` started or attached to, and how to stop it."""

    mlflow: MlflowUi | None = None
    prefect: Any = None  # local_server.LocalServer, when no PREFECT_API_URL is set
    home: Path | None = None

    def stop(self, say: Callable[[str], None]) -> None:
        """Stop what was started here; leave a Prefect server that a run uses now."""
        from orchestrator.flow import local_server
        if self.mlflow is not None:
            self.mlflow.stop()
            say("stopped the MLflow UI")
            self.mlflow = None
        server, self.prefect = self.prefect, None
        if server is None:
            return
        server.release()  # our lease; a server for the UI alone is stopped here
        if not (server.started_here and server.lingers) or self.home is None:
            if server.started_here:
                say("stopped the Prefect server")
            return
        try:
            stopped = local_server.stop_server(self.home)
        except local_server.PrefectServerError:  # a run attached to it meanwhile
            say(f"left the Prefect server at {local_server.ui_url(server.api_url)} "
                "running: a run is using it (it stops by itself once unused)")
            return
        if stopped is not None:
            say("stopped the Prefect server")


def cmd_ui(args: argparse.Namespace) -> int:
    """Start both dashboards, print their addresses, serve until Ctrl-C or SIGTERM."""
    def say(text: str) -> None:
        print(text, flush=True)  # read through a pipe by scripts and tests

    dashboards = Dashboards()
    try:
        with _stop_on_signals():
            try:
                return _open(args, dashboards, say)
            except OrchestratorError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return exc.exit_code
            finally:
                with _signals_held():
                    dashboards.stop(say)
    except _Stop:  # also when it came while an error was being printed
        return 0


def _open(args: argparse.Namespace, dashboards: Dashboards,
          say: Callable[[str], None]) -> int:
    from orchestrator.cache import project
    from orchestrator.flow import local_server
    target = Path(args.target) if args.target else None
    if target is not None and not target.exists():
        raise OrchestratorError("no such recipe file or project folder", file=str(target))
    recipe = recipe_name(target) if target is not None and target.is_file() else None
    _check_port(args.mlflow_port, "--mlflow-port")  # before anything starts
    own_prefect = os.environ.get("PREFECT_API_URL")
    if not own_prefect:
        _check_port(args.prefect_port, "--prefect-port")
    root = project.project_root(target)
    uri = project.tracking_uri(root)
    # both servers boot at once (each imports for seconds), then both are waited for
    _launch_mlflow(dashboards, uri, args.mlflow_port, root)
    if not own_prefect:
        dashboards.home = project.local_home(root)
        dashboards.prefect = local_server.attach_for_ui(dashboards.home, args.prefect_port)
    lines = _mlflow_lines(dashboards, uri, recipe)
    lines += _prefect_lines(dashboards, own_prefect, args.prefect_port)
    say("\n".join([*lines, "Ctrl-C stops what this command started."]))
    return _watch_until_stopped(dashboards)


def _launch_mlflow(dashboards: Dashboards, uri: str, port: int | None, root: Path) -> None:
    """Start `mlflow server` on a local tracking store (a tracking server has its UI)."""
    if uri.startswith(("http://", "https://")):
        return
    db = _local_store(uri)
    if db is not None and not db.is_file():
        from orchestrator.formatting import command_hint

        raise OrchestratorError("no MLflow runs here yet; run a recipe first "
                                f"({command_hint('run', 'RECIPE')})", file=str(db))
    artifacts = db.parent / "artifacts" if db is not None else None
    dashboards.mlflow = MlflowUi.start(uri, artifacts, _pick_mlflow_port(port), root)


def _mlflow_lines(dashboards: Dashboards, uri: str, recipe: str | None) -> list[str]:
    """Wait for the MLflow UI; the lines that say where it is and what it shows."""
    from orchestrator.redaction import redact
    from orchestrator.tracking.common import KEY_METRICS_VIEW, SAVED_VIEW_TAG

    if dashboards.mlflow is None:
        return [f"MLflow   {redact(uri).rstrip('/')}/#/experiments?{CLASSIC_VIEW}",
                "         your MLFLOW_TRACKING_URI's server"]
    dashboards.mlflow.wait_ready()
    found = dashboards.mlflow.experiment(recipe) if recipe else None
    experiment = None if found is None else str(found["experiment_id"])
    # the key metrics as columns, where a run has saved that view (MLflow: an unknown one
    # is an error on the page)
    view = found is not None and any(tag.get("key") == SAVED_VIEW_TAG + KEY_METRICS_VIEW
                                     for tag in found.get("tags") or [])
    where = f"tracking {redact(uri)}"
    if recipe is None:
        what = f"the experiments in {where}"
    elif experiment is None:
        what = f"no experiment {recipe!r} yet (run the recipe first): all experiments in {where}"
    else:
        what = f"experiment {recipe!r} in {where}"
    return [f"MLflow   {mlflow_url(dashboards.mlflow.base_url, experiment, view)}",
            f"         {what}"]


def _prefect_lines(dashboards: Dashboards, own: str | None, port: int | None) -> list[str]:
    """Wait for the Prefect server; the lines that say where its runs page is."""
    from orchestrator.flow import local_server
    if own:
        unused = f" (--prefect-port {port} not used)" if port is not None else ""
        return [f"Prefect  {local_server.ui_url(own)}runs",
                f"         your PREFECT_API_URL's server{unused}"]
    server = dashboards.prefect
    server.wait_ready(START_TIMEOUT_S)
    ui = local_server.ui_url(server.api_url)
    if server.started_here:
        note = ("started for runs to share; it stops with this command unless a run uses "
                "it then" if server.lingers else "started for this command")
    else:
        note = "the server the runs share (started by a run, left running)"
        if port is not None and f":{port}/" not in ui:
            note += f"; it was running already, so --prefect-port {port} is not used"
    if _get(f"{ui}ui-settings")[0] != 200:
        from orchestrator.formatting import command_hint

        note += ("; it serves no UI (PREFECT_UI_ENABLED is off?): stop it with "
                 f"`{command_hint('server', 'stop')}` and run this again")
    return [f"Prefect  {ui}runs", f"         {note}"]


def _watch_until_stopped(dashboards: Dashboards) -> int:
    """Until a signal: watch that the MLflow UI keeps running."""
    from orchestrator.flow.local_server import pid_alive

    warned = False
    while True:
        time.sleep(0.5)
        if dashboards.mlflow is not None and dashboards.mlflow.process.poll() is not None:
            tail = _tail(dashboards.mlflow.log)
            dashboards.mlflow.log.close()
            dashboards.mlflow = None
            raise UiError(f"the MLflow UI exited:\n{tail}")
        server = dashboards.prefect
        if server is not None and not warned and not pid_alive(server.pid):
            warned = True
            from orchestrator.formatting import command_hint

            print(f"warning: the Prefect server stopped ({command_hint('server', 'stop')}?); "
                  "the next run starts a new one", file=sys.stderr, flush=True)


def add_parsers(sub: Any) -> None:
    """Register `ui` on the CLI's subparsers."""
    ui = sub.add_parser("ui", help="open the MLflow and Prefect dashboards of a project "
                        "(until Ctrl-C)")
    ui.add_argument("target", nargs="?", metavar="RECIPE_OR_FOLDER",
                    help="a recipe (opens its experiment) or a folder of the project "
                         "(default: the working directory)")
    ui.add_argument("--mlflow-port", type=_port, default=None, metavar="N",
                    help=f"the MLflow UI's port (default {MLFLOW_DEFAULT_PORT}, or a free "
                         "one when that is taken)")
    ui.add_argument("--prefect-port", type=_port, default=None, metavar="N",
                    help="the port of the Prefect server when this command starts it "
                         "(default: a free one); a running one keeps its port")
    ui.set_defaults(fn=cmd_ui)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return value
