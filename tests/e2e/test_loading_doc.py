"""docs/loading.md's code run on a fresh digits run's outputs, and what that run's console
and report say a person reads: the file to ship, one unit family, no repeated warnings.

The Python snippets are taken from the page itself (a block whose first line is
`# python NAME.py ...`), so the page cannot drift from what runs."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.project_env import in_project

from orchestrator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "loading.md"
VARIANTS = ("fp32", "int8", "mobile", "litert_int8")

pytestmark = pytest.mark.slow


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def _python_snippets() -> dict[str, str]:
    """Script name -> code, for the blocks the page says were run here."""
    found = {}
    for code in _blocks("python"):
        first = code.splitlines()[0]
        match = re.match(r"# python (\w+\.py) ", first)
        if match:
            found[match.group(1)] = code
    return found


@pytest.fixture(scope="module")
def digits_run(digits_example: Path, prefect_server: None,
               tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("loading")
    recipe = work / "recipes" / "digits.yaml"
    recipe.parent.mkdir()
    shutil.copy(ROOT / "recipes" / "digits.yaml", recipe)
    (work / "examples").symlink_to(ROOT / "examples")
    key = base64.b64encode(os.urandom(32)).decode()
    env = {"ORCHESTRATOR_HOME": str(work / ".orchestrator"), "ORCHESTRATOR_MODEL_KEY": key,
           "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    out, err = io.StringIO(), io.StringIO()
    with in_project(work, env), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        code = main(["run", str(recipe), "-o", "out/digits",
                     *[a for v in VARIANTS for a in ("--variant", v)]])
    return {"work": work, "out": work / "out" / "digits", "key": key, "code": code,
            "stdout": out.getvalue(), "stderr": err.getvalue(),
            "report": json.loads((work / "out" / "digits" / "report.json").read_text())}


# Every snippet in one Python process of its own (one TensorFlow import, not one per
# snippet): each run as `python NAME.py FOLDER` runs it, its own __main__, from the
# checkout's root; its last printed line, or its traceback.
DRIVER = """
import contextlib, io, json, runpy, sys, traceback
results = []
for script, folder in json.loads(sys.argv[1]):
    out = io.StringIO()
    sys.argv = [script, folder]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
        lines = out.getvalue().strip().splitlines()
        results.append({"ok": True, "line": lines[-1] if lines else ""})
    except BaseException:
        results.append({"ok": False, "line": traceback.format_exc()[-2000:]})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def snippets(digits_run: dict) -> dict[tuple[str, str], str]:
    """(script, folder name) -> the last line it printed, for each snippet on the shipped
    files; load_mmap.py on the mobile model decrypted into a plain memmapped folder (as a
    pipeline ending in memmap ships it)."""
    from orchestrator.model.encryption import decrypt
    from orchestrator.model.keys import parse_key

    work, out = digits_run["work"], digits_run["out"]
    for name, code in _python_snippets().items():
        (work / name).write_text(code)
    kind, plaintext = decrypt((out / "mobile" / "model.enc").read_bytes(),
                              parse_key(digits_run["key"], "the test's key"))
    plain = work / "memmapped"
    plain.mkdir()
    (plain / "model.mmap").write_bytes(plaintext)
    signature = json.loads((out / "mobile" / "signature.json").read_text())
    (plain / "signature.json").write_text(json.dumps({**signature, "kind": kind}))
    runs = [("load_tflite.py", out / "litert_int8"), ("load_graphdef.py", out / "fp32"),
            ("load_graphdef.py", out / "int8"), ("load_encrypted.py", out / "mobile"),
            ("decrypt_model.py", out / "mobile"), ("load_mmap.py", plain)]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER,
         json.dumps([[str(work / script), str(folder)] for script, folder in runs])],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "ORCHESTRATOR_MODEL_KEY": digits_run["key"],
             "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    found = {}
    for (script, folder), result in zip(runs, results, strict=True):
        found[script, folder.name] = result["line"] if result["ok"] else (
            f"FAILED: {result['line']}")
    return found


def test_the_page_has_the_snippets_it_says_were_run() -> None:
    assert set(_python_snippets()) == {"load_tflite.py", "load_graphdef.py", "load_mmap.py",
                                       "load_encrypted.py", "decrypt_model.py"}


@pytest.mark.parametrize(("script", "variant"), [
    ("load_tflite.py", "litert_int8"), ("load_graphdef.py", "fp32"),
    ("load_graphdef.py", "int8"), ("load_encrypted.py", "mobile")])
def test_the_python_loading_code_runs_on_the_shipped_files(digits_run: dict, snippets: dict,
                                                           script: str, variant: str) -> None:
    assert digits_run["code"] == 0, digits_run["stderr"][-2000:]
    assert snippets[script, variant] == "class 5"


