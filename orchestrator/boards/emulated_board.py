"""The emulated aarch64 board: Debian's arm64 Python under qemu-user, built from real parts.

`orchestrator device prepare qemu://aarch64` builds it once per user, in
`~/.cache/orchestrator/boards/aarch64` (`ORCHESTRATOR_BOARDS` moves it):

- `root/`: Debian's arm64 packages of Python 3 and the libraries it needs (the closure
  `apt-cache depends` gives), fetched by apt from the machine's own package sources and
  unpacked with `dpkg-deb -x`: nothing is installed on the host but qemu-user-static;
- `site/`: the aarch64 wheels of numpy, ai-edge-litert (the host's release) and
  cryptography, installed for the board's Python by pip's `--platform`;
- `cpus/<cpu>/`: what qemu's `-L` sees for one emulated core: `proc/cpuinfo` written for
  that core, every other path a link into `root/`. LiteRT reads /proc/cpuinfo to pick its
  kernels; under qemu-user it would see the host's x86 text and crash, and a cpuinfo that
  claims features the emulated core lacks (`asimddp` on a Cortex-A72) dies of SIGILL;
- `bin/python3-<cpu>`: the board's Python on that core, for `ssh://...?python=` or a shell.

What emulation can tell: the Arm kernels' numerics (outputs, accuracy, agreement with the
host). What it cannot: their speed. Timings measured here are marked emulated and never
decide a selection or a budget.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import OrchestratorError

QEMU = "qemu-aarch64-static"
ARCH = "aarch64"
DEBIAN_ARCH = "arm64"
WHEEL_PLATFORMS = ("manylinux_2_27_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64",
                   "manylinux_2_28_aarch64")
# Debian's arm64 Python and the C++ runtime the wheels link against
ROOT_PACKAGES = ("python3", "libstdc++6")


@dataclass(frozen=True)
class Core:
    part: str  # the MIDR part number LiteRT's CPU detection reads
    variant: str
    revision: int
    features: str


_V8_0 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid"
_V8_2 = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
         "lrcpc dcpop asimddp")
# qemu's name -> what the kernel of a board with that core prints
CORES = {
    "cortex-a53": Core("0xd03", "0x0", 4, _V8_0),   # Raspberry Pi 3
    "cortex-a72": Core("0xd08", "0x0", 3, _V8_0),   # Raspberry Pi 4
    "cortex-a55": Core("0xd05", "0x1", 0, _V8_2),   # phones' little cores
    "cortex-a76": Core("0xd0b", "0x4", 1, _V8_2),   # Raspberry Pi 5, phones' big cores
}


class BoardSetupError(OrchestratorError):
    """The emulated board cannot be built or used here: the message says what to install."""


def boards_home() -> Path:
    env = os.environ.get("ORCHESTRATOR_BOARDS")
    return Path(env) if env else Path.home() / ".cache" / "orchestrator" / "boards"


def board_folder(arch: str = ARCH) -> Path:
    return boards_home() / arch


def python_for(cpu: str, folder: Path | None = None) -> Path:
    """The emulated board's Python on `cpu` (a script that starts it under qemu)."""
    return (folder or board_folder()) / "bin" / f"python3-{cpu}"


def check_cpu(cpu: str) -> None:
    if cpu not in CORES:
        raise BoardSetupError(f"the emulated board has no core {cpu!r}: use one of "
                              f"{', '.join(CORES)} (qemu://aarch64?cpu=cortex-a76)")


def missing_setup(folder: Path | None = None) -> str | None:
    """Why the emulated board cannot run here (with the fix), or None when it can."""
    folder = folder or board_folder()
    if shutil.which(QEMU) is None:
        return (f"{QEMU} is not installed: `apt-get install qemu-user-static` (Debian), "
                "then `orchestrator device prepare qemu://aarch64`")
    if not (folder / "board.json").is_file():
        return (f"the emulated board is not built in {folder}: run `orchestrator device "
                "prepare qemu://aarch64` (it needs apt's arm64 packages and PyPI's aarch64 "
                "wheels, once)")
    return None


def cpuinfo(core: Core, cores: int) -> str:
    block = ("processor\t: {n}\nBogoMIPS\t: 50.00\nFeatures\t: {f}\nCPU implementer\t: "
             "0x41\nCPU architecture: 8\nCPU variant\t: {v}\nCPU part\t: {p}\nCPU revision\t: "
             "{r}\n\n")
    return "".join(block.format(n=n, f=core.features, v=core.variant, p=core.part,
                                r=core.revision) for n in range(cores))


def _run(argv: list[str], what: str, cwd: Path | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise BoardSetupError(f"{what} failed (`{' '.join(argv[:4])} ...`):\n{tail}")
    return done.stdout


def _ensure_arm64_packages(say: Callable[[str], None]) -> None:
    """apt must know Debian's arm64 packages: added here when root, else the exact steps."""
    foreign = _run(["dpkg", "--print-foreign-architectures"], "dpkg").split()
    if DEBIAN_ARCH in foreign:
        return
    if os.geteuid() != 0:
        raise BoardSetupError("apt does not know Debian's arm64 packages: run `dpkg "
                              "--add-architecture arm64 && apt-get update` as root, then "
                              "this again")
    say("adding Debian's arm64 architecture to apt (dpkg --add-architecture arm64)")
    _run(["dpkg", "--add-architecture", DEBIAN_ARCH], "dpkg --add-architecture")
    _run(["apt-get", "update", "-q"], "apt-get update")


def _closure() -> list[str]:
    """Every arm64 package Python needs (Depends and Pre-Depends, recursively)."""
    out = _run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances",
                *[f"{p}:{DEBIAN_ARCH}" for p in ROOT_PACKAGES]], "apt-cache depends")
    return sorted({line for line in out.splitlines() if line.endswith(f":{DEBIAN_ARCH}")
                   and not line.startswith((" ", "<"))})


