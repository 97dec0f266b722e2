"""The local Prefect server that outlives a run: attach or start, lease, idle exit.

Real servers (prefect_daemon in its own process), no mocks. Waits poll with generous
deadlines: they wait for something to happen, they do not time it.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.waiting import wait_for

from orchestrator.errors import OrchestratorError
from orchestrator.flow import local_server
from orchestrator.flow.local_server import (
    LEASE_FILE,
    STATE_FILE,
    LocalServer,
    PrefectServerError,
    pid_alive,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / ".orchestrator"
    yield folder
    state = local_server._read_state(folder)  # never leave a server behind
    if state is not None and pid_alive(int(state["pid"])):
        os.kill(int(state["pid"]), 15)


def start(home: Path, idle_s: float) -> LocalServer:
    server = local_server._attach_or_start(home, idle_s)
    server.wait_ready()
    return server


def begin(home: Path, idle_s: float) -> LocalServer:
    """Attach or start, not waiting for the server to answer: where a test checks only
    what a run decides from the record and the lease (attach, or start a new server), the
    server is ended while it still imports Prefect's, which saves most of the 9 s of CPU
    a server takes to start."""
    return local_server._attach_or_start(home, idle_s)


def test_second_run_attaches_and_server_exits_when_idle(home: Path) -> None:
    first = start(home, idle_s=1.0)
    assert first.started_here and first.lingers
    state = json.loads((home / STATE_FILE).read_text())
    assert state["pid"] == first.pid and state["api_url"] == first.api_url
    with urllib.request.urlopen(f"{first.api_url}/admin/version", timeout=5) as response:
        assert json.loads(response.read()) == state["prefect"]  # it is that Prefect

    second = start(home, idle_s=1.0)  # while the first still holds its lease
    assert not second.started_here
    assert (second.api_url, second.pid) == (first.api_url, first.pid)

    first.release()
    # the second run's lease keeps the server up well past its idle time
    time.sleep(4.0)
    assert pid_alive(first.pid), "the server exited under an attached run"
    assert (home / STATE_FILE).is_file()

    second.release()
    wait_for(lambda: not pid_alive(first.pid), "the idle server to exit")
    assert not (home / STATE_FILE).exists(), "an exited server left its record"

    third = begin(home, idle_s=1.0)  # a new server, since the last one is gone
    assert third.started_here and third.pid != first.pid
    third.release()


def test_runs_starting_together_share_one_booting_server(home: Path) -> None:
    first = local_server._attach_or_start(home, 30.0)
    second = local_server._attach_or_start(home, 30.0)  # before the first answers
    try:
        assert first.started_here and not second.started_here
        assert second.pid == first.pid
        second.wait_ready()
        first.wait_ready()
    finally:
        first.release()
        second.release()


def test_a_server_still_inside_execve_is_attached_to(home: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The window the test above once lost on a loaded machine: the first server's command
    line read empty (its execve not done), so the second run started a server of its own.
    The kernel's empty reads are played here, for the real server's pid: the second run
    waits them out and attaches; a command line that stays empty is not our server."""
    first = local_server._attach_or_start(home, 30.0)
    real = local_server._command_line
    reads: list[int] = []

    def still_exec(pid: int) -> bytes:
        reads.append(pid)
        return b"" if len(reads) <= 3 else real(pid)

    monkeypatch.setattr(local_server, "_command_line", still_exec)
    second = local_server._attach_or_start(home, 30.0)
    try:
        assert not second.started_here and second.pid == first.pid, second
        assert reads == [first.pid] * 4
        monkeypatch.setattr(local_server, "EXEC_WINDOW_S", 0.2)
        monkeypatch.setattr(local_server, "_command_line", lambda pid: b"")
        port = int(first.api_url.rsplit(":", 1)[1].split("/")[0])
        assert not local_server._is_our_daemon(first.pid, port)  # a kernel thread, say
    finally:
        first.release()
        second.release()


def test_server_whose_store_folder_is_deleted_exits(home: Path) -> None:
    import shutil

    server = start(home, idle_s=1.0)
    server.release()
    shutil.rmtree(home)
    wait_for(lambda: not pid_alive(server.pid), "the server to notice its folder is gone")


