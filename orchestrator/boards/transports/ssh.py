"""ssh://[user@]host[:port]: a board reached with the user's own OpenSSH client.

Everything the user set up applies: `~/.ssh/config` (or the file `ORCHESTRATOR_SSH_CONFIG`
names, as a CI runner may), the agent, jump hosts, known_hosts. Never a password: `BatchMode`
makes ssh fail instead of asking. An unknown host key is an error unless the user accepts
it explicitly (`orchestrator device check URL --accept-host-key`, which records it once).

One connection per run: `open()` starts an OpenSSH control master (its socket in a private
folder under the temp dir), and every measurement runs over it. Keep-alives end a dead
connection within `ServerAliveInterval` x `ServerAliveCountMax` seconds.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from orchestrator.boards.errors import DeviceUnreachable
from orchestrator.boards.urls import DeviceURL

CONNECT_TIMEOUT_S = 10
ALIVE_INTERVAL_S = 5
ALIVE_COUNT = 3
CONFIG_ENV = "ORCHESTRATOR_SSH_CONFIG"


def _control_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"orchestrator-ssh-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


class SshTransport:
    def __init__(self, url: DeviceURL, accept_new_host_key: bool = False) -> None:
        self.url = url
        self.accept_new_host_key = accept_new_host_key
        # short: a unix socket's path has a length limit
        name = hashlib.sha256(f"{url.text}:{os.getpid()}".encode()).hexdigest()[:16]
        self.control = _control_folder() / name
        self.opened = False

    @property
    def destination(self) -> str:
        return f"{self.url.user}@{self.url.host}" if self.url.user else self.url.host

    def options(self) -> list[str]:
        config = os.environ.get(CONFIG_ENV)
        checking = "accept-new" if self.accept_new_host_key else "yes"
        return [*(["-F", config] if config else []),
                "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={checking}",
                "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}",
                "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
                "-o", f"ControlPath={self.control}",
                *(["-p", str(self.url.port)] if self.url.port else [])]

    def open(self) -> None:
        """The control master, or DeviceUnreachable saying why and what to do."""
        if self.opened:
            return
        with tempfile.TemporaryFile() as errors:
            try:
                done = subprocess.run(
                    ["ssh", *self.options(), "-o", "ControlMaster=yes", "-o",
                     "ControlPersist=300", "-N", "-f", self.destination],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                    check=False, timeout=CONNECT_TIMEOUT_S * 3)
            except subprocess.TimeoutExpired:  # connected, but the login never finished
                raise DeviceUnreachable(f"{self.destination} did not finish the SSH login in "
                                        f"{CONNECT_TIMEOUT_S * 3} s") from None
            errors.seek(0)
            said = errors.read().decode(errors="replace").strip()
        if done.returncode != 0:
            raise DeviceUnreachable(self.explain(said))
        self.opened = True

    def explain(self, said: str) -> str:
        where = f"{self.destination}" + (f" port {self.url.port}" if self.url.port else "")
        last = said.splitlines()[-1] if said else "ssh failed without a message"
        if "Host key verification failed" in said or "No ED25519 host key is known" in said \
                or "host key for" in said.lower():
            return (f"the SSH host key of {where} is not known here ({last}): check the key, "
                    f"then accept it once with `orchestrator device check {self.url.text} "
                    "--accept-host-key`")
        if "Permission denied" in said:
            return (f"{where} refused the login ({last}): give the board your public key "
                    "(ssh-copy-id) and load the key into your ssh-agent; passwords are "
                    "never used")
        return f"cannot reach {where} over SSH: {last}"

    def python_command(self, *args: str) -> list[str]:
        remote = " ".join(shlex.quote(part) for part in (self.url.python, *args))
        return ["ssh", *self.options(), "-o", "ControlMaster=no", "-T", self.destination,
                "--", remote]

    def run(self, command: str, timeout: float = 60, data: bytes | None = None
            ) -> subprocess.CompletedProcess[bytes]:
        """A shell command on the board over the run's connection."""
        return subprocess.run(["ssh", *self.options(), "-o", "ControlMaster=no", "-T",
                               self.destination, "--", command], input=data,
                              capture_output=True, timeout=timeout, check=False,
                              stdin=None if data is not None else subprocess.DEVNULL)

    def close(self) -> None:
        if self.opened:
            subprocess.run(["ssh", *self.options(), "-O", "exit", self.destination],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False, timeout=10)
            self.opened = False
