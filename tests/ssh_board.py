"""A real OpenSSH server on loopback for the device tests: Debian's sshd, started in a
temporary folder with its own host key and user key, and a client config that reaches it
non-interactively with strict host key checking. Its faults are real ones: sessions
killed (a connection lost), the server stopped and started again (a board that rebooted).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 15


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


@dataclass
class SshBoard:
    folder: Path
    port: int
    user: str
    config: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def url(self, python: str | None = None) -> str:
        base = f"ssh://{self.user}@127.0.0.1:{self.port}"
        return base if python is None else f"{base}?python={quote(python, safe='/')}"

    def start(self) -> None:
        log = open(self.folder / "sshd.log", "ab")  # noqa: SIM115  (the server's own)
        for _ in range(20):  # the port may be held a moment after a stop
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.folder / "sshd_config")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
            if self._answers():
                log.close()
                return
            self.stop()
            time.sleep(0.25)
        log.close()
        tail = (self.folder / "sshd.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"sshd did not answer on port {self.port}:\n{tail}")

    def _answers(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                return False
            done = subprocess.run(["ssh", "-F", str(self.config), "-p", str(self.port),
                                   f"{self.user}@127.0.0.1", "true"],
                                  stdin=subprocess.DEVNULL, capture_output=True, check=False,
                                  timeout=30)
            if done.returncode == 0:
                return True
            time.sleep(0.1)
        return False

    def descendants(self) -> list[int]:
        """Every process under the listener: the sessions and what they run."""
        if self.process is None:
            return []
        found, todo = [], [self.process.pid]
        while todo:
            for child in _children(todo.pop()):
                found.append(child)
                todo.append(child)
        return found

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (the listener's children)."""
        return [] if self.process is None else _children(self.process.pid)

    def kill_sessions(self) -> int:
        """Kill every connection's sshd (not the listener): the clients lose their
        connection; what the sessions ran goes on, as on a board whose network dropped."""
        killed = 0
        for pid in self.session_pids():
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                continue
        return killed

    def stop(self) -> None:
        """The server and every session it spawned (their process group)."""
        if self.process is None:
            return
        for pid in [*self.descendants(), self.process.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def config_without_known_host(self) -> Path:
        """A client config whose known_hosts is empty: the server's key is unknown."""
        path = self.folder / "ssh_config_unknown"
        empty = self.folder / "known_hosts_empty"
        empty.touch()
        path.write_text(self.config.read_text().replace(
            str(self.folder / "known_hosts"), str(empty)))
        return path


def start_ssh_board(folder: Path) -> SshBoard:
    """sshd on 127.0.0.1 at a free port, for this user, with keys made in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    for name in ("host_key", "id_ed25519"):
        if not (folder / name).exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(folder / name)], check=True, stdin=subprocess.DEVNULL,
                           capture_output=True)
    (folder / "authorized_keys").write_text((folder / "id_ed25519.pub").read_text())
    port = _free_port()
    (folder / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {folder}/host_key\n"
        f"PidFile {folder}/sshd.pid\nAuthorizedKeysFile {folder}/authorized_keys\n"
        "StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nPermitUserEnvironment no\n"
        "MaxSessions 50\nMaxStartups 50\nLogLevel ERROR\n")
    host_key = (folder / "host_key.pub").read_text().split()
    (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    config = folder / "ssh_config"
    config.write_text(
        "Host 127.0.0.1\n"
        f"  IdentityFile {folder}/id_ed25519\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {folder}/known_hosts\n  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n  LogLevel ERROR\n")
    import pwd

    board = SshBoard(folder, port, pwd.getpwuid(os.getuid()).pw_name, config)
    board.start()
    return board
