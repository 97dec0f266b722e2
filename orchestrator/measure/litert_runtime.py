"""Run a `.tflite` model with LiteRT's interpreter, behind GraphRunner's interface.

benchmark, evaluate and the guard take a runner from `tf_runtime.open_runner` and never ask
which kind it is. Inputs and outputs are matched to the artifact's by name: through the
file's signature (convert_tflite writes one naming the graph's tensors), else by the
tensors' own names, and only when neither tells (names stripped) by position: the converter
does not keep a graph's output order. A model with int8 edges
(`convert_tflite io: int8`) is fed float data quantized with its input's scale and zero
point, and its outputs are dequantized: callers always see float, as with a graph.

Kernel sets: the same file can give other answers under other kernels (int16 activations
run on reference kernels on a CPU; XNNPACK rounds otherwise than LiteRT's builtin int8
kernels). `KERNEL_SETS` names the ones a target may run: "default" (LiteRT's default, the
XNNPACK delegate where it takes the ops, builtin kernels elsewhere), "builtin" (the builtin
kernels alone, no default delegate) and "reference" (the reference kernels, slow).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.model.litert_model import in_order, interpreter, signature_map

if TYPE_CHECKING:
    from orchestrator.model.artifact import ModelArtifact

# kernel set -> the name of LiteRT's OpResolverType that selects it (None: the default)
KERNEL_SETS: dict[str, str | None] = {
    "default": None,
    "builtin": "BUILTIN_WITHOUT_DEFAULT_DELEGATES",
    "reference": "BUILTIN_REF",
}


def resolver_kwargs(kernels: str) -> dict[str, Any]:
    """The Interpreter keyword arguments that select the kernel set `kernels`."""
    if kernels not in KERNEL_SETS:
        raise ValueError(f"unknown kernel set {kernels!r}; known: {', '.join(KERNEL_SETS)}")
    name = KERNEL_SETS[kernels]
    if name is None:
        return {}
    from ai_edge_litert.interpreter import OpResolverType

    return {"experimental_op_resolver_type": getattr(OpResolverType, name)}


class LiteRTRunner:
    """One interpreter, tensors allocated once (again when a batch size changes)."""

    def __init__(self, artifact: ModelArtifact, num_threads: int | None = None,
                 kernels: str = "default") -> None:
        assert artifact.payload is not None
        self.interpreter = interpreter(artifact.payload, num_threads=num_threads,
                                       **resolver_kwargs(kernels))
        self.num_threads = num_threads
        self.kernels = kernels
        self.inputs = in_order(self.interpreter.get_input_details(), artifact.input_names,
                               signature_map(self.interpreter, "inputs"))
        self.outputs = in_order(self.interpreter.get_output_details(), list(artifact.outputs),
                                signature_map(self.interpreter, "outputs"))

    def __enter__(self) -> LiteRTRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.interpreter = None

    def input_specs(self) -> list[tuple[list[int | None] | None, np.dtype]]:
        """(shape, dtype) per input as the app sees it: float for int8 edges, which the
        runner quantizes itself."""
        specs = []
        for detail in self.inputs:
            signature = detail.get("shape_signature")
            dims = signature if signature is not None and len(signature) else detail["shape"]
            dtype = np.dtype(np.float32) if _quantized(detail) else np.dtype(detail["dtype"])
            specs.append(([None if int(d) < 0 else int(d) for d in dims], dtype))
        return specs

    def fixed_batch_size(self) -> int | None:
        shape, _ = self.input_specs()[0]
        return shape[0] if shape else None

    def run(self, *inputs: np.ndarray, fetches: Sequence[Any] | None = None,
            options: Any = None, run_metadata: Any = None) -> list[np.ndarray]:
        """One invoke; the outputs in the artifact's order, float."""
        if fetches is not None or options is not None or run_metadata is not None:
            raise TypeError("a LiteRT model has no graph tensors to fetch or trace")
        self.set_inputs(*inputs)
        self.interpreter.invoke()
        return self.outputs_now()

    def set_inputs(self, *inputs: np.ndarray) -> None:
        """Feed one batch (resizing the interpreter's inputs to its shape when needed)."""
        resized = False
        for detail, value in zip(self.inputs, inputs, strict=True):
            if tuple(detail["shape"]) != tuple(value.shape):
                self.interpreter.resize_tensor_input(detail["index"], list(value.shape))
                resized = True
        if resized:
            self.interpreter.allocate_tensors()
            self.inputs = _refreshed(self.interpreter.get_input_details(), self.inputs)
            self.outputs = _refreshed(self.interpreter.get_output_details(), self.outputs)
        for detail, value in zip(self.inputs, inputs, strict=True):
            self.interpreter.set_tensor(detail["index"], _to_edge(value, detail))

    def invoke(self) -> None:
        """The timed part of a run: the inputs already set."""
        self.interpreter.invoke()

    def outputs_now(self) -> list[np.ndarray]:
        return [_from_edge(self.interpreter.get_tensor(d["index"]), d) for d in self.outputs]

    def node_timings(self, feeds: Sequence[np.ndarray], runs: int) -> None:
        """LiteRT's Python interpreter exposes no per-op profiler (the C++ benchmark tool
        has one): no per-node profile."""
        return None

    def batches(self, inputs: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
        fixed = self.fixed_batch_size()
        size = fixed or batch_size
        for start in range(0, len(inputs), size):
            batch = inputs[start:start + size]
            if fixed and len(batch) < fixed:
                batch = np.concatenate([batch, np.repeat(batch[-1:], fixed - len(batch),
                                                         axis=0)], axis=0)
            yield batch

    def predict_all(self, inputs: np.ndarray, batch_size: int = 64,
                    first_only: bool = False) -> list[np.ndarray]:
        per_batch = [self.run(batch) for batch in self.batches(inputs, batch_size)]
        count = 1 if first_only else len(self.outputs)
        return [np.concatenate([outs[i] for outs in per_batch], axis=0)[:len(inputs)]
                for i in range(count)]

    def predict(self, inputs: np.ndarray, batch_size: int = 64) -> np.ndarray:
        return self.predict_all(inputs, batch_size, first_only=True)[0]


NO_PROFILE_NOTE = ("LiteRT's Python interpreter has no per-op profiler; run LiteRT's C++ "
                   "benchmark_model with --enable_op_profiling for one")


def _refreshed(details: list[dict[str, Any]], old: list[dict[str, Any]]
               ) -> list[dict[str, Any]]:
    by_index = {d["index"]: d for d in details}
    return [by_index[d["index"]] for d in old]


def _quantized(detail: dict[str, Any]) -> bool:
    scale, _ = detail.get("quantization", (0.0, 0))
    return np.dtype(detail["dtype"]) in (np.int8, np.uint8, np.int16) and scale > 0


def _to_edge(value: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    if _quantized(detail) and not np.issubdtype(value.dtype, np.integer):
        scale, zero_point = detail["quantization"]
        info = np.iinfo(dtype)
        value = np.clip(np.round(value / scale + zero_point), info.min, info.max)
    return np.ascontiguousarray(value, dtype=dtype)


def _from_edge(value: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    if _quantized(detail):
        scale, zero_point = detail["quantization"]
        return (value.astype(np.float32) - zero_point) * np.float32(scale)
    return np.array(value, copy=True)
