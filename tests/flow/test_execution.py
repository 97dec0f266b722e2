"""The executor a run uses: the recipe's `execution:` block, the command line on top, and a
scheduler address checked before anything runs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from orchestrator.errors import RecipeError
from orchestrator.flow import task_runners
from orchestrator.recipe.loading import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def recipe_with(tmp_path: Path, block: str | None) -> Path:
    text = (ROOT / "recipes" / "digits_rounded.yaml").read_text().replace(
        "../examples/", f"{ROOT / 'examples'}/")
    path = tmp_path / "recipe.yaml"
    path.write_text(text + (f"execution: {block}\n" if block else ""))
    return path


def test_local_by_default(tmp_path: Path) -> None:
    loaded = load_recipe(recipe_with(tmp_path, None))
    assert task_runners.resolve(loaded) == task_runners.Execution()
    assert task_runners.task_runner(task_runners.resolve(loaded)) is None


def test_recipe_block_and_command_line_on_top(tmp_path: Path) -> None:
    loaded = load_recipe(recipe_with(tmp_path, "{executor: dask, workers: 3}"))
    chosen = task_runners.resolve(loaded)
    assert (chosen.executor, chosen.workers, chosen.threads_per_worker) == ("dask", 3, 1)
    assert task_runners.resolve(loaded, "local") == task_runners.Execution()  # the CLI wins
    by_address = task_runners.resolve(loaded, None, "tcp://127.0.0.1:8786")
    assert (by_address.executor, by_address.address, by_address.workers) == (
        "dask", "tcp://127.0.0.1:8786", None)
    runner = task_runners.task_runner(chosen)
    assert type(runner).__name__ == "DaskTaskRunner"
    assert runner.cluster_kwargs["n_workers"] == 3
    assert runner.cluster_kwargs["processes"] is True
    assert runner.cluster_kwargs["preload"] == ["orchestrator.flow.dask_preload"]
    # its workers are forked by a server that imported TensorFlow once (not spawned, each
    # importing it again): the method Dask's Nanny reads, and what that server imports
    import multiprocessing.forkserver

    import dask

    assert dask.config.get("distributed.worker.multiprocessing-method") == "forkserver"
    preload = multiprocessing.forkserver._forkserver._preload_modules
    assert preload == task_runners.FORK_SERVER_PRELOAD
    assert "orchestrator.flow.fork_server_imports" in preload
    threads = load_recipe(recipe_with(tmp_path, "{executor: dask, processes: false}"))
    kwargs = task_runners.task_runner(task_runners.resolve(threads)).cluster_kwargs
    assert kwargs["processes"] is False and "preload" not in kwargs


def test_two_runs_clusters_at_once_start_without_a_port_warning(tmp_path: Path) -> None:
    """Two runs' LocalClusters side by side (threads: the cheapest), from the arguments a
    run gives Dask: each scheduler on ports of its own, nothing on the console about 8787."""
    import warnings

    from distributed import LocalCluster

    threads = load_recipe(recipe_with(tmp_path, "{executor: dask, processes: false}"))
    kwargs = {**task_runners.task_runner(task_runners.resolve(threads)).cluster_kwargs,
              "n_workers": 1}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with LocalCluster(**kwargs) as first, LocalCluster(**kwargs) as second:
            ports = {first.scheduler.http_server.port, second.scheduler.http_server.port}
    assert len(ports) == 2 and 8787 not in ports
    assert not [w for w in caught if "already in use" in str(w.message)], \
        [str(w.message) for w in caught]


def test_address_or_workers_not_both(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="not both"):
        load_recipe(recipe_with(tmp_path, "{executor: dask, workers: 2, address: "
                                          "'tcp://127.0.0.1:8786'}"))
    with pytest.raises(RecipeError, match="not both"):
        load_recipe(recipe_with(tmp_path, "{executor: dask, processes: false, address: "
                                          "'tcp://127.0.0.1:8786'}"))
    with pytest.raises(RecipeError, match="executor"):
        load_recipe(recipe_with(tmp_path, "{executor: ray}"))


def test_address_from_the_recipe_is_named_with_its_file(tmp_path: Path) -> None:
    loaded = load_recipe(recipe_with(tmp_path, "{executor: dask, address: "
                                               "'tcp://127.0.0.1:1'}"))
    with pytest.raises(task_runners.ExecutionError) as caught:
        task_runners.check_address(task_runners.resolve(loaded))
    assert "recipe.yaml: execution.address tcp://127.0.0.1:1: no Dask scheduler" in str(
        caught.value)
    assert caught.value.exit_code == 2


def test_address_checked_for_real(tmp_path: Path) -> None:
    with socket.socket() as listening:  # something answers here
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        task_runners.check_address(task_runners.resolve(None, "dask", f"tcp://127.0.0.1:{port}"))
    for bad in ("tcp://127.0.0.1", "http://127.0.0.1:8786", "tcp://:99"):
        with pytest.raises(task_runners.ExecutionError, match="expected a Dask scheduler"):
            task_runners.check_address(task_runners.resolve(None, "dask", bad))


def test_a_dead_worker_is_the_stage_error() -> None:
    """Dask's KilledWorker (the stage's worker died on every try) becomes the stage's own
    error, exit 3 naming it; any other error is left as it is."""
    from distributed import KilledWorker

    from orchestrator.errors import StageError

    class Node:
        pipeline, stage = "int8", "log_ranges"

    class Worker:
        address = "tcp://127.0.0.1:40000"

    died = KilledWorker("run_stage-1234", Worker(), 3)  # type: ignore[arg-type]
    error = task_runners.explain_failure(Node(), died)  # type: ignore[arg-type]
    assert isinstance(error, StageError) and error.exit_code == 3
    assert str(error).startswith("stage int8/log_ranges failed: the Dask worker")
    other = ValueError("a bug")
    assert task_runners.explain_failure(Node(), other) is other  # type: ignore[arg-type]
