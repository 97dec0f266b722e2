"""Issue 24, section 1: one output folder per recipe. The folder's `.orchestrator-recipe`
names the recipe that owns it; a run of another recipe there, or into a folder of other
files, is exit 2 before anything is written (the error names the folder and both
recipes, and `--force`); a run replaces the folder's contents whole, a `--variant` run
too; `history` writes its chart into the folder the recipe's run writes by default.

Real `orchestrator` commands: subprocesses where what is under test happens before a run
starts (and a first run, whose printed hint names the console command), the later runs of a
test in this process (`cli.main`: the same command, without a fresh process's imports); the
runs use the session's Prefect server and a small recipe (the digits SavedModel through
`freeze`)."""

from __future__ import annotations

import datetime
import json
import shlex
from pathlib import Path

import pytest
from support.robust_helpers import (
    RUN_TIMEOUT_S,
    check_clean_error,
    cli_in_process,
    cli_subprocess,
    output_is_whole_or_absent,
    small_recipe,
    tree,
    write_yaml,
)

from orchestrator.results.output_folder import MARKER

pytestmark = pytest.mark.slow


def _two_pipelines(name: str) -> dict:
    recipe = small_recipe(name)
    recipe["pipelines"]["strip"] = {"from": "fp32", "stages": ["strip"]}
    return recipe


def _project(tmp_path: Path) -> Path:
    """A project of its own (pyproject.toml marks its root): default outputs in out/."""
    project = tmp_path / "project"
    (project / "recipes").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    return project


def _marker(folder: Path) -> dict:
    return json.loads((folder / MARKER).read_text())


def _visible(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")}


def test_another_recipes_folder_is_refused_before_anything_is_written(
        tmp_path: Path, load_env: dict[str, str]) -> None:
    """No run needed: the check comes before the Prefect server or MLflow start."""
    project = _project(tmp_path)
    mine = write_yaml(project / "recipes" / "mine.yaml", small_recipe("mine"))
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"recipe": "theirs",
                                          "recipe_path": "../project/recipes/theirs.yaml"}))
    (out / "report.json").write_text("{}")
    before = tree(out)
    done = cli_subprocess(["run", mine, "-o", out], load_env, tmp_path)
    message = check_clean_error(done.code, done.err, out, "'theirs'", "'mine'", "--force")
    assert len(message.strip().splitlines()) == 1, message
    assert tree(out) == before  # nothing written, nothing removed
    assert not (tmp_path / ".orchestrator").exists()  # the store untouched too

    # a folder of other files (no marker, no report of this recipe)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    done = cli_subprocess(["run", mine, "-o", notes], load_env, tmp_path)
    check_clean_error(done.code, done.err, notes, "todo.txt", "'mine'", "--force")
    assert (notes / "todo.txt").read_text() == "mine"

    # a folder that holds the project (or the recipe, the store): never, even with --force
    for folder in (project, project / "recipes"):
        done = cli_subprocess(["run", mine, "-o", folder, "--force"], load_env, tmp_path)
        check_clean_error(done.code, done.err, folder, "cannot be the output folder")
    assert sorted(p.name for p in project.iterdir()) == ["pyproject.toml", "recipes"]


