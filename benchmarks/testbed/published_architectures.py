"""The architectures of the published latency measurements
(benchmarks/data/published_latency.csv), built untrained and converted to TFLite, so that
a latency estimate can be run on the same graph a published number was measured on.

Weights are seeded random (weights=None): latency follows the graph (its ops, shapes and
precision), not the weights' values. Each model keeps its classifier (include_top, 1000
classes; the TF-slim hosted models have 1001, a background class: one column of the last
matmul, nothing measurable).

    python -m testbed.published_architectures [--work DIR]    (from benchmarks/)

builds and converts every (model, alpha, size, precision) the rows of the CSV need, plus
MobileNetV3 Small/Large in float32 and int8, caching each .tflite file under DIR.

Builders and how faithful they are:
- Keras applications: mobilenet_v1 (MobileNet), mobilenet_v2, mobilenet_v3_small/large
  (include_preprocessing=False), nasnet_mobile, nasnet_large, inception_v3,
  inception_resnet_v2, resnet_v2_101 (ResNet101V2), densenet (DenseNet121), resnet50 and
  resnet50_v1.5 (ResNet50, see `_resnet50`).
- Hand-built from the TF-slim definitions (tensorflow/models research/slim/nets), inference
  graph, no auxiliary head (a frozen inference graph drops it: it does not lead to the
  predictions): inception_v1 (GoogLeNet), inception_v2 (BN-Inception, first layer a 7x7
  separable conv), inception_v4. Conv + batch norm (scale off, as slim's
  inception_arg_scope) + ReLU, which the converter folds into one CONV_2D with its bias.
- squeezenet: SqueezeNet v1.0 as tensorflow/tpu models/official/squeezenet defines it,
  TF's own SqueezeNet, the likeliest source of TF's hosted squeezenet_2018_04_27 (49.0 %
  top-1: not the Caffe weights' 57.5 %; 5.0 MB: 1.25 M float parameters). Not confirmed;
  the published latencies agree better with v1.0's 0.84 G multiply-adds than with v1.1's
  0.35 G (Pixel 3: 35.8 ms, mobilenet_v1 1.0 with 0.57 G: 23.9 ms). "squeezenet_v1.1"
  builds the v1.1 layout instead.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TF quiet: before any TF import
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # and its oneDNN banner with it

if TYPE_CHECKING:
    import tensorflow as tf

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "benchmarks" / "data" / "published_latency.csv"
DEFAULT_WORK = ROOT / ".orchestrator" / "bench" / "estimates"
PRECISIONS = ("float32", "int8", "dynamic")
# the CSV's variant (after a leading alpha) -> the precision of the file built for it
VARIANT_PRECISION = {"float32": "float32", "float32 original": "float32",
                     "uint8 QAT": "int8", "quant-aware trained uint8": "int8",
                     "post-training quantized": "dynamic"}
CLASSES = 1000
SEED = 0


class NotBuilt(Exception):  # noqa: N818 - the name the benchmark catches
    """A published model this module does not build (the reason is the message)."""


def _apps() -> Any:
    import keras
    return keras.applications


def _shape(size: int) -> tuple[int, int, int]:
    return (size, size, 3)


def _alpha(alpha: float | None) -> float:
    return 1.0 if alpha is None else alpha


def _resnet50(alpha: float | None, size: int) -> Any:
    # keras' ResNet50 is v1: each bottleneck's stride is in its first 1x1 conv. v1.5 (the
    # published "resnet50_v1.5") moves the stride to the 3x3 conv; the block's
    # first 1x1 then runs at the higher resolution: a few % more FLOPs (the first block of
    # stages 3-5: +0.23 G multiply-adds, about 4.1 vs 3.9 G at 224, +6 %), same params.
    return _apps().ResNet50(weights=None, input_shape=_shape(size), classes=CLASSES)


# --- TF-slim inception nets -------------------------------------------------------------

def _conv(x: Any, filters: int, kernel: int | tuple[int, int], strides: int = 1,
          padding: str = "same") -> Any:
    """slim.conv2d under inception_arg_scope: conv without bias, batch norm, ReLU."""
    from keras import layers
    x = layers.Conv2D(filters, kernel, strides=strides, padding=padding, use_bias=False)(x)
    x = layers.BatchNormalization(epsilon=0.001, scale=False)(x)
    return layers.ReLU()(x)


def _cat(parts: list[Any]) -> Any:
    from keras import layers
    return layers.Concatenate()(parts)


def _pool(x: Any, kind: str = "max", size: int = 3, strides: int = 1,
          padding: str = "same") -> Any:
    from keras import layers
    pool = layers.MaxPooling2D if kind == "max" else layers.AveragePooling2D
    return pool(size, strides=strides, padding=padding)(x)


def _mixed(x: Any, b0: int, b1: tuple[int, ...], b2: tuple[int, ...], b3: int,
           pool: str = "max") -> Any:
    """An inception module: 1x1 | 1x1 then 3x3s | 1x1 then 3x3s | pool 3x3 then 1x1."""
    branches = [_conv(x, b0, 1)]
    for chain in (b1, b2):
        y = _conv(x, chain[0], 1)
        for filters in chain[1:]:
            y = _conv(y, filters, 3)
        branches.append(y)
    return _cat([*branches, _conv(_pool(x, pool), b3, 1)])


def _reduce(x: Any, b0: tuple[int, ...], b1: tuple[int, ...]) -> Any:
    """inception_v2's Mixed_4a/5a: 1x1 then 3x3s, the last with stride 2 (SAME), and a
    max pool 3x3/2."""
    branches = []
    for chain in (b0, b1):
        y = _conv(x, chain[0], 1)
        for filters in chain[1:-1]:
            y = _conv(y, filters, 3)
        branches.append(_conv(y, chain[-1], 3, 2))
    return _cat([*branches, _pool(x, strides=2)])


def _head(x: Any, pool: int, dense: bool = False) -> Any:
    """slim's logits: average pool over the whole map (VALID), dropout, then a 1x1 conv
    with bias (v1, v2) or flatten + fully connected (v4); softmax."""
    from keras import layers
    x = layers.AveragePooling2D(pool, padding="valid")(x)
    x = layers.Dropout(0.2)(x)
    if dense:
        x = layers.Dense(CLASSES)(layers.Flatten()(x))
    else:
        x = layers.Flatten()(layers.Conv2D(CLASSES, 1)(x))
    return layers.Softmax()(x)


def _model(inputs: Any, outputs: Any, name: str) -> Any:
    import keras
    return keras.Model(inputs, outputs, name=name)


def _inception_v1(alpha: float | None, size: int) -> Any:
    """research/slim/nets/inception_v1.py (GoogLeNet with batch norm)."""
    import keras
    inputs = keras.Input(_shape(size))
    x = _pool(_conv(inputs, 64, 7, 2), strides=2)
    x = _pool(_conv(_conv(x, 64, 1), 192, 3), strides=2)
    x = _mixed(x, 64, (96, 128), (16, 32), 32)                 # Mixed_3b
    x = _mixed(x, 128, (128, 192), (32, 96), 64)               # Mixed_3c
    x = _pool(x, strides=2)                                    # MaxPool_4a_3x3
    for spec in ((192, (96, 208), (16, 48), 64), (160, (112, 224), (24, 64), 64),
                 (128, (128, 256), (24, 64), 64), (112, (144, 288), (32, 64), 64),
                 (256, (160, 320), (32, 128), 128)):           # Mixed_4b..4f
        x = _mixed(x, *spec)
    x = _pool(x, size=2, strides=2)                            # MaxPool_5a_2x2
    x = _mixed(x, 256, (160, 320), (32, 128), 128)             # Mixed_5b
    x = _mixed(x, 384, (192, 384), (48, 128), 128)             # Mixed_5c
    return _model(inputs, _head(x, x.shape[1]), "inception_v1")


def _inception_v2(alpha: float | None, size: int) -> Any:
    """research/slim/nets/inception_v2.py (BN-Inception), depth_multiplier 1."""
    import keras
    from keras import layers
    inputs = keras.Input(_shape(size))
    # Conv2d_1a_7x7: separable, depthwise multiplier min(64 // 3, 8) = 8, then 1x1 to 64
    x = layers.SeparableConv2D(64, 7, strides=2, padding="same", depth_multiplier=8,
                               use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization(epsilon=0.001, scale=False)(x))
    x = _pool(x, strides=2)
    x = _pool(_conv(_conv(x, 64, 1), 192, 3), strides=2)
    x = _mixed(x, 64, (64, 64), (64, 96, 96), 32, "avg")       # Mixed_3b
    x = _mixed(x, 64, (64, 96), (64, 96, 96), 64, "avg")       # Mixed_3c
    x = _reduce(x, (128, 160), (64, 96, 96))                   # Mixed_4a
    for spec in ((224, (64, 96), (96, 128, 128), 128), (192, (96, 128), (96, 128, 128), 128),
                 (160, (128, 160), (128, 160, 160), 96), (96, (128, 192), (160, 192, 192), 96)):
        x = _mixed(x, *spec, "avg")                            # Mixed_4b..4e
    x = _reduce(x, (128, 192), (192, 256, 256))                # Mixed_5a
    x = _mixed(x, 352, (192, 320), (160, 224, 224), 128, "avg")  # Mixed_5b
    x = _mixed(x, 352, (192, 320), (192, 224, 224), 128, "max")  # Mixed_5c
    return _model(inputs, _head(x, min(x.shape[1], 7)), "inception_v2")


def _inception_v4(alpha: float | None, size: int) -> Any:
    """research/slim/nets/inception_v4.py."""
    import keras
    inputs = keras.Input(_shape(size))
    x = _conv(_conv(inputs, 32, 3, 2, "valid"), 32, 3, padding="valid")
    x = _conv(x, 64, 3)
    x = _cat([_pool(x, strides=2, padding="valid"), _conv(x, 96, 3, 2, "valid")])  # 3a
    a = _conv(_conv(x, 64, 1), 96, 3, padding="valid")
    b = _conv(_conv(_conv(_conv(x, 64, 1), 64, (1, 7)), 64, (7, 1)), 96, 3, padding="valid")
    x = _cat([a, b])                                                               # 4a
    x = _cat([_conv(x, 192, 3, 2, "valid"), _pool(x, strides=2, padding="valid")])  # 5a
    for _ in range(4):                                         # Inception-A, Mixed_5b..5e
        x = _cat([_conv(x, 96, 1), _conv(_conv(x, 64, 1), 96, 3),
                  _conv(_conv(_conv(x, 64, 1), 96, 3), 96, 3),
                  _conv(_pool(x, "avg"), 96, 1)])
    b = _conv(_conv(_conv(x, 192, 1), 224, 3), 256, 3, 2, "valid")  # Reduction-A, Mixed_6a
    x = _cat([_conv(x, 384, 3, 2, "valid"), b, _pool(x, strides=2, padding="valid")])
    for _ in range(7):                                         # Inception-B, Mixed_6b..6h
        b = _conv(_conv(_conv(x, 192, 1), 224, (1, 7)), 256, (7, 1))
        c = _conv(_conv(x, 192, 1), 192, (7, 1))
        c = _conv(_conv(_conv(c, 224, (1, 7)), 224, (7, 1)), 256, (1, 7))
        x = _cat([_conv(x, 384, 1), b, c, _conv(_pool(x, "avg"), 128, 1)])
    a = _conv(_conv(x, 192, 1), 192, 3, 2, "valid")            # Reduction-B, Mixed_7a
    b = _conv(_conv(_conv(x, 256, 1), 256, (1, 7)), 320, (7, 1))
    x = _cat([a, _conv(b, 320, 3, 2, "valid"), _pool(x, strides=2, padding="valid")])
    for _ in range(3):                                         # Inception-C, Mixed_7b..7d
        b = _conv(x, 384, 1)
        b = _cat([_conv(b, 256, (1, 3)), _conv(b, 256, (3, 1))])
        c = _conv(_conv(_conv(x, 384, 1), 448, (3, 1)), 512, (1, 3))
        c = _cat([_conv(c, 256, (1, 3)), _conv(c, 256, (3, 1))])
        x = _cat([_conv(x, 256, 1), b, c, _conv(_pool(x, "avg"), 256, 1)])
    return _model(inputs, _head(x, x.shape[1], dense=True), "inception_v4")


def _squeezenet(alpha: float | None, size: int, version: str = "1.0") -> Any:
    """SqueezeNet as TF built it: tensorflow/tpu models/official/squeezenet (v1.0: 7x7/96
    first conv, max pools after conv1, fire4 and fire8; every conv SAME with bias and ReLU,
    no batch norm; pools VALID; conv10 then a 13x13 average pool). version "1.1": the
    v1.1 Caffe model's layout (3x3/64 first conv, pools after conv1, fire3, fire5),
    about 2.4x fewer multiply-adds."""
    import keras
    from keras import layers

    def conv(x: Any, filters: int, kernel: int, strides: int = 1) -> Any:
        return layers.Conv2D(filters, kernel, strides=strides, padding="same",
                             activation="relu")(x)

    def fire(x: Any, squeeze: int, expand: int) -> Any:
        s = conv(x, squeeze, 1)
        return _cat([conv(s, expand, 1), conv(s, expand, 3)])

    def pool(x: Any) -> Any:
        return _pool(x, strides=2, padding="valid")

    inputs = keras.Input(_shape(size))
    if version == "1.0":
        x = pool(conv(inputs, 96, 7, 2))
        x = pool(fire(fire(fire(x, 16, 64), 16, 64), 32, 128))
        x = pool(fire(fire(fire(fire(x, 32, 128), 48, 192), 48, 192), 64, 256))
        x = fire(x, 64, 256)
    else:
        x = pool(layers.Conv2D(64, 3, strides=2, activation="relu")(inputs))
        x = pool(fire(fire(x, 16, 64), 16, 64))
        x = pool(fire(fire(x, 32, 128), 32, 128))
        x = fire(fire(fire(fire(x, 48, 192), 48, 192), 64, 256), 64, 256)
    x = conv(layers.Dropout(0.5)(x), CLASSES, 1)
    x = layers.AveragePooling2D(x.shape[1], padding="valid")(x)
    x = layers.Softmax()(layers.Flatten()(x))
    return _model(inputs, x, f"squeezenet_v{version}")


def _app(name: str, **extra: Any) -> Callable[[float | None, int], Any]:
    def make(alpha: float | None, size: int) -> Any:
        return getattr(_apps(), name)(weights=None, input_shape=_shape(size),
                                      classes=CLASSES, **extra)
    make.__doc__ = f"keras.applications.{name}"
    return make


def _with_alpha(name: str, **extra: Any) -> Callable[[float | None, int], Any]:
    def make(alpha: float | None, size: int) -> Any:
        return getattr(_apps(), name)(weights=None, input_shape=_shape(size),
                                      alpha=_alpha(alpha), classes=CLASSES, **extra)
    make.__doc__ = f"keras.applications.{name}"
    return make


# published model name (the CSV's `model`) -> builder(alpha, size)
ROWS_MODELS: dict[str, Callable[[float | None, int], Any]] = {
    "mobilenet_v1": _with_alpha("MobileNet"),
    "mobilenet_v2": _with_alpha("MobileNetV2"),
    "mobilenet_v3_small": _with_alpha("MobileNetV3Small", include_preprocessing=False),
    "mobilenet_v3_large": _with_alpha("MobileNetV3Large", include_preprocessing=False),
    # hard-swish, squeeze-excite and 5x5 kernels taken out (ReLU, 3x3 only)
    "mobilenet_v3_small_minimalistic": _with_alpha(
        "MobileNetV3Small", include_preprocessing=False, minimalistic=True),
    "mobilenet_v3_large_minimalistic": _with_alpha(
        "MobileNetV3Large", include_preprocessing=False, minimalistic=True),
    "nasnet_mobile": _app("NASNetMobile"),
    "nasnet_large": _app("NASNetLarge"),
    "inception_v3": _app("InceptionV3"),
    "inception_resnet_v2": _app("InceptionResNetV2"),
    "resnet_v2_101": _app("ResNet101V2"),
    "densenet": _app("DenseNet121"),
    "resnet50": _resnet50,
    "resnet50_v1.5": _resnet50,
    "squeezenet": _squeezenet,  # v1.0, as tensorflow/tpu (see the module's docstring)
    # not a published row: the other SqueezeNet, for comparison
    "squeezenet_v1.1": lambda alpha, size: _squeezenet(alpha, size, "1.1"),
    "inception_v1": _inception_v1,
    "inception_v2": _inception_v2,
    "inception_v4": _inception_v4,
}


def build(model: str, alpha: float | None, size: int, seed: int = SEED) -> tf.keras.Model:
    """The untrained Keras model for a published `model` name, its weights seeded."""
    if model not in ROWS_MODELS:
        raise NotBuilt(f"no builder for {model!r} (known: {', '.join(sorted(ROWS_MODELS))})")
    import keras
    keras.utils.set_random_seed(seed)
    return ROWS_MODELS[model](alpha, size)


def convert(model: Any, precision: str) -> bytes:
    """The model as a .tflite flatbuffer. float32: plain conversion. int8: full integer
    (int8 kernels only, calibrated on 2 seeded random samples; float input and output).
    dynamic: weights-only int8 (dynamic range), no calibration data."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    import absl.logging
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework import convert_to_constants

    # batch 1, as the published files; the variables frozen to constants first (a Keras 3
    # model's variables, passed as the converter's trackable, stay variables: VAR_HANDLE
    # and READ_VARIABLE ops, batch norms unfolded, no weights in the file)
    shape = [1, *model.input_shape[1:]]
    function = tf.function(lambda x: model(x, training=False),
                           input_signature=[tf.TensorSpec(shape, tf.float32)])
    frozen = convert_to_constants.convert_variables_to_constants_v2(
        function.get_concrete_function())
    # the converter warns that no trackable object was given: a frozen function has none
    absl.logging.set_verbosity(absl.logging.ERROR)
    warnings.filterwarnings("ignore", "Statistics for quantized inputs")  # float inputs
    converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen])
    if precision != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if precision == "int8":
        rng = np.random.default_rng(SEED)
        samples = [rng.uniform(-1.0, 1.0, shape).astype(np.float32) for _ in range(2)]

        def representative() -> Any:
            for sample in samples:
                yield [sample]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return converter.convert()


