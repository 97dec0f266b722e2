"""`orchestrator devices [NAME] [--json]`: every preset with its clusters, bandwidth, threads
and expected error; one preset with the sources of its figures; an unknown name is a usage
error (exit 2) with the closest preset."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli.main import main
from orchestrator.spec.devices import PRESETS


def run(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> tuple[str, str]:
    assert main(["devices", *args]) == code
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_every_preset_is_listed_with_its_threads_and_expected_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = run(capsys)
    blocks: dict[str, list[str]] = {}
    for line in out.splitlines():
        if not line.startswith(" "):
            blocks[line.split(":")[0]] = []
        blocks[list(blocks)[-1]].append(line)
    assert list(blocks) == list(PRESETS)
    for name, device in PRESETS.items():
        head, threads, error, sources = blocks[name]
        assert f"{device.memory_gbs:g} GB/s DRAM" in head, name
        assert f"estimates assume {device.default_threads} threads" in threads, name
        assert error.startswith("  expected error: within "), name
        assert f"{len(device.sources)} sources: `orchestrator devices {name}`" in sources
    assert "source:" not in out  # only for one device
    # a big.LITTLE chip: its little cluster is marked, and its threads are the big cores
    assert "4x Cortex-A53 1.4 GHz, 8 FLOP/cycle (in order, little)" in out
    assert PRESETS["rk3399"].default_threads == 2


def test_one_device_prints_each_source(capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = run(capsys, "pixel-4")
    device = PRESETS["pixel-4"]
    lines = out.splitlines()
    assert lines[0].startswith("pixel-4: Snapdragon 855; 1x Kryo 485 Gold prime (Cortex-A76) "
                               "2.84 GHz, 16 FLOP/cycle (dot product)")
    assert "34.1 GB/s DRAM" in lines[0] and "6144 MB RAM" in lines[0]
    assert "estimates assume 4 threads" in lines[1]
    assert [line.removeprefix("  source: ") for line in lines
            if line.startswith("  source: ")] == device.sources
    assert len(device.sources) >= 2


def test_an_unknown_device_names_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = run(capsys, "pixle-4", code=2)
    assert out == ""
    assert "unknown device 'pixle-4'" in err and 'did you mean "pixel-4"?' in err
    assert "raspberry-pi-4" in err and "inline" not in err


def test_json_parses_with_the_same_facts(capsys: pytest.CaptureFixture[str]) -> None:
    every = json.loads(run(capsys, "--json")[0])
    assert [d["name"] for d in every] == list(PRESETS)
    for fact in every:
        device = PRESETS[fact["name"]]
        assert fact["threads"] == device.default_threads
        assert fact["memory_gbs"] == device.memory_gbs and fact["sources"] == device.sources
        assert fact["expected_error"].startswith("within ")
    one = json.loads(run(capsys, "rk3399", "--json")[0])
    assert one == next(d for d in every if d["name"] == "rk3399")
    assert one["clusters"].startswith("2x Cortex-A72 1.8 GHz, 8 FLOP/cycle; 4x Cortex-A53")
