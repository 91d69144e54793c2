"""Peers: a workload in, the seconds per call of the library a user would run instead, on one thread:
numpy (always) and ONNX Runtime (with the `bench` extra); for whole networks ONNX Runtime, or the TFLite
interpreter (LiteRT) for a TFLite model."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from xtune.errors import InputError, XtuneError
from xtune.ops.activation import onnx_nodes as activation_nodes
from xtune.ops.epilogue import activation
from xtune.ops.registry import family
from xtune.ops.workload import RTOL, Workload, compare_output, random_inputs

if TYPE_CHECKING:
    import onnx

# Names under which OpenBLAS builds export their thread-count setter (numpy's wheels rename it).
_BLAS_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads",
)
_BLAS_GETTERS = (
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
    "openblas_get_num_threads",
)


def _openblas() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        with contextlib.suppress(OSError):
            return ctypes.CDLL(path)
    return None


@contextlib.contextmanager
def single_thread_blas() -> Iterator[None]:
    """Pin numpy's OpenBLAS to one thread for a fair single-core comparison, then restore it."""
    lib = _openblas()
    setter = next((getattr(lib, n) for n in _BLAS_SETTERS if lib is not None and hasattr(lib, n)), None)
    getter = next((getattr(lib, n) for n in _BLAS_GETTERS if lib is not None and hasattr(lib, n)), None)
    if setter is None or getter is None:
        yield  # no OpenBLAS found: numpy's BLAS is already whatever OPENBLAS_NUM_THREADS says
        return
    before = int(getter())
    setter(1)
    try:
        yield
    finally:
        setter(before)


def _seconds_per_call(call: Callable[[], object], repeat: int, min_repeat_s: float) -> list[float]:
    """Seconds per call of `call`, one figure per repeat, after one warm-up call."""

    def per_call(number: int) -> float:
        start = time.perf_counter()
        for _ in range(number):
            call()
        return (time.perf_counter() - start) / number

    call()  # warm up: page in, let the library pick its kernels
    number = 1
    while (first := per_call(number)) * number < min_repeat_s:
        number *= 2  # like the agent: calls per repeat grow until a repeat is long enough
    return [first] + [per_call(number) for _ in range(repeat - 1)]


def numpy_seconds(workload: Workload, repeat: int = 5, min_repeat_s: float = 0.05) -> list[float]:
    """Seconds per call of the numpy reference, one figure per repeat, on one thread."""
    inputs = random_inputs(workload)
    with single_thread_blas():
        return _seconds_per_call(lambda: workload.reference(inputs), repeat, min_repeat_s)


def ort_available() -> bool:
    """Whether the ONNX Runtime peer can run here (the `bench` extra: onnx and onnxruntime)."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime"))


def ort_seconds(workload: Workload, repeat: int = 5, min_repeat_s: float = 0.05) -> list[float]:
    """Seconds per call of ONNX Runtime running the workload's ONNX model (`onnx_model`), one figure per
    repeat, on one thread, after checking its output against the workload's numpy reference."""
    session = ort_session(onnx_model(workload).SerializeToString())
    inputs = random_inputs(workload)
    feed = {_INPUT: inputs[0]}
    got = session.run(None, feed)[0]
    mismatch = compare_output(got, workload.reference(inputs).astype(np.float32), RTOL)
    if mismatch:
        raise XtuneError(f"ONNX Runtime's output for {workload.key} differs from numpy's: {mismatch}")
    return _seconds_per_call(lambda: session.run(None, feed), repeat, min_repeat_s)


def ort_session(model: bytes) -> Any:
    """An ONNX Runtime CPU session of a serialized model on one thread, every graph optimization on."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise InputError(_MISSING) from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Errors only: exporters leave unused initializers (Caffe2's *_SHAPE tensors in the model zoo), and
    # ONNX Runtime's default level writes a warning line per initializer into xtune's report.
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def ort_network(
    model: bytes, x: np.ndarray, repeat: int = 0, min_repeat_s: float = 0.05, where: str = "the model"
) -> tuple[np.ndarray, list[float]]:
    """ONNX Runtime's output of a one-input network on `x`, and (with `repeat`) its seconds per
    inference, one figure per repeat, on one thread. A model ONNX Runtime refuses or fails on is an
    InputError naming `where` (its file) with the first line of ONNX Runtime's reason."""
    try:
        session = ort_session(model)
        feed = {session.get_inputs()[0].name: x}
        out = np.asarray(session.run(None, feed)[0], dtype=np.float32)
    except (InputError, MemoryError):
        raise
    except Exception as err:  # onnxruntime's Fail, InvalidGraph, RuntimeException...: Exception subclasses
        first = " ".join(str(err).split())[:300] or type(err).__name__
        raise InputError(f"{where}: ONNX Runtime refuses the model ({type(err).__name__}: {first})") from None
    seconds = _seconds_per_call(lambda: session.run(None, feed), repeat, min_repeat_s) if repeat else []
    return out, seconds