def _board_python(root: Path) -> Path:
    found = sorted(root.glob("usr/bin/python3.[0-9]*"))
    found = [p for p in found if p.name.replace("python", "").replace(".", "").isdigit()]
    if not found:
        raise BoardSetupError(f"no python3.X in the unpacked arm64 packages ({root}/usr/bin)")
    return found[-1]


def _host_litert_version() -> str:
    from importlib.metadata import version

    return version("ai-edge-litert")


def _host_tensorflow_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tensorflow-cpu")
    except PackageNotFoundError:
        return version("tensorflow")


def add_tensorflow(folder: Path | None = None, say: Callable[[str], None] = print) -> None:
    """TensorFlow's aarch64 wheel (this host's release) into the built board's site, for
    GraphDef variants: 1.5 GB, and its import alone took 62 s under qemu on this project's
    machine, so the board is built without it."""
    folder = folder or board_folder()
    facts = json.loads((folder / "board.json").read_text())
    _install_wheels(folder / "site", facts["python"], say,
                    [f"tensorflow=={_host_tensorflow_version()}"])
    facts["tensorflow"] = _host_tensorflow_version()
    (folder / "board.json").write_text(json.dumps(facts, indent=1))


def _install_wheels(site: Path, python_version: str, say: Callable[[str], None],
                    wanted: list[str] | None = None) -> None:
    wanted = wanted or ["numpy", f"ai-edge-litert=={_host_litert_version()}", "cryptography"]
    say(f"installing the aarch64 wheels of {', '.join(wanted)} for Python {python_version}")
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
          "--no-compile", "--target", str(site), *platforms, "--implementation", "cp",
          "--python-version", python_version, "--only-binary=:all:", *wanted],
         "pip install (aarch64 wheels)")


def _write_core(folder: Path, cpu: str, python: Path) -> None:
    """cpus/<cpu>/: proc/cpuinfo for that core, every other top folder a link into root/."""
    overlay = folder / "cpus" / cpu
    (overlay / "proc").mkdir(parents=True, exist_ok=True)
    (overlay / "proc" / "cpuinfo").write_text(cpuinfo(CORES[cpu], os.cpu_count() or 1))
    for entry in (folder / "root").iterdir():
        link = overlay / entry.name
        if entry.name != "proc" and not link.exists():
            link.symlink_to(Path("..", "..", "root", entry.name))
    script = folder / "bin" / f"python3-{cpu}"
    relative = python.relative_to(folder)
    script.write_text(
        "#!/bin/sh\n"
        f"# The emulated aarch64 board's Python on a {cpu} (orchestrator device prepare)\n"
        'board="$(cd "$(dirname "$0")/.." && pwd)"\n'
        f'ORCHESTRATOR_BOARD_PYTHON="$board/bin/python3-{cpu}" PYTHONPATH="$board/site" '
        "PYTHONNOUSERSITE=1 \\\n"
        f'  exec {QEMU} -cpu {cpu} -L "$board/cpus/{cpu}" "$board/{relative}" "$@"\n')
    script.chmod(0o755)


def build(folder: Path | None = None, say: Callable[[str], None] = print) -> Path:
    """Build the emulated board in `folder` (whole, or not at all); its folder."""
    folder = folder or board_folder()
    if shutil.which(QEMU) is None:
        raise BoardSetupError(f"{QEMU} is not installed: `apt-get install qemu-user-static` "
                              "(Debian), then this again")
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise BoardSetupError(f"{tool} is not on this machine: the emulated board is built "
                                  "from Debian's arm64 packages with apt")
    _ensure_arm64_packages(say)
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        packages = _closure()
        say(f"fetching {len(packages)} Debian arm64 packages (Python and its libraries)")
        debs = work / "debs"
        debs.mkdir()
        os.chmod(work, 0o755)  # apt's sandbox user writes here
        _run(["apt-get", "download", "-q", *packages], "apt-get download", cwd=debs)
        root = work / "root"
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(root)], f"dpkg-deb -x {deb.name}")
        shutil.rmtree(debs)
        python = _board_python(root)
        python_version = python.name.removeprefix("python")
        _install_wheels(work / "site", python_version, say)
        say("compiling the board's Python modules (the host's Python, same bytecode)")
        if sys.version_info[:2] == tuple(int(p) for p in python_version.split(".")):
            for tree in (root / "usr" / "lib" / f"python{python_version}", work / "site"):
                subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "-x",
                                "/tests?/", str(tree)], check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               stdin=subprocess.DEVNULL)
        (work / "bin").mkdir()
        for cpu in CORES:
            _write_core(work, cpu, python)
        (work / "board.json").write_text(json.dumps(
            {"arch": ARCH, "python": python_version, "packages": packages,
             "cores": sorted(CORES), "litert": _host_litert_version()}, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        work.rename(folder)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return folder
