"""The digits example's own fp32 and int8 graphs, built with the recipe's stages.

Import as `from support.digits_graphs import ...` (tests/ is on sys.path under pytest);
a test module binds the fixtures it uses.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from orchestrator.model import tf_adapter  # noqa: F401  (TF env defaults before TF is imported
from orchestrator.model.artifact import ModelArtifact, TensorSpec
from orchestrator.stages import StageContext, get_stage


def apply(name: str, artifact: ModelArtifact, x: np.ndarray | None = None, **params: object
          ) -> ModelArtifact:
    def representative(samples: int | None, batch_size: int):  # noqa: ANN202
        rows = x if samples is None else x[:samples]
        for start in range(0, len(rows), batch_size):
            yield rows[start:start + batch_size]

    stage = get_stage(name)
    ctx = StageContext(pipeline="test", stage=name,
                       representative=None if x is None else representative)
    return stage.run(artifact, stage.params(**params), ctx).artifact


@functools.cache
def data(folder: str) -> dict[str, np.ndarray]:
    with np.load(Path(folder) / "data.npz") as loaded:
        return {k: loaded[k] for k in ("x_calib", "x_test", "y_test")}


@functools.cache
def fp32(folder: str) -> ModelArtifact:
    from orchestrator.model.sources import load_model

    artifact = load_model(Path(folder) / "saved_model", "auto",
                          [TensorSpec("image", "float32", (1, 8, 8, 1))], ["probs"])
    for name in ("freeze", "strip", "fold"):
        artifact = apply(name, artifact)
    return artifact


@functools.cache
def int8(folder: str) -> ModelArtifact:
    artifact = fp32(folder)
    x = data(folder)["x_calib"][:200]
    artifact = apply("quantize_weights", artifact)
    artifact = apply("quantize_nodes", artifact)
    artifact = apply("log_ranges", artifact, x)
    return apply("freeze_ranges", artifact, min_percentile=5, max_percentile=5)


@pytest.fixture(scope="session")
def digits_fp32(digits_example: Path) -> ModelArtifact:
    return fp32(str(digits_example))


@pytest.fixture(scope="session")
def digits_int8(digits_example: Path) -> ModelArtifact:
    return int8(str(digits_example))


@pytest.fixture(scope="session")
def digits_data(digits_example: Path) -> dict[str, np.ndarray]:
    return data(str(digits_example))
