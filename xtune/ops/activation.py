"""The activation family of a network's generated operators: ONNX's Sigmoid, HardSigmoid, HardSwish, Tanh,
LeakyRelu, Elu, Erf and Gelu (a node, its attributes and shape in) as one `Activation` kernel (a vector
map over the tensor, in place, in its input's layout) out; a Sigmoid whose only reader is Mul(x,
Sigmoid(x)) is one SiLU kernel (x / (1 + e^-x)). GELU as exporters write it (Erf or Tanh between Mul, Div
and Add) is one Gelu node after normalization (xtune/frontend/gelu.py): x/2 (1 + Erf(x / sqrt 2)), or
its tanh form as x / (1 + e^-2u).

The transcendental ones are built from the loop-nest IR's `Exp` (docs/design.md, "The loop-nest IR":
relative error below 8e-8): Sigmoid(x) = 1 / (1 + e^-x), which is 0 where e^-x overflows to +inf;
Tanh(x) = 1 - 2 / (1 + e^2x), exact in its limits (e^2x = +inf gives 1, 0 gives -1) and within a few
float32 ulps of 1 in absolute error near 0 (the subtraction cancels: about 1.2e-7, well under the 1e-4 a
network is checked to); Elu(x) = max(x, 0) + alpha * (e^min(x, 0) - 1); Erf is the IR's own `Erf`
(within 1e-7 of a float64 erf in relative error, the tails included). The rest are exact in float32
arithmetic up to rounding: HardSigmoid(x) = max(0, min(1, alpha * x + beta)), HardSwish(x) = x *
HardSigmoid(x) with alpha 1/6, beta 1/2, LeakyRelu(x) = max(x, 0) + alpha * min(x, 0). Semantics and
default attributes as the ONNX operator definitions (https://onnx.ai/onnx/operators/)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout
from xtune.ops.opkit import Consts, Mapped, NodeFamily, PointwiseOp, Shape, positive_dims
from xtune.schedule.loopnest import Binary, BinaryOp, Const, Erf, Exp, Kernel, MulAdd, Value

if TYPE_CHECKING:
    import onnx


class ActivationKind(Enum):
    SIGMOID = "sigmoid"
    HARD_SIGMOID = "hardsigmoid"
    HARD_SWISH = "hardswish"
    TANH = "tanh"
    LEAKY_RELU = "leakyrelu"
    ELU = "elu"
    ERF = "erf"
    SILU = "silu"  # x * Sigmoid(x): a Sigmoid whose only reader multiplies it by its own input
    GELU = "gelu"  # x * Phi(x), through Erf
    GELU_TANH = "gelu_tanh"  # its tanh approximation


_ONNX = {
    "Sigmoid": ActivationKind.SIGMOID,
    "HardSigmoid": ActivationKind.HARD_SIGMOID,
    "HardSwish": ActivationKind.HARD_SWISH,
    "Tanh": ActivationKind.TANH,
    "LeakyRelu": ActivationKind.LEAKY_RELU,
    "Elu": ActivationKind.ELU,
    "Erf": ActivationKind.ERF,
    # GELU as normalization writes it (xtune/frontend/gelu.py): ONNX's Gelu (opset 20; approximate="tanh"
    # is GELU_TANH, `_kind`), or ONNX Runtime's contrib Gelu and FastGelu below opset 20.
    "Gelu": ActivationKind.GELU,
    "com.microsoft.Gelu": ActivationKind.GELU,
    "com.microsoft.FastGelu": ActivationKind.GELU_TANH,
}
# GELU's tanh form: 0.5 x (1 + tanh(u)) = x / (1 + e^-2u), u = sqrt(2/pi) (x + 0.044715 x^3) (Hendrycks
# and Gimpel, arXiv:1606.08415): 2u = x (_GELU_T0 + _GELU_T1 x^2). No cancellation, exact limits.
_GELU_T0 = 2 * math.sqrt(2 / math.pi)
_GELU_T1 = _GELU_T0 * 0.044715
# ONNX's default alpha and beta per op type (HardSwish's are fixed by its definition).
_DEFAULTS = {
    "HardSigmoid": (0.2, 0.5),
    "HardSwish": (1 / 6, 0.5),
    "LeakyRelu": (0.01, 0.0),
    "Elu": (1.0, 0.0),
}


@dataclass(frozen=True, kw_only=True)
class Activation(PointwiseOp):
    """One activation applied to every element of `shape`, with its `alpha` and `beta` where it has them."""

    kind: ActivationKind
    shape: Shape
    alpha: float = 0.0
    beta: float = 0.0

    def __post_init__(self) -> None:
        positive_dims("activation", self.shape)
        if not (math.isfinite(self.alpha) and math.isfinite(self.beta)):
            raise InputError(f"{self.kind.value}: alpha {self.alpha} and beta {self.beta} must be finite")

    @property
    def label(self) -> str:
        """How a profile names its steps."""
        return self.kind.value

    def reference(self, x: np.ndarray) -> np.ndarray:
        """The ONNX definitions in float64."""
        v, a, b = x.astype(np.float64), self.alpha, self.beta
        k = self.kind
        if k is ActivationKind.SIGMOID:
            out = 1 / (1 + np.exp(-v))
        elif k is ActivationKind.SILU:
            out = v / (1 + np.exp(-v))
        elif k is ActivationKind.ERF:
            out = np.vectorize(math.erf)(v) if v.size else v
        elif k is ActivationKind.GELU:
            out = 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))) if v.size else v
        elif k is ActivationKind.GELU_TANH:
            out = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
        elif k is ActivationKind.TANH:
            out = np.tanh(v)
        elif k is ActivationKind.ELU:
            out = np.where(v > 0, v, a * np.expm1(np.minimum(v, 0)))
        elif k is ActivationKind.LEAKY_RELU:
            out = np.where(v > 0, v, a * v)
        else:
            out = np.clip(a * v + b, 0, 1) * (v if k is ActivationKind.HARD_SWISH else 1)
        return out.astype(np.float32)

    def expr(self, x: Value, lanes: int) -> Value:
        """The activation of `x` (`lanes` wide) in the loop-nest IR."""

        def c(value: float) -> Const:
            return Const(value, lanes)

        def op(kind: BinaryOp, a: Value, b: Value) -> Binary:
            return Binary(kind, a, b)

        k = self.kind
        if k in (ActivationKind.SIGMOID, ActivationKind.SILU):
            numerator = x if k is ActivationKind.SILU else c(1.0)
            return op(BinaryOp.DIV, numerator, op(BinaryOp.ADD, c(1.0), Exp(op(BinaryOp.SUB, c(0.0), x))))
        if k is ActivationKind.ERF:
            return Erf(x)
        if k is ActivationKind.GELU:  # x/2 (1 + erf(x / sqrt 2))
            half = op(BinaryOp.MUL, x, c(0.5))
            return MulAdd(half, Erf(op(BinaryOp.MUL, x, c(math.sqrt(0.5)))), half)
        if k is ActivationKind.GELU_TANH:
            two_u = op(BinaryOp.MUL, x, MulAdd(op(BinaryOp.MUL, x, x), c(_GELU_T1), c(_GELU_T0)))
            return op(BinaryOp.DIV, x, op(BinaryOp.ADD, c(1.0), Exp(op(BinaryOp.SUB, c(0.0), two_u))))
        if k is ActivationKind.TANH:
            e2x = Exp(op(BinaryOp.MUL, x, c(2.0)))
            return op(BinaryOp.SUB, c(1.0), op(BinaryOp.DIV, c(2.0), op(BinaryOp.ADD, c(1.0), e2x)))
        positive_part, negative_part = op(BinaryOp.MAX, x, c(0.0)), op(BinaryOp.MIN, x, c(0.0))
        if k is ActivationKind.LEAKY_RELU:
            return op(BinaryOp.ADD, positive_part, op(BinaryOp.MUL, negative_part, c(self.alpha)))
        if k is ActivationKind.ELU:
            em1 = op(BinaryOp.SUB, Exp(negative_part), c(1.0))
            return op(BinaryOp.ADD, positive_part, op(BinaryOp.MUL, em1, c(self.alpha)))
        linear = op(BinaryOp.ADD, op(BinaryOp.MUL, x, c(self.alpha)), c(self.beta))
        hard = op(BinaryOp.MIN, op(BinaryOp.MAX, linear, c(0.0)), c(1.0))
        return op(BinaryOp.MUL, x, hard) if k is ActivationKind.HARD_SWISH else hard

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        return self.map_nest(name, lanes, "x", lambda xs, width: self.expr(xs[0], width))


def _silu(graph: Graph, node: Node, nxt: Node | None) -> Node | None:
    """The Mul that makes `node` (a Sigmoid) SiLU: its only reader, multiplying it by the Sigmoid's own
    input (x * Sigmoid(x), as exporters write SiLU and Swish), or None."""
    x, s = node.inputs[0], node.outputs[0]
    if nxt is None or nxt.op != "Mul" or s in graph.outputs or sorted(nxt.inputs[:2]) != sorted((x, s)):
        return None
    return nxt


def _parameters(node: Node) -> tuple[float, float]:
    alpha, beta = _DEFAULTS.get(node.op, (0.0, 0.0))
    if node.op != "HardSwish":
        alpha = float(node.attr("alpha", alpha))  # type: ignore[arg-type]
        beta = float(node.attr("beta", beta))  # type: ignore[arg-type]
    return alpha, beta


MICRO = 1_000_000  # a fused activation's alpha and beta are workload keys in millionths (integers)


def epilogue_form(graph: Graph, node: Node, x: str) -> tuple[ActivationKind, int, int] | None:
    """`node` as the activation a conv's or matmul's epilogue applies to its output `x`: its kind and its
    alpha and beta rounded to millionths (so HardSigmoid's 1/6 is 0.166667: the output moves by at most
    5e-7 |x| + 5e-7, far inside the 1e-4 a network is checked to); None if it is no activation."""
    if node.op not in _ONNX or node.inputs[0] != x or any(node.inputs[1:]):
        return None
    alpha, beta = _parameters(node)
    return _kind(node), round(alpha * MICRO), round(beta * MICRO)


def _kind(node: Node) -> ActivationKind:
    """The activation of a node of an op type in _ONNX: ONNX's Gelu by its `approximate`."""
    if node.op == "Gelu" and node.attr("approximate", "none") == "tanh":
        return ActivationKind.GELU_TANH
    return _ONNX[node.op]


