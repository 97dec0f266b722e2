"""A float `.tflite` as differentiable TensorFlow: its weights as variables, LiteRT's int8
kernels simulated by fake quantization.

Quantization-aware fine-tuning needs gradients through the model, and a float `.tflite`
is what every model source ends as before the LiteRT Quantizer (SavedModel, Keras 3,
`.h5`, a frozen `.pb`): so the replica is built from the flatbuffer itself, op by op, with
each op's builtin options (strides, padding, dilation, fused activation...), and its
convolution and fully connected filters and biases become `tf.Variable`s. In float it
reproduces the interpreter's outputs (about 1e-5).

With `quantize=True` it computes what the quantizer's int8 file computes, as
`ai-edge-quantizer`'s min-max policy lays it out:
- weights per channel, symmetric, narrow range [-127, 127] (output channels, axis 0, for
  CONV_2D and FULLY_CONNECTED; axis 3 for DEPTHWISE_CONV_2D), biases in int32 at the
  input's scale times the weight's;
- each op's output per tensor, asymmetric int8, with a trainable range
  (its gradient as LSQ's: the rounding error inside the range, the clipping outside),
  after the fused activation; the model input too (float io quantizes at the edge);
- SOFTMAX and LOGISTIC at LiteRT's fixed [0, 255/256], TANH at [-1, 127/128];
- ops that keep their input's scale (RESHAPE, MAX_POOL_2D, TRANSPOSE, PAD, slices...) take
  none of their own; AVERAGE_POOL_2D re-rounds on its input's grid; CONCATENATION
  requantizes its inputs to its output's own range (the quantizer's SAME_AS_OUTPUT).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

FLOAT32 = 0
_NUMPY = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_,
          9: np.int8, 10: np.float64}
_PADDING = {0: "SAME", 1: "VALID"}
# weight input index -> the axis of its per-channel scales
_WEIGHTED = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0}
# outputs at LiteRT's fixed int8 ranges (scale, zero point): [0, 255/256] and [-1, 127/128]
_FIXED = {"SOFTMAX": (0.0, 255 / 256), "LOGISTIC": (0.0, 255 / 256), "TANH": (-1.0, 127 / 128)}
# on their input's scale: no range of their own (values stay on the input's grid)
_SAME_SCALE = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "MAX_POOL_2D", "TRANSPOSE", "PAD",
               "STRIDED_SLICE", "SLICE", "SPACE_TO_DEPTH", "GATHER", "QUANTIZE",
               "DEQUANTIZE"}
# on their input's scale, but computing new values: rounded onto the input's grid
_REROUNDED = {"AVERAGE_POOL_2D"}


def _activation(code: int) -> Callable[[Any], Any]:
    import tensorflow as tf

    table: dict[int, Callable[[Any], Any]] = {
        0: lambda x: x, 1: tf.nn.relu, 2: lambda x: tf.clip_by_value(x, -1.0, 1.0),
        3: tf.nn.relu6, 4: tf.tanh}
    if code not in table:
        raise ValueError(f"fused activation {code} is not replicated")
    return table[code]


class Replica:
    """The main subgraph of a float `.tflite` as a TensorFlow function.

    `weights` (buffer index -> variable, the flatbuffer's layout) are the filters and
    biases of CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED; `ranges` (tensor name ->
    (min, max) variables) the activation ranges that are the tensor's own."""

    def __init__(self, float_model: bytes) -> None:
        import tensorflow as tf
        from ai_edge_litert.tools import flatbuffer_utils

        from orchestrator.model.litert_model import read_model

        self.model = read_model(float_model)
        self.graph = self.model.subgraphs[0]
        self.ops = [(flatbuffer_utils.opcode_to_name(self.model, op.opcodeIndex) or "CUSTOM",
                     op) for op in self.graph.operators]
        missing = sorted({kind for kind, _ in self.ops if kind not in _BUILDERS})
        if missing:
            raise ValueError("cannot replicate the .tflite's op(s) " + ", ".join(missing)
                             + " for fine-tuning")
        self.inputs = [int(i) for i in self.graph.inputs]
        self.outputs = [int(i) for i in self.graph.outputs]
        if len(self.inputs) != 1:
            raise ValueError(f"the model has {len(self.inputs)} inputs; fine-tuning feeds one")
        self.weights: dict[int, Any] = {}
        self.channel_axis: dict[int, int] = {}
        for kind, op in self.ops:
            if kind in _WEIGHTED:
                for position in (1, 2):
                    index = self._input(op, position)
                    if index is not None and self.constant(index) is not None:
                        buffer = self.graph.tensors[index].buffer
                        if buffer not in self.weights:
                            self.weights[buffer] = tf.Variable(self.constant(index),
                                                               name=f"w{buffer}")
                            self.channel_axis[buffer] = _WEIGHTED[kind] if position == 1 \
                                else 0
        # tensor index -> the tensor whose range it is quantized with (its own, its input's)
        self.range_of: dict[int, int] = {self.inputs[0]: self.inputs[0]}
        self.fixed: dict[int, tuple[float, float]] = {}
        for kind, op in self.ops:
            out = int(op.outputs[0])
            if self.graph.tensors[out].type != FLOAT32:
                continue
            source = self._input(op, 0)
            if kind in _FIXED:
                self.fixed[out] = _FIXED[kind]
                self.range_of[out] = out
            elif kind in _SAME_SCALE | _REROUNDED and source in self.range_of:
                self.range_of[out] = self.range_of[source]
            else:
                self.range_of[out] = out
        owned = sorted({i for i in self.range_of.values() if i not in self.fixed})
        self.ranges = {self.name(i): (tf.Variable(0.0, name=f"min{i}"),
                                      tf.Variable(0.0, name=f"max{i}")) for i in owned}
        self._ops_quantized = [kind for kind, op in self.ops
                               if int(op.outputs[0]) in self.fixed
                               or self.range_of.get(int(op.outputs[0])) == int(op.outputs[0])]

    # --- the flatbuffer --------------------------------------------------------------

    def name(self, index: int) -> str:
        from orchestrator.model.litert_model import tensor_name

        return tensor_name(self.graph.tensors[index])

    def constant(self, index: int) -> np.ndarray | None:
        tensor = self.graph.tensors[index]
        data = self.model.buffers[tensor.buffer].data
        if data is None or not len(data):
            return None
        kind = _NUMPY.get(tensor.type)
        if kind is None:
            raise ValueError(f"constant {self.name(index)!r} has tensor type {tensor.type}")
        shape = [] if tensor.shape is None else [int(d) for d in tensor.shape]
        return np.frombuffer(np.asarray(data, dtype=np.uint8).tobytes(), dtype=kind
                             ).reshape(shape).copy()

    @staticmethod
    def _input(op: Any, position: int) -> int | None:
        inputs = op.inputs if op.inputs is not None else []
        return int(inputs[position]) if position < len(inputs) and inputs[position] >= 0 \
            else None

    def quantized_ops(self) -> list[str]:
        """The kinds of the ops whose outputs are fake-quantized in their own range."""
        return list(self._ops_quantized)

    # --- running it ------------------------------------------------------------------

    def forward(self, x: Any, quantize: bool, taps: dict[str, Any] | None = None) -> list[Any]:
        """The model's outputs on `x`; `quantize`: as the int8 file computes them. `taps`,
        when given, receives every tensor that has a range of its own (name -> tensor,
        before its fake quantization) and each output's input logits (`name@logits`)."""
        import tensorflow as tf

        values: dict[int, Any] = {}
        x = tf.convert_to_tensor(x, tf.float32)
        values[self.inputs[0]] = self._activations(self.inputs[0], x, quantize, taps)
        producer: dict[int, tuple[str, Any]] = {}
        for kind, op in self.ops:
            out = _BUILDERS[kind](self, op, values, quantize)
            index = int(op.outputs[0])
            if self.graph.tensors[index].type == FLOAT32:
                if kind in _REROUNDED and quantize and index in self.range_of \
                        and self.range_of[index] != index:
                    out = self._fake_quant(out, self.range_of[index])
                out = self._activations(index, out, quantize, taps)
            values[index] = out
            producer[index] = (kind, op)
        if taps is not None:
            for index in self.outputs:
                kind, op = producer.get(index, ("", None))
                if kind == "SOFTMAX":
                    taps[self.name(index) + "@logits"] = values[int(op.inputs[0])]
        return [values[i] for i in self.outputs]

    def logits(self, x: Any, quantize: bool) -> list[Any]:
        """Per output: its float value, or for a SOFTMAX output the logits it reads (what
        fine-tuning matches: probabilities near 0 and 1 hide the differences)."""
        taps: dict[str, Any] = {}
        outputs = self.forward(x, quantize, taps)
        return [taps.get(self.name(i) + "@logits", out) for i, out in zip(self.outputs, outputs,
                                                                          strict=True)]

    def _activations(self, index: int, value: Any, quantize: bool,
                     taps: dict[str, Any] | None) -> Any:
        if self.range_of.get(index) != index:
            return value
        if taps is not None and index not in self.fixed:
            taps[self.name(index)] = value
        return self._fake_quant(value, index) if quantize else value

    def _fake_quant(self, value: Any, owner: int) -> Any:
        import tensorflow as tf

        if owner in self.fixed:
            low, high = self.fixed[owner]
            return tf.quantization.fake_quant_with_min_max_args(value, low, high, num_bits=8)
        return _fake_quant_int8(value, *self._range(owner))

    def _range(self, owner: int) -> tuple[Any, Any]:
        import tensorflow as tf

        low, high = self.ranges[self.name(owner)]
        # the quantizer's range always holds 0 (a zero point inside int8)
        return tf.minimum(low, 0.0), tf.maximum(high, 1e-6 + tf.maximum(low, 0.0))

    def input_scale(self, index: int) -> Any | None:
        owner = self.range_of.get(index)
        if owner is None:
            return None
        if owner in self.fixed:
            low, high = self.fixed[owner]
            return (high - low) / 255.0
        low, high = self._range(owner)
        return (high - low) / 255.0

    def weight(self, op: Any, position: int, values: dict[int, Any], quantize: bool,
               scale_in: Any = None) -> Any:
        """Input `position` of a weighted op: its variable, fake-quantized as LiteRT stores
        it (the filter per channel; the bias in int32 at input scale x filter scale)."""
        import tensorflow as tf

        index = self._input(op, position)
        if index is None:
            return None
        buffer = self.graph.tensors[index].buffer
        if buffer not in self.weights:  # computed (a DEQUANTIZE of float16 weights)
            return _in(self, op, values, position)
        value = self.weights[buffer]
        if not quantize:
            return value
        if position == 1:
            return _per_channel(value, self.channel_axis[buffer])
        if scale_in is None:
            return value
        filter_index = self._input(op, 1)
        if filter_index is None or self.graph.tensors[filter_index].buffer not in self.weights:
            return value
        filt = self.weights[self.graph.tensors[filter_index].buffer]
        axis = self.channel_axis[self.graph.tensors[filter_index].buffer]
        step = tf.reshape(_channel_scale(filt, axis), [-1]) * scale_in
        step = tf.maximum(step, 1e-30)
        return value + tf.stop_gradient(tf.round(value / step) * step - value)

    def initialise_ranges(self, batches: Iterable[np.ndarray]) -> dict[str, tuple[float, float]]:
        """Each owned range set to its tensor's min and max over `batches` (float run)."""
        seen: dict[str, tuple[float, float]] = {}
        for batch in batches:
            taps: dict[str, Any] = {}
            self.forward(batch, False, taps)
            for name in self.ranges:
                value = taps[name].numpy()
                low, high = float(value.min()), float(value.max())
                if name in seen:
                    low, high = min(low, seen[name][0]), max(high, seen[name][1])
                seen[name] = (low, high)
        for name, (low, high) in seen.items():
            self.ranges[name][0].assign(min(low, 0.0))
            self.ranges[name][1].assign(max(high, 0.0))
        return seen

    def trained_ranges(self) -> dict[str, tuple[float, float]]:
        """Tensor name -> (min, max) as the quantizer should take them (0 inside)."""
        found = {}
        for name, (low, high) in self.ranges.items():
            low_v, high_v = float(low.numpy()), float(high.numpy())
            low_v, high_v = min(low_v, 0.0), max(high_v, 0.0)
            found[name] = (low_v, high_v if high_v > low_v else low_v + 1e-6)
        return found

    def written_back(self) -> bytes:
        """The float flatbuffer with every weight variable's current value in its buffer
        (same shapes, float32); names and ops unchanged."""
        from ai_edge_litert.tools import flatbuffer_utils

        for buffer, variable in self.weights.items():
            array = np.ascontiguousarray(variable.numpy().astype(np.float32))
            self.model.buffers[buffer].data = np.frombuffer(array.tobytes(), dtype=np.uint8)
        return bytes(flatbuffer_utils.convert_object_to_bytearray(self.model))


def _fake_quant_int8(value: Any, low: Any, high: Any) -> Any:
    """Per-tensor asymmetric int8 on [low, high] as LiteRT's kernels store it, with the
    learned-step-size gradient for the range (Esser et al., LSQ): through the rounding
    error inside the range as well as the clipping outside it. TF's
    fake_quant_with_min_max_vars passes the range only the clipped values' gradient, so
    a range could only widen: ranges started at min/max then only grew, and the loss
    with them."""
    import tensorflow as tf

    scale = (high - low) / 255.0
    zero = tf.stop_gradient(tf.round(-128.0 - low / scale))
    level = value / scale + zero
    level = level + tf.stop_gradient(tf.round(level) - level)  # straight through
    return (tf.clip_by_value(level, -128.0, 127.0) - zero) * scale


def _channel_scale(value: Any, axis: int) -> Any:
    """Per-channel symmetric narrow-range scale: max |w| over the channel / 127, kept
    broadcastable against `value`."""
    import tensorflow as tf

    rank = len(value.shape)
    others = [a for a in range(rank) if a != axis]
    top = tf.reduce_max(tf.abs(value), axis=others, keepdims=True)
    return tf.maximum(top, 1e-12) / 127.0


def _per_channel(value: Any, axis: int) -> Any:
    """int8 per channel, [-127, 127], with a straight-through gradient for the weights."""
    import tensorflow as tf

    scale = tf.stop_gradient(_channel_scale(value, axis))
    rounded = tf.clip_by_value(tf.round(value / scale), -127.0, 127.0) * scale
    return value + tf.stop_gradient(rounded - value)


# --- one function per op kind: (replica, op, values, quantize) -> output tensor -----------

def _in(replica: Replica, op: Any, values: dict[int, Any], position: int) -> Any:
    import tensorflow as tf

    index = Replica._input(op, position)
    if index is None:
        return None
    if index in values:
        return values[index]
    constant = replica.constant(index)
    if constant is None:
        raise ValueError(f"tensor {replica.name(index)!r} is read before it is computed")
    return tf.constant(constant)


def _conv(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
    import tensorflow as tf

    o = op.builtinOptions
    x = _in(replica, op, values, 0)
    scale_in = replica.input_scale(int(op.inputs[0])) if quantize else None
    filt = tf.transpose(replica.weight(op, 1, values, quantize), [1, 2, 3, 0])  # OHWI -> HWIO
    y = tf.nn.conv2d(x, filt, strides=[1, o.strideH, o.strideW, 1],
                     padding=_PADDING[o.padding],
                     dilations=[1, o.dilationHFactor, o.dilationWFactor, 1])
    bias = replica.weight(op, 2, values, quantize, scale_in)
    return _activation(o.fusedActivationFunction)(y if bias is None else y + bias)


def _depthwise(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
    import tensorflow as tf

    o = op.builtinOptions
    x = _in(replica, op, values, 0)
    scale_in = replica.input_scale(int(op.inputs[0])) if quantize else None
    filt = replica.weight(op, 1, values, quantize)  # [1, H, W, I * M]
    channels = int(x.shape[-1]) if x.shape[-1] is not None \
        else int(filt.shape[-1]) // max(int(o.depthMultiplier), 1)
    height, width = int(filt.shape[1]), int(filt.shape[2])
    filt = tf.reshape(filt, [height, width, channels, -1])
    y = tf.nn.depthwise_conv2d(x, filt, strides=[1, o.strideH, o.strideW, 1],
                               padding=_PADDING[o.padding],
                               dilations=[o.dilationHFactor, o.dilationWFactor])
    bias = replica.weight(op, 2, values, quantize, scale_in)
    return _activation(o.fusedActivationFunction)(y if bias is None else y + bias)


def _fully_connected(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
    import tensorflow as tf

    o = op.builtinOptions
    x = _in(replica, op, values, 0)
    scale_in = replica.input_scale(int(op.inputs[0])) if quantize else None
    weights = replica.weight(op, 1, values, quantize)  # [O, I]
    units, depth = int(weights.shape[0]), int(weights.shape[1])
    flat = tf.reshape(x, [-1, depth])
    y = tf.matmul(flat, weights, transpose_b=True)
    bias = replica.weight(op, 2, values, quantize, scale_in)
    y = _activation(o.fusedActivationFunction)(y if bias is None else y + bias)
    if o.keepNumDims:
        y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [units]], axis=0))
    return y


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def build(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
        y = fn(_in(replica, op, values, 0), _in(replica, op, values, 1))
        code = getattr(op.builtinOptions, "fusedActivationFunction", 0) or 0
        return _activation(code)(y)
    return build


def _unary(fn: Callable[..., Any]) -> Callable[..., Any]:
    def build(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
        return fn(_in(replica, op, values, 0), op.builtinOptions)
    return build


def _pool(kind: str) -> Callable[..., Any]:
    def build(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
        import tensorflow as tf

        o = op.builtinOptions
        pool = tf.nn.max_pool2d if kind == "max" else tf.nn.avg_pool2d
        y = pool(_in(replica, op, values, 0), ksize=[o.filterHeight, o.filterWidth],
                 strides=[o.strideH, o.strideW], padding=_PADDING[o.padding])
        return _activation(o.fusedActivationFunction)(y)
    return build


def _mean(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
    import tensorflow as tf

    axes = replica.constant(int(op.inputs[1]))
    keep = bool(op.builtinOptions.keepDims) if op.builtinOptions is not None else False
    return tf.reduce_mean(_in(replica, op, values, 0),
                          axis=[int(a) for a in np.atleast_1d(axes)], keepdims=keep)


def _reshape(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
    import tensorflow as tf

    x = _in(replica, op, values, 0)
    index = Replica._input(op, 1)
    if index is not None and index in values:
        return tf.reshape(x, values[index])  # computed from the input's shape: batch-free
    shape = replica.constant(index) if index is not None else None
    if shape is None:
        shape = np.asarray(op.builtinOptions.newShape, dtype=np.int32)
    shape = [int(d) for d in np.atleast_1d(shape)]
    source = replica.graph.tensors[int(op.inputs[0])]
    signature = source.shapeSignature if source.shapeSignature is not None else source.shape
    # a batch fixed at 1 in the constant shape, of an input whose batch is free
    if shape and shape[0] == 1 and signature is not None and len(signature) \
            and int(signature[0]) < 0:
        shape[0] = -1
    return tf.reshape(x, shape)


def _strided_slice(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
    import tensorflow as tf

    o = op.builtinOptions
    begin, end, strides = (_in(replica, op, values, i) for i in (1, 2, 3))
    if getattr(o, "offset", False):
        end = begin + end
    return tf.strided_slice(_in(replica, op, values, 0), begin, end, strides,
                            begin_mask=o.beginMask, end_mask=o.endMask,
                            ellipsis_mask=o.ellipsisMask, new_axis_mask=o.newAxisMask,
                            shrink_axis_mask=o.shrinkAxisMask)


def _concatenation(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
    import tensorflow as tf

    parts = [_in(replica, op, values, i) for i in range(len(op.inputs))]
    y = tf.concat(parts, axis=op.builtinOptions.axis)
    return _activation(op.builtinOptions.fusedActivationFunction)(y)


def _pack(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
    import tensorflow as tf

    parts = [_in(replica, op, values, i) for i in range(len(op.inputs))]
    return tf.stack(parts, axis=op.builtinOptions.axis)


def _with_constant(fn: Callable[[Any, Any, Any], Any]) -> Callable[..., Any]:
    """An op whose second input is a constant (axes, permutation, paddings, alpha...)."""
    def build(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
        return fn(_in(replica, op, values, 0), _in(replica, op, values, 1), op.builtinOptions)
    return build


def _pass(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
    import tensorflow as tf

    return tf.cast(_in(replica, op, values, 0), tf.float32)


def _builders() -> dict[str, Callable[..., Any]]:
    def tf_() -> Any:
        import tensorflow as tf
        return tf

    def squeeze(x: Any, o: Any) -> Any:
        dims = [int(d) for d in o.squeezeDims] if o is not None and o.squeezeDims is not None \
            and len(o.squeezeDims) else None
        return tf_().squeeze(x, axis=dims)

    def prelu(x: Any, alpha: Any, o: Any) -> Any:
        return tf_().maximum(x, 0.0) + alpha * tf_().minimum(x, 0.0)

    def hard_swish(x: Any, o: Any) -> Any:
        return x * tf_().nn.relu6(x + 3.0) / 6.0

    def softmax(x: Any, o: Any) -> Any:
        return tf_().nn.softmax(x * (o.beta if o is not None else 1.0))

    def shape(replica: Replica, op: Any, values: dict[int, Any], quantize: bool) -> Any:
        kind = _NUMPY[replica.graph.tensors[int(op.outputs[0])].type]
        return tf_().shape(_in(replica, op, values, 0), out_type=tf_().as_dtype(kind))

    return {
        "CONV_2D": _conv, "DEPTHWISE_CONV_2D": _depthwise,
        "FULLY_CONNECTED": _fully_connected,
        "ADD": _binary(lambda a, b: a + b), "SUB": _binary(lambda a, b: a - b),
        "MUL": _binary(lambda a, b: a * b),
        "MAXIMUM": _binary(lambda a, b: tf_().maximum(a, b)),
        "MINIMUM": _binary(lambda a, b: tf_().minimum(a, b)),
        "MEAN": _mean, "MAX_POOL_2D": _pool("max"), "AVERAGE_POOL_2D": _pool("average"),
        "RESHAPE": _reshape, "SQUEEZE": _unary(squeeze),
        "EXPAND_DIMS": _with_constant(lambda x, axis, o: tf_().expand_dims(
            x, int(np.asarray(axis).reshape(-1)[0]))),
        "TRANSPOSE": _with_constant(lambda x, perm, o: tf_().transpose(x, perm)),
        "PAD": _with_constant(lambda x, pads, o: tf_().pad(x, pads)),
        "STRIDED_SLICE": _strided_slice, "CONCATENATION": _concatenation, "PACK": _pack,
        "SHAPE": shape,
        "SOFTMAX": _unary(softmax), "LOGISTIC": _unary(lambda x, o: tf_().sigmoid(x)),
        "TANH": _unary(lambda x, o: tf_().tanh(x)),
        "RELU": _unary(lambda x, o: tf_().nn.relu(x)),
        "RELU6": _unary(lambda x, o: tf_().nn.relu6(x)),
        "RELU_N1_TO_1": _unary(lambda x, o: tf_().clip_by_value(x, -1.0, 1.0)),
        "LEAKY_RELU": _unary(lambda x, o: tf_().nn.leaky_relu(x, alpha=o.alpha)),
        "PRELU": _with_constant(prelu), "HARD_SWISH": _unary(hard_swish),
        "QUANTIZE": _pass, "DEQUANTIZE": _pass,
    }


_BUILDERS = _builders()