def test_a_run_replaces_its_folder_whole(tmp_path: Path, run_env: dict[str, str],
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Without -o, `run` and `history` use the same folder (out/<recipe name> at the
    project root, whatever the working directory). Stale files of the same recipe's earlier
    runs go; a --variant run keeps only its own variants (report.json lists exactly what
    the folder holds); another recipe's run (or history) is refused, then with --force
    replaces the folder, marker included. The first run is a subprocess (the hint it prints
    names the console command), the commands after it run in this process, in the same
    working folder, store and MLflow database."""
    project = _project(tmp_path)
    mine = write_yaml(project / "recipes" / "mine.yaml", _two_pipelines("mine"))
    theirs = write_yaml(project / "recipes" / "theirs.yaml", small_recipe("theirs"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = project / "out" / "mine"

    done = cli_subprocess(["run", mine], run_env, elsewhere, timeout=RUN_TIMEOUT_S)
    assert done.code == 0, done.err[-3000:]
    printed = done.out
    monkeypatch.chdir(elsewhere)
    for key in ("ORCHESTRATOR_HOME", "MLFLOW_TRACKING_URI", "ORCHESTRATOR_MODEL_KEY"):
        monkeypatch.setenv(key, run_env[key])

    def command(*args: object) -> tuple[int, str, str]:
        code, stdout, err = cli_in_process([str(a) for a in args], capsys)
        assert "Traceback" not in err, err[-3000:]
        return code, stdout, err

    def run(*args: object) -> str:
        code, stdout, err = command(*args)
        assert code == 0, err[-3000:]
        return stdout

    # the hint pasted as printed runs this project's command on this recipe
    dashboards = next(line for line in printed.splitlines() if line.startswith("Dashboards:"))
    words = shlex.split(dashboards.removeprefix("Dashboards:"))
    assert words[1:] == ["ui", str(mine)], dashboards
    assert words[0] == "orchestrator" or Path(elsewhere, words[0]).is_file(), dashboards
    assert _visible(out) >= {"report.json", "fp32", "strip"}
    assert output_is_whole_or_absent(out) == "whole"
    marker = _marker(out)  # the recipe's file relative to the folder: both move together
    assert marker["recipe"] == "mine" and not Path(marker["recipe_path"]).is_absolute()
    assert (out / marker["recipe_path"]).resolve() == mine.resolve()

    assert f"chart: {out / 'history.png'}" in run("history", mine)
    assert (out / "history.png").is_file()
    assert sorted(p.name for p in (project / "out").iterdir()) == ["mine"]
    code, _, err = command("history", theirs, "-o", out)
    check_clean_error(code, err, out, "'mine'", "'theirs'", "--force")

    # stale files: what an earlier version or run left, in the folder and in a variant
    (out / "stale.png").write_bytes(b"old")
    (out / "removed_variant").mkdir()
    (out / "fp32" / "stale.txt").write_text("old")
    run("run", mine, "--variant", "fp32")
    report = json.loads((out / "report.json").read_text())
    assert list(report["variants"]) == ["fp32"]
    assert _visible(out) == {"report.json", "fp32", *report.get("page_files", [])}
    assert not (out / "fp32" / "stale.txt").exists()
    assert output_is_whole_or_absent(out) == "whole"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [MARKER]

    # another recipe: refused, the folder as it was
    before = tree(out)
    code, _, err = command("run", theirs, "-o", out)
    check_clean_error(code, err, out, "'mine'", "'theirs'", "--force")
    assert tree(out) == before

    run("run", theirs, "-o", out, "--force")
    assert _marker(out)["recipe"] == "theirs"
    report = json.loads((out / "report.json").read_text())
    assert report["recipe"] == "theirs" and list(report["variants"]) == ["fp32"]
    assert output_is_whole_or_absent(out) == "whole"


def test_the_store_mlflow_and_the_project_are_never_an_output_folder(
        tmp_path: Path, load_env: dict[str, str]) -> None:
    """`run -o` and `history -o` alike: not a folder inside the store or MLflow's folder
    (the orchestrator manages those), nor the project or a folder holding the recipe, even
    with --force; exit 2, one line, before anything is written."""
    project = _project(tmp_path)
    mine = write_yaml(project / "recipes" / "mine.yaml", small_recipe("mine"))
    store = Path(load_env["ORCHESTRATOR_HOME"])
    store.mkdir()
    before = tree(tmp_path)
    # MLflow's own folder: the project's mlruns/ (MLFLOW_TRACKING_URI unset)
    default = {k: v for k, v in load_env.items() if k != "MLFLOW_TRACKING_URI"}
    cases = [(store / "x", "inside the store", load_env),
             (store, "holds the store", load_env),
             (project / "mlruns" / "x", "inside MLflow's folder", default),
             (project / "mlruns", "holds MLflow's folder", default),
             (project, "it holds the", load_env),
             (project / "recipes", "holds the recipe", load_env)]
    for command in ("run", "history"):
        for folder, says, env in cases:
            done = cli_subprocess([command, mine, "-o", folder, "--force"], env, tmp_path)
            message = check_clean_error(done.code, done.err, folder,
                                        "cannot be the output folder", says)
            assert len(message.strip().splitlines()) == 1, message
    assert tree(tmp_path) == before  # nothing made, not even the folder asked for


def test_history_says_what_force_does_for_history(tmp_path: Path,
                                                  load_env: dict[str, str]) -> None:
    """Into a folder another recipe owns, `history` (which writes only history.png) says
    --force writes history.png there, not that it replaces the folder's contents."""
    project = _project(tmp_path)
    mine = write_yaml(project / "recipes" / "mine.yaml", small_recipe("mine"))
    out = tmp_path / "theirs-out"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"recipe": "theirs",
                                          "recipe_path": "../project/recipes/theirs.yaml"}))
    (out / "report.json").write_text("{}")
    done = cli_subprocess(["history", mine, "-o", out], load_env, tmp_path)
    message = check_clean_error(done.code, done.err, out, "'theirs'", "'mine'",
                                "pass --force to write history.png there")
    assert "replace its contents" not in message
    done = cli_subprocess(["run", mine, "-o", out], load_env, tmp_path)  # run's own words
    check_clean_error(done.code, done.err, out, "pass --force to replace its contents")


def _a_run_of_mine(tmp_path: Path) -> tuple[Path, object]:
    """`out/` holding a run of recipe 'mine' (its marker, report.json, a variant folder)."""
    from orchestrator.results.output_folder import owner_of, replacing

    recipe = tmp_path / "recipes" / "mine.yaml"
    recipe.parent.mkdir(exist_ok=True)
    recipe.write_text("name: mine\n")
    owner = owner_of("mine", recipe)
    out = tmp_path / "out"
    with replacing(out, owner) as built:
        (built / "fp32").mkdir()
        (built / "fp32" / "model.pb").write_bytes(b"graph")
        (built / "report.json").write_text("{}")
    return out, owner


