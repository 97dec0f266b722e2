"""`orchestrator ui` as a user meets it: a recipe runs in a project of its own, the command
starts, and a real headless Chromium opens both printed addresses. Each page must show the
run by its name, with nothing in the browser's console.

Chromium comes from the system's packages (`apt-get install chromium`), driven by
Playwright's Python package (`pip install -e '.[browser]'`) pointed at that executable:
nothing is downloaded. Without either, the tests skip and say how to install them.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.prefect_session_server import new_prefect_home
from support.waiting import wait_for

from orchestrator.flow import local_server
from orchestrator.flow.local_server import pid_alive

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "digits-cnn"
CHROMIUM_ENV = "ORCHESTRATOR_CHROMIUM"
INSTALL = ("install Chromium from your system's packages (`apt-get install chromium`) and "
           "Playwright's Python package, which drives it (`pip install -e '.[browser]'`; no "
           "browser download is needed), or name a Chromium executable in " + CHROMIUM_ENV)
# what MLflow's own UI logs on a server without its basic-auth app: it asks who is logged
# in, and only that app answers
MLFLOW_WHOAMI = "/ajax-api/2.0/mlflow/users/current"

pytestmark = pytest.mark.slow


def chromium() -> str:
    """The Chromium executable to drive; skips (saying how to install one) without it."""
    found = os.environ.get(CHROMIUM_ENV) or next(
        (path for name in ("chromium", "chromium-browser", "google-chrome")
         if (path := shutil.which(name))), None)
    if not found:
        pytest.skip(f"no Chromium found: {INSTALL}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip(f"Playwright's Python package is not installed: {INSTALL}")
    return found







def descendants(pid: int) -> set[int]:
    """The processes below `pid`, now."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(proc.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Project:
    root: Path
    env: dict[str, str]

    def orchestrator(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "orchestrator", *args], env=self.env,
                              cwd=cwd or self.root, capture_output=True, text=True,
                              timeout=900, check=False)

    def server_state(self) -> dict[str, Any] | None:
        return local_server._read_state(self.root / ".orchestrator")


