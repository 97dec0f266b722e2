"""encrypt: AES-256-GCM per docs/formats.md; keys from env or file, never leaked; every
tampered, truncated or wrong-key input is a clear exit-2 error."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from orchestrator import load_encrypted
from orchestrator.cli.main import main
from orchestrator.measure.tf_runtime import predict
from orchestrator.model import kinds
from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.encryption import EncryptedFormatError, decrypt, read_header
from orchestrator.model.keys import KeyMaterialError, ModelKey, key_id, load_key, parse_key
from orchestrator.stages import StageContext, get_stage

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))


def context(key: bytes = KEY) -> StageContext:
    model_key = ModelKey(key, source="test")
    keys = {model_key.key_id: model_key}

    def lookup(wanted: str | None) -> ModelKey:
        if wanted is None:
            return model_key
        if wanted not in keys:
            raise KeyMaterialError(f"no key {wanted}")
        return keys[wanted]

    return StageContext(pipeline="test", stage="encrypt", model_key=lookup)


def encrypt(artifact: ModelArtifact, key: bytes = KEY) -> object:
    stage = get_stage("encrypt")
    return stage.run(artifact, stage.params(), context(key))


def memmapped(artifact: ModelArtifact) -> ModelArtifact:
    stage = get_stage("memmap")
    return stage.run(artifact, stage.params(measure=False), context()).artifact


@pytest.fixture(params=["graphdef", "memmapped"])
def plain(request: pytest.FixtureRequest, digits_int8: ModelArtifact) -> ModelArtifact:
    return digits_int8 if request.param == "graphdef" else memmapped(digits_int8)


def test_encrypted_file_hides_decrypts_and_runs(plain: ModelArtifact, digits_int8: ModelArtifact,
                                                digits_data: dict, tmp_path: Path) -> None:
    result = encrypt(plain)
    out = result.artifact
    assert out.kind == "encrypted"
    blob, plaintext = kinds.to_bytes(out), kinds.to_bytes(plain)
    assert len(blob) == 28 + len(plaintext) + 16
    # none of the plaintext's 32-byte windows appears in the file
    windows = {plaintext[i:i + 32] for i in range(0, len(plaintext) - 31)}
    assert not any(blob[i:i + 32] in windows for i in range(0, len(blob) - 31))
    assert decrypt(blob, KEY) == (plain.kind, plaintext)
    header = read_header(blob)
    assert (header.payload_kind, header.key_id) == (plain.kind, key_id(KEY))
    assert result.info["encryption"]["key_id"] == key_id(KEY)
    assert kinds.facts(out)["params"] == kinds.facts(plain)["params"]
    # load_encrypted: decrypted in memory into a runnable model, same outputs
    x = digits_data["x_test"][:40]
    path = tmp_path / "model.enc"
    path.write_bytes(blob)
    (tmp_path / "signature.json").write_text(out.signature_json())
    for key in (KEY, base64.b64encode(KEY).decode(), KEY.hex()):
        model = load_encrypted(path, key=key)
        assert np.array_equal(predict(model, x), predict(digits_int8, x))
    (tmp_path / "signature.json").unlink()  # detected inputs/outputs without a signature
    assert np.array_equal(predict(load_encrypted(path, key=KEY), x), predict(digits_int8, x))


def test_measuring_stages_run_the_encrypted_model(digits_int8: ModelArtifact,
                                                  digits_data: dict) -> None:
    from orchestrator.stages.base import EvaluationData

    out = encrypt(memmapped(digits_int8)).artifact
    x, y = digits_data["x_test"], digits_data["y_test"]
    ctx = context()
    ctx.evaluation = lambda: EvaluationData(x, y)
    ctx.reference_outputs = lambda: predict(digits_int8, x)
    evaluate = get_stage("evaluate")
    info = evaluate.run(out, evaluate.params(), ctx).info
    assert info["fidelity"] == 1.0 and info["max_abs_diff"] == 0.0
    benchmark = get_stage("benchmark")
    bench = benchmark.run(out, benchmark.params(warmup=1, runs=3), ctx).info
    assert bench["flops"] > 0 and bench["precision"] == "int8"
    ctx.model_key = None  # no key: a clear exit-2 error
    with pytest.raises(KeyMaterialError, match="encrypted .* no key"):
        evaluate.run(out, evaluate.params(), ctx)


def test_pycryptodome_decrypts_using_only_the_documented_layout(
        digits_int8: ModelArtifact) -> None:
    """A second, independent AES-GCM, reading the file per docs/formats.md."""
    import hashlib

    from Crypto.Cipher import AES

    plaintext = kinds.to_bytes(digits_int8)
    blob = kinds.to_bytes(encrypt(digits_int8).artifact)
    assert blob[0:4] == b"OENC" and blob[4] == 1 and blob[5] == 1 and blob[6:8] == b"\0\0"
    assert blob[8:16] == hashlib.sha256(KEY).digest()[:8]
    cipher = AES.new(KEY, AES.MODE_GCM, nonce=blob[16:28], mac_len=16)
    cipher.update(blob[0:28])
    assert cipher.decrypt_and_verify(blob[28:-16], blob[-16:]) == plaintext


@pytest.fixture(scope="module")
def sealed(digits_example: Path) -> bytes:
    from support.digits_graphs import fp32

    return kinds.to_bytes(encrypt(fp32(str(digits_example))).artifact)


@pytest.mark.parametrize("position", [0, 3, 4, 5, 6, 8, 15, 16, 27, 28, 1000, -17, -1])
def test_any_tampered_byte_is_refused(position: int, sealed: bytes) -> None:
    data = bytearray(sealed)
    data[position] ^= 0x01
    with pytest.raises(EncryptedFormatError) as info:
        decrypt(bytes(data), KEY)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("length", [0, 10, 43, 44, 1000, -1])
def test_truncated_file_is_refused(length: int, sealed: bytes) -> None:
    with pytest.raises(EncryptedFormatError, match="truncated|modified"):
        decrypt(sealed[:length], KEY)


def test_decrypt_command(sealed: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    path, out = tmp_path / "model.enc", tmp_path / "model.pb"
    path.write_bytes(sealed)
    key_file = tmp_path / "k.key"
    key_file.write_text(KEY.hex())
    wrong = tmp_path / "wrong.key"
    wrong.write_text(base64.b64encode(OTHER).decode())
    assert main(["decrypt", str(path), "-o", str(out), "--key-file", str(wrong)]) == 2
    err = capsys.readouterr().err
    assert "wrong key" in err and key_id(OTHER) in err and not out.exists()
    tampered = tmp_path / "tampered.enc"
    tampered.write_bytes(sealed[:-1] + bytes([sealed[-1] ^ 1]))
    assert main(["decrypt", str(tampered), "-o", str(out), "--key-file", str(key_file)]) == 2
    assert "modified" in capsys.readouterr().err and not out.exists()
    monkeypatch.setenv("ORCHESTRATOR_MODEL_KEY", base64.b64encode(KEY).decode())
    assert main(["decrypt", str(path), "-o", str(out)]) == 0
    assert decrypt(sealed, KEY)[1] == out.read_bytes()
    shown = capsys.readouterr()
    for form in (base64.b64encode(KEY).decode(), KEY.hex()):
        assert form not in shown.out + shown.err


@pytest.mark.parametrize(("value", "words"), [
    ("", "empty"),
    (base64.b64encode(bytes(16)).decode(), "is 16 bytes; AES-256 needs 32"),
    ("ab" * 31, "is 31 bytes"),
    ("not a key at all!", "neither base64 nor hex"),
    ("zz" * 32, "is 48 bytes"),
    ("%" * 44, "neither base64 nor hex"),
])
def test_bad_keys(value: str, words: str) -> None:
    with pytest.raises(KeyMaterialError, match=words) as info:
        parse_key(value, "environment variable X")
    assert info.value.exit_code == 2
    if len(value) > 8:
        assert value not in str(info.value)  # the error never quotes the value


def test_key_sources() -> None:
    assert parse_key(KEY.hex(), "x") == KEY
    assert parse_key(base64.b64encode(KEY).decode() + "\n", "x") == KEY
    assert parse_key(base64.urlsafe_b64encode(KEY).decode(), "x") == KEY
    with pytest.raises(KeyMaterialError, match="set ORCH_K"):
        load_key("ORCH_K", environ={})
    found = load_key("ORCH_K", environ={"ORCH_K": KEY.hex()})
    assert found.secret == KEY and "ORCH_K" in found.source
    assert KEY.hex() not in repr(found) and str(list(KEY)) not in repr(found)


def test_keygen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sub" / "model.key"
    assert main(["keygen", "-o", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = load_key(key_file=path)
    out = capsys.readouterr().out
    assert key.key_id in out and path.read_text().strip() not in out
    before = path.read_bytes()
    assert main(["keygen", "-o", str(path)]) == 2  # never overwrites a key
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["model.key"]  # no temp left
    assert main(["keygen"]) == 0
    assert len(parse_key(capsys.readouterr().out, "stdout")) == 32


def test_cache_key_follows_the_key_id_not_where_it_is(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      digits_example: Path) -> None:
    from orchestrator.engine.plan import build_plan
    from orchestrator.recipe.loading import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nname: enc\nmodel:\n  path: {digits_example}/saved_model\n"
                      "pipelines:\n  p:\n    stages: [freeze, encrypt]\n")
    other = recipe.with_name("o.yaml")
    other.write_text(recipe.read_text().replace("encrypt]", "encrypt: {key_env: OTHER_K}]"))

    def key_of(path: Path) -> str:
        return build_plan(load_recipe(path, check_files=False), None, {}).pipelines["p"][-1].key

    monkeypatch.setenv("ORCHESTRATOR_MODEL_KEY", KEY.hex())
    monkeypatch.setenv("OTHER_K", base64.b64encode(KEY).decode())
    first = key_of(recipe)
    assert key_of(other) == first  # same key, another variable: same artifact
    monkeypatch.setenv("ORCHESTRATOR_MODEL_KEY", OTHER.hex())
    assert key_of(recipe) != first  # another key: never the cached artifact
    monkeypatch.delenv("ORCHESTRATOR_MODEL_KEY")
    from orchestrator.errors import DataError

    with pytest.raises(DataError, match="no model key") as info:
        key_of(recipe)
    assert info.value.line == 7 and info.value.file == str(recipe)
    os.environ.pop("OTHER_K", None)
