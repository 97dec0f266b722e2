"""`orchestrator benchmark MODEL`: the benchmark stage on model files of every kind, its
printed tables checked against its own --json, and every bad input an exit 2 without a
traceback. Real models throughout: a small Keras CNN with unknown spatial dimensions,
exported as a SavedModel and converted (frozen .pb, .tflite, memmapped, encrypted)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.main import main

RUNS = 4
KEY_ENV = "BENCH_TEST_KEY"

# A Keras CNN with input (None, None, None, 3): batch and spatial size unknown. Built in a
# fresh process, so that Keras' global state stays out of the test session.
_MAKE = textwrap.dedent("""
    import sys
    from pathlib import Path
    import keras
    import tensorflow as tf

    out = Path(sys.argv[1])
    keras.utils.set_random_seed(0)
    pixels = keras.Input((None, None, 3), name="pixels")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv")(pixels)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    # a bias that is not all zeros: LiteRT's converter drops an all-zero one (the graph
    # keeps its BiasAdd), and the .tflite's FLOPs would then differ from the graph's
    probs = keras.layers.Dense(4, activation="softmax", name="probs",
                               bias_initializer="ones")(x)
    model = keras.Model(pixels, probs)
    model.export(str(out / "saved_model"), verbose=False)
    model.save(out / "model.keras")
    converter = tf.lite.TFLiteConverter.from_saved_model(str(out / "saved_model"))
    (out / "model.tflite").write_bytes(converter.convert())
