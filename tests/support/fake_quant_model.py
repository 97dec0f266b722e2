"""The digits CNN with FakeQuant nodes where TF1's contrib quantize (or TFMOT) puts them.

`FakeQuantWithMinMaxVars` after the input, after each conv/dense (+ReLU) output and on the
logits, with min/max variables, and on the weights (`...PerChannel` on the convolutions,
per tensor on the dense layers; symmetric, narrow range, as TFMOT's 8-bit scheme). The
weights are the `cnn` fixture's (quant_fixtures: trained once per session); the activation
ranges are set from the data, as a few QAT steps would leave them: the 99.5th percentile of
each activation's values on the calibration images, narrower than the per-sample maxima
log_ranges would measure, so a test can tell the model's own ranges from logged ones.

`frozen` gives the frozen GraphDef artifact (as a TF1 freeze_graph leaves it: the weights'
FakeQuant nodes still in it), `save` a SavedModel (tf.Module + tf.function).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.model.artifact import ModelArtifact, TensorSpec

INPUT = "image"
# activation FakeQuant -> where it sits (the op whose output it quantizes)
ACTIVATIONS = ("input", "conv1", "conv2", "fc1", "logits")
PERCENTILE = 99.5


def _float_activations(weights: list[np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    """Each activation point's float values on `x` (no fake quantization)."""
    import tensorflow as tf

    k1, b1, k2, b2, k3, b3, k4, b4 = weights
    out = {"input": x}
    h = tf.nn.relu(tf.nn.conv2d(x, k1, 1, "SAME") + b1)
    out["conv1"] = h.numpy()
    h = tf.nn.max_pool2d(h, 2, 2, "VALID")
    h = tf.nn.relu(tf.nn.conv2d(h, k2, 1, "SAME") + b2)
    out["conv2"] = h.numpy()
    h = tf.nn.relu(tf.reshape(h, [-1, k3.shape[0]]) @ k3 + b3)
    out["fc1"] = h.numpy()
    out["logits"] = (h @ k4 + b4).numpy()
    return out


def ranges_from_data(weights: list[np.ndarray], x: np.ndarray) -> dict[str, tuple[float, float]]:
    """(min, max) per activation point: its values' 0.5th/99.5th percentiles (zero kept)."""
    ranges = {}
    for name, values in _float_activations(weights, x).items():
        lo, hi = np.percentile(values, [100 - PERCENTILE, PERCENTILE])
        ranges[name] = (min(float(lo), 0.0), max(float(hi), 0.0))
    ranges["input"] = (0.0, 1.0)  # digits' pixels: what an input quantize layer learns
    return ranges


def module(weights: list[np.ndarray], ranges: dict[str, tuple[float, float]]) -> Any:
    """A tf.Module whose `__call__` (input `image`, [None, 8, 8, 1]) runs the CNN with
    FakeQuant nodes; every range is a variable, as QAT leaves it."""
    import tensorflow as tf

    class FakeQuantCNN(tf.Module):
        def __init__(self) -> None:
            super().__init__(name="fake_quant_cnn")
            self.kernels = [tf.Variable(w, name=f"w{i}") for i, w in enumerate(weights)]
            self.ranges = {k: (tf.Variable(np.float32(lo), name=f"{k}_min"),
                               tf.Variable(np.float32(hi), name=f"{k}_max"))
                           for k, (lo, hi) in ranges.items()}

        def _act(self, x: Any, name: str) -> Any:
            if name not in self.ranges:  # a layer the model did not quantize
                return x
            lo, hi = self.ranges[name]
            return tf.quantization.fake_quant_with_min_max_vars(x, lo, hi, name=f"{name}/act_quant")

        @staticmethod
        def _weights(w: Any, per_channel: bool) -> Any:
            bound = (tf.reduce_max(tf.abs(w), axis=list(range(len(w.shape) - 1)))
                     if per_channel else tf.reduce_max(tf.abs(w)))
            fq = (tf.quantization.fake_quant_with_min_max_vars_per_channel if per_channel
                  else tf.quantization.fake_quant_with_min_max_vars)
            return fq(w, -bound, bound, narrow_range=True, name="weights_quant")

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name=INPUT)])
        def __call__(self, x: Any) -> Any:
            k1, b1, k2, b2, k3, b3, k4, b4 = self.kernels
            x = self._act(x, "input")
            with tf.name_scope("conv1"):
                h = tf.nn.conv2d(x, self._weights(k1, True), 1, "SAME")
                h = tf.nn.relu(tf.nn.bias_add(h, b1))
            h = self._act(h, "conv1")
            h = tf.nn.max_pool2d(h, 2, 2, "VALID", name="pool")
            with tf.name_scope("conv2"):
                h = tf.nn.conv2d(h, self._weights(k2, True), 1, "SAME")
                h = tf.nn.relu(tf.nn.bias_add(h, b2))
            h = self._act(h, "conv2")
            h = tf.reshape(h, [-1, k3.shape[0]], name="flatten")
            with tf.name_scope("fc1"):
                h = tf.nn.relu(tf.nn.bias_add(h @ self._weights(k3, False), b3))
            h = self._act(h, "fc1")
            with tf.name_scope("logits"):
                h = tf.nn.bias_add(h @ self._weights(k4, False), b4)
            h = self._act(h, "logits")
            return tf.nn.softmax(h, name="probs")

    return FakeQuantCNN()


def frozen(cnn_module: Any) -> ModelArtifact:
    """The module's call frozen (variables to constants, Identity nodes removed), its
    weights' FakeQuant nodes kept: a TF1 frozen graph as contrib quantize left it."""
    from orchestrator.model.graph_rewrite import subgraph
    from orchestrator.model.tf_adapter import convert_to_constants, transform_graph

    concrete = cnn_module.__call__.get_concrete_function()
    graph = convert_to_constants().convert_variables_to_constants_v2(concrete)
    outputs = [t.name.split(":")[0] for t in graph.outputs]
    graph_def = transform_graph(graph.graph.as_graph_def(), [INPUT], outputs,
                                "remove_control_dependencies remove_nodes(op=Identity)")
    graph_def = subgraph(graph_def, [INPUT, *outputs])
    return ModelArtifact(graph_def=graph_def,
                         inputs=(TensorSpec(INPUT, "float32", (None, 8, 8, 1)),),
                         outputs=tuple(outputs))


def save(cnn_module: Any, folder: Path) -> Path:
    """The module as a SavedModel (serving_default: image -> probs)."""
    import tensorflow as tf

    tf.saved_model.save(cnn_module, str(folder), signatures={
        "serving_default": cnn_module.__call__.get_concrete_function()})
    return folder


def fake_quant_ranges(artifact: ModelArtifact) -> dict[str, tuple[float, float]]:
    """The activation FakeQuant nodes' (min, max), as TF nudges them (zero on a step),
    by activation point name."""
    import tensorflow as tf

    from orchestrator.stages.freeze_ranges import nudged_range

    consts = {n.name: n for n in artifact.graph_def.node if n.op == "Const"}
    found = {}
    for node in artifact.graph_def.node:
        if node.op == "FakeQuantWithMinMaxVars" and node.name.endswith("/act_quant"):
            lo, hi = (float(tf.make_ndarray(consts[i.split(":")[0]].attr["value"].tensor))
                      for i in node.input[1:3])
            found[node.name[: -len("/act_quant")]] = nudged_range(lo, hi)
    return found
