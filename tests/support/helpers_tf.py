"""TF helpers shared by tests/model/sources and tests/stages: a tiny tf.Module SavedModel
and a runner.

Import as `from support.helpers_tf import ...`: tests/ is on sys.path (pyproject.toml's
[tool.pytest.ini_options] pythonpath).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.measure import tf_runtime
from orchestrator.model.artifact import ModelArtifact

W = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(3, 2)
B = np.array([0.1, -0.2], np.float32)


def run(artifact: ModelArtifact, *inputs: np.ndarray) -> list[np.ndarray]:
    """All of the artifact's outputs on `inputs`, through orchestrator.measure.tf_runtime."""
    with tf_runtime.GraphRunner.for_artifact(artifact) as runner:
        return runner.run(*inputs)


def module_saved_model(directory: Path) -> Path:
    """A tf.Module SavedModel with variables W, B and a nested tf.function; signature
    x[?,3] -> {'y': softmax(x @ W + B)}[?,2]."""
    import tensorflow as tf

    class Tiny(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(W)
            self.b = tf.Variable(B)

        @tf.function
        def dense(self, x: Any) -> Any:
            return tf.matmul(x, self.w) + self.b

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def __call__(self, x: Any) -> Any:
            return {"y": tf.nn.softmax(self.dense(x))}

    tf.saved_model.save(Tiny(), str(directory))
    return directory