def key(model: str, alpha: float | None, size: int, precision: str) -> str:
    """The file name of a build: mobilenet_v1_a0.5_224_int8.tflite."""
    tag = "" if alpha is None else f"_a{alpha:g}"
    return f"{model}{tag}_{size}_{precision}.tflite"


def tflite_file(model: str, alpha: float | None, size: int, precision: str,
                work: Path) -> Path:
    """The cached .tflite file of a build under `work`, built and converted the first time
    (written to a temporary file, then renamed: never a half-written file)."""
    path = Path(work) / key(model, alpha, size, precision)
    if path.exists():
        return path
    keras_model = build(model, alpha, size)
    data = convert(keras_model, precision)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(temp, 0o644)  # mkstemp's 0600: readable as any file written plainly
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    finally:
        import keras
        keras.backend.clear_session()
    return path


def parse_variant(variant: str) -> tuple[float | None, str]:
    """A CSV variant -> (alpha, precision): "0.25 uint8 QAT" -> (0.25, "int8")."""
    head, _, rest = variant.partition(" ")
    try:
        alpha: float | None = float(head)
    except ValueError:
        alpha, rest = None, variant
    if rest not in VARIANT_PRECISION:
        raise ValueError(f"variant {variant!r}: unknown precision {rest!r}")
    return alpha, VARIANT_PRECISION[rest]


