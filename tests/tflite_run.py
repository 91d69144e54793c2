"""Running the tests' TFLite models: a model's bytes and inputs in, LiteRT's outputs (its default kernels,
or its own builtin ones) and ONNX Runtime's on the imported model out; the ranges LiteRT sees (a
post-training calibration, `quantized`), and the one-quantization-step comparison of the int8 tests."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from tests.tflite_nets import Net, Ranges
from xtune.firmware.network_bench import random_input
from xtune.frontend.tflite_file import read_tflite


def random_feed(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return random_input(shape, seed)


def feeds(data: bytes, seed: int) -> list[np.ndarray]:
    """A seeded random float input for each input of a (float-input) TFLite model."""
    model = read_tflite(data, "model.tflite")
    return [random_feed(model.tensors[i].shape, seed + 100 * k) for k, i in enumerate(model.inputs)]


def _interpreter(data: bytes, xs: list[np.ndarray], **options: Any) -> Any:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data, num_threads=1, **options)
    interpreter.allocate_tensors()
    for d, x in zip(interpreter.get_input_details(), xs, strict=True):
        interpreter.set_tensor(d["index"], x)
    interpreter.invoke()
    return interpreter


def litert(
    data: bytes, xs: list[np.ndarray], builtin: bool = False, reference: bool = False
) -> list[np.ndarray]:
    """LiteRT's outputs: as it runs by default (XNNPACK where it applies), with `builtin` its own
    kernels only (XNNPACK rejects some int8 operand scales that TFLite's own kernels requantize), with
    `reference` its reference kernels (tensorflow/lite/kernels/internal/reference/)."""
    from ai_edge_litert.interpreter import OpResolverType

    resolver = OpResolverType.AUTO
    if builtin or reference:
        resolver = (
            OpResolverType.BUILTIN_REF if reference else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        )
    interpreter = _interpreter(data, xs, experimental_op_resolver_type=resolver)
    return [np.array(interpreter.get_tensor(d["index"])) for d in interpreter.get_output_details()]


def litert_ranges(data: bytes, xs: list[np.ndarray]) -> Ranges:
    """(min, max) of every float tensor LiteRT computes on `xs`: a post-training calibration."""
    with warnings.catch_warnings():  # LiteRT warns that keeping every tensor is for debugging: it is
        warnings.simplefilter("ignore")
        interpreter = _interpreter(data, xs, experimental_preserve_all_tensors=True)
    ranges = {}
    for d in interpreter.get_tensor_details():
        v = interpreter.get_tensor(d["index"])
        if v.dtype == np.float32 and v.size:
            ranges[d["name"]] = (float(v.min()), float(v.max()))
    return ranges


def ort(model: onnx.ModelProto, xs: list[np.ndarray]) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {i.name: x for i, x in zip(session.get_inputs(), xs, strict=True)}
    return [np.asarray(y) for y in session.run(None, feed)]


def quantized(build: Callable[[Net], list[int]], unsigned: bool = False) -> bytes:
    """The int8 (or uint8) twin of a float net, calibrated on one input (TFLite's post-training
    quantization)."""
    net = Net()
    data = net.tflite(build(net))
    twin = Net(litert_ranges(data, feeds(data, seed=7)), float_input=True, unsigned=unsigned)
    return twin.tflite(build(twin))


def within_one_step(data: bytes, model: onnx.ModelProto, seeds: int) -> None:
    """Every output within one quantization step of LiteRT's on >= 99.9 % of elements, two at most."""
    far, total = 0, 0
    for seed in range(seeds):
        xs = feeds(data, seed)
        for w, g in zip(litert(data, xs, builtin=True), ort(model, xs), strict=True):
            assert g.shape == w.shape
            step = one_step(w)
            diff = np.abs(g.astype(np.float64) - w)
            far += int(np.count_nonzero(diff > step * 1.001))
            total += w.size
            assert np.max(diff) <= 2 * step * 1.001
    assert far <= 0.001 * total, (far, total)


def one_step(reference: np.ndarray) -> float:
    """One quantization step of an output behind DEQUANTIZE: the smallest gap between its values."""
    levels = np.unique(reference)
    return float(np.min(np.diff(levels))) if levels.size > 1 else 1.0
