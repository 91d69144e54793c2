"""What the int8 convolutions (qconv2d, qdepthwise) share: a workload in, its NHWC geometry, exact integer
reference, random inputs and the padded image its kernels read out; and an ONNX QLinearConv node in, its
kernel call (an `Anchor` with its int8 constants in `quant`) out.

Padding is the activation's zero point (ONNX's QLinearConv and ConvInteger, TFLite's int8 Conv: an
out-of-image tap contributes (za - za) * w = 0). The kernels copy the input once per call into a padded
image (`PaddedImage`): za (as the dot sees it) around the image and in the channels past c up to a
multiple of 4, the image flipped to the dot's signedness where it differs (xtune/ops/qmatmul/micro.py,
`DotPlan`), each pixel holding its filter row's s pixels where c is too small to fill dot groups
(`folded`); a 1x1-like workload with nothing to pad, round or flip reads its input in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor, refuse
from xtune.ops.conv import (
    SIDE_DEFAULTS,
    SIDES,
    ConvNode,
    ConvShape,
    canonical_pads,
    conv_geometry,
    pad_sides,
    validate_window,
    windows,
)
from xtune.ops.layout import Layout
from xtune.ops.qlinear import WORDS, int32_bias, requant_key, requantization, symmetric, zero_point
from xtune.ops.qmatmul import reference as qref
from xtune.ops.qmatmul.operator import (
    QMATMUL_MAX_K,
    QUANT_DEFAULTS,
    QUANT_KEYS,
    QUANT_WORDS,
    requant_of,
    validate_quant,
)
from xtune.ops.workload import Inits, ParamValue, Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Broadcast,
    Buffer,
    BufferKind,
    Cast,
    Const,
    DType,
    Load,
    NestBuilder,
    Shuffle,
    Value,
)

if TYPE_CHECKING:
    import onnx

# The keys of both families after their sizes: the window, then the quantization (qmatmul's).
WINDOW_KEYS = ("stride", "pad", *SIDES, "dilation")
WINDOW_DEFAULTS: dict[str, ParamValue] = {"stride": 1, "pad": 0, **SIDE_DEFAULTS, "dilation": 1}
OPTIONAL = frozenset((*SIDES, "dilation", *QUANT_KEYS))


class QConvOperator:
    """What both int8 convolution families share: the workload grammar after their own `sizes` (the
    window, the quantization), validation, the exact reference, and the QLinearConv mapping (`depthwise`
    picks which nodes are the family's)."""

    name: ClassVar[str]
    sizes: ClassVar[tuple[str, ...]]
    depthwise: ClassVar[bool]
    defaults: ClassVar[dict[str, ParamValue]] = {**WINDOW_DEFAULTS, **QUANT_DEFAULTS}
    optional: ClassVar[frozenset[str]] = OPTIONAL
    words: ClassVar[dict[str, tuple[str, ...]]] = QUANT_WORDS
    onnx_ops: ClassVar[tuple[str, ...]] = ("QLinearConv",)
    layouts: ClassVar[frozenset[Layout]] = frozenset((Layout.NHWC,))

    def validate(self, params: dict[str, ParamValue]) -> None:
        validate_window(self.name, params, self.sizes)
        validate_quant(self.name, params)
        taps = int(params["r"]) * int(params["s"]) * (1 if self.depthwise else int(params["c"]))
        if taps > QMATMUL_MAX_K:
            raise InputError(
                f"{self.name}: r*s*c is {taps}, more than the {QMATMUL_MAX_K} products an int32 "
                "accumulator of 8-bit values holds"
            )

    def canonical(self, params: dict[str, ParamValue]) -> dict[str, ParamValue]:
        return canonical_pads(params)

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        return reference(wl, inputs, self.depthwise)

    def anchor(self, graph: Graph, node: Node) -> Anchor | None:
        return read_qlinearconv(graph, node, self.depthwise)

    def task_key(self, anchor: Anchor, switches: dict[str, ParamValue], layout: Layout) -> str:
        """Always NHWC (the key has no layout): the int8 network runs in NHWC (`task_key` below)."""
        return task_key(anchor, switches)

    def onnx_nodes(self, wl: Workload, x: str, out: str, inits: Inits) -> list[onnx.NodeProto]:
        raise InputError(f"{self.name}: no ONNX model is written for it (bench_int8.py writes its own)")


def qconv_shape(wl: Workload) -> ConvShape:
    """The NHWC geometry of a qconv2d (k output channels) or qdepthwise (k = c) workload."""
    sides = pad_sides(wl)
    return ConvShape(
        n=wl["n"],
        c=wl["c"],
        h=wl["h"],
        w=wl["w"],
        k=wl["k"] if "k" in wl.operator.keys else wl["c"],
        r=wl["r"],
        s=wl["s"],
        stride=wl["stride"],
        pad=wl["pad"],
        dilation=wl["dilation"],
        nhwc=True,
        sides=None if len(set(sides)) == 1 else sides,
    )


def taps(sh: ConvShape, x: np.ndarray, zero: int) -> np.ndarray:
    """The input padded with `zero`, as (n, oh, ow, r, s, c): every output pixel's window, in int64."""
    pads = ((0, 0), (sh.top, sh.bottom), (sh.left, sh.right), (0, 0))
    padded = np.pad(x.astype(np.int64), pads, constant_values=zero)
    flat = replace(sh, pad=0, sides=None, h=padded.shape[1], w=padded.shape[2])
    return windows(padded, flat, (1, 2)).transpose(0, 4, 5, 1, 2, 3)  # from (n, r, s, c, oh, ow)


def reference(wl: Workload, inputs: list[np.ndarray], depthwise: bool) -> np.ndarray:
    """The exact output: int32 sums of (x - za) * w over each window (wrapping as the kernels add) plus
    the bias, requantized as qmatmul's (ONNX Runtime's or TFLite's, xtune/ops/qmatmul/reference.py)."""
    sh = qconv_shape(wl)
    x, w, bias, *scales, qparams = inputs
    za = int(qparams[0])
    win = taps(sh, x, za) - za
    if depthwise:  # (n, oh, ow, r, s, c) * (r, s, c), summed over r and s
        acc = np.einsum("nyxijc,ijc->nyxc", win, w.astype(np.int64))
    else:
        acc = win.reshape(sh.n, sh.oh, sh.ow, -1) @ w.astype(np.int64).reshape(-1, sh.k)
    return qref.output(qref.wrap32(acc + bias), scales, qparams, str(wl.value("a")), requant_of(wl))


def sample(wl: Workload, rng: np.random.Generator, weights: tuple[int, ...]) -> list[np.ndarray]:
    """Random inputs of a realistic layer (qmatmul's `sample_inputs` over the window's products), the
    activations drawn over the whole input."""
    sh = qconv_shape(wl)
    a = str(wl.value("a"))
    products = int(np.prod(weights)) // sh.k if len(weights) == 4 else sh.r * sh.s
    channels = sh.k if wl["perchannel"] else 1
    dequant = bool(wl["dequant"])
    _, b, *rest = qref.sample_inputs((1, sh.k, products), a, requant_of(wl), channels, rng, dequant)
    lo, hi = qref.RANGES[a]
    x = rng.integers(lo, hi + 1, (sh.n, sh.h, sh.w, sh.c)).astype(qref.NUMPY_TYPES[a])
    return [x, b.reshape(weights), *rest]


@dataclass(frozen=True, kw_only=True)
class PaddedImage:
    """The image a kernel's windows read: the input itself, or (`copied`) a stack copy of n x (h + pads) x
    (w + pads) x `depth` bytes of type `dtype`, za around the image and past c (module docstring)."""

    sh: ConvShape
    act: DType  # the input's type
    dtype: DType  # the type the kernel reads (the input's, or its flip)
    depth: int  # bytes per pixel of the copy: c (or s*c when `folded`), rounded up to a multiple of 4
    vector: int  # bytes per copy store
    # Each pixel holds the c bytes of the s pixels its filter row reads from it (dilation apart): the
    # window's s taps become one tap of s*c channels, so few channels (a 1-channel stem) fill whole dot
    # groups instead of one byte of each.
    folded: bool = False
    # Every odd channel group (channels 4-7 of each 8) stored complemented (~x = -x - 1), za' around the
    # image too: the second group of each pair the A72 route multiplies with smlsl (`DotDiff`).
    complement: bool = False
    # Bytes per step of the fill and, where an input row lands contiguous in the copy (depth == c, not
    # folded), of a whole row's copy (`row_block`), instead of `vector` per pixel: AArch64's LDP/STP move
    # 32 bytes an instruction, and a step of its loops costs three more (add, cmp, b.ne). 0: by `vector`
    # and pixel.
    block: int = 0

    @property
    def copied(self) -> bool:
        sh = self.sh
        return (
            self.folded
            or self.complement
            or self.act is not self.dtype
            or self.depth != sh.c
            or sh.padded != (sh.h, sh.w)
        )

    def alternate(self, even: Value, odd: Value, lanes: int) -> Value:
        """`even` in the bytes of even channel groups, `odd` in the odd ones, of `lanes` bytes starting at a
        multiple of 8 channels (pixels and stores start at one: `complement` needs c % 8 == 0)."""
        return Shuffle(even, odd, tuple(i + lanes * (i // 4 % 2) for i in range(lanes)))

    @property
    def row_block(self) -> int:
        """Bytes per step of a row's copy: the largest power of two up to `block` that divides the row (a
        partial vector would be loaded in pieces)."""
        row = self.sh.w * self.sh.c
        return next(p for p in (self.block >> i for i in range(self.block.bit_length())) if row % p == 0)

    @property
    def name(self) -> str:
        return "image" if self.copied else "input"

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        rows, cols = self.sh.padded
        size = self.sh.n * rows * cols * self.depth
        return (Buffer("image", size, BufferKind.LOCAL, self.dtype),) if self.copied else ()

    @property
    def pixel_vector(self) -> int:
        """Bytes per store of a pixel's copy: the widest power of two up to `vector` that divides c (a
        partial vector is stored lane by lane), else the widest up to c, with one partial tail."""
        sizes = [self.vector >> i for i in range(self.vector.bit_length()) if self.vector >> i <= self.sh.c]
        return next((v for v in sizes if self.sh.c % v == 0 and v >= 4), sizes[0] if sizes else self.sh.c)

    def at(self, image: Affine, row: Affine, col: Affine) -> Affine:
        """The first byte of pixel (row, col) of the padded image `image`."""
        rows, cols = self.sh.padded if self.copied else (self.sh.h, self.sh.w)
        return ((image * rows + row) * cols + col) * self.depth

    def emit(self, b: NestBuilder) -> None:
        """The copy: every byte za', then each input pixel's c bytes (flipped) at its padded place."""
        if not self.copied:
            return
        sh, v = self.sh, self.block or self.vector
        za: Value = Load("qparams", Affine())
        if self.act is not self.dtype:  # xor 0x80 moves za by 128 in the flipped type, as `DotPlan` says
            za = Binary(BinaryOp.XOR, za, Const(128, 1, DType.I32))
        fill: Value = Broadcast(Cast(za, self.dtype), v)
        if self.complement:
            inverse = Binary(BinaryOp.XOR, za, Const(-1, 1, DType.I32))
            fill = self.alternate(fill, Broadcast(Cast(inverse, self.dtype), v), v)
        rows, cols = sh.padded

        def pad(at: Affine, extent: int) -> None:
            b.split(extent, v, lambda i, size: b.store("image", at + i, fill, v, size % v), "zf")

        if self.block and not self.folded and self.depth == sh.c:
            # Whole rows copied: only the padding is filled, the rows above and below the image and each
            # row's sides, beside the row's copy.
            with b.loop(sh.n, "zn") as image:
                pad(self.at(image, Affine(), Affine()), sh.top * cols * self.depth)
                pad(self.at(image, Affine.of(sh.top + sh.h), Affine()), sh.bottom * cols * self.depth)
                with b.loop(sh.h, "zy") as y:
                    pad(self.at(image, y + sh.top, Affine()), sh.left * self.depth)
                    pad(self.at(image, y + sh.top, Affine.of(sh.left + sh.w)), sh.right * self.depth)
                    place = self.at(image, y + sh.top, Affine.of(sh.left))
                    self.copy(b, (image * sh.h + y) * (sh.w * sh.c), place, sh.w * sh.c, self.row_block)
            return
        pad(Affine(), sh.n * rows * cols * self.depth)
        for tap in range(sh.s if self.folded else 1):
            # Input column x lands at padded column x + left - tap*dilation of the tap's slot: the columns
            # from `first` on, where that is not left of the image.
            first = max(0, tap * sh.dilation - sh.left) if self.folded else 0
            with b.loop(sh.n, "zn") as image, b.loop(sh.h, "zy") as y, b.loop(sh.w - first, "zx") as x:
                source = ((image * sh.h + y) * sh.w + x + first) * sh.c
                place = self.at(image, y + sh.top, x + (first + sh.left - tap * sh.dilation)) + tap * sh.c
                self.copy_pixel(b, source, place)

    def copy_pixel(self, b: NestBuilder, source: Affine, place: Affine) -> None:
        """An input pixel's c bytes (flipped to the image's type) from input[source] to image[place]."""
        self.copy(b, source, place, self.sh.c, self.pixel_vector)

    def copy(self, b: NestBuilder, source: Affine, place: Affine, extent: int, p: int) -> None:
        """`extent` bytes of whole pixels from input[source] to image[place], flipped to the image's type,
        `p` bytes (a multiple of 8 where `complement`) at a time."""

        def chunk(j: Affine, size: int) -> None:
            value: Value = Load("input", source + j, p, size % p)
            flip = -128 if self.act is not self.dtype else 0
            if self.complement:
                mask = self.alternate(Const(flip, p, DType.I8), Const(~flip, p, DType.I8), p)
                value = Cast(Binary(BinaryOp.XOR, value, mask), self.dtype)
            elif flip:
                value = Cast(Binary(BinaryOp.XOR, value, Const(flip, p, DType.I8)), self.dtype)
            b.store("image", place + j, value, p, size % p)

        b.split(extent, p, chunk, "zc")


def each_tap(
    b: NestBuilder, taps: tuple[int, int], unrolled: bool, tap: Callable[[Affine, Affine | int], None]
) -> None:
    """tap(i, j) for every tap (i, j) of `taps` (rows, columns): i a loop, j a loop or (`unrolled`) each
    column in turn."""
    with b.loop(taps[0], "ti") as i:
        if unrolled:
            for col in range(taps[1]):
                tap(i, col)
        else:
            with b.loop(taps[1], "tj") as j:
                tap(i, j)


# --- ONNX: QLinearConv ---------------------------------------------------------------------------------


def read_qlinearconv(graph: Graph, node: Node, depthwise: bool) -> Anchor | None:
    """The kernel call of a QLinearConv (inputs x, x_scale, x_zero_point, w, w_scale, w_zero_point,
    y_scale, y_zero_point[, B]; xtune's `out_lo`/`out_hi` clamp: docs/int8.md) with constant int8 OIHW
    weights: qdepthwise's if `depthwise` (group = channels, one filter per channel), qconv2d's for group 1,
    None for the other family's node; a refusal naming what the kernels do not take (asymmetric or uint8
    weights, other groups, scales not per tensor or output channel). `quant` holds the workload's
    "scale" and "qparams" as ONNX Runtime computes them (xtune/ops/qlinear.py) and "input", an empty
    array of the activation's type; `bias` the int32 bias (zeros if absent)."""
    x, w = node.inputs[0], node.inputs[3]
    word = WORDS.get(graph.dtype(x))
    weights = graph.constant(w)
    if word is None:
        raise refuse(graph, node, f"input '{x}' is {graph.dtype(x)}, not int8 or uint8")
    shape = graph.shape(x)
    if weights is None or weights.dtype != np.int8 or weights.ndim != 4 or len(shape) != 4:
        raise refuse(graph, node, f"weights '{w}' are not constant int8 OIHW of a 2-D convolution")
    c, k = shape[1], weights.shape[0]
    group = int(node.attr("group", 1))  # type: ignore[arg-type]
    one_per_channel = group == c > 1 and weights.shape[1] == 1 and k == c
    if group != 1 and not one_per_channel:
        raise refuse(graph, node, f"group {group} with {k} filters: only group 1 or one filter per channel")
    if one_per_channel != depthwise:
        return None  # the other family's
    za, zw, zy = (zero_point(graph, node, t) for t in (node.inputs[2], node.inputs[5], node.inputs[7]))
    symmetric(graph, node, zw, k)
    rs = (weights.shape[2], weights.shape[3])
    conv = ConvNode(
        input=(shape[0], c, shape[2], shape[3]),
        weights=weights,
        geometry=conv_geometry(graph, node, (shape[2], shape[3]), rs),
        group=group,
        bias=int32_bias(graph, node, k),
        out=graph.shape(node.outputs[0]),
    )
    quant = {"input": np.zeros(0, np.dtype(graph.dtype(x)))} | requantization(graph, node, word, k, za, zy)
    return Anchor(
        node=node,
        op="qdepthwise" if depthwise else "qconv2d",
        sizes=(*conv.sizes(() if depthwise else (("k", k),)), ("dilation", conv.geometry[2])),
        out_shape=conv.out,
        channel_axis=1,
        weights=weights,
        bias=conv.bias,
        quant=quant,
    )


def task_key(anchor: Anchor, switches: dict[str, ParamValue]) -> str:
    """A QLinearConv's workload key: the activation type of quant's "input", ONNX Runtime's or TFLite's
    requantization (`requant_key`), per channel where the scale is. A fused activation of a quantized
    network is its output range (the qparams clamp), never a switch: a float epilogue switch on an int8
    call is a caller's mistake."""
    extra = {k: v for k, v in switches.items() if k != "bias" and v not in (0, "none")}
    if extra:
        raise InputError(f"{anchor.op}: an int8 kernel's activation is its qparams clamp, not {extra}")
    quant = anchor.quant
    if quant is None or "input" not in quant:
        raise InputError(f"{anchor.op}: only a QLinearConv node maps to it")
    act = "u8" if quant["input"].dtype == np.uint8 else "s8"
    return anchor.key((("a", act), *requant_key(quant)), {})