def needed(csv_path: Path = CSV) -> list[tuple[str, float | None, int, str]]:
    """Every (model, alpha, size, precision) the CSV's rows need, plus MobileNetV3
    Small/Large in float32 and int8 at 224."""
    combos = set()
    with open(csv_path, newline="") as handle:
        for row in csv.DictReader(handle):
            alpha, precision = parse_variant(row["variant"])
            combos.add((row["model"], alpha, int(row["input"]), precision))
    for model in ("mobilenet_v3_small", "mobilenet_v3_large"):
        for precision in ("float32", "int8"):
            combos.add((model, None, 224, precision))
    return sorted(combos, key=lambda c: (c[0], c[1] or 0.0, c[2], c[3]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args(argv)
    start = time.monotonic()
    built, skipped, failed = 0, 0, 0
    for model, alpha, size, precision in needed(args.csv):
        name = key(model, alpha, size, precision)
        began = time.monotonic()
        try:
            path = tflite_file(model, alpha, size, precision, args.work)
        except NotBuilt as exc:
            skipped += 1
            print(f"SKIP  {name}: {exc}", flush=True)
            continue
        except Exception as exc:  # report and go on: one failure must not cost the rest
            failed += 1
            print(f"FAIL  {name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        built += 1
        print(f"OK    {name}: {path.stat().st_size / 1e6:.2f} MB, "
              f"{time.monotonic() - began:.1f} s", flush=True)
    print(f"{built} files, {skipped} skipped, {failed} failed, "
          f"{time.monotonic() - start:.0f} s in all", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