@pytest.fixture(scope="module")
def project(digits_example: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    """A project (pyproject.toml, the digits recipe and model) with one run of its fp32
    variant, tracked where runs track by default: its own `mlruns/`, `.orchestrator/`, and
    a Prefect database of its own."""
    root = tmp_path_factory.mktemp("dashboards") / "proj"
    (root / "examples" / "digits").mkdir(parents=True)
    (root / "recipes").mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'dashboards-test'\n")
    shutil.copytree(digits_example / "saved_model", root / "examples/digits/saved_model")
    shutil.copy(digits_example / "data.npz", root / "examples/digits/data.npz")
    # the digits recipe cut to its fp32 pipeline of two stages: the dashboards show a run,
    # whatever it measured
    text = (ROOT / "recipes" / "digits.yaml").read_text()
    fp32_only, found, _ = text.partition("  int8:\n")
    stages = "stages: [freeze, strip, fold, benchmark, evaluate]"
    assert found and stages in fp32_only, "recipes/digits.yaml changed: update this cut"
    (root / "recipes" / "digits.yaml").write_text(
        fp32_only.replace(stages, "stages: [freeze, evaluate]"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORCHESTRATOR_HOME", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    env.update(PREFECT_HOME=str(new_prefect_home(root.parent / "prefect-home")),
               PREFECT_SERVER_ANALYTICS_ENABLED="false",
               **{local_server.IDLE_ENV: "300"})
    made = Project(root, env)
    try:
        done = made.orchestrator("run", "recipes/digits.yaml")
        # fp32 misses the phone's size budget (exit 1): a run all the same
        assert done.returncode in (0, 1), done.stderr[-3000:]
        assert (root / "mlruns" / "mlflow.db").is_file()
        yield made
    finally:
        state = made.server_state()
        if state is not None and pid_alive(int(state["pid"])):
            os.kill(int(state["pid"]), signal.SIGTERM)


@dataclass
class Ui:
    """A running `orchestrator ui`, with what it printed."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)

    @classmethod
    def start(cls, project: Project, *args: str, cwd: Path | None = None) -> Ui:
        process = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", *args],
                                   env=project.env, cwd=cwd or project.root, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        ui = cls(process)
        threading.Thread(target=ui._read, daemon=True).start()
        return ui

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, start: str, deadline_s: float = 300.0) -> str:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                line = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            if line.startswith(start):
                return line
        pytest.fail(f"`orchestrator ui` printed no line starting {start!r}:\n"
                    + "\n".join(self.lines))

    def url(self, dashboard: str) -> str:
        return next(line.split()[1] for line in self.lines if line.startswith(dashboard))

    def stop(self, sig: int) -> int:
        """Send `sig`; its exit code, once all it printed is in `lines`."""
        self.process.send_signal(sig)
        code = self.process.wait(timeout=120)
        while (line := self._queue.get(timeout=30)) is not None:
            self.lines.append(line)
        return code


def mlflow_parent_run(base_url: str, experiment_id: str) -> dict[str, Any]:
    """The newest parent run (no mlflow.parentRunId) of the experiment, by MLflow's API."""
    request = urllib.request.Request(
        f"{base_url}/api/2.0/mlflow/runs/search", method="POST",
        data=json.dumps({"experiment_ids": [experiment_id], "max_results": 100,
                         "order_by": ["attributes.start_time DESC"]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        runs = json.loads(response.read())["runs"]
    parents = [r for r in runs if not any(t["key"] == "mlflow.parentRunId"
                                          for t in r["data"].get("tags", []))]
    assert parents, f"no parent run in experiment {experiment_id}"
    return parents[0]


def prefect_flow_run(ui_url: str) -> tuple[str, str]:
    """(flow name, flow run name) of the newest flow run, by Prefect's API."""
    api = ui_url.removesuffix("runs") + "api"

    def post(path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(f"{api}{path}", method="POST",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    runs = post("/flow_runs/filter", {"sort": "START_TIME_DESC", "limit": 10})
    assert runs, "Prefect has no flow run"
    with urllib.request.urlopen(f"{api}/flows/{runs[0]['flow_id']}", timeout=10) as response:
        flow = json.loads(response.read())
    return flow["name"], runs[0]["name"]


class Browser:
    """Headless Chromium, and every console error or failed request of its pages."""

    def __init__(self, executable: str) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(executable_path=executable,
                                                         headless=True)
        self.problems: list[str] = []

    def open(self, url: str) -> Any:
        page = self._browser.new_page(viewport={"width": 1400, "height": 900})

        def on_console(message: Any) -> None:
            where = (message.location or {}).get("url", "")
            if message.type == "error" and not where.endswith(MLFLOW_WHOAMI):
                self.problems.append(f"console error on {url}: {message.text} ({where})")

        page.on("console", on_console)
        page.on("pageerror", lambda exc: self.problems.append(f"page error on {url}: {exc}"))
        page.on("requestfailed", lambda request: self.problems.append(
            f"request failed on {url}: {request.url} ({request.failure})"))
        page.goto(url)
        return page

    def close(self) -> None:
        self._browser.close()
        self._playwright.stop()


@pytest.fixture(scope="module")
def chromium_executable() -> str:
    """Module-scoped, so that a machine without a browser skips before the recipe runs."""
    return chromium()


@pytest.fixture
def browser(chromium_executable: str) -> Iterator[Browser]:
    opened = Browser(chromium_executable)
    try:
        yield opened
    finally:
        opened.close()


def test_both_dashboards_show_the_run_by_name(chromium_executable: str, project: Project,
                                              browser: Browser) -> None:
    """Attached to the server the run left: Ctrl-C stops the MLflow UI and leaves that
    server running, as it was before."""
    shared = project.server_state()
    assert shared is not None, "the run left no Prefect server for later runs"
    ui = Ui.start(project, "recipes/digits.yaml", "--mlflow-port", str(free_port()))
    try:
        ui.wait_for_line("Ctrl-C")
        mlflow, prefect = ui.url("MLflow"), ui.url("Prefect")
        # the runs table, in the key-metrics view the run saved on its experiment
        assert "/#/experiments/" in mlflow and mlflow.endswith(
            "/runs?workflowType=machine_learning&viewStateShareKey=orchestrator-key-metrics"
        ), ui.lines
        assert prefect == f"{local_server.ui_url(shared['api_url'])}runs", ui.lines
        started = descendants(ui.process.pid)
        assert started, "no MLflow server below `orchestrator ui`"

        base, experiment = mlflow.split("/#/experiments/")
        run = mlflow_parent_run(base, experiment.split("/")[0])
        run_name = run["info"]["run_name"]
        assert run_name.startswith(RECIPE), run_name
        page = browser.open(mlflow)
        # in the runs table (the recipe's name is also the experiment's, in the breadcrumbs)
        page.locator('[role="gridcell"]').get_by_text(run_name, exact=True).wait_for(
            timeout=120_000)
        # the classic tracking view: a "Runs" page, not the GenAI "Training runs"
        page.get_by_role("heading", name="Runs", exact=True).wait_for(timeout=60_000)

        flow_name, flow_run_name = prefect_flow_run(prefect)
        assert RECIPE in f"{flow_name} {flow_run_name}", (flow_name, flow_run_name)
        page = browser.open(prefect)
        page.get_by_text(flow_run_name, exact=True).first.wait_for(timeout=120_000)
        assert not browser.problems, "\n".join(browser.problems)

        assert ui.stop(signal.SIGINT) == 0, ui.lines
        assert "stopped the MLflow UI" in ui.lines
        assert "stopped the Prefect server" not in ui.lines
    finally:
        if ui.process.poll() is None:
            ui.process.kill()
    wait_for(lambda: not any(pid_alive(pid) for pid in started), "the MLflow server to stop")
    assert not answers(f"{base}/health")
    assert project.server_state() == shared and pid_alive(int(shared["pid"])), \
        "`orchestrator ui` stopped the Prefect server a run had started"


def test_ui_started_from_elsewhere_stops_what_it_started_on_sigterm(
        project: Project, tmp_path: Path) -> None:
    """No server runs: the command starts one on the port asked, and SIGTERM stops it and
    the MLflow UI. Started from another folder, it writes nothing there."""
    stopped = project.orchestrator("server", "stop", "--force")
    assert stopped.returncode == 0, stopped.stderr
    assert project.server_state() is None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    port = free_port()
    ui = Ui.start(project, str(project.root / "recipes" / "digits.yaml"),
                  "--prefect-port", str(port), cwd=elsewhere)
    try:
        ui.wait_for_line("Ctrl-C")
        assert ui.url("Prefect") == f"http://127.0.0.1:{port}/runs", ui.lines
        assert any("started for runs to share" in line for line in ui.lines), ui.lines
        state = project.server_state()
        assert state is not None and state["port"] == port
        assert answers(f"http://127.0.0.1:{port}/ui-settings")
        started = descendants(ui.process.pid)
        assert int(state["pid"]) in started

        assert ui.stop(signal.SIGTERM) == 0, ui.lines
        assert "stopped the Prefect server" in ui.lines
    finally:
        if ui.process.poll() is None:
            ui.process.kill()
    wait_for(lambda: not any(pid_alive(pid) for pid in started), "both servers to stop")
    assert project.server_state() is None
    assert list(elsewhere.iterdir()) == []