""")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every kind of model file of one CNN, plus a key file and an unrelated key."""
    from orchestrator.model.encryption import encrypt
    from orchestrator.model.keys import encode_key, generate_key, write_key_file
    from orchestrator.model.sources import load_model
    from orchestrator.stages import get_stage
    from orchestrator.stages.base import StageContext

    out = tmp_path_factory.mktemp("bench-models")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _MAKE, str(out)], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ctx = StageContext(pipeline="test", stage="freeze")
    freeze = get_stage("freeze")
    frozen = freeze.run(load_model(out / "saved_model"), freeze.params(), ctx).artifact
    (out / "model.pb").write_bytes(frozen.graph_bytes())
    memmap = get_stage("memmap")  # min size 100: the conv kernel and dense weights map
    mapped = memmap.run(frozen, memmap.params(min_conversion_size_bytes=100, measure=False),
                        ctx).artifact
    (out / "model.mmap").write_bytes(mapped.payload)
    key = generate_key()
    write_key_file(out / "model.key", key)
    for name, kind, plain in (("pb.enc", "graphdef", frozen.graph_bytes()),
                              ("mmap.enc", "memmapped", mapped.payload),
                              ("tflite.enc", "tflite", (out / "model.tflite").read_bytes())):
        (out / name).write_bytes(encrypt(plain, kind, key))
    (out / "key.txt").write_text(encode_key(key))
    (out / "other-key.txt").write_text(encode_key(generate_key()))
    return {p.name: p for p in out.iterdir()}


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models: dict[str, Path]) -> Path:
    """Run in a scratch folder, the key in KEY_ENV, the session's default key unset."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(KEY_ENV, models["key.txt"].read_text())
    monkeypatch.delenv("ORCHESTRATOR_MODEL_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["benchmark", *args])
    out, err = capsys.readouterr()
    return code, out, err


def bench_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = bench(capsys, *args, "--json")
    assert code == 0, err
    return dict(json.loads(out))


# --------------------------------------------------------------------------- parsing text


LATENCY = re.compile(r"^  threads=(\d+): count=(\d+) (.*)$", re.MULTILINE)
TIMING = re.compile(r"^(-?[\d,]+(?:\.\d+)?) (µs|ms)$")
STAT = re.compile(r"(\w+)=(\S+ \S+)")


def ms_of(text: str) -> float:
    """A timing as formatting.format_ms prints it ("5.60 µs", "1.25 ms", "0 ms"), in ms:
    3 significant digits (at least the digits of its rounding), µs below 1 ms."""
    match = TIMING.match(text)
    assert match, f"not a timing: {text!r}"
    value = float(match.group(1).replace(",", ""))
    if match.group(2) == "µs":
        assert abs(value) < 1000, text
        return value / 1000.0
    assert value == 0 or abs(value) >= 1, f"{text}: below 1 ms is shown in µs"
    return value


def significant_digits(text: str) -> int:
    digits = TIMING.match(text).group(1).replace(",", "").replace("-", "")  # type: ignore[union-attr]
    return len(digits.replace(".", "").lstrip("0"))


def latency_lines(text: str) -> list[tuple[int, int, dict[str, float]]]:
    found = []
    for t, c, rest in LATENCY.findall(text):
        stats = STAT.findall(rest)
        assert " ".join(f"{k}={v}" for k, v in stats) == rest, rest
        for _, value in stats:  # 3 significant digits, or an exact 0
            assert significant_digits(value) in (0, 3) or value.count(",") > 0, value
        found.append((int(t), int(c), {k: ms_of(v) for k, v in stats}))
    return found


def mib_of(text: str, label: str) -> float:
    match = re.search(rf"{label}: ([\d.]+) MiB", text)
    assert match, f"no {label} in MiB in:\n{text}"
    return float(match.group(1))


def table(text: str, title: str) -> tuple[list[str], list[list[str]]]:
    """A benchmark_model table: its columns and rows (split on runs of 2+ spaces; the last
    column, the node name, holds no such run)."""
    lines = text.split(f"============ {title} ============\n", 1)[1].splitlines()
    rows = []
    for line in lines[1:]:
        if not line.strip() or line.startswith("..."):
            break
        rows.append(re.split(r" {2,}", line.strip()))
    return re.split(r" {2,}", lines[0].strip()), rows


def number_after(text: str, label: str) -> int:
    match = re.search(rf"{label}: ([\d,]+)", text)
    assert match, f"no {label} in:\n{text}"
    return int(match.group(1).replace(",", ""))


# --------------------------------------------------------------------------- the tables


def test_text_report_agrees_with_json(in_tmp: Path, models: dict[str, Path],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    args = (str(models["model.pb"]), "--runs", str(RUNS), "--warmup", "1", "--threads", "1,2",
            "--profile-runs", "3", "--input-shape", "pixels:2,8,8,3")
    info = bench_json(capsys, *args)
    assert info["latency_ms"]["count"] == RUNS and len(info["latency_runs_ms"]) == RUNS
    assert [row["threads"] for row in info["threads_matrix"]] == [1, 2]
    assert info["batch_size"] == 2 and info["flops"] > 0
    assert info["profile"]["source"] == "step_stats" and info["profile"]["runs"] == 3
    assert info["memory"]["load_ms"] > 0

    code, text, err = bench(capsys, *args)
    assert code == 0, err
    assert "Traceback" not in err
    # one latency line per threads setting, each over --runs timed runs, ordered stats
    lines = latency_lines(text)
    assert [(t, c) for t, c, _ in lines] == [(1, RUNS), (2, RUNS)]
    for _, _, stats in lines:
        assert set(stats) == {"first", "curr", "min", "max", "avg", "std", "p50", "p90", "p99"}
        assert stats["min"] <= stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"]
        assert stats["min"] <= stats["avg"] <= stats["max"]
    assert "batch 2" in text and "1 warm-up + 4 timed runs" in text
    host = info["host"]
    host_line = next(line for line in text.splitlines() if line.startswith("Measured on"))
    assert "Measured on this host: " in host_line
    assert host["cpu"] in host_line and f"TensorFlow {host['tensorflow']}" in host_line
    assert f"{host['cores']} cores" in host_line
    # measured figures first, the estimates under their own header
    measured, estimated = text.split("Estimated (computed from the graph, not measured):")
    assert "Memory of a fresh process" in measured and "load" in measured
    assert "FLOPs" not in measured and "Peak memory" not in measured
    assert number_after(estimated, "FLOPs") == info["flops"]
    peak = info["peak_memory_bytes"] / 2**20  # MiB, 3 significant digits
    assert mib_of(estimated, "Peak memory") == pytest.approx(peak, rel=5e-3)
    assert "bytes" not in estimated.split("Sizes in")[0] and "KiB" not in text
    assert re.search(r"load \S+ (µs|ms), resident \+[\d.]+ MiB, heap \(RssAnon\) "
                     r"\+[\d.]+ MiB", measured), measured

    # "Summary by node type": the same op types and counts as --json, its % adding to 100
    columns, rows = table(text, "Summary by node type")
    assert columns == ["node type", "count", "avg", "avg %", "cdf %", "mem MiB"]
    for row in rows:
        ms_of(row[2])  # a timing as format_ms prints it
    by_type = {r[0]: int(r[1]) for r in rows}
    assert by_type == {r["node type"]: r["count"] for r in info["profile"]["by_node_type"]}
    assert sum(float(r[3]) for r in rows) == pytest.approx(100.0, abs=0.05)
    assert float(rows[-1][4]) == pytest.approx(100.0, abs=0.01)
    # "Top by Computation Time": at most 10 nodes, slowest first, cdf% the running sum
    columns, top = table(text, "Top by Computation Time")
    assert columns == ["node type", "start", "first", "avg", "%", "cdf%", "mem MiB", "name"]
    assert 0 < len(top) <= 10
    running = 0.0
    for row in top:
        running += float(row[4])
        assert float(row[5]) == pytest.approx(running, abs=0.01)
    assert [ms_of(r[3]) for r in top] == sorted((ms_of(r[3]) for r in top), reverse=True)
    assert {r[0] for r in top} <= set(by_type)
    nodes = sum(by_type.values())
    if nodes > len(top):  # the rest is summarized: the shares still add up to 100
        rest = re.search(r"\.\.\. (\d+) more nodes, ([\d.]+)% of the time", text)
        assert rest and int(rest.group(1)) == nodes - len(top)
        assert running + float(rest.group(2)) == pytest.approx(100.0, abs=0.05)
    assert "Per-node profile, measured over 3 traced runs at threads=1" in text


def test_every_printed_timing_and_size_is_the_measured_one_rounded(
        in_tmp: Path, models: dict[str, Path]) -> None:
    """One real benchmark of the frozen graph, printed by format_report: each timing, the
    memory and the profile are its info's figures (what --json prints) in format_ms (3
    significant digits, µs below 1 ms) and MiB, never in KB, KiB or bytes."""
    from orchestrator.cli.benchmark import format_report, run_benchmark
    from orchestrator.model.files import open_model
    from orchestrator.stages import get_stage

    path = models["model.pb"]
    opened = open_model(path)
    params = get_stage("benchmark").params(runs=RUNS, warmup=1, threads=[1], profile_runs=3)
    result = run_benchmark(opened.artifact, params, None, path)
    info, text = result.info, format_report(opened, opened.artifact, params, result)
    (_, count, stats), = latency_lines(text)
    row = info["threads_matrix"][0]["latency_ms"]
    assert count == RUNS
    for key, shown in stats.items():
        assert shown == pytest.approx(row["mean" if key == "avg" else key], rel=5e-3,
                                      abs=1e-9), key
    memory = re.search(r"load (\S+ \S+), resident \+([\d.]+) MiB, heap \(RssAnon\) "
                       r"\+([\d.]+) MiB", text)
    assert memory, text
    assert ms_of(memory.group(1)) == pytest.approx(info["memory"]["load_ms"], rel=5e-3)
    assert float(memory.group(2)) == pytest.approx(info["memory"]["rss_growth_mb"], rel=5e-3)
    assert float(memory.group(3)) == pytest.approx(info["memory"]["anon_growth_mb"],
                                                   rel=5e-3, abs=1e-3)
    assert mib_of(text, "Peak memory") == pytest.approx(info["peak_memory_bytes"] / 2**20,
                                                        rel=5e-3)
    _, rows = table(text, "Summary by node type")
    by_type = {r["node type"]: r for r in info["profile"]["by_node_type"]}
    for cells in rows:
        assert ms_of(cells[2]) == pytest.approx(by_type[cells[0]]["avg ms"], rel=5e-3,
                                                abs=1e-6)
        assert float(cells[5]) == pytest.approx(by_type[cells[0]]["mem KB"] / 1024,
                                                rel=5e-3, abs=1e-9)
    assert "KB" not in text and "KiB" not in text and " bytes" not in text.split("Sizes in")[0]
    assert text.splitlines()[-1].startswith("Sizes in MiB = 1,048,576 bytes")


def test_input_shape_fixes_unknown_dimensions(in_tmp: Path, models: dict[str, Path],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    common = (str(models["model.pb"]), "--runs", "2", "--warmup", "0", "--threads", "1",
              "--profile-runs", "0")
    small = bench_json(capsys, *common, "--input-shape", "pixels:1,8,8,3")
    large = bench_json(capsys, *common, "--input-shape", "pixels:3,16,16,3")
    assert (small["batch_size"], large["batch_size"]) == (1, 3)
    # FLOPs are per sample: the convolution's grow with the area (x4), the head's do not
    assert 3.5 < large["flops"] / small["flops"] <= 4.0
    assert large["memory"] is not None and large["peak_memory_bytes"] > small[
        "peak_memory_bytes"]
    # without a shape the unknown dimensions are fed as 1, and the user is told so
    code, out, err = bench(capsys, *common)
    assert code == 0
    assert "warning: input pixels has unknown dimensions [?,?,?,3]" in err
    assert "--input-shape pixels:" in err
    assert "Input: pixels float32 [?,?,?,3]" in out


def test_several_inputs_in_one_option(in_tmp: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    """benchmark_model's comma-separated form names each input; the second input's
    unknown dimension takes the given size (its FLOPs grow with it)."""
    import numpy as np
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, None], name="y")
        w = tf.constant(np.ones((4, 2), np.float32), name="w")
        tf.add(tf.matmul(x, w), tf.reduce_sum(y * y, axis=1, keepdims=True), name="out")
    path = in_tmp / "two_inputs.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    args = (str(path), "--runs", "2", "--warmup", "0", "--threads", "1", "--profile-runs", "0")
    narrow = bench_json(capsys, *args, "--input-shape", "x:3,4,y:3,5")
    wide = bench_json(capsys, *args, "--input-shape", "y:3,50", "--input-shape", "x:3,4")
    assert narrow["batch_size"] == wide["batch_size"] == 3
    assert wide["flops"] > narrow["flops"]


# --------------------------------------------------------------------------- every kind


_FLOPS: dict[str, int] = {}
KINDS = ["saved_model", "model.keras", "model.pb", "model.mmap", "model.tflite", "pb.enc",
         "mmap.enc", "tflite.enc"]


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_is_benchmarked(name: str, in_tmp: Path, models: dict[str, Path],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    args = (str(models[name]), "--runs", str(RUNS), "--warmup", "1", "--threads", "1",
            "--profile-runs", "2", "--key-env", KEY_ENV, "--input-shape", "pixels:2,8,8,3")
    info = bench_json(capsys, *args)
    assert info["latency_ms"]["count"] == RUNS and info["batch_size"] == 2
    assert info["memory"] is not None  # the fresh process read the file as it ships
    code, text, err = bench(capsys, *args)
    assert code == 0 and "Traceback" not in err
    assert [(t, c) for t, c, _ in latency_lines(text)] == [(1, RUNS)]
    key = models["key.txt"].read_text().strip()
    assert key not in text and key not in err
    if "model.pb" not in _FLOPS:
        _FLOPS["model.pb"] = bench_json(capsys, str(models["model.pb"]), "--runs", "1",
                                        "--profile-runs", "0", "--threads", "1",
                                        "--input-shape", "pixels:2,8,8,3")["flops"]
    # the same model in every container, the .tflite's counted from its own operators
    assert info["flops"] == _FLOPS["model.pb"] and info["flops"] > 0
    assert f"FLOPs: {info['flops']:,} (" in text
    if "tflite" in name:
        # LiteRT's Python interpreter has no op profiler: the stage's note, no empty tables
        assert info["profile"]["source"] is None
        assert info["profile"]["note"] in text
        assert "Top by Computation Time" not in text and "Summary by node type" not in text
        assert "serving_default_pixels:0 float32 [2,8,8,3]" in text
    else:
        assert info["profile"]["source"] == "step_stats"
        assert "Top by Computation Time" in text and "Summary by node type" in text
        assert "Input: pixels float32 [2,8,8,3]" in text
    if name.endswith(".enc"):
        assert f"from environment variable {KEY_ENV}" in text


def test_key_file_opens_an_encrypted_model(in_tmp: Path, models: dict[str, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    info = bench_json(capsys, str(models["pb.enc"]), "--key-file", str(models["model.key"]),
                      "--runs", "1", "--threads", "1", "--profile-runs", "0")
    assert info["latency_ms"]["count"] == 1


def test_help_defaults_are_the_stages() -> None:
    from orchestrator.cli.main import build_parser
    from orchestrator.stages.benchmark import Params

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    helps = {a.dest: a.help for a in sub.choices["benchmark"]._actions}
    for dest in ("runs", "warmup", "profile_runs"):
        assert f"(default {Params.model_fields[dest].default})" in helps[dest]


def test_parse_input_shapes() -> None:
    from orchestrator.cli.benchmark import parse_input_shapes, parse_threads

    assert parse_input_shapes(["a:1,3,b:2,5,5", "c:4"]) == {"a": (1, 3), "b": (2, 5, 5),
                                                            "c": (4,)}
    assert parse_input_shapes(["x:0:1,8"]) == {"x:0": (1, 8)}  # a tensor name
    assert parse_input_shapes(["scalar:"]) == {"scalar": ()}
    assert parse_threads("1, 2,4") == [1, 2, 4]


# --------------------------------------------------------------------------- bad input


def _truncated(models: dict[str, Path], name: str, keep: int, tmp: Path) -> str:
    path = tmp / f"cut-{name}"
    path.write_bytes(models[name].read_bytes()[:keep])
    return str(path)


BAD = {
    "missing file": (lambda m, t: [str(t / "nope.pb")], ["nope.pb", "not found"]),
    "unknown format": (lambda m, t: [_write(t / "model.onnx", b"onnx?")],
                       ["model.onnx", "cannot tell the model format", ".tflite"]),
    "truncated tflite": (lambda m, t: [_truncated(m, "model.tflite", 1000, t)],
                         ["cut-model.tflite", "truncated"]),
    "tflite header only": (lambda m, t: [_truncated(m, "model.tflite", 8, t)],
                           ["cut-model.tflite", "LiteRT"]),
    "truncated pb": (lambda m, t: [_truncated(m, "model.pb", 1500, t)],
                     ["cut-model.pb", "not a GraphDef"]),
    "garbage pb": (lambda m, t: [_write(t / "junk.pb", b"\xff" * 3000)],
                   ["junk.pb", "GraphDef"]),
    "truncated mmap": (lambda m, t: [_truncated(m, "model.mmap", 2000, t)],
                       ["cut-model.mmap", "memmapped package"]),
    "truncated enc": (lambda m, t: [_truncated(m, "pb.enc", 200, t), "--key-env", KEY_ENV],
                      ["cut-pb.enc", "modified or truncated"]),
    "enc without key": (lambda m, t: [str(m["pb.enc"]), "--key-env", "NO_SUCH_KEY_VAR"],
                        ["pb.enc", "no model key", "NO_SUCH_KEY_VAR"]),
    "enc, wrong key": (lambda m, t: [str(m["pb.enc"]), "--key-file", str(m["other-key.txt"])],
                       ["pb.enc", "wrong key", "other-key.txt"]),
    # `--runs 0`, `--threads 0`: argparse's usage error (exit 2) saying the bound, as for
    # every counting flag (tests/test_count_bounds.py)
    "threads empty": (lambda m, t: [str(m["model.pb"]), "--threads", ""], ["--threads"]),
    "threads not numbers": (lambda m, t: [str(m["model.pb"]), "--threads", "1,two"],
                            ["--threads", "'two'"]),
    "shape: unknown input": (lambda m, t: [str(m["model.pb"]), "--input-shape", "image:1,8,8,3"],
                             ["no input 'image'", "pixels [?,?,?,3]"]),
    "shape: wrong rank": (lambda m, t: [str(m["model.pb"]), "--input-shape", "pixels:1,8,8"],
                          ["'pixels'", "[?,?,?,3] (rank 4)", "[1,8,8] has rank 3"]),
    "shape: fixed dim": (lambda m, t: [str(m["model.mmap"]), "--input-shape", "pixels:1,8,8,4"],
                         ["'pixels'", "[?,?,?,3]", "dimension 3 is fixed to 3",
                          "[1,8,8,4]"]),
    "shape: tflite rank": (lambda m, t: [str(m["model.tflite"]), "--input-shape", "pixels:8,8"],
                           ["serving_default_pixels:0", "[?,?,?,3]", "[8,8]"]),
    "shape: enc input": (lambda m, t: [str(m["tflite.enc"]), "--key-env", KEY_ENV,
                                       "--input-shape", "nope:1"],
                         ["no input 'nope'", "serving_default_pixels:0"]),
    "shape: zero dim": (lambda m, t: [str(m["model.pb"]), "--input-shape", "pixels:0,8,8,3"],
                        ["--input-shape", "at least 1"]),
    "shape: no name": (lambda m, t: [str(m["model.pb"]), "--input-shape", "1,8,8,3"],
                       ["--input-shape", "NAME:d1,d2"]),
    "device: unknown": (lambda m, t: [str(m["model.pb"]), "--device", "pixel-44"],
                        ["--device 'pixel-44'", "did you mean", "pixel-4"]),
    "device: more threads than cores": (
        lambda m, t: [str(m["model.pb"]), "--device", "raspberry-pi-3:5"],
        ["--device 'raspberry-pi-3:5'", "5 threads", "the 4 cores of raspberry-pi-3"]),
    "device: threads not a number": (
        lambda m, t: [str(m["model.pb"]), "--device", "pixel-4:two"],
        ["--device 'pixel-4:two'", "NAME:THREADS"]),
    "device: a colon with no threads": (
        lambda m, t: [str(m["model.pb"]), "--device", "pixel-4:"],
        ["--device 'pixel-4:'", "threads '' is not a whole number", "NAME:THREADS"]),
    "device: with --on": (lambda m, t: [str(m["model.tflite"]), "--device", "pixel-4",
                                        "--on", "ssh://nobody@127.0.0.1:1"],
                          ["--device", "--on", "give one of them"]),
}


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_exit_2_without_traceback(case: str, in_tmp: Path,
                                               models: dict[str, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    make_args, expected = BAD[case]
    # --runs 1 first: a case's own --runs comes later and wins
    code, out, err = bench(capsys, "--runs", "1", *make_args(models, in_tmp))
    assert code == 2, (out, err)
    assert out == ""
    assert err.startswith("error: ") and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    for fragment in expected:
        assert fragment in err, err
    key = models["key.txt"].read_text().strip()
    assert key not in err


def test_a_shape_the_graph_cannot_take_is_exit_2(in_tmp: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """x [?,4] reshaped to a fixed [1,4]: batch 2 fits the input, not the graph behind it;
    found by shape inference (GraphDef) or LiteRT's allocation (.tflite), before any run."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def fixed(x: Any) -> Any:
        return tf.reshape(x, [1, 4]) * 2.0

    concrete = fixed.get_concrete_function()
    lite = in_tmp / "fixed.tflite"
    lite.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([concrete]).convert())
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        tf.identity(tf.reshape(x, [1, 4]) * 2.0, name="out")
    pb = in_tmp / "fixed.pb"
    pb.write_bytes(graph.as_graph_def().SerializeToString())
    for path, reason in ((pb, "Cannot reshape a tensor with 8 elements"), (lite, "reshape")):
        code, out, err = bench(capsys, str(path), "--runs", "1", "--input-shape", "x:2,4")
        assert code == 2 and out == "", err
        assert err.startswith(f"error: {path}: the model does not take --input-shape x:2,4: ")
        assert reason in err and "Traceback" not in err
    code, _, err = bench(capsys, str(pb), "--runs", "1", "--profile-runs", "0",
                         "--input-shape", "x:1,4")  # the size it was built for
    assert code == 0, err