def litert_available() -> bool:
    """Whether the TFLite peer can run here (the `bench` extra: ai-edge-litert)."""
    return importlib.util.find_spec("ai_edge_litert") is not None


def litert_network(
    model: bytes, x: np.ndarray, repeat: int = 0, min_repeat_s: float = 0.05
) -> tuple[np.ndarray, list[float]]:
    """The TFLite interpreter's (LiteRT's) output of a one-input TFLite network on `x` (of the input's
    type: int8 for a fully quantized model), and (with `repeat`) its seconds per inference, one figure per
    repeat, on one thread, with the kernels LiteRT picks by default (XNNPACK where it applies)."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise InputError(_MISSING_LITERT) from None
    interpreter = Interpreter(model_content=model, num_threads=1)
    interpreter.allocate_tensors()
    (source,), sink = interpreter.get_input_details(), interpreter.get_output_details()[0]
    if x.dtype != source["dtype"]:
        raise InputError(f"the TFLite model's input is {np.dtype(source['dtype'])}, not {x.dtype}")

    def call() -> None:
        interpreter.set_tensor(source["index"], x)
        interpreter.invoke()

    call()
    out = np.array(interpreter.get_tensor(sink["index"]))
    seconds = _seconds_per_call(call, repeat, min_repeat_s) if repeat else []
    return out, seconds


def ort_gflops(workload: Workload) -> float | None:
    """ONNX Runtime's single-thread GFLOP/s on this host (median of `ort_seconds`), None without it, for
    an operator no ONNX node maps to, or for an integer one (qmatmul, qconv2d, qdepthwise: the float
    model `onnx_model` writes is not theirs; benchmarks/bench_int8.py runs their QLinear peers)."""
    quantized = any(t.dtype != "float32" for t in workload.tensors())
    if not ort_available() or not family(workload.op).onnx_ops or quantized:
        return None
    return workload.flops() / statistics.median(ort_seconds(workload)) / 1e9


_MISSING = "the ONNX Runtime peer needs onnx and onnxruntime: pip install 'xtune[bench]'"
_MISSING_LITERT = "the TFLite peer needs ai-edge-litert: pip install 'xtune[bench]'"
_INPUT, _OUTPUT = "x", "y"
_OPSET = 17  # Conv, MatMul, Add, Relu, Transpose are unchanged since opset 13 or earlier
_IR_VERSION = 8  # the IR version of opset 17 (onnx/docs/Versioning.md), for older runtimes too


def onnx_model(workload: Workload) -> onnx.ModelProto:
    """The workload as an ONNX model: its first tensor is the graph input, the other inputs (weights,
    bias) are initializers, as in a deployed model, from `random_inputs` like numpy's.

    The operator's own nodes are its family's (`onnx_nodes`: MatMul, Conv, ...); then (+ Add residual)
    (+ Relu, or Clip(0, 6) for relu6) (+ the fused activation's nodes)."""
    try:
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        raise InputError(_MISSING) from None
    tensors = workload.tensors()
    x, *params = [t for t in tensors if not t.is_output]
    out = next(t for t in tensors if t.is_output)
    inits = {t.name: a for t, a in zip(params, random_inputs(workload)[1:], strict=True)}
    nodes: list[onnx.NodeProto] = []
    # The fused epilogue after the op itself: + residual, then Relu or Clip(0, 6) (ReLU6).
    act = activation(workload)
    tail = ["residual"] * bool(workload["residual"]) + ["relu"] * bool(workload["relu"] or workload["relu6"])
    tail += ["act"] * (act is not None)
    names = [f"pre_{step}" for step in tail] + [_OUTPUT]
    last = names[0]
    nodes += family(workload.op).onnx_nodes(workload, _INPUT, last, inits)
    for step, (before, after) in zip(tail, itertools.pairwise(names), strict=True):
        if step == "residual":
            nodes.append(helper.make_node("Add", [before, "residual"], [after]))
        elif step == "act":
            assert act is not None
            nodes += activation_nodes(act, before, after)
        elif workload["relu6"]:
            inits["relu6_lo"], inits["relu6_hi"] = np.array(0, np.float32), np.array(6, np.float32)
            nodes.append(helper.make_node("Clip", [before, "relu6_lo", "relu6_hi"], [after]))
        else:
            nodes.append(helper.make_node("Relu", [before], [after]))
    graph = helper.make_graph(
        nodes,
        workload.symbol,
        [helper.make_tensor_value_info(_INPUT, TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info(_OUTPUT, TensorProto.FLOAT, list(out.shape))],
        [numpy_helper.from_array(np.array(a, order="C"), name) for name, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="xtune")
    model.ir_version = _IR_VERSION
    return model
