"""Issue 24: names a user types, and commands the tool tells them to type.

- `run --variant NAME` with a name the recipe lacks: exit 2 naming it, the recipe's
  pipelines and the closest one (it was exit 70 with a KeyError traceback).
- The hints the tool prints (`make one with orchestrator keygen ...`, `Dashboards:
  orchestrator ui ...`, `next: ...`) work when pasted as printed: `orchestrator` when
  that name on PATH is the command that printed it, else that command's path."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from support.robust_helpers import RECIPES, check_clean_error, cli_subprocess

SCRIPT = Path(sysconfig.get_path("scripts")) / "orchestrator"  # this venv's console script
VARIANTS = ("fp32", "int8", "mobile", "litert_int8", "litert_dynamic")


@pytest.mark.parametrize(("name", "closest"), [("nope", None), ("lite_int8", "litert_int8"),
                                               ("INT8", "int8")])
def test_unknown_variant_is_exit_2_with_the_known_ones(
        name: str, closest: str | None, digits_example: Path, tmp_path: Path,
        load_env: dict[str, str]) -> None:
    done = cli_subprocess(["run", RECIPES / "digits.yaml", "--variant", "fp32", "--variant",
                           name, "-o", tmp_path / "out"], load_env, tmp_path)
    message = check_clean_error(done.code, done.err, "digits.yaml", f"unknown variant {name!r}",
                                *VARIANTS)
    assert len(message.strip().splitlines()) == 1, message
    if closest is None:
        assert "did you mean" not in message
    else:  # worded as the recipe checks word it: double quotes, before the known names
        hint = f'unknown variant {name!r} (did you mean "{closest}"?); the recipe has: '
        assert hint in message, message
    # refused before anything started or was written
    assert not (tmp_path / "out").exists() and not (tmp_path / ".orchestrator").exists()


def test_every_did_you_mean_is_worded_one_way() -> None:
    """Each "did you mean" the package prints reads `(did you mean "NAME"?)`, before the
    list of known names (recipe checks, devices, stages, --variant alike)."""
    import re

    package = Path(__file__).resolve().parents[2] / "orchestrator"
    found = []
    for source in sorted(package.rglob("*.py")):
        for number, line in enumerate(source.read_text().splitlines(), 1):
            if "did you mean" in line and ("f'" in line or 'f"' in line):
                found.append((source.name, number, line.strip()))
    assert len(found) >= 5, found  # recipe_checks, recipe_errors, devices, stages, cli_common
    for name, number, line in found:
        assert re.search(r"""f' \(did you mean "\{[^}]+\}"\?\)'""", line), (name, number, line)
    # and before the list: no hint is added after a list of names
    for source in sorted(package.rglob("*.py")):
        text = source.read_text()
        assert not re.search(r"(\{listed\}|\)\})\{hint\}", text), source.name


def _hint(text: str, before: str) -> str:
    """The command inside `...` after `before` in `text`."""
    start = text.index(before) + len(before)
    return text[start:text.index("`", start)]


def _env(path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env.update(PATH=path, LC_ALL="C.UTF-8", LANG="C.UTF-8")
    return env


@pytest.mark.skipif(not SCRIPT.is_file(), reason=f"no console script at {SCRIPT}")
@pytest.mark.parametrize("on_path", [False, True], ids=["not-on-PATH", "venv-on-PATH"])
def test_a_printed_hint_works_when_pasted(on_path: bool, tmp_path: Path) -> None:
    """The console script run by its path, as after `make` without activating the venv:
    the hint names that path (relative to the working directory when shorter); with the
    venv's bin on PATH (activated) it is plain `orchestrator`. Either way the hint, pasted
    into a shell in the same folder with the same PATH, does what it says."""
    system_path = os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(
        os.pathsep) if not (Path(p) / "orchestrator").exists())
    path = os.pathsep.join([str(SCRIPT.parent), system_path]) if on_path else system_path
    env = _env(path)
    cwd = SCRIPT.parents[2]  # the project holding .venv/: the hint is then relative
    key = tmp_path / "model.key"
    done = subprocess.run([str(SCRIPT), "decrypt", str(tmp_path / "absent.enc"), "-o",
                           str(tmp_path / "plain"), "--key-file", str(key)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    hint = _hint(done.stderr, "make one with `")
    words = shlex.split(hint)
    if on_path:
        assert words[0] == "orchestrator", hint
    else:
        assert Path(words[0]) == SCRIPT.relative_to(cwd), hint  # .venv/bin/orchestrator
    assert words[1:] == ["keygen", "-o", str(key)]
    pasted = subprocess.run(["bash", "-c", hint], env=env, cwd=cwd, capture_output=True,
                            text=True, timeout=60)
    assert pasted.returncode == 0, (hint, pasted.stderr)
    assert len(key.read_text().strip()) == 44  # a 32-byte key, base64


def test_hints_of_the_test_runner_name_this_venvs_command(tmp_path: Path,
                                                          load_env: dict[str, str]) -> None:
    """Run as `python -c ... console_main()` (how the suite starts the CLI), the hint
    still names a command that runs this code: this environment's console script."""
    done = cli_subprocess(["decrypt", tmp_path / "absent.enc", "-o", tmp_path / "plain",
                           "--key-file", tmp_path / "k.key"], load_env, tmp_path)
    hint = _hint(done.err, "make one with `")
    first = shlex.split(hint)[0]
    found = first if os.sep in first else shutil.which(first, path=load_env.get("PATH"))
    assert found is not None and Path(tmp_path, found).resolve() == SCRIPT.resolve(), hint
