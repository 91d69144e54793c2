"""The fused epilogue every tunable operator takes (bias, residual, ReLU/ReLU6 or an activation) and the
prepacked switch: their workload keys, their extra tensors, their numpy side, the checks of a family's
integer and switch keys, and which graph IR node after a kernel call becomes which switch (the residual
Add: `residual_operand`; the activation: `activation_switches`, `silu_switches`; after an int8 kernel, a
DequantizeLinear: `dequantize_output`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.activation import MICRO, Activation, ActivationKind, epilogue_form, silu_mul
from xtune.ops.quantize import node_qparams
from xtune.ops.workload import ParamValue, TensorSpec, Workload

# The fused epilogue switches every operator takes, in the order they apply: out = conv/matmul
# (+ bias[channel]) (+ residual[same index as out]), then max(., 0) (relu) or min(max(., 0), 6) (relu6,
# the Clip(0, 6) of MobileNetV2). residual is a whole extra input tensor shaped like the output (ResNet's
# skip connection). All default to 0 and are left out of the text then, so older logs stay valid.
EPILOGUE = {"bias": 0, "residual": 0, "relu": 0, "relu6": 0}
# An activation after them (xtune/ops/activation.py: sigmoid, hardswish, silu, ...), in place of relu and
# relu6, with its alpha and beta in millionths (integers: the workload grammar has no reals); "none" and
# 0 by default and left out of the text then, so older keys and logs stay valid.
ACTIVATION: dict[str, ParamValue] = {"act": "none", "alpha": 0, "beta": 0}
ACTIVATION_WORDS = {"act": ("none", *(k.value for k in ActivationKind))}
# How the kernel reads its weights (conv2d's weights, matmul's B): prepacked=1, already in the packed
# layout of the kernel's config, as a network's constant weights are laid out at build time (the
# template's `kernel_inputs`, docs/design.md "Convolutions"); 0, as the tensors() say, packed per call as
# the config asks. The reference, the tensors and the flops are the same either way.
PREPACKED = {"prepacked": 0}


def epilogue_tensors(wl: Workload, channels: int, out_shape: tuple[int, ...]) -> tuple[TensorSpec, ...]:
    """The epilogue's extra inputs, between the operator's own inputs and its output: bias, residual."""
    bias = (TensorSpec("bias", (channels,), constant=True),) if wl["bias"] else ()
    residual = (TensorSpec("residual", out_shape),) if wl["residual"] else ()
    return (*bias, *residual)


def apply_epilogue(wl: Workload, out: np.ndarray, extra: list[np.ndarray], axis: int) -> np.ndarray:
    """out + bias along `axis` + residual, then ReLU or ReLU6: the numpy side of the fused epilogue.
    `extra` are the inputs after the operator's own (the `epilogue_tensors`)."""
    rest = iter(extra)
    if wl["bias"]:
        bias = next(rest)
        shape = [1] * out.ndim
        shape[axis] = bias.size
        out = out + bias.reshape(shape)
    if wl["residual"]:
        out = out + next(rest)
    if wl["relu"] or wl["relu6"]:
        out = np.maximum(out, np.float32(0))
    if wl["relu6"]:
        out = np.minimum(out, np.float32(6))
    if (act := activation(wl)) is not None:
        out = act.reference(out)
    return out.astype(np.float32, copy=False)


def activation(wl: Workload) -> Activation | None:
    """The workload's fused activation (`act`), or None."""
    kind = wl.value("act")
    if kind == "none":
        return None
    return Activation(
        kind=ActivationKind(kind), shape=(1,), alpha=wl["alpha"] / MICRO, beta=wl["beta"] / MICRO
    )


def residual_operand(node: Node, out: str) -> str:
    """The tensor an Add adds to the kernel's output `out`, which may be its `residual`; "" if `node`
    is no Add (or adds `out` to itself)."""
    return next((t for t in node.inputs[:2] if t != out), "") if node.op == "Add" else ""


def activation_switches(graph: Graph, node: Node, x: str) -> dict[str, ParamValue] | None:
    """`node`, reading the kernel's output `x`, as the epilogue's last step: relu for Relu and Clip(0, none)
    (an omitted max is +inf, ONNX Clip from opset 11), relu6 for Clip(0, 6) (MobileNetV2's ReLU6), act
    with its alpha and beta for an activation (xtune/ops/activation.py, `epilogue_form`); None if it is
    none of these (other clips do not fuse)."""
    if node.op in ("Relu", "Clip"):
        clamp = _clamp(graph, node)
        return {clamp: 1} if clamp else None
    act = epilogue_form(graph, node, x)
    if act is None:
        return None
    kind, alpha, beta = act
    return {"act": kind.value, "alpha": alpha, "beta": beta}


def silu_switches(graph: Graph, x: str, readers: list[Node]) -> tuple[Node, dict[str, ParamValue]] | None:
    """x * Sigmoid(x), the one activation that reads the kernel's output `x` twice, when `readers` (of x)
    are that Sigmoid and that Mul: the Mul and the epilogue's switch; else None."""
    mul = silu_mul(graph, x, readers)
    return None if mul is None else (mul, {"act": ActivationKind.SILU.value})


def dequantize_output(
    graph: Graph, node: Node, x: str, quant: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray] | None:
    """`node`, reading an int8 kernel's output `x` (its constants `quant`, qparams = [za, zy, lo, hi]), as
    the kernel's dequant=1 epilogue: a DequantizeLinear of x, per tensor, of the zero point the kernel
    writes, gives the kernel's `out_scale`; None for any other node (it does not fuse)."""
    if node.op != "DequantizeLinear" or node.inputs[0] != x or "qparams" not in quant:
        return None
    params = node_qparams(graph, node)
    if params is None or params.zero != int(quant["qparams"][1]) or params.qtype != graph.dtype(x):
        return None
    return {"out_scale": np.array([params.scale], np.float32)}


def _clamp(graph: Graph, node: Node) -> str:
    if node.op == "Relu":
        return "relu"
    lo_name, hi_name = (*node.inputs[1:3], "", "")[:2]
    if _scalar(graph, lo_name) != 0.0:
        return ""
    if not hi_name:
        return "relu"
    return "relu6" if _scalar(graph, hi_name) == 6.0 else ""


def _scalar(graph: Graph, tensor: str) -> float | None:
    value = graph.constant(tensor) if tensor else None
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def require_positive(op: str, params: dict[str, ParamValue], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key not in params:
            raise InputError(f"{op}: missing size '{key}'")
        value = params[key]
        if not isinstance(value, int) or value <= 0:
            raise InputError(f"{op}: '{key}' must be a positive integer, got {value}")


def require_switches(op: str, params: dict[str, ParamValue]) -> None:
    for key in (*EPILOGUE, *(k for k in PREPACKED if k in params)):
        if params[key] not in (0, 1):
            raise InputError(f"{op}: '{key}' must be 0 or 1, got {params[key]}")
    if params["relu"] and params["relu6"]:
        raise InputError(f"{op}: 'relu' and 'relu6' exclude each other (relu6 already clamps at 0)")
    if params["act"] != "none" and (params["relu"] or params["relu6"]):
        raise InputError(f"{op}: 'act' excludes 'relu' and 'relu6' (one activation per epilogue)")