def test_decrypting_without_orchestrator(digits_run: dict, snippets: dict) -> None:
    from orchestrator.model.encryption import decrypt
    from orchestrator.model.keys import parse_key

    kind, plaintext = decrypt((digits_run["out"] / "mobile" / "model.enc").read_bytes(),
                              parse_key(digits_run["key"], "the test's key"))
    assert snippets["decrypt_model.py", "mobile"] == (
        f"{kind} {len(plaintext)} bytes, never written to disk")
    # the memmapped payload, as a pipeline ending in memmap ships it
    assert snippets["load_mmap.py", "memmapped"] == "class 5"


def test_the_cpp_decryption_matches(digits_run: dict, tmp_path: Path) -> None:
    from orchestrator.model.encryption import decrypt
    from orchestrator.model.keys import parse_key

    compiler = shutil.which("g++")
    if compiler is None or not Path("/usr/include/openssl/evp.h").is_file():
        pytest.skip("needs g++ and OpenSSL's headers")
    [function] = [c for c in _blocks("cpp") if "DecryptModel" in c]
    (tmp_path / "decrypt.cc").write_text(function + """
#include <cstdio>
#include <fstream>
#include <iterator>
int main(int, char** argv) {
  std::ifstream in(argv[1], std::ios::binary), k(argv[2], std::ios::binary);
  std::vector<unsigned char> file((std::istreambuf_iterator<char>(in)), {});
  std::vector<unsigned char> key((std::istreambuf_iterator<char>(k)), {});
  int kind = 0;
  try {
    auto plain = DecryptModel(file, key.data(), &kind);
    std::fwrite(plain.data(), 1, plain.size(), stdout);
  } catch (const std::exception& e) { std::fprintf(stderr, "%s\\n", e.what()); return 1; }
  return kind == 2 ? 0 : 3;
}
""")
    subprocess.run([compiler, "-std=c++17", "-Wall", "-Werror", str(tmp_path / "decrypt.cc"),
                    "-lcrypto", "-o", str(tmp_path / "decrypt")], check=True, timeout=300)
    key = parse_key(digits_run["key"], "the test's key")
    (tmp_path / "key").write_bytes(key)
    enc = digits_run["out"] / "mobile" / "model.enc"
    done = subprocess.run([tmp_path / "decrypt", enc, tmp_path / "key"], capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == decrypt(enc.read_bytes(), key)[1]
    (tmp_path / "key").write_bytes(bytes(32))  # a wrong key: refused, nothing returned
    wrong = subprocess.run([tmp_path / "decrypt", enc, tmp_path / "key"], capture_output=True,
                           timeout=60)
    assert wrong.returncode == 1 and wrong.stdout == b""


def test_the_console_says_what_to_ship_once_in_one_unit(digits_run: dict) -> None:
    stdout, stderr = digits_run["stdout"], digits_run["stderr"]
    # which file, relative to the working directory, and where its loading code is
    for target in ("phone", "pi"):
        assert f"selected for {target}: litert_int8" in stdout
    assert stdout.count("  ship out/digits/litert_int8/model.tflite, a LiteRT flatbuffer; "
                        "load it: ") == 2
    assert "docs/loading.md" in stdout
    assert "KiB" not in stdout and "FAIL" not in stdout
    assert stdout.count("MiB = 1,048,576 bytes") == 1
    # a healthy model: no warning, beside a stage or under the table; no diagnostics table
    assert "warning" not in stdout + stderr, stdout + stderr
    assert "worst 8-bit layers" not in stderr and "RMSE/scale" not in stdout + stderr


def test_report_json_says_what_was_measured(digits_run: dict) -> None:
    from orchestrator.results.report import RAM_HEAP

    variants = digits_run["report"]["variants"]
    # one RAM measure for every kind: the load probe's heap growth, which benchmark measured
    assert variants["litert_int8"]["ram_source"] == RAM_HEAP
    assert variants["fp32"]["ram_source"] == RAM_HEAP
    assert variants["fp32"]["ram_bytes"] == round(
        variants["fp32"]["memory"]["anon_growth_mb"] * 1048576)
    for variant in variants.values():
        kl = variant["metrics"].get("kl_divergence.probs")
        assert kl is not None and kl >= 0.0
    assert variants["fp32"]["targets"]["phone"]["broken"] == ["size"]
    assert variants["fp32"]["targets"]["pi"]["broken"] == []
    [trial] = variants["int8"]["trials"]  # the guard's one trial: the recipe's own, chosen
    assert trial["chosen"] is True
    diagnostics = " ".join(variants["int8"]["diagnostics"])
    assert "no eight-bit kernel: Softmax" in diagnostics
    page = (digits_run["out"] / "report.html").read_text()
    assert '<a href="litert_int8/model.tflite">' in page
    link = re.search(r'<a href="([^"]*loading\.md)">', page)
    assert link and (digits_run["out"] / link.group(1)).resolve() == DOC