def test_a_model_tensorflow_cannot_run_is_exit_2(in_tmp: Path, models: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A graph that parses and imports, but whose weight holds too few bytes."""
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString(models["model.pb"].read_bytes())
    const = next(n for n in graph_def.node if n.op == "Const"
                 and len(n.attr["value"].tensor.tensor_content) > 16)
    const.attr["value"].tensor.tensor_content = const.attr["value"].tensor.tensor_content[:-4]
    path = in_tmp / "short_weight.pb"
    path.write_bytes(graph_def.SerializeToString())
    code, out, err = bench(capsys, str(path), "--runs", "1", "--threads", "1")
    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}: TensorFlow cannot run this model: ")
    assert "Traceback" not in err


def test_corrupt_tflite_in_the_real_command(in_tmp: Path, models: dict[str, Path]) -> None:
    """The console command itself, in a fresh process: a flatbuffer whose bytes are
    scrambled past its header is rejected by LiteRT's verifier, never a crash."""
    data = bytearray(models["model.tflite"].read_bytes())
    data[64:] = bytes(reversed(data[64:]))
    path = in_tmp / "scrambled.tflite"
    path.write_bytes(bytes(data))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "benchmark", str(path)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error: " in done.stderr and "scrambled.tflite" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


# --------------------------------------------------------------------------- inspect


def _inspect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["inspect", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", KINDS)
def test_inspect_takes_every_kind_benchmark_takes(name: str, in_tmp: Path,
                                                  models: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The same inputs, outputs and FLOPs as `benchmark` prints for the same file."""
    if "flops" not in _FLOPS:  # benchmark's count at the declared shape (unknown dims 1)
        _FLOPS["flops"] = bench_json(capsys, str(models["model.tflite"]), "--runs", "1",
                                     "--profile-runs", "0", "--threads", "1")["flops"]
        assert _FLOPS["flops"] == bench_json(capsys, str(models["model.pb"]), "--runs", "1",
                                             "--profile-runs", "0", "--threads",
                                             "1")["flops"]
    code, out, err = _inspect(capsys, str(models[name]), "--key-env", KEY_ENV, "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["flops"] == _FLOPS["flops"] > 0
    inputs = [i["name"] for i in found["summary"]["inputs"]]
    assert inputs == (["serving_default_pixels:0"] if "tflite" in name else ["pixels"])
    code, text, err = _inspect(capsys, str(models[name]), "--key-env", KEY_ENV)
    assert code == 0 and "Traceback" not in err
    assert text.startswith(f"Model: {models[name]} (")
    assert f"FLOPs: {_FLOPS['flops']:,} (" in text
    key = models["key.txt"].read_text().strip()
    assert key not in text and key not in err


def test_inspect_a_tflite_prints_what_benchmark_does(in_tmp: Path, models: dict[str, Path],
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    path = str(models["model.tflite"])
    code, text, err = _inspect(capsys, path)
    assert code == 0, err
    lines = text.splitlines()
    assert lines[0] == f"Model: {path} (LiteRT flatbuffer)"
    assert lines[1] == "Found 1 inputs: name=serving_default_pixels:0, type=float32, " \
        "shape=[?,?,?,3]"
    output = re.fullmatch(r"Found 1 outputs: name=(\S+), type=float32, shape=\[\?,4\]",
                          lines[2])
    assert output, lines[2]
    ops = {op: int(n) for n, op in re.findall(r"(\d+) ([A-Z_0-9]+)", text.split(
        "Op types used: ")[1].splitlines()[0])}
    assert ops == {"CONV_2D": 1, "FULLY_CONNECTED": 1, "MEAN": 1, "SOFTMAX": 1}, ops
    # every constant element: conv 3x3x3x8 + 8, dense 8x4 + 4, and MEAN's 2 axes
    assert "Found 262 const parameters" in text
    code, bench_text, _ = bench(capsys, path, "--runs", "1", "--profile-runs", "0",
                                "--threads", "1")
    assert code == 0
    flops = [line.strip() for line in text.splitlines() if "FLOPs:" in line]
    assert flops and flops == [line.strip() for line in bench_text.splitlines()
                               if "FLOPs:" in line]
    # the output names benchmark runs are the ones inspect lists
    assert f"Outputs: {output.group(1)}\n" in bench_text


def test_inspect_an_encrypted_model_without_its_key_shows_the_header(
        in_tmp: Path, models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, text, err = _inspect(capsys, str(models["tflite.enc"]))
    assert code == 0, err
    assert "payload_kind: tflite" in text and "--key-env VAR or --key-file FILE" in text
    code, text, err = _inspect(capsys, str(models["tflite.enc"]), "--key-file",
                               str(models["model.key"]))
    assert code == 0, err
    assert "encrypted LiteRT flatbuffer" in text and "CONV_2D" in text


# the cases about the model file (not about benchmark's own options)
INSPECT_BAD = [case for case in BAD
               if not case.startswith(("shape", "runs", "threads", "device"))]


@pytest.mark.parametrize("case", INSPECT_BAD)
def test_inspect_bad_input_is_exit_2_naming_its_flags(case: str, in_tmp: Path,
                                                      models: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    make_args, expected = BAD[case]
    code, out, err = _inspect(capsys, *make_args(models, in_tmp))
    assert code == 2, (out, err)
    assert err.startswith("error: ") and "Traceback" not in err
    for fragment in expected:
        assert fragment in err, err
    assert "model.format" not in err  # a recipe's key: the command's flag is --format


def test_a_format_that_cannot_be_told_names_the_flag_there_is(
        in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_tmp / "model.onnx").write_bytes(b"onnx?")
    code, _, err = _inspect(capsys, str(in_tmp / "model.onnx"))
    assert code == 2 and "or give --format" in err and "model.format" not in err
    assert ".tflite, .mmap or .enc" in err  # the kinds it takes, as benchmark's
    code, _, err = bench(capsys, str(in_tmp / "model.onnx"))
    assert code == 2 and "--format" not in err and "model.format" not in err
    assert ".tflite, .mmap or .enc" in err
    # what the recipe's loader says of a .tflite: "... or set model.format"
    code, _, err = _inspect(capsys, str(in_tmp / "model.onnx"), "--format", "keras")
    assert code == 2 and "model.format" not in err


def test_inspect_an_encrypted_package_describes_it_as_it_ships(
        in_tmp: Path, models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """An encrypted memmapped package: its graph as stored (ImmutableConst nodes, regions),
    the same as `inspect` of the plain .mmap prints, not the graph rebuilt to run it."""
    code, plain, err = _inspect(capsys, str(models["model.mmap"]), "--json")
    assert code == 0, err
    code, inside, err = _inspect(capsys, str(models["mmap.enc"]), "--key-env", KEY_ENV,
                                 "--json")
    assert code == 0, err
    plain_found, found = json.loads(plain), json.loads(out := inside)
    assert found["kind"] == "encrypted" and found["inner_kind"] == "memmapped", out
    assert found["summary"]["op_counts"].get("ImmutableConst", 0) >= 1
    for key in ("regions", "converted_nodes", "summary", "flops", "precision"):
        assert found[key] == plain_found[key], key
    code, text, err = _inspect(capsys, str(models["mmap.enc"]), "--key-env", KEY_ENV)
    assert code == 0, err
    first = text.splitlines()[0]
    assert first.startswith(f"Model: {models['mmap.enc']} (encrypted memmapped package; ")
    assert f"{len(found['regions'])} regions" in first
    code, plain_text, _ = _inspect(capsys, str(models["model.mmap"]))
    # everything after the first line is what the plain package shows
    assert text.split("\n", 1)[1] == plain_text.split("\n", 1)[1]
    assert re.search(r"\d+ ImmutableConst", text.split("Op types used: ")[1])
    assert re.search(r"length [\d.]+ MiB", text), text


# ---------------------------------------------------------------- agreeing with a run's report


def test_the_spread_warning_is_the_one_a_runs_estimate_gives() -> None:
    """`benchmark` warns by the rule a run's report does (measure.estimates.timings_spread):
    the issue's 107 µs p50 against a 7.2 µs fastest run is spread, a steady setting is not."""
    from orchestrator.cli.benchmark import spread_warnings
    from orchestrator.measure.estimates import basis, estimate
    from orchestrator.model.operators import Operator
    from orchestrator.spec.devices import resolve_device

    info = {"threads_matrix": [
        {"threads": 2, "latency_ms": {"p50": 0.107, "min": 0.0072}},
        {"threads": 1, "latency_ms": {"p50": 0.0075, "min": 0.0072}}]}
    warnings = spread_warnings(info)
    assert len(warnings) == 1
    assert warnings[0].startswith("threads=2: host timings spread (p50 14.9× the fastest "
                                  "run): rerun on a quiet machine")
    # the run's estimate for the same timings says the same words, where this host's probe
    # enters it (a TF session's cost per node); LiteRT's dispatch is calibrated: no word
    ops = [Operator("x", "Placeholder", "reshape", "float32", 0, 64, 256),
           Operator("y", "MatMul", "fully_connected", "float32", 1_100_000, 128, 280_000)]
    phone = resolve_device("phone-2016")

    def method(p50: float, runtime: str) -> str:
        made = estimate(1.1e6, phone, "float32",
                        basis(p50, 7e10, 7e10, 0.0005, len(ops), runtime, min_ms=0.0072,
                              per_op_ms=0.001, operators=ops))
        assert made is not None and made.top_ops
        return made.method

    assert "host timings spread (p50 14.9× the fastest run)" in method(0.107, "tensorflow")
    assert "spread" not in method(0.0075, "tensorflow")
    assert "spread" not in method(0.107, "litert")


def test_the_default_threads_are_the_stages_and_the_report_says_so(tmp_path: Path) -> None:
    """Without --threads the command times what a recipe's benchmark stage times (the
    stage's own default, the same Params), and its report says which, and why."""
    import tensorflow as tf

    from orchestrator.cli.benchmark import run_benchmark, threads_text
    from orchestrator.model.files import open_model
    from orchestrator.stages import get_stage

    graph = tf.Graph()
    with graph.as_default():
        tf.nn.relu(tf.compat.v1.placeholder(tf.float32, [1, 4], name="x"), name="y")
    path = tmp_path / "tiny.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    opened = open_model(path)
    params = get_stage("benchmark").params(runs=2, warmup=0, memory=False, profile_runs=0)
    result = run_benchmark(opened.artifact, params, None, path)
    timed = result.info["threads"]
    assert timed == os.cpu_count()  # the stage's default: this host's cores
    assert threads_text(params, result.info["host"]["cores"]) == (
        f"threads: {timed} (the benchmark stage's default, as a recipe's benchmark stage "
        f"times: this host's {timed} cores)")
    given = get_stage("benchmark").params(threads=[1, 2])
    assert threads_text(given, 2) == "threads: 1,2 (--threads)"


# ---------------------------------------------------------------- estimates per --device


@pytest.mark.parametrize("name", ["model.tflite", "model.pb"])
def test_device_estimates_the_file_as_a_recipe_target(name: str, in_tmp: Path,
                                                      models: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """`--device NAME[:THREADS]` gives the estimate a recipe's target on that preset gets:
    the file's operators priced on its cores, for its big cores or THREADS, its costliest
    ops and its expected error; printed as --json holds it."""
    from orchestrator.formatting import format_ms
    from orchestrator.measure.estimates import estimate
    from orchestrator.spec.devices import resolve_device

    args = (str(models[name]), "--runs", "2", "--warmup", "0", "--profile-runs", "0",
            "--input-shape", ("serving_default_pixels:0" if name.endswith("tflite")
                              else "pixels") + ":1,16,16,3",
            "--device", "pixel-4", "--device", "raspberry-pi-3:1")
    info = bench_json(capsys, *args)
    made, est = info["estimate"], info["est_latency_ms"]
    assert list(made) == list(est) == ["pixel-4", "raspberry-pi-3:1"]
    priced_as = "litert-xnnpack" if name.endswith("tflite") else "tensorflow"
    for target, threads, source in (("pixel-4", 4, "big cores"),
                                    ("raspberry-pi-3:1", 1, "target")):
        assert made[target]["threads"] == threads and made[target]["threads_from"] == source
        assert made[target]["priced_as"] == priced_as
        assert made[target]["expected_error"]["p80_factor"] > 1
        # the same figure a recipe's target gets from this run's basis
        device = resolve_device(target.split(":")[0])
        if threads == 1:
            device = device.model_copy(update={"threads": 1})
        again = estimate(info["flops"], device, info["precision"], info["estimate_basis"])
        assert again is not None and round(again.latency_ms, 4) == est[target]
    assert {op["op"] for op in made["pixel-4"]["top_ops"]} & {"CONV_2D", "Conv2D"}
    # an in-order A53 on one thread against a Cortex-A76 on four
    assert est["raspberry-pi-3:1"] > est["pixel-4"]

    code, text, err = bench(capsys, *args)
    assert code == 0, err
    estimated = text.split("Estimated (computed from the graph, not measured):")[1]
    for target in made:
        line = next(line for line in estimated.splitlines()
                    if line.startswith(f"  Latency on {target}: "))
        assert line == f"  Latency on {target}: {made[target]['summary']}"
        # the figure, as the report rounds it (0.1 µs): the same to 3 digits, or one
        # rounding step off where the 4th digit of ms was cut
        figure, unit = line.split(": ", 1)[1].split(" on ")[0].split()
        shown_ms = float(figure) / (1000.0 if unit == "µs" else 1.0)
        assert shown_ms == pytest.approx(est[target], abs=1.5e-4, rel=5e-3)
        error = made[target]["expected_error"]
        # no published row ran a TF session: a GraphDef's error is not known, and it says so
        assert (f"expected error: within {error['p80_factor']:.2f}x" if priced_as != "tensorflow"
                else "expected error: not measured for a TF session (a GraphDef)") in line
        block = estimated.split(line, 1)[1]
        assert block.splitlines()[1] == f"    threads: {made[target]['threads']} (" + (
            "--device NAME:THREADS)" if made[target]["threads_from"] == "target" else
            "the device's big cores; --device NAME:THREADS sets them)")
        costliest = block.splitlines()[2]
        assert costliest.startswith("    costliest ops: ")
        shown = re.findall(r"(\S+) \((\w+)\) (\S+ (?:µs|ms)) (\d+)%", costliest)
        assert [(n, op) for n, op, _, _ in shown] == [(o["name"], o["op"])
                                                      for o in made[target]["top_ops"]]
        shares = [int(share) for *_, share in shown]
        # whole percents, each rounded: their sum may pass 100 by the rounding
        assert shares == sorted(shares, reverse=True)
        assert sum(shares) <= 100 + len(shares) // 2
        for (_, _, ms, share), op in zip(shown, made[target]["top_ops"], strict=True):
            assert ms == format_ms(op["ms"])
            assert abs(int(share) - 100 * op["ms"] / est[target]) <= 0.5 + 1e-9
        assert block.splitlines()[3] == f"    expected error: {error['text']}"

    # without --device: no estimate, and the line says how to ask for one
    plain = bench_json(capsys, *args[:9])
    assert not plain.get("estimate") and not plain.get("est_latency_ms")
    code, text, _ = bench(capsys, *args[:9])
    assert "  Latency on a device: give --device NAME[:THREADS]" in text
