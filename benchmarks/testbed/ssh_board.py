"""A real OpenSSH server on loopback for the device tests: Debian's sshd, started in a
temporary folder with its own host key and user key, and a client config that reaches it
non-interactively with strict host key checking. Its faults are real ones: sessions
killed (a connection lost), the server stopped and started again (a board that rebooted).

    board = start_ssh_board(tmp_path / "sshd")
    try:
        ssh -F board.config -p board.port root@127.0.0.1 ...   (or board.url(python=...))
    finally:
        board.stop()

Plain functions and a dataclass: the pytest fixtures are built on top of it elsewhere.

Process layout (OpenSSH 9.2, as root): the listener (`sshd -D`, started in a session of
its own) forks one sshd per connection; each of those calls setsid() and forks what the
client runs, in a session of its own again. So no process group holds a board's
processes: they are found through /proc, by parent (`descendants()`) and, for what
outlived its session (kill_sessions(keep_commands=True)), by the SSH_CONNECTION in its
environment that names this server's port (`processes()`). A tree is killed frozen:
SIGSTOP to every process in it until no new one appears, then SIGKILL, so nothing forks
away from the kill. (sshd's own /proc/PID/environ cannot mark it: setproctitle() writes
the process title over that memory.)
"""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

SSHD = "/usr/sbin/sshd"
HOST = "127.0.0.1"
START_TIMEOUT_S = 10  # one launch: until `ssh ... true` succeeds
RESTART_WINDOW_S = 5  # restart(): relaunches on the same port while it is still held
PORT_ATTEMPTS = 5  # start_ssh_board(): fresh ports when one got taken meanwhile
GONE_TIMEOUT_S = 5  # killed processes: until /proc no longer shows them alive
LOG_TAIL_CHARS = 3000


class SshdExited(RuntimeError):
    """sshd ended before answering: most often its port was taken (see sshd.log)."""


# -- /proc ---------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _parents() -> dict[int, int]:
    """pid -> ppid of every live process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] not in ("Z", "X"):
                table[int(entry.name)] = stat[1]
    return table


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _kill(pids: list[int]) -> list[int]:
    """SIGKILL each; the ones that were there to kill."""
    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return killed


def _wait_gone(pids: list[int], timeout: float = GONE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _freeze(roots: list[int]) -> list[int]:
    """SIGSTOP the roots and all their descendants, again until no new one appears (a
    process forking as it is stopped); all of them, roots first, ready for SIGKILL."""
    frozen: list[int] = []
    for _ in range(50):
        children: dict[int, list[int]] = {}
        for pid, ppid in _parents().items():
            children.setdefault(ppid, []).append(pid)
        tree, todo = [], list(roots)
        while todo:
            pid = todo.pop(0)
            tree.append(pid)
            todo.extend(children.get(pid, []))
        new = [pid for pid in tree if pid not in frozen]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except (ProcessLookupError, PermissionError):
                continue
            frozen.append(pid)
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline and any(
                (_stat(pid) or ("X", 0))[0] not in "TtZX" for pid in new):
            time.sleep(0.005)
    return frozen


# -- files ---------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _q(path: Path) -> str:
    """A path as an ssh(d)_config argument."""
    return f'"{path}"' if any(c.isspace() for c in str(path)) else str(path)


def _keygen(path: Path) -> None:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ssh-board",
                        "-f", str(path)], check=True, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=30)


def _client_config(folder: Path, known_hosts: Path) -> str:
    return (f"Host {HOST}\n"
            f"  IdentityFile {_q(folder / 'id_ed25519')}\n"
            "  IdentitiesOnly yes\n"
            "  IdentityAgent none\n"
            f"  UserKnownHostsFile {_q(known_hosts)}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
            "  UpdateHostKeys no\n"
            "  BatchMode yes\n"
            "  PasswordAuthentication no\n"
            "  KbdInteractiveAuthentication no\n"
            "  LogLevel ERROR\n")


def _configure(folder: Path, port: int) -> Path:
    """sshd_config, known_hosts and ssh_config for `port`; the client config's path."""
    (folder / "sshd_config").write_text(
        f"ListenAddress {HOST}\n"
        f"Port {port}\n"
        f"HostKey {_q(folder / 'host_key')}\n"
        f"PidFile {_q(folder / 'sshd.pid')}\n"
        f"AuthorizedKeysFile {_q(folder / 'authorized_keys')}\n"
        "StrictModes no\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "PermitUserEnvironment no\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "UseDNS no\n"
        "Subsystem sftp internal-sftp\n"
        # sessions run `$SHELL -c COMMAND`, and Debian's bash sources ~/.bashrc when run
        # by sshd at shell level 1: this host's (pyenv init, rehashing under a lock) would
        # slow every session, hang them behind a lock a killed session left, and change
        # PATH. At SHLVL=1 the session's bash counts level 2 and reads no startup file.
        "SetEnv SHLVL=1\n"
        "MaxSessions 50\n"
        "MaxStartups 50\n")
    kind, key = (folder / "host_key.pub").read_text().split()[:2]
    (folder / "known_hosts").write_text(f"[{HOST}]:{port} {kind} {key}\n")
    config = folder / "ssh_config"
    config.write_text(_client_config(folder, folder / "known_hosts"))
    return config


