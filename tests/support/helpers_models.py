"""Tiny models in every source format, written to a folder, with their expected outputs.

Each builder returns a `Built` record: the path to load, a test input and the outputs the
original model gives on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from support import helpers_tf
from support.helpers_tf import B, W

X3 = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
X4 = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)


@dataclass(frozen=True)
class Built:
    path: Path
    x: np.ndarray
    expected: np.ndarray


def reference(x: np.ndarray) -> np.ndarray:
    """softmax(x @ W + B): what every tiny model here computes."""
    logits = x @ W + B
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def module_saved_model(directory: Path) -> Built:
    """helpers_tf's tf.Module SavedModel; signature x -> {'y'}."""
    return Built(helpers_tf.module_saved_model(directory), X3, reference(X3))


def break_for_tf2_loader(directory: Path) -> None:
    """Drop the object graph's concrete functions: tf.saved_model.load then fails (as on
    some old Keras exports), while the TF1 loader, which reads only the meta graph and its
    signatures, still works."""
    from tensorflow.core.protobuf import saved_model_pb2

    pb = directory / "saved_model.pb"
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(pb.read_bytes())
    proto.meta_graphs[0].object_graph_def.concrete_functions.clear()
    pb.write_bytes(proto.SerializeToString())


def keras_model() -> Any:
    """Input 'feat'[?,3] -> Dense 'probs' (softmax) with the fixed W, B."""
    import keras

    inputs = keras.Input(shape=(3,), name="feat")
    outputs = keras.layers.Dense(2, activation="softmax", name="probs")(inputs)
    model = keras.Model(inputs, outputs)
    model.get_layer("probs").set_weights([W, B])
    return model


def keras_files(directory: Path) -> dict[str, Built]:
    """The same Keras model as .keras, .h5 and an exported SavedModel."""
    model = keras_model()
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"keras": directory / "m.keras", "h5": directory / "m.h5",
             "export": directory / "exported"}
    model.save(paths["keras"])
    model.save(paths["h5"])
    model.export(str(paths["export"]), verbose=False)
    return {k: Built(p, X3, reference(X3)) for k, p in paths.items()}


def multi_io_keras(directory: Path) -> Path:
    """Inputs 'zeta'[?,3], 'alpha'[?,4]; outputs 'first'[?,2], 'second'[?,1]."""
    import keras

    keras.utils.set_random_seed(0)
    zeta = keras.Input(shape=(3,), name="zeta")
    alpha = keras.Input(shape=(4,), name="alpha")
    joined = keras.layers.Concatenate()([zeta, alpha])
    first = keras.layers.Dense(2, name="first")(joined)
    second = keras.layers.Dense(1, name="second")(joined)
    path = directory / "multi.keras"
    keras.Model([zeta, alpha], [first, second]).save(path)
    return path


def tf1_graph(with_variables: bool) -> Any:
    """x[?,3] -> softmax(x @ w + b) named 'y', in a tf.Graph (w a variable, or a Const)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        if with_variables:
            w = tf.compat.v1.get_variable("w", initializer=W)
            b = tf.compat.v1.get_variable("b", initializer=B, use_resource=False)
        else:
            w, b = tf.constant(W, name="w"), tf.constant(B, name="b")
        tf.nn.softmax(tf.matmul(x, w) + b, name="y")
    return graph


def frozen_files(directory: Path) -> dict[str, Built]:
    """The Const version of tf1_graph as binary .pb and text .pbtxt."""
    from google.protobuf import text_format

    directory.mkdir(parents=True, exist_ok=True)
    graph_def = tf1_graph(with_variables=False).as_graph_def()
    pb, pbtxt = directory / "model.pb", directory / "model.pbtxt"
    pb.write_bytes(graph_def.SerializeToString())
    pbtxt.write_text(text_format.MessageToString(graph_def))
    return {"pb": Built(pb, X3, reference(X3)), "pbtxt": Built(pbtxt, X3, reference(X3))}


def tf1_checkpoint(directory: Path) -> Built:
    """tf1_graph with variables (one resource, one ref), a Saver and an init op, saved as
    directory/model.ckpt{.meta,.index,.data-*} plus the `checkpoint` state file."""
    import tensorflow as tf

    graph = tf1_graph(with_variables=True)
    with graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init)
            saver.save(session, str(directory / "model.ckpt"))
    return Built(directory, X3, reference(X3))


def tf1_builder_saved_model(directory: Path) -> Built:
    """A TF1 SavedModel (SavedModelBuilder): signature {'feat': x} -> {'score': y}."""
    import tensorflow as tf

    graph = tf1_graph(with_variables=True)
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        builder = tf.compat.v1.saved_model.Builder(str(directory))
        signature = tf.compat.v1.saved_model.predict_signature_def(
            {"feat": graph.get_tensor_by_name("x:0")}, {"score": graph.get_tensor_by_name("y:0")})
        builder.add_meta_graph_and_variables(session, ["serve"],
                                             signature_def_map={"serving_default": signature})
        builder.save()
    return Built(directory, X3, reference(X3))