def test_a_failed_run_leaves_its_folder_as_it_was(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: a run that fails (a stage, or recording it once its outputs are written)
    or is interrupted leaves the previous run's folder exactly as it was, and `held_by`
    says which run it holds; a run that completes replaces it. Leftovers of a killed run
    (.staging-*, .old-*) go with the next run, but not a live run's."""
    import fcntl
    import os

    from orchestrator.results.output_folder import (
        WRITTEN_FORMAT,
        held_by,
        read_owner,
        remove_leftovers,
        replacing,
    )

    monkeypatch.chdir(tmp_path)  # held_by names a folder relative to the working directory

    out, owner = _a_run_of_mine(tmp_path)
    assert read_owner(out) == owner
    before = tree(out)
    assert held_by(out).startswith("out still holds the run of 20")
    assert held_by(out).endswith(" UTC")
    # a run that failed after its outputs were in (a server lost as its flow ended): its own
    written = datetime.datetime.strptime(json.loads((out / MARKER).read_text())["written"],
                                         WRITTEN_FORMAT).replace(tzinfo=datetime.UTC)
    assert held_by(out, written).startswith("out holds this run's outputs, complete")
    # a re-run that started within the same second, after the last run wrote: not its own
    assert "still holds" in held_by(out, written + datetime.timedelta(microseconds=1))
    assert "still holds" in held_by(out, written + datetime.timedelta(seconds=1))
    for error in (RuntimeError("recording the run failed"), KeyboardInterrupt()):
        with pytest.raises(type(error)), replacing(out, owner) as built:
            (built / "int8").mkdir()
            (built / "report.json").write_text('{"new": 1}')
            raise error
        assert tree(out) == before, error  # hidden working folders gone too

    # a folder the failed run created is removed; nothing was written, it says
    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError), replacing(fresh, owner) as built:
        (built / "report.json").write_text("{}")
        raise RuntimeError("a stage failed")
    assert not fresh.exists()
    assert held_by(fresh) == "nothing was written to fresh"

    # a killed run's leftovers go; a live run's (locked) stay
    dead = out / ".staging-dead"
    (dead / "fp32").mkdir(parents=True)
    (out / ".old-dead").mkdir()
    live = out / ".staging-live"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert sorted(remove_leftovers(out)) == [".old-dead", ".staging-dead"]
        assert live.is_dir() and tree(out, skip=[".staging-live"]) == before
    finally:
        os.close(fd)
    assert remove_leftovers(out) == [".staging-live"]

    # a run that completes replaces the folder whole
    with replacing(out, owner) as built:
        (built / "int8").mkdir()
        (built / "report.json").write_text('{"new": 2}')
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "int8", "report.json"]


def test_mlflow_records_the_run_right_before_the_swap(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of issue 39: the run is recorded (MLflow: FINISHED) only once its marker and
    the folder the old outputs move to are made, and with Ctrl-C held until the swap is
    done: a Ctrl-C while recording acts once the folder holds this run, which `held_by`
    then says; a record that fails (OSError included) leaves the folder as it was."""
    import os
    import signal

    from orchestrator.results.output_folder import held_by, replacing

    monkeypatch.chdir(tmp_path)  # held_by names a folder relative to the working directory

    out, owner = _a_run_of_mine(tmp_path)
    before = tree(out)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: raises
    try:
        for error in (RuntimeError("MLflow refused"), BrokenPipeError("worker gone")):
            def fails(built: Path, error: Exception = error) -> None:
                raise error

            with pytest.raises(type(error)), replacing(out, owner, record=fails) as built:
                (built / "report.json").write_text('{"new": 1}')
            assert tree(out) == before, error
            assert "still holds the run of" in held_by(out)

        seen: dict[str, object] = {}

        def record(built: Path) -> None:  # what MLflow reads, and a Ctrl-C meanwhile
            seen["marker"] = (built / MARKER).is_file()
            seen["old"] = [name for name in os.listdir(out) if name.startswith(".old-")]
            seen["out"] = tree(out, skip=[name for name in os.listdir(out)
                                          if name.startswith((".old-", ".staging-"))])
            os.kill(os.getpid(), signal.SIGINT)
            seen["recorded"] = True  # not cut short

        started = datetime.datetime.now(datetime.UTC)
        with pytest.raises(KeyboardInterrupt), replacing(out, owner, record=record) as built:
            (built / "report.json").write_text('{"new": 2}')
        assert seen["marker"] and len(seen["old"]) == 1 and seen["out"] == before
        assert seen["recorded"]
        assert json.loads((out / "report.json").read_text()) == {"new": 2}
        assert sorted(p.name for p in out.iterdir()) == [MARKER, "report.json"]
        assert held_by(out, started).startswith("out holds this run's outputs, complete")

        # a folder the run created stays once it holds the run
        fresh = tmp_path / "fresh"
        with pytest.raises(KeyboardInterrupt), replacing(fresh, owner, record=record) as built:
            (built / "report.json").write_text("{}")
        assert sorted(p.name for p in fresh.iterdir()) == [MARKER, "report.json"]
    finally:
        signal.signal(signal.SIGINT, previous)