# -- the board -----------------------------------------------------------------------------

@dataclass
class SshBoard:
    folder: Path  # everything: keys, configs, sshd.log, sshd.pid
    port: int  # sshd listens on 127.0.0.1:port
    user: str  # the login user: this process's own (root here)
    config: Path  # the client's ssh_config: `ssh -F config -p port user@127.0.0.1 ...`
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    last_error: str = field(default="", repr=False)  # the last failed probe's ssh stderr

    # what the client needs

    @property
    def destination(self) -> str:
        return f"{self.user}@{HOST}"

    def url(self, python: str | None = None) -> str:
        base = f"ssh://{self.user}@{HOST}:{self.port}"
        return base if python is None else f"{base}?python={quote(python, safe='/')}"

    def ssh_command(self, *remote: str, config: Path | None = None,
                    options: tuple[str, ...] = ()) -> list[str]:
        """`ssh -F config -p port [options] user@127.0.0.1 [remote...]`, for subprocess."""
        return ["ssh", "-F", str(config or self.config), "-p", str(self.port), *options,
                self.destination, *remote]

    def config_without_known_host(self) -> Path:
        """A client config like `config` whose known_hosts (known_hosts_empty, created
        empty on the first call and kept afterwards: a test may accept the key into it)
        does not know the server's key: strict checking refuses the host."""
        empty = self.folder / "known_hosts_empty"
        empty.touch()
        path = self.folder / "ssh_config_unknown_host"
        path.write_text(_client_config(self.folder, empty))
        return path

    # the server

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, window_s: float = 0) -> None:
        """Launch sshd on `port` and wait until a real `ssh ... true` succeeds. While sshd
        exits at once (its port still held) it is relaunched for `window_s` seconds; then
        SshdExited. RuntimeError when it runs but does not let the client in."""
        if self.running:
            return
        deadline = time.monotonic() + window_s
        while True:
            try:
                self._launch()
                return
            except SshdExited:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.25)

    def _launch(self) -> None:
        with open(self.folder / "sshd.log", "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} ssh_board: sshd on port "
                      f"{self.port}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.folder / "sshd_config")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.running:
                self._reap()
                raise SshdExited(self._failure("sshd exited before answering"))
            if self._answers():
                if self.running:  # and not another server that happened to be there
                    return
                continue
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(self._failure(f"sshd did not let ssh in within {START_TIMEOUT_S} s"))

    def _answers(self) -> bool:
        """One `ssh ... true`: True when it succeeded. Whatever else holds the port may
        accept and never answer, so the probe ends as soon as sshd does. (No bare TCP
        probe first: each costs sshd a preauth child, and a refused ssh fails at once.)"""
        probe = subprocess.Popen(self.ssh_command("true", options=("-o", "ConnectTimeout=5")),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 5
            while probe.poll() is None and self.running and time.monotonic() < deadline:
                time.sleep(0.02)
            if probe.poll() is None:
                probe.kill()
                self.last_error = "ssh true got no answer" if self.running else "sshd exited"
            probe.wait()
            said = probe.stderr.read().decode(errors="replace").strip() if probe.stderr else ""
            self.last_error = said or self.last_error
            return probe.returncode == 0
        finally:
            if probe.stderr:
                probe.stderr.close()

    def _failure(self, what: str) -> str:
        try:
            tail = (self.folder / "sshd.log").read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            tail = "(no sshd.log)"
        return (f"{what} ({HOST}:{self.port}, {self.folder})\n"
                f"last ssh error: {self.last_error or '-'}\nsshd.log:\n{tail}")

    def _reap(self) -> None:
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.process = None

    def stop(self) -> None:
        """The board powered off: the listener, every session, and everything the sessions
        ran, orphans included (the ones kill_sessions(keep_commands=True) left). Idempotent."""
        if self.process is None:
            return
        doomed: list[int] = []
        if self.running:  # the listener frozen first: no new connection from here on
            doomed = _freeze([self.process.pid])
            _kill(doomed)
        self._reap()
        for _ in range(5):  # then what outlived its session, frozen with what it forked
            orphans = self._outliving()
            if not orphans:
                break
            frozen = _freeze(orphans)
            _kill(frozen)
            doomed += frozen
            _wait_gone(frozen)
        _wait_gone(doomed)
        try:
            (self.folder / "sshd.pid").unlink()
        except OSError:
            pass

    def restart(self) -> None:
        """The board rebooted: stopped (if it was not) and started again on the same port
        with the same keys; relaunched for a few seconds while the port is still held."""
        self.stop()
        self.start(window_s=RESTART_WINDOW_S)

    # its processes

    def descendants(self) -> list[int]:
        """Every live process under the listener: the sessions and what they run."""
        if not self.running:
            return []
        children: dict[int, list[int]] = {}
        for pid, ppid in _parents().items():
            children.setdefault(ppid, []).append(pid)
        found, todo = [], [self.process.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                found.append(child)
                todo.append(child)
        return found

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes: the listener's children."""
        if not self.running:
            return []
        return sorted(pid for pid, ppid in _parents().items() if ppid == self.process.pid)

    def processes(self) -> list[int]:
        """Every live process of this board: the listener, its descendants, and what its
        sessions ran that outlived them (orphans, found by SSH_CONNECTION's port)."""
        found = set(self._outliving()) | set(self.descendants())
        if self.running:
            found.add(self.process.pid)
        return sorted(found)

    def _outliving(self) -> list[int]:
        # SSH_CONNECTION=client_ip client_port server_ip server_port
        server = f" {HOST} {self.port}".encode()
        found = []
        for pid in _parents():
            if pid == os.getpid():
                continue
            if any(entry.startswith(b"SSH_CONNECTION=") and entry.endswith(server)
                   for entry in _environ(pid)):
                found.append(pid)
        return sorted(found)

    def kill_sessions(self, keep_commands: bool = False) -> int:
        """A connection lost mid-measurement: SIGKILL every per-connection sshd (not the
        listener, which accepts new connections as before), so each client sees its
        connection drop. What the sessions ran is killed too, unless `keep_commands`: then
        it goes on, orphaned, as on a board whose network dropped (stop() ends it).
        Returns how many sessions were killed."""
        sessions = self.session_pids()
        if keep_commands:
            doomed = [pid for pid in self.descendants() if _comm(pid) == "sshd"]
        else:  # frozen first: nothing reports a clean exit, nothing forks away
            doomed = _freeze(sessions)
        killed = _kill(doomed)
        _wait_gone(doomed)
        return len(set(killed) & set(sessions))

    # with-statement

    def __enter__(self) -> SshBoard:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start_ssh_board(folder: Path) -> SshBoard:
    """sshd on 127.0.0.1 at a free port, for this user, with keys made in `folder`;
    answering (a real `ssh ... true` succeeded) when this returns."""
    folder.mkdir(parents=True, exist_ok=True)
    run_sshd = Path("/run/sshd")  # sshd's privilege separation dir: it refuses to start without
    if not run_sshd.is_dir():
        run_sshd.mkdir(mode=0o755, parents=True, exist_ok=True)
        run_sshd.chmod(0o755)
    _keygen(folder / "host_key")
    _keygen(folder / "id_ed25519")
    user_key = (folder / "id_ed25519.pub").read_text()
    authorized = folder / "authorized_keys"
    if user_key not in (authorized.read_text() if authorized.exists() else ""):
        with open(authorized, "a") as keys:
            keys.write(user_key)
    user = pwd.getpwuid(os.getuid()).pw_name
    for attempt in range(PORT_ATTEMPTS):
        port = _free_port()  # free a moment ago: another process may take it before sshd
        board = SshBoard(folder, port, user, _configure(folder, port))
        try:
            board.start()
            return board
        except SshdExited:
            if attempt == PORT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
