"""Learned rounding (AdaRound) with bias correction for a LiteRT Quantizer int8 file.

Rounding each weight to its nearest int8 level is the best choice weight by weight, not
layer by layer: the rounding errors of a channel's weights add up in its output. AdaRound
(Nagel et al., 2020) picks, per weight, the level below or above (never further) that makes
the layer's output closest to the float layer's on representative data. Here, for every
CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED of the quantized file, in order:

- its input as the quantized model computes it (every earlier layer already re-rounded:
  the int8 tensor dequantized), so a layer also corrects the error piled up before it
  (AdaRound's asymmetric reconstruction); its target is the float layer's output after
  its fused activation, computed with the float weights on the float model's own input
  of that layer (the ops match by their first output's name: the quantizer keeps them);
- W_q = s * clip(floor(W / s) + h(V), -127, 127), h the rectified sigmoid, optimised with
  Adam against the output's squared error plus AdaRound's regulariser, which pushes h to
  0 or 1 as its exponent is annealed from 20 to 2; the file's own scales (per channel or
  per tensor, symmetric) stay;
- then bias correction: the int32 bias moves by the mean pre-activation error per output
  channel, in the bias's own scale (s_in * s_w), where that lowers the channel's error.

Convolutions run as a product of patches (what each output position reads, with the op's
strides, padding and dilation) at a sample of output positions, so a big activation costs a few
thousand rows. A layer keeps its file weights when re-rounding does not lower its error on
those rows, and one this cannot reproduce (another activation, int16 inputs, a weight that
is not a constant int8) is left as is and reported as skipped, with why. Only weight and
bias buffers change. Deterministic: seeded sampling, one seeded optimiser per layer.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.model.litert_model import interpreter, read_model

LAYER_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
FLOAT32, INT32, INT8 = 0, 2, 9  # schema TensorType
ACTIVATIONS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6"}  # fused, that we model
ZETA, GAMMA = 1.1, -0.1  # the rectified sigmoid's stretch (AdaRound)
MAX_ROWS = 4096  # output positions per layer the rounding is fitted on
MAX_SAMPLES = 256  # representative rows run through both models
BATCH_ROWS = 512  # rows per optimiser step
WARMUP = 0.2  # share of iterations before the regulariser starts
BETA = (20.0, 2.0)
LEARNING_RATE = 1e-2
REGULARISER = 1.0  # times nearest rounding's error
SEED = 0


@dataclass
class _Layer:
    """One weighted op of the quantized file and its twin in the float model."""

    name: str
    op: str
    q_input: int  # tensor index in the quantized file
    f_input: int  # tensor index in the float file
    f_output: int
    weight: int  # quantized file's weight tensor
    bias: int | None  # quantized file's int32 bias tensor
    float_weight: np.ndarray  # in the quantized file's layout
    float_bias: np.ndarray
    options: Any


def learn_rounding(float_model: bytes, quantized: bytes, batches: list[np.ndarray], *,
                   iterations: int = 300, log: Any, seed: int = SEED,
                   correct_bias: bool = True) -> tuple[bytes, dict[str, Any]]:
    """`quantized` (the LiteRT Quantizer's static int8 file of `float_model`, unshrunk) with
    its int8 weights re-rounded to match each float layer's output on `batches`, and its
    int32 biases corrected (unless not `correct_bias`); and a report: per layer its output
    error before and after (relative to the float output's power), the layers skipped and
    why, and seconds.
    ValueError when `quantized` is not a static int8 file."""
    from ai_edge_litert.tools import flatbuffer_utils

    started = time.perf_counter()
    q_model, f_model = read_model(quantized), read_model(float_model)
    layers, skipped = _layers(q_model, f_model)
    if not layers and not any(s["why"].startswith("input is int16") for s in skipped):
        raise ValueError("learned rounding needs a static int8 file (int8 weights and int8 "
                         "activations, as quantize_tflite's static_wi8_ai8 makes): this one "
                         "has no CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED with int8 "
                         "inputs and int8 weights (dynamic range or weight-only?)")
    rows = _sample_rows(batches, MAX_SAMPLES)
    rng = np.random.default_rng(seed)
    f_tensors = _run(float_model, rows, {i for layer in layers
                                         for i in (layer.f_input, layer.f_output)})
    report_layers: list[dict[str, Any]] = []
    for number, layer in enumerate(layers):
        current = bytes(flatbuffer_utils.convert_object_to_bytearray(q_model)) \
            if number else quantized
        q_input = _run(current, rows, {layer.q_input})[layer.q_input]
        try:
            row = _relearn(q_model, layer, q_input, f_tensors[layer.f_input],
                           f_tensors[layer.f_output], iterations, rng, seed + number,
                           correct_bias)
        except _Unfit as exc:
            skipped.append({"layer": layer.name, "op": layer.op, "why": str(exc)})
            continue
        log.debug("learned rounding: %s %s error %.3g -> %.3g", layer.op, layer.name,
                  row["nmse_before"], row["nmse_after"])
        report_layers.append(row)
    out = bytes(flatbuffer_utils.convert_object_to_bytearray(q_model))
    return out, {"layers": report_layers, "skipped": skipped, "iterations": iterations,
                 "samples": len(rows), "seconds": round(time.perf_counter() - started, 3)}


class _Unfit(Exception):
    """A layer this cannot reproduce: left as the file has it."""


def _name(tensor: Any) -> str:
    from orchestrator.model.litert_model import tensor_name

    return tensor_name(tensor)


def _layers(q_model: Any, f_model: Any) -> tuple[list[_Layer], list[dict[str, Any]]]:
    """The quantized file's weighted ops in order, each with its float twin's weights; and
    those skipped, with why."""
    from ai_edge_litert.tools import flatbuffer_utils

    q_graph, f_graph = q_model.subgraphs[0], f_model.subgraphs[0]
    f_ops = {}
    for op in f_graph.operators:
        if op.outputs is not None and len(op.outputs):
            f_ops[_name(f_graph.tensors[op.outputs[0]])] = op
    layers, skipped = [], []
    uses: dict[int, int] = {}
    for tensor in q_graph.tensors:
        uses[tensor.buffer] = uses.get(tensor.buffer, 0) + 1
    for op in q_graph.operators:
        kind = flatbuffer_utils.opcode_to_name(q_model, op.opcodeIndex)
        if kind not in LAYER_OPS or op.outputs is None or not len(op.outputs):
            continue
        name = _name(q_graph.tensors[op.outputs[0]])
        try:
            layers.append(_layer(q_model, f_model, op, kind, name, f_ops.get(name), uses))
        except _Unfit as exc:
            skipped.append({"layer": name, "op": kind, "why": str(exc)})
    return layers, skipped


def _layer(q_model: Any, f_model: Any, op: Any, kind: str, name: str, f_op: Any,
           uses: dict[int, int]) -> _Layer:
    q_graph, f_graph = q_model.subgraphs[0], f_model.subgraphs[0]
    inputs = [int(i) for i in op.inputs]
    q_in, weight = q_graph.tensors[inputs[0]], q_graph.tensors[inputs[1]]
    if weight.type != INT8 or _data(q_model, weight) is None:
        raise _Unfit("its weight is not a constant int8 tensor")
    if q_in.type != INT8:
        raise _Unfit("input is int16 (a16w8)" if q_in.type == 7 else "input is not int8")
    if uses[weight.buffer] > 1:
        raise _Unfit("its weight buffer is shared with another tensor")
    bias = inputs[2] if len(inputs) > 2 and inputs[2] >= 0 else None
    if bias is not None and (q_graph.tensors[bias].type != INT32
                             or _data(q_model, q_graph.tensors[bias]) is None
                             or uses[q_graph.tensors[bias].buffer] > 1):
        raise _Unfit("its bias is not an unshared constant int32 tensor")
    activation = getattr(op.builtinOptions, "fusedActivationFunction", 0)
    if activation not in ACTIVATIONS:
        raise _Unfit(f"its fused activation ({activation}) is not one this models")
    if kind == "FULLY_CONNECTED" and getattr(op.builtinOptions, "weightsFormat", 0):
        raise _Unfit("its weights are in a shuffled format")
    if f_op is None:
        raise _Unfit("the float model has no op of that output name")
    f_inputs = [int(i) for i in f_op.inputs]
    f_weight = _data(f_model, f_graph.tensors[f_inputs[1]])
    if f_weight is None or f_graph.tensors[f_inputs[1]].type != FLOAT32:
        raise _Unfit("the float model's weight is not a constant float32 tensor")
    shape = tuple(int(d) for d in weight.shape)
    f_weight = f_weight.view(np.float32)
    if f_weight.size != math.prod(shape):
        raise _Unfit("the float and int8 weights differ in shape")
    f_bias = np.zeros(shape[-1] if kind == "DEPTHWISE_CONV_2D" else shape[0], np.float32)
    if len(f_inputs) > 2 and f_inputs[2] >= 0:
        raw = _data(f_model, f_graph.tensors[f_inputs[2]])
        if raw is None:
            raise _Unfit("the float model's bias is not a constant")
        f_bias = raw.view(np.float32).copy()
    return _Layer(name, kind, inputs[0], f_inputs[0], int(f_op.outputs[0]), inputs[1], bias,
                  f_weight.reshape(shape).copy(), f_bias, op.builtinOptions)


def _data(model: Any, tensor: Any) -> np.ndarray | None:
    data = model.buffers[tensor.buffer].data
    return None if data is None or not len(data) else np.asarray(data, dtype=np.uint8)


def _sample_rows(batches: Sequence[np.ndarray], limit: int) -> np.ndarray:
    rows = np.concatenate([np.asarray(b, dtype=np.float32) for b in batches], axis=0)
    if len(rows) > limit:  # evenly spread: the data's order may follow its classes
        rows = rows[np.linspace(0, len(rows) - 1, limit).round().astype(int)]
    return rows


def _run(model: bytes, rows: np.ndarray, wanted: set[int], batch: int = 64
         ) -> dict[int, np.ndarray]:
    """The tensors `wanted` (by index) of `model` run on `rows`, int8 ones dequantized."""
    with warnings.catch_warnings():  # "... intended for debugging purposes only"
        warnings.simplefilter("ignore")
        runner = interpreter(model, allocate=False, experimental_preserve_all_tensors=True)
    detail = runner.get_input_details()[0]
    signature = detail.get("shape_signature")
    fixed = int(detail["shape"][0]) if signature is None or not len(signature) \
        or int(signature[0]) > 0 else None
    size = fixed or batch
    runner.allocate_tensors()
    got: dict[int, list[np.ndarray]] = {i: [] for i in wanted}
    quantization = {d["index"]: d["quantization"] for d in runner.get_tensor_details()
                    if d["index"] in wanted}
    for start in range(0, len(rows), size):
        part = rows[start:start + size]
        count = len(part)
        if fixed and count < fixed:
            part = np.concatenate([part, np.repeat(part[-1:], fixed - count, axis=0)])
        if tuple(runner.get_input_details()[0]["shape"]) != part.shape:
            runner.resize_tensor_input(detail["index"], list(part.shape))
            runner.allocate_tensors()
        scale, zero = detail["quantization"]
        if np.dtype(detail["dtype"]) != np.float32 and scale:
            part = np.clip(np.round(part / scale + zero), -128, 127)
        runner.set_tensor(detail["index"], part.astype(detail["dtype"]))
        runner.invoke()
        for index in wanted:
            value = runner.get_tensor(index)[:count]
            scale, zero = quantization[index] if value.dtype != np.float32 else (0.0, 0)
            got[index].append((value.astype(np.float32) - zero) * scale if scale
                              else value.astype(np.float32))
    return {i: np.concatenate(v, axis=0) for i, v in got.items()}


def _positions(x: np.ndarray, layer: _Layer, kernel: tuple[int, int],
               rng: np.random.Generator) -> tuple[Any, ...]:
    """A sample of the op's output positions: row indices (FULLY_CONNECTED) or (sample,
    y, x) of a convolution's output, at most MAX_ROWS of them."""
    if layer.op == "FULLY_CONNECTED":
        count = x.size // layer.float_weight.shape[1]
        return (np.sort(rng.choice(count, min(MAX_ROWS, count), replace=False)),)
    if x.ndim != 4:
        raise _Unfit(f"its input has rank {x.ndim}, not 4")
    o = layer.options
    sizes = [_out_size(x.shape[1], kernel[0], o.strideH, o.dilationHFactor, o.padding),
             _out_size(x.shape[2], kernel[1], o.strideW, o.dilationWFactor, o.padding)]
    count = x.shape[0] * sizes[0] * sizes[1]
    flat = np.sort(rng.choice(count, min(MAX_ROWS, count), replace=False))
    return np.unravel_index(flat, (x.shape[0], *sizes))


def _out_size(size: int, kernel: int, stride: int, dilation: int, padding: int) -> int:
    reach = (kernel - 1) * dilation + 1
    return -(-size // stride) if padding == 0 else -(-(size - reach + 1) // stride)


def _patches(x: np.ndarray, layer: _Layer, kernel: tuple[int, int], where: tuple[Any, ...]
             ) -> np.ndarray:
    """What each sampled output position reads, as rows [positions, kh * kw * C] (the
    order of the file's weights), with the op's strides, dilation and zero padding."""
    if layer.op == "FULLY_CONNECTED":
        return x.reshape(-1, layer.float_weight.shape[1])[where[0]]
    o = layer.options
    n, oy, ox = where
    pads = []
    for axis, k, stride, dilation in ((1, kernel[0], o.strideH, o.dilationHFactor),
                                      (2, kernel[1], o.strideW, o.dilationWFactor)):
        out = _out_size(x.shape[axis], k, stride, dilation, o.padding)
        total = max((out - 1) * stride + (k - 1) * dilation + 1 - x.shape[axis], 0) \
            if o.padding == 0 else 0
        pads.append((total // 2, total - total // 2))
    padded = np.pad(x, [(0, 0), *pads, (0, 0)])
    ky = oy[:, None] * o.strideH + np.arange(kernel[0])[None] * o.dilationHFactor
    kx = ox[:, None] * o.strideW + np.arange(kernel[1])[None] * o.dilationWFactor
    rows = padded[n[:, None, None], ky[:, :, None], kx[:, None, :]]  # [P, kh, kw, C]
    return rows.reshape(len(n), -1)


class _Linear:
    """The op as a product: rows [P, K] with weights in the file's layout -> [P, C]."""

    def __init__(self, layer: _Layer) -> None:
        shape = layer.float_weight.shape
        self.op, self.shape = layer.op, shape
        if layer.op == "DEPTHWISE_CONV_2D":  # [1, kh, kw, Cin*m]
            self.kernel = (shape[1], shape[2])
            self.channels_in = int(shape[3] // max(layer.options.depthMultiplier, 1))
        elif layer.op == "CONV_2D":  # [Cout, kh, kw, Cin]
            self.kernel = (shape[1], shape[2])
        else:  # [Cout, Cin]
            self.kernel = (1, 1)
        self.channel_axis = 3 if layer.op == "DEPTHWISE_CONV_2D" else 0

    def __call__(self, rows: Any, weight: Any) -> Any:
        import tensorflow as tf

        if self.op == "DEPTHWISE_CONV_2D":
            k = self.kernel[0] * self.kernel[1]
            mult = self.shape[3] // self.channels_in
            x = tf.reshape(rows, [-1, k, self.channels_in])
            w = tf.reshape(weight, [k, self.channels_in, mult])
            return tf.reshape(tf.einsum("pkc,kcm->pcm", x, w), [-1, self.shape[3]])
        return tf.matmul(rows, tf.reshape(weight, [self.shape[0], -1]), transpose_b=True)


def _activate(y: Any, activation: int) -> Any:
    import tensorflow as tf

    low, high = {0: (None, None), 1: (0.0, None), 2: (-1.0, 1.0), 3: (0.0, 6.0)}[activation]
    y = tf.convert_to_tensor(y)
    if low is not None:
        y = tf.maximum(y, low)
    if high is not None:
        y = tf.minimum(y, high)
    return y


def _relearn(q_model: Any, layer: _Layer, q_input: np.ndarray, f_input: np.ndarray,
             f_output: np.ndarray, iterations: int, rng: np.random.Generator, seed: int,
             correct_bias: bool) -> dict[str, Any]:
    """Re-round one layer's weights and correct its bias in `q_model`; its report row."""
    graph = q_model.subgraphs[0]
    linear = _Linear(layer)
    if q_input.shape != f_input.shape:
        raise _Unfit("its float and int8 inputs differ in shape")
    where = _positions(q_input, layer, linear.kernel, rng)
    q_rows = _patches(q_input, layer, linear.kernel, where)
    f_rows = _patches(f_input, layer, linear.kernel, where)

    weight_tensor = graph.tensors[layer.weight]
    quantization = weight_tensor.quantization
    scale = np.asarray(quantization.scale, np.float32)
    if quantization.zeroPoint is not None and np.any(np.asarray(quantization.zeroPoint)):
        raise _Unfit("its weights are not symmetric (zero point not 0)")
    axis = int(quantization.quantizedDimension or 0) if len(scale) > 1 else linear.channel_axis
    if len(scale) > 1 and axis != linear.channel_axis:
        raise _Unfit(f"its weight scales run along axis {axis}")
    shape = layer.float_weight.shape
    broadcast = [1] * len(shape)
    broadcast[linear.channel_axis] = -1
    step = scale.reshape(broadcast) if len(scale) > 1 else scale.reshape([1] * len(shape))
    q_file = _data(q_model, weight_tensor).view(np.int8).reshape(shape).astype(np.float32)

    activation = int(getattr(layer.options, "fusedActivationFunction", 0))
    channels = shape[linear.channel_axis]
    if layer.bias is not None:
        bias_tensor = graph.tensors[layer.bias]
        bias_int = _data(q_model, bias_tensor).view(np.int32).astype(np.int64)
        bias_scale = np.broadcast_to(np.asarray(bias_tensor.quantization.scale, np.float64),
                                     bias_int.shape)
        bias_q = (bias_int * bias_scale).astype(np.float32)
    else:
        bias_int, bias_scale, bias_q = None, None, np.zeros(channels, np.float32)

    f_pre = linear(f_rows, layer.float_weight).numpy() + layer.float_bias
    target = _activate(f_pre, activation).numpy()
    given = f_output.reshape(-1, target.shape[1])[where[0]] if layer.op == "FULLY_CONNECTED" \
        else f_output[where]
    if given.shape != target.shape or not np.allclose(given, target, rtol=1e-3,
                                                        atol=1e-3 * np.abs(given).max()):
        raise _Unfit("its float output could not be reproduced from its input and weights")
    power = float(np.mean(target ** 2)) or 1.0

    def outputs(weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pre = linear(q_rows, weight.astype(np.float32)).numpy() + bias
        return pre, _activate(pre, activation).numpy()

    _, before_out = outputs(q_file * step, bias_q)
    before = float(np.mean((before_out - target) ** 2)) / power
    chosen = _fit(linear, q_rows, target, layer.float_weight, step, bias_q, activation,
                  iterations, seed, power, before)
    rounded_out = outputs(chosen * step, bias_q)[1]
    learned = float(np.mean((rounded_out - target) ** 2)) / power
    kept = learned >= before
    weights = q_file if kept else chosen
    pre, out = outputs(weights * step, bias_q)

    corrected = 0
    new_bias_int = bias_int
    if bias_int is not None and correct_bias:
        shift = np.mean(f_pre - pre, axis=0)
        steps = np.round(shift / bias_scale).astype(np.int64)
        trial_int = np.clip(bias_int + steps, -(2 ** 31) + 1, 2 ** 31 - 1)
        _, trial_out = outputs(weights * step, (trial_int * bias_scale).astype(np.float32))
        better = np.mean((trial_out - target) ** 2, axis=0) \
            < np.mean((out - target) ** 2, axis=0)
        new_bias_int = np.where(better, trial_int, bias_int)
        corrected = int(np.sum(better & (steps != 0)))
        _, out = outputs(weights * step, (new_bias_int * bias_scale).astype(np.float32))
    after = float(np.mean((out - target) ** 2)) / power

    if not kept:
        q_model.buffers[weight_tensor.buffer].data = \
            np.frombuffer(weights.astype(np.int8).tobytes(), np.uint8).copy()
    if corrected:
        q_model.buffers[graph.tensors[layer.bias].buffer].data = \
            np.frombuffer(new_bias_int.astype(np.int32).tobytes(), np.uint8).copy()
    changed = int(np.sum(weights != q_file))
    return {"layer": layer.name, "op": layer.op, "rows": len(q_rows),
            "nmse_before": float(f"{before:.6g}"), "nmse_after": float(f"{after:.6g}"),
            "rounding_kept": kept, "weights_changed": changed,
            "bias_channels_corrected": corrected}


def _fit(linear: _Linear, rows: np.ndarray, target: np.ndarray, weight: np.ndarray,
         step: np.ndarray, bias: np.ndarray, activation: int, iterations: int, seed: int,
         power: float, nearest_error: float) -> np.ndarray:
    """AdaRound: the int8 levels (floor or floor + 1 of W / s, clipped) that fit `target`."""
    import tensorflow as tf

    floor = np.floor(weight / step).astype(np.float32)
    rest = np.clip(weight / step - floor, 1e-4, 1 - 1e-4)
    # h(V) = rest at the start: the fit starts from the float weights themselves
    v = tf.Variable(-np.log((ZETA - GAMMA) / (rest - GAMMA) - 1).astype(np.float32))
    moment = tf.Variable(tf.zeros_like(v))
    second = tf.Variable(tf.zeros_like(v))
    floor_t, step_t = tf.constant(floor), tf.constant(step.astype(np.float32))
    rows_t, target_t = tf.constant(rows), tf.constant(target)
    bias_t = tf.constant(bias.astype(np.float32))
    generator = tf.random.Generator.from_seed(seed)
    batch = min(BATCH_ROWS, len(rows))
    # an undecided layer's regulariser weighs as much as nearest rounding's output error:
    # the same units whatever the layer's error
    lam = tf.constant(max(nearest_error, 1e-8) * REGULARISER, tf.float32)

    def soft(v: Any) -> Any:
        return tf.clip_by_value(tf.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)

    start = int(WARMUP * iterations)

    @tf.function  # the whole loop in one graph: a step costs its arithmetic only
    def train() -> None:
        for i in tf.range(iterations):
            t = tf.cast(i, tf.float32)
            done = tf.maximum(t - start, 0.0) / max(iterations - start, 1)
            beta = BETA[0] + (BETA[1] - BETA[0]) * done  # AdaRound's linear decay
            regularise = tf.cast(i >= start, tf.float32)
            index = generator.uniform([batch], 0, len(rows), dtype=tf.int64)
            with tf.GradientTape() as tape:
                levels = tf.clip_by_value(floor_t + soft(v), -127.0, 127.0)
                pre = linear(tf.gather(rows_t, index), levels * step_t) + bias_t
                error = tf.reduce_mean((_activate(pre, activation)
                                        - tf.gather(target_t, index)) ** 2) / power
                undecided = tf.reduce_mean(1.0 - tf.abs(2.0 * soft(v) - 1.0) ** beta)
                loss = error + regularise * lam * undecided
            grad = tape.gradient(loss, v)
            moment.assign(0.9 * moment + 0.1 * grad)  # Adam
            second.assign(0.999 * second + 0.001 * grad * grad)
            v.assign_sub(LEARNING_RATE * (moment / (1 - 0.9 ** (t + 1)))
                         / (tf.sqrt(second / (1 - 0.999 ** (t + 1))) + 1e-8))

    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")  # one new graph per layer is the design, not a retracing fault
    try:
        train()
    finally:
        logger.setLevel(level)
    return np.clip(floor + (v.numpy() >= 0), -127, 127)
