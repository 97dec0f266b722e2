"""round_weights: same raw size, smaller gzip, <= num_steps values per weight tensor."""

from __future__ import annotations

import gzip

import numpy as np
from support import quant_fixtures
from support.quant_fixtures import agreement, apply, predict

from orchestrator.model.graph_rewrite import const_value, copy_graph
from orchestrator.quant.ranges import const_elements
from orchestrator.stages.round_weights import round_values

# Fixtures shared by the eight-bit stage tests: bound here so that pytest finds them.
cnn = quant_fixtures.cnn
digits = quant_fixtures.digits


def float_weights(artifact, minimum: int = 16) -> dict[str, np.ndarray]:  # noqa: ANN001
    return {n.name: const_value(n) for n in artifact.graph_def.node
            if n.op == "Const" and n.attr["dtype"].type == 1 and const_elements(n) >= minimum}


def test_same_size_smaller_gzip_few_values(cnn, digits) -> None:  # noqa: ANN001
    result = apply("round_weights", cnn)
    out = result.artifact
    assert out.graph_def.ByteSize() == cnn.graph_def.ByteSize()
    before_gz = len(gzip.compress(cnn.graph_bytes(), mtime=0))
    assert result.metrics["gzip_size_bytes"] == len(gzip.compress(out.graph_bytes(), mtime=0))
    assert result.metrics["gzip_size_bytes"] < 0.5 * before_gz
    weights = float_weights(out)
    assert len(weights) >= 6  # 4 kernels + 2 biases of >= 16 values
    for name, values in weights.items():
        assert len(np.unique(values)) <= 256, name
    x = digits["x_test"]
    assert agreement(predict(cnn, x), predict(out, x)) >= 0.99


def test_num_steps(cnn) -> None:  # noqa: ANN001
    out = apply("round_weights", cnn, num_steps=16).artifact
    for name, values in float_weights(out).items():
        assert len(np.unique(values)) <= 16, name
    original = float_weights(cnn)
    for name, values in float_weights(out).items():
        span = original[name].max() - original[name].min()
        assert np.abs(values - original[name]).max() <= span / 16 / 2 * 1.001, name


def test_maximum_stays_in_the_last_bucket() -> None:
    # TF's transform puts the maximum in a bucket of its own: num_steps + 1 values.
    values = np.linspace(-1.0, 1.0, 10_001, dtype=np.float32)
    rounded = round_values(values, 256)
    assert len(np.unique(rounded)) == 256
    assert rounded.min() >= -1.0 and rounded.max() <= 1.0


def test_constant_tensor_is_left_alone() -> None:
    values = np.full(64, 0.25, dtype=np.float32)
    np.testing.assert_array_equal(round_values(values, 256), values)


def test_input_is_not_mutated(cnn) -> None:  # noqa: ANN001
    before = copy_graph(cnn.graph_def)
    apply("round_weights", cnn)
    assert cnn.graph_def == before