def silu_mul(graph: Graph, x: str, readers: list[Node]) -> Node | None:
    """The Mul of x by Sigmoid(x) when `readers`, the readers of x, are that Sigmoid and that Mul: SiLU
    as exporters write it; else None. (The caller checks that the Mul alone reads the Sigmoid.)"""
    sig = next((r for r in readers if r.op == "Sigmoid" and r.inputs[0] == x), None)
    mul = next((r for r in readers if r.op == "Mul"), None)
    if len(readers) != 2 or sig is None or mul is None or sig.outputs[0] in graph.outputs:
        return None
    return mul if sorted(mul.inputs[:2]) == sorted((x, sig.outputs[0])) else None


def onnx_nodes(act: Activation, x: str, out: str) -> list[onnx.NodeProto]:
    """`act` of x as ONNX nodes (the ONNX Runtime peer of a workload with a fused activation)."""
    from onnx import helper

    if act.kind is ActivationKind.SILU:
        return [
            helper.make_node("Sigmoid", [x], [f"{out}.sigmoid"]),
            helper.make_node("Mul", [x, f"{out}.sigmoid"], [out]),
        ]
    if act.kind in (ActivationKind.GELU, ActivationKind.GELU_TANH):
        return _gelu_nodes(act.kind is ActivationKind.GELU_TANH, x, out)
    op = next(op for op, kind in _ONNX.items() if kind is act.kind)
    node = helper.make_node(op, [x], [out])
    if op in ("HardSigmoid", "LeakyRelu", "Elu"):
        node.attribute.append(helper.make_attribute("alpha", act.alpha))
    if op == "HardSigmoid":
        node.attribute.append(helper.make_attribute("beta", act.beta))
    return [node]