def test_server_for_one_run_exits_when_the_run_is_killed(tmp_path: Path) -> None:
    code = ("import os, sys\nfrom pathlib import Path\n"
            "from orchestrator.flow import local_server\n"
            f"server = local_server._start_for_this_run(Path({str(tmp_path)!r}))\n"
            "server.wait_ready()\nprint(server.pid, flush=True)\n"
            "os._exit(9)  # killed: no release()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 9, done.stderr[-2000:]
    pid = int(done.stdout.split()[0])
    wait_for(lambda: not pid_alive(pid), "the orphaned per-run server to exit")


def test_a_server_that_dies_while_booting_is_a_clear_error(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('port taken')"],
                               stderr=(log := (tmp_path / "log").open("w+b")))
    server = LocalServer(api_url="http://127.0.0.1:9/api", pid=process.pid, lingers=False,
                         started_here=True, process=process, log=log)
    with pytest.raises(PrefectServerError, match="exited") as caught:
        server.wait_ready()
    assert "port taken" in str(caught.value) and caught.value.exit_code == 2
    server.release()


def test_record_of_a_dead_server_is_replaced(home: Path) -> None:
    home.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    identity = local_server._identity()
    local_server._write_state(home, {"pid": dead.pid, "port": 9, "api_url":
                                       "http://127.0.0.1:9/api", **identity})
    server = begin(home, idle_s=30.0)
    try:
        assert server.started_here and server.pid != dead.pid
        assert json.loads((home / STATE_FILE).read_text())["pid"] == server.pid
    finally:
        server.release()


@pytest.mark.parametrize("changed", [{"prefect": "0.0.1"},  # another installation
                                     {"daemon": None}])  # an older orchestrator's: no UI
def test_server_of_another_installation_is_not_reused(home: Path,
                                                      changed: dict[str, str | None]) -> None:
    first = begin(home, idle_s=30.0)
    first.release()
    state = json.loads((home / STATE_FILE).read_text())
    state.update(changed)
    local_server._write_state(home, {k: v for k, v in state.items() if v is not None})
    second = begin(home, idle_s=30.0)
    try:
        assert second.started_here and second.pid != first.pid
    finally:
        second.release()
        os.kill(first.pid, 15)


def test_lease_is_shared_and_blocks_an_exclusive_lock(home: Path) -> None:
    server = begin(home, idle_s=30.0)
    try:
        with open(home / LEASE_FILE, "a+") as probe:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # other runs may attach
    finally:
        server.release()
    with open(home / LEASE_FILE, "a+") as probe:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the run


@pytest.mark.parametrize("raw", ["soon", "-5", "nan"])
def test_bad_idle_setting_is_a_clear_error(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(local_server.IDLE_ENV, raw)
    with pytest.raises(OrchestratorError, match=local_server.IDLE_ENV) as caught:
        local_server.idle_seconds()
    assert caught.value.exit_code == 2


def test_cli_reuses_the_server_and_per_run_mode_leaves_none(
        digits_example: Path, tmp_path: Path) -> None:
    """Two real `orchestrator run`s with no PREFECT_API_URL: the second attaches to the
    server the first started and is all cache hits; with IDLE_S=0 no server outlives the
    run. The server's lifetime is under test, not the stages: a recipe of two pipelines
    of cheap stages (the digits SavedModel through freeze, strip and fold)."""
    recipe = tmp_path / "recipes" / "small.yaml"
    recipe.parent.mkdir()
    saved_model = digits_example / "saved_model"
    recipe.write_text(f"version: 1\nname: small\nmodel: {{path: {saved_model}}}\n"
                      "pipelines:\n  fp32: {stages: [freeze, strip]}\n"
                      "  folded: {from: fp32, stages: [fold]}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(ORCHESTRATOR_HOME=str(tmp_path / ".orchestrator"),
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
               **{local_server.IDLE_ENV: "60"})

    def run(out: str, **extra: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(recipe),
                               "-o", str(tmp_path / out)], env={**env, **extra},
                              cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    home = tmp_path / ".orchestrator"
    try:
        first = run("out1")
        assert "is kept for later runs" in first.stderr
        pid = json.loads((home / STATE_FILE).read_text())["pid"]
        second = run("out2")
        assert "is kept for later runs" not in second.stderr
        assert json.loads((home / STATE_FILE).read_text())["pid"] == pid
        report = json.loads((tmp_path / "out2" / "report.json").read_text())
        stages = [s for v in report["variants"].values() for s in v["stages"]]
        assert stages and all(s["cached"] for s in stages)
    finally:
        state = local_server._read_state(home)
        if state is not None:
            os.kill(int(state["pid"]), 15)
    wait_for(lambda: not pid_alive(pid), "the server to stop on SIGTERM")
    assert not (home / STATE_FILE).exists(), "a server stopped by a signal left its record"

    third = run("out3", **{local_server.IDLE_ENV: "0"})
    assert "is kept" not in third.stderr
    assert not (home / STATE_FILE).exists()
    wait_for(lambda: not servers_of(home), "the per-run server to stop")

    # a new project's first run, a server per run, Prefect's database in the project (no
    # PREFECT_HOME): the server makes the folder it keeps it in
    fresh = tmp_path / "fresh" / ".orchestrator"
    own = {k: v for k, v in env.items()
           if k not in ("PREFECT_HOME", local_server.DATABASE_ENV)}
    own.update(ORCHESTRATOR_HOME=str(fresh), **{local_server.IDLE_ENV: "0"})
    done = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(recipe),
                           "-o", str(tmp_path / "out4"), "--no-cache"], env=own, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (fresh / local_server.DATABASE_FILE).is_file()


def servers_of(home: Path) -> list[int]:
    """Live prefect_daemon processes serving `home`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"orchestrator.flow.server_process" in argv and str(home).encode() in argv \
                and pid_alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def test_server_command_shows_and_stops_the_server(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main as cli
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
    server = start(home, idle_s=60.0)
    assert cli.main(["server", "status"]) == 0
    out = capsys.readouterr().out
    assert f"pid {server.pid}" in out and "in use by a run" in out

    assert cli.main(["server", "stop"]) == 2  # a run is attached
    assert "--force" in capsys.readouterr().err
    assert pid_alive(server.pid)

    server.release()
    assert cli.main(["server"]) == 0
    assert "idle" in capsys.readouterr().out
    assert cli.main(["server", "stop"]) == 0
    assert f"pid {server.pid}" in capsys.readouterr().out
    wait_for(lambda: not pid_alive(server.pid), "the stopped server to exit")
    assert not (home / STATE_FILE).exists()
    assert cli.main(["server", "status"]) == 0
    assert "no local Prefect server" in capsys.readouterr().out


def test_forced_stop_forgets_the_server_before_it_goes(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main as cli
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
    server = start(home, idle_s=60.0)
    try:
        assert cli.main(["server", "stop", "--force"]) == 0  # although a run is attached
        assert not (home / STATE_FILE).exists()
        wait_for(lambda: not pid_alive(server.pid), "the forced server to exit")
    finally:
        server.release()
    again = begin(home, idle_s=60.0)  # the next run starts a new one
    assert again.started_here and again.pid != server.pid
    again.release()


def get(url: str, accept: str = "*/*") -> tuple[int, str, bytes, str]:
    """Status, content type, body and final address of a GET."""
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        return (response.status, response.headers.get("content-type", ""), response.read(),
                response.url)


def check_classic_ui(api_url: str) -> None:
    """The UI next to the API: its settings point at this server, pages fall back to the
    app's index.html, the favicon its pages link is there (no 404 in a browser's console),
    and the classic UI is the default (the new one calls an analytics host at load)."""
    ui = local_server.ui_url(api_url)
    assert ui == api_url.removesuffix("api")
    settings = json.loads(get(f"{ui}ui-settings")[2])
    assert settings["api_url"] == api_url
    assert settings["default_ui"] == "v1" and "v1" in settings["available_uis"]
    status, kind, body, final = get(f"{ui}runs", accept="text/html")
    assert (status, final) == (200, f"{ui}runs")  # served there, not redirected to v2
    assert kind.startswith("text/html") and b'<div id="app"' in body
    status, kind, body, _ = get(f"{ui}favicon.ico")
    assert status == 200 and kind.startswith("image/") and body


def test_ui_attaches_to_the_shared_server_or_starts_it_on_its_port(home: Path) -> None:
    """`orchestrator ui` starts the lingering server on the port asked, with Prefect's
    classic UI (one server for both checks: each start costs seconds of CPU)."""
    port = local_server.free_port()
    first = local_server.attach_for_ui(home, port)
    try:
        first.wait_ready()
        assert first.started_here and first.lingers
        assert first.api_url == f"http://127.0.0.1:{port}/api"
        check_classic_ui(first.api_url)
        # a run (or a second `ui`) attaches to it, whatever port it would have asked for
        second = local_server.attach_for_ui(home, local_server.free_port())
        assert not second.started_here and second.pid == first.pid
        second.release()
    finally:
        first.release()


def test_ui_on_a_taken_port_starts_nothing(home: Path) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = int(sock.getsockname()[1])
        with pytest.raises(local_server.PortTaken, match=f"port {port} is taken") as caught:
            local_server.attach_for_ui(home, port)
    assert caught.value.exit_code == 2
    assert not (home / STATE_FILE).exists() and not (home / local_server.LOG_FILE).exists()
    assert not servers_of(home)


def test_identity_is_the_installation_not_the_name_of_its_python() -> None:
    """`make demo` runs the console script (bin/python3 in its shebang), a script runs
    `python -m orchestrator`: both must share one server."""
    names = [p for p in (Path(sys.executable).with_name(n) for n in ("python", "python3"))
             if p.exists()]
    if len(names) < 2:
        pytest.skip("this installation has one name for its Python")
    code = "from orchestrator.flow.local_server import _identity; print(_identity())"
    seen = {subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                           check=True, timeout=120).stdout for python in names}
    assert len(seen) == 1, seen
