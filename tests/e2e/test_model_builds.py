"""The models tests train (benchmarks/testbed/models_*.py, through model_builds.build) come out the
same, bit for bit, from two fresh processes: a test that trains a model sees one outcome.

A short build (one epoch on 256 signals of models_conv1d: the same `deterministic` setup,
shuffling, BatchNormalization and Adam as every builder) twice, in two processes at once,
each with one TF thread; then the digest itself: blind to the .keras zip's timestamps,
not to a weight.
"""

from __future__ import annotations

import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from testbed import model_builds

SHORT = {"epochs": 1, "train": 256}


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, dict]]:
    """Two builds at once; the first a recording one (it trains too, and commits its
    weights in the folder `weights` beside them), which test_committed_weights_... loads."""
    root = tmp_path_factory.mktemp("model_builds")
    folders = [root / "first", root / "second"]
    with ThreadPoolExecutor(2) as pool:
        facts = list(pool.map(lambda folder: model_builds.build(
            "models_conv1d", folder, timeout=300, **SHORT, **(
                {"record": True, "trained": root / "weights"} if folder == folders[0]
                else {})), folders))
    return list(zip(folders, facts, strict=True))


def test_two_fresh_processes_train_the_same_weights(two_builds: list[tuple[Path, dict]]
                                                    ) -> None:
    (first, facts1), (second, facts2) = two_builds
    print("first:", facts1, "\nsecond:", facts2)
    assert facts1["weights_sha256"] == facts2["weights_sha256"]
    assert facts1 == facts2  # the accuracies on the test signals too
    assert (first / "data.npz").read_bytes() == (second / "data.npz").read_bytes()
    assert model_builds.weights_digest(first / "model.keras") == facts1["weights_sha256"]


def test_committed_weights_give_the_trained_model(two_builds: list[tuple[Path, dict]],
                                                 tmp_path: Path) -> None:
    """What the suite's builds rely on (model_builds.fit): weights committed by a recording
    build, loaded by the next one, make the model training made, bit for bit."""
    (first, recorded), (_, trained) = two_builds
    weights = first.parent / "weights"
    assert len(list(weights.glob("*.weights.h5"))) == 1
    loaded = model_builds.build("models_conv1d", tmp_path / "load", timeout=300,
                                trained=weights, **SHORT)
    assert (recorded["weights"], trained["weights"], loaded["weights"]) == \
        ("trained", "trained", "committed")
    for facts in (recorded, loaded):
        assert {k: v for k, v in facts.items() if k != "weights"} == \
            {k: v for k, v in trained.items() if k != "weights"}


def test_the_digest_sees_a_weight_not_the_zip(two_builds: list[tuple[Path, dict]],
                                              tmp_path: Path) -> None:
    import h5py
    import numpy as np

    (first, facts), _ = two_builds
    with zipfile.ZipFile(first / "model.keras") as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    weights = tmp_path / "model.weights.h5"
    weights.write_bytes(members["model.weights.h5"])

    def rezip(target: Path) -> Path:  # new timestamps, same members
        with zipfile.ZipFile(target, "w") as archive:
            for name, data in members.items():
                archive.writestr(zipfile.ZipInfo(name, date_time=(2001, 2, 3, 4, 5, 6)),
                                 weights.read_bytes() if name == "model.weights.h5" else data)
        return target

    assert model_builds.weights_digest(rezip(tmp_path / "same.keras")) == \
        facts["weights_sha256"]
    with h5py.File(weights, "r+") as store:
        kernels: list[h5py.Dataset] = []
        store.visititems(lambda _, item: kernels.append(item)
                         if isinstance(item, h5py.Dataset) and item.ndim >= 2 else None)
        value = kernels[0][()]
        value.flat[0] = np.nextafter(value.flat[0], np.float32(np.inf))  # one ulp
        kernels[0][...] = value
    assert model_builds.weights_digest(rezip(tmp_path / "nudged.keras")) != \
        facts["weights_sha256"]
