"""A target's `connect:` URL: where to measure, checked before anything runs.

- `ssh://[user@]host[:port][?python=PATH]`: a board reached with the user's own OpenSSH
  (config, agent, jump hosts, known_hosts); `python` is the board's interpreter (default
  `python3`). A password has no place in it: keys and the agent do that.
- `qemu://aarch64[?cpu=NAME]`: an emulated Arm CPU on this host (`emulated_board`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

SCHEMES = ("ssh", "qemu")
EMULATED_ARCHES = ("aarch64",)
DEFAULT_CPU = "cortex-a76"


class DeviceURLError(ValueError):
    """A `connect:` value that is not a device URL we can use (the message says why)."""


@dataclass(frozen=True)
class DeviceURL:
    scheme: str
    text: str  # as written: it names where figures were measured (no credentials in it)
    host: str = ""
    user: str | None = None
    port: int | None = None
    python: str = "python3"
    cpu: str | None = None  # qemu: the emulated core
    accept_new_host_key: bool = False

    @property
    def emulated(self) -> bool:
        return self.scheme == "qemu"


def parse_device_url(text: str) -> DeviceURL:
    """The URL checked; DeviceURLError with the reason and the forms that work."""
    forms = "ssh://[user@]host[:port] or qemu://aarch64?cpu=cortex-a76"
    parts = urlsplit(text.strip())
    if parts.scheme not in SCHEMES:
        raise DeviceURLError(f"{text!r} is not a device URL: use {forms}")
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    if parts.scheme == "qemu":
        unknown = set(query) - {"cpu"}
        if unknown:
            raise DeviceURLError(f"{text!r}: unknown option {sorted(unknown)[0]!r} (qemu:// "
                                 "takes cpu=NAME)")
        if parts.hostname not in EMULATED_ARCHES:
            raise DeviceURLError(f"{text!r}: the emulated board is one of "
                                 f"{', '.join(EMULATED_ARCHES)}, e.g. qemu://aarch64?cpu="
                                 f"{DEFAULT_CPU}")
        return DeviceURL("qemu", text, host=parts.hostname, cpu=query.get("cpu") or DEFAULT_CPU)
    if parts.password is not None:
        raise DeviceURLError(f"{parts.scheme}://{parts.username}:***@{parts.hostname}: a "
                             "password never goes in a recipe; give the board your SSH key "
                             "(ssh-copy-id) and use your ssh-agent")
    if not parts.hostname:
        raise DeviceURLError(f"{text!r} names no host: use {forms}")
    unknown = set(query) - {"python"}
    if unknown:
        raise DeviceURLError(f"{text!r}: unknown option {sorted(unknown)[0]!r} (ssh:// takes "
                             "python=PATH, the board's Python)")
    try:
        port = parts.port
    except ValueError as exc:
        raise DeviceURLError(f"{text!r}: {exc}") from None
    return DeviceURL("ssh", text, host=parts.hostname, user=parts.username and unquote(
        parts.username), port=port, python=query.get("python") or "python3")