def _gelu_nodes(tanh: bool, x: str, out: str) -> list[onnx.NodeProto]:
    """GELU as its opset-17 nodes: x/2 (1 + Erf(x / sqrt 2)), or x/2 (1 + Tanh(sqrt(2/pi) (x + 0.044715
    x^3))), each constant a Constant node."""
    from onnx import helper

    nodes: list[onnx.NodeProto] = []

    def node(op: str, *args: str | float) -> str:
        names = []
        for a in args:
            if isinstance(a, float):
                names.append(f"{out}.c{len(nodes)}")
                nodes.append(helper.make_node("Constant", [], [names[-1]], value_float=a))
            else:
                names.append(a)
        nodes.append(helper.make_node(op, names, [f"{out}.t{len(nodes)}"]))
        return nodes[-1].output[0]

    if tanh:
        cube = node("Mul", node("Mul", x, x), x)
        inner = node("Add", x, node("Mul", cube, 0.044715))
        core = node("Tanh", node("Mul", inner, math.sqrt(2 / math.pi)))
    else:
        core = node("Erf", node("Mul", x, math.sqrt(0.5)))
    node("Mul", node("Mul", x, 0.5), node("Add", core, 1.0))
    nodes[-1].output[0] = out
    return nodes


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    if node.op == "Sigmoid" and (mul := _silu(graph, node, nxt)) is not None:
        kernel = Activation(kind=ActivationKind.SILU, shape=graph.shape(mul.outputs[0]))
        return Mapped(kernel=kernel, inputs=(node.inputs[0],), in_place=True, fused=mul)
    alpha, beta = _parameters(node)
    if any(node.inputs[1:]):  # FastGelu's bias
        raise refuse(graph, node, "an input added before the activation (a bias) is not supported")
    kernel = Activation(kind=_kind(node), shape=graph.shape(node.outputs[0]), alpha=alpha, beta=beta)
    return Mapped(kernel=kernel, inputs=(node.inputs[0],), in_place=True)


FAMILY = NodeFamily(
    kind="elementwise",
    onnx_ops=tuple(_ONNX),
    layouts=frozenset(Layout),
    from_node=from_node,
    follows_input=True,
)
