"""The local response normalization family of a network's generated operators: ONNX's LRN (AlexNet,
Inception v1, ZFNet) of a 4-D tensor in, one `Lrn` kernel out, in NCHW or NHWC.

y[c] = x[c] / (bias + alpha / size * sum of x[i]^2 for i in [c - floor((size-1)/2), c + ceil((size-1)/2)]
within the channels) ** beta (ONNX operator spec, LRN). The power is exp(-beta * ln(.)) through the
loop-nest IR's `Exp` and `Log` (relative errors about 1e-7 each: docs/design.md, "The loop-nest IR"),
which needs a positive base: a bias that is not positive is refused. The squares are written once into
a stack buffer with `size - 1` zeros around the channels, so that every window is `size` plain loads:
in NCHW a vector of pixels per channel (the buffer holds lanes x channels), in NHWC a vector of channels
per pixel."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout, physical
from xtune.ops.opkit import ChannelsOp, Consts, Mapped, NodeFamily, Shape, params, positive, refusing
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Const,
    Exp,
    Kernel,
    Load,
    Log,
    NestBuilder,
    Value,
)


@dataclass(frozen=True, kw_only=True)
class Lrn(ChannelsOp):
    """LRN over the channels of (n, c, h, w), or of (n, h, w, c) in NHWC."""

    n: int
    c: int
    h: int
    w: int
    size: int
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0
    layout: Layout = Layout.NCHW

    def __post_init__(self) -> None:
        positive("lrn", n=self.n, c=self.c, h=self.h, w=self.w, size=self.size)
        if not self.bias > 0:
            raise InputError(f"lrn: bias {self.bias} must be positive (xtune raises it to -beta through log)")

    @property
    def output_shape(self) -> Shape:
        return physical((self.n, self.c, self.h, self.w), self.layout)

    @property
    def _lo(self) -> int:
        return (self.size - 1) // 2

    def reference(self, x: np.ndarray) -> np.ndarray:
        axis = 3 if self.layout is Layout.NHWC else 1
        v = np.moveaxis(x.astype(np.float64), axis, 1)
        squares = np.pad(v * v, ((0, 0), (self._lo, self.size - 1 - self._lo), (0, 0), (0, 0)))
        window = sum(squares[:, d : d + self.c] for d in range(self.size))
        out = v / (self.bias + self.alpha / self.size * window) ** self.beta
        return np.moveaxis(out, 1, axis).astype(np.float32)

    def _normalized(self, x: Value, window: Value, lanes: int) -> Value:
        """x * (bias + alpha/size * window) ** -beta."""
        scaled = Binary(BinaryOp.MUL, window, Const(self.alpha / self.size, lanes))
        base = Binary(BinaryOp.ADD, scaled, Const(self.bias, lanes))
        power = Exp(Binary(BinaryOp.MUL, Log(base), Const(-self.beta, lanes)))
        return Binary(BinaryOp.MUL, x, power)

    def _window(self, at: Affine, step: int, lanes: int, count: int = 0) -> Value:
        total: Value = Load("sq", at, lanes, count)
        for d in range(1, self.size):
            total = Binary(BinaryOp.ADD, total, Load("sq", at + d * step, lanes, count))
        return total

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, c, plane, pad = NestBuilder(), self.c, self.h * self.w, self.size - 1
        nhwc = self.layout is Layout.NHWC
        width = 1 if nhwc else lanes  # the squares buffer's row: a vector of pixels in NCHW, one in NHWC
        for slot in (*range(self._lo), *range(self._lo + c, c + pad)):  # the zero borders, once
            b.store("sq", Affine.of(slot * width), Const(0.0, width), width)
        if nhwc:
            with b.loop(self.n * plane, "q") as q:

                def squares(ch: Affine, count: int, q: Affine = q) -> None:
                    v = Load("x", q * c + ch, lanes, count)
                    b.store("sq", ch + self._lo, Binary(BinaryOp.MUL, v, v), lanes, count)

                def normalize(ch: Affine, count: int, q: Affine = q) -> None:
                    x = Load("x", q * c + ch, lanes, count)
                    y = self._normalized(x, self._window(ch, 1, lanes, count), lanes)
                    b.store("out", q * c + ch, y, lanes, count)

                b.split(c, lanes, squares, "c")
                b.split(c, lanes, normalize, "k")
        else:
            with b.loop(self.n, "n") as img:

                def pixels(p: Affine, count: int, img: Affine = img) -> None:
                    with b.loop(c, "c") as ch:
                        v = Load("x", img * (c * plane) + ch * plane + p, lanes, count)
                        b.store("sq", (ch + self._lo) * lanes, Binary(BinaryOp.MUL, v, v), lanes)
                    with b.loop(c, "k") as ch:
                        at = img * (c * plane) + ch * plane + p
                        window = self._window(ch * lanes, lanes, lanes)
                        value = self._normalized(Load("x", at, lanes, count), window, lanes)
                        b.store("out", at, value, lanes, count)

                b.split(plane, lanes, pixels, "p")
        size = self.n * c * plane
        return b.kernel(
            name, (*params([("x", size)], size), Buffer("sq", (c + pad) * width, BufferKind.LOCAL))
        )


def _number(node: Node, key: str, default: float) -> float:
    value = node.attr(key, default)
    return float(value) if isinstance(value, int | float) else default


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x = node.inputs[0]
    shape = graph.shape(x)
    if len(shape) != 4:
        raise refuse(graph, node, f"LRN of a {len(shape)}-D tensor (xtune normalizes 4-D ones)")
    n, c, h, w = shape
    size, alpha, beta, bias = (
        _number(node, k, d) for k, d in (("size", 0), ("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0))
    )
    with refusing(graph, node):
        kernel = Lrn(n=n, c=c, h=h, w=w, size=int(size), alpha=alpha, beta=beta, bias=bias)
    return Mapped(kernel=kernel, inputs=(x,))


FAMILY = NodeFamily(
    kind="normalization",
    onnx_ops=("LRN",),
    layouts=frozenset(Layout),
    from_node=from_node,
)
