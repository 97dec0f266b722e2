"""The same exit for the same fault: a board nobody answers at is exit 2 for `device check`,
for `benchmark --on` and for a run (before any stage), each in its own words; and the hint
for a runtime the board lacks is the real command, shell-quoted."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import OrchestratorError

# nothing listens on port 1: ssh is refused at once
UNREACHABLE = "ssh://nobody@127.0.0.1:1"


@pytest.fixture
def tiny_pb(tmp_path: Path) -> Path:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 4], name="x")
        tf.nn.relu(x, name="y")
    path = tmp_path / "tiny.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return path


def test_the_same_unreachable_board_is_exit_2_for_every_command(
        tmp_path: Path, tiny_pb: Path, digits_example: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.engine.plan import build_plan
    from orchestrator.engine.prepared_run import preflight_devices
    from orchestrator.recipe.loading import load_recipe

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    said = {}
    for command in (["device", "check", UNREACHABLE],
                    ["benchmark", str(tiny_pb), "--on", UNREACHABLE, "--runs", "2"]):
        code = main(command)
        err = capsys.readouterr().err
        said[command[0]] = err
        assert code == 2, (command, err)
        assert "cannot reach nobody@127.0.0.1 port 1" in err and "Traceback" not in err
        assert "stage" not in err  # neither command has stages
    assert said["benchmark"].startswith("error: --on: ")
    assert f"`orchestrator device check {UNREACHABLE}`" in said["benchmark"]
    # a run: its check of the boards before any stage (what `run` calls; the whole run over
    # SSH is tests/robustness/test_device_faults.py)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""\
version: 1
name: unreachable
model: {{path: {digits_example / 'saved_model'}}}
targets:
  - {{name: pi, device: raspberry-pi-4, connect: "{UNREACHABLE}"}}
pipelines:
  fp32: {{stages: [freeze, strip, fold]}}
""")
    loaded = load_recipe(recipe)
    with pytest.raises(OrchestratorError) as caught:
        preflight_devices(loaded, build_plan(loaded), None)
    assert caught.value.exit_code == 2
    text = str(caught.value)
    assert "r.yaml:5:" in text and "targets.0.connect" in text
    assert "cannot reach nobody@127.0.0.1 port 1" in text and "stage" not in text


def test_the_prepare_hint_is_the_real_command_shell_quoted() -> None:
    """`?` is a glob: the URL is quoted, so the command runs as printed."""
    import tensorflow as tf

    from orchestrator.boards.measurement import prepare_command, why_not_measurable
    from orchestrator.model.artifact import ModelArtifact, TensorSpec

    graph = tf.Graph()
    with graph.as_default():
        tf.nn.relu(tf.compat.v1.placeholder(tf.float32, [1, 4], name="x"), name="y")
    artifact = ModelArtifact(graph.as_graph_def(), inputs=(TensorSpec("x", "float32", (1, 4)),),
                             outputs=("y",))
    url = "qemu://aarch64?cpu=cortex-a76"
    board = {"runtimes": {"numpy": "2.0", "tensorflow": None}}
    why = why_not_measurable(artifact, board, url)
    assert why == ("the board has no tensorflow (`orchestrator device prepare "
                   f"'{url}' --runtime tensorflow` installs it)")
    command = why.split("`")[1]
    assert shlex.split(command) == ["orchestrator", "device", "prepare", url, "--runtime",
                                    "tensorflow"]
    assert prepare_command("ssh://pi@board") == "orchestrator device prepare ssh://pi@board"
    assert why_not_measurable(artifact, {"runtimes": {"numpy": "2", "tensorflow": "2"}},
                              url) is None
