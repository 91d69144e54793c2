"""The resize family of a network's generated operators: ONNX's Resize (a node with constant scales or
sizes, opsets 11 to 19; older Resize and Upsample nodes are upgraded to it by normalization,
xtune/frontend/normalize.py) of a 4-D tensor over its two spatial axes in, one `Resize` kernel out, in
NCHW or NHWC.

Semantics as the ONNX operator definition (https://onnx.ai/onnx/operators/onnx__Resize.html), nearest's
coordinates computed in float32 as ONNX Runtime's CPU kernel computes them, linear's exactly: mode
nearest (nearest_mode round_prefer_floor, round_prefer_ceil, floor, ceil) or linear (bilinear over H and
W, the source coordinate clamped to the image), coordinate_transformation_mode half_pixel,
pytorch_half_pixel, align_corners or asymmetric. Refused in one line each: cubic, tf_crop_and_resize,
half_pixel_symmetric, antialias=1, exclude_outside=1, keep_aspect_ratio_policy other than stretch, a
scale other than 1 on N or C.

Each output row and column reads input rows and columns known at build time (`Tap`); the kernel that
blends them, unrolled over the periods of their pattern, vectors along W in NCHW and along C in NHWC, and
separable where the pattern does not repeat soon, is built by xtune/ops/resize_nest.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout, physical, to_layout
from xtune.ops.opkit import ChannelsOp, Consts, Mapped, NodeFamily, Shape, params, positive, refusing
from xtune.ops.resize_nest import (
    MAX_BODIES,
    Image,
    Tap,
    bodies,
    column_runs,
    direct,
    runs,
    scratch,
    separable,
)
from xtune.ops.template import MAX_STACK_BYTES
from xtune.schedule.loopnest import Buffer, Kernel, NestBuilder

MODES = ("nearest", "linear")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
# The scratch image of the separable kernel is on the stack: at most what any kernel may use. Its lanes are
# not known before the kernel is built: counted at the widest vector (AVX-512's 16 floats) in NHWC.
_WIDEST = 16


def source_coordinate(transform: str, out: int, scale: float, size: int, length: int, exact: bool) -> float:
    """Where output `out` of `length` falls in an input axis of `size` (ONNX Resize, the
    coordinate_transformation_mode formulas): in float32 arithmetic as ONNX Runtime's kernel computes it
    (nearest: rounding it picks the tap), or `exact`, in float64 (linear: the weights then repeat with
    the period of the ratio, where float32's rounding would differ from one period to the next)."""
    f = float if exact else np.float32
    x = f(out)
    if transform == "asymmetric":
        return float(f(x / f(scale)))
    if transform == "align_corners":
        return 0.0 if length == 1 else float(f(x * f(size - 1) / f(length - 1)))
    if transform == "pytorch_half_pixel" and length == 1:
        return 0.0
    return float(f((x + f(0.5)) / f(scale) - f(0.5)))


def _nearest(x: float, mode: str) -> int:
    if mode == "floor":
        return math.floor(x)
    if mode == "ceil":
        return math.ceil(x)
    if x == math.floor(x) + 0.5:  # a tie
        return math.floor(x) if mode == "round_prefer_floor" else math.ceil(x)
    return round(x)


def axis_taps(
    mode: str, transform: str, nearest: str, size: int, length: int, scale: float
) -> tuple[Tap, ...]:
    """The taps of `length` outputs resized from an axis of `size`: nearest's rounded index, or linear's
    two neighbours of the coordinate clamped to [0, size - 1], both clamped to the axis."""
    taps = []
    for out in range(length):
        x = source_coordinate(transform, out, scale, size, length, exact=mode == "linear")
        if mode == "nearest":
            i = min(max(_nearest(x, nearest), 0), size - 1)
            taps.append(Tap(i, i, 0.0))
            continue
        x = min(max(x, 0.0), size - 1)
        lo = min(int(x), size - 1)
        hi = min(lo + 1, size - 1)
        taps.append(Tap(lo, hi, x - lo if hi != lo else 0.0))
    return tuple(taps)


@dataclass(frozen=True, kw_only=True)
class Resize(ChannelsOp):
    """(n, c, h, w) resized to (n, c, len(rows), len(cols)) through the taps of each output row and
    column; in NHWC, (n, h, w, c) to (n, oh, ow, c)."""

    n: int
    c: int
    h: int
    w: int
    rows: tuple[Tap, ...]
    cols: tuple[Tap, ...]
    layout: Layout = Layout.NCHW

    def __post_init__(self) -> None:
        positive("resize", n=self.n, c=self.c, h=self.h, w=self.w, oh=len(self.rows), ow=len(self.cols))
        for taps, size in ((self.rows, self.h), (self.cols, self.w)):
            if any(not (0 <= t.lo < size and 0 <= t.hi < size and 0 <= t.t <= 1) for t in taps):
                raise InputError(f"resize: a tap reads outside an axis of {size}")
        one_by_one, separate = bodies(runs(self.rows), runs(self.cols))
        need = self._scratch(_WIDEST).size * 4
        if one_by_one > MAX_BODIES and (separate > MAX_BODIES or need > MAX_STACK_BYTES):
            raise InputError(
                f"resize: {self.h}x{self.w} to {len(self.rows)}x{len(self.cols)} needs {separate} unrolled "
                f"bodies and {need} bytes of stack (at most {MAX_BODIES} and {MAX_STACK_BYTES})"
            )

    @property
    def _image(self) -> Image:
        oh, ow = len(self.rows), len(self.cols)
        return Image(n=self.n, c=self.c, h=self.h, w=self.w, oh=oh, ow=ow, nhwc=self.layout is Layout.NHWC)

    def _scratch(self, lanes: int) -> Buffer:
        """The separable kernel's image of row-blended pixels: oh x w, each `lanes` channels in NHWC."""
        return scratch(len(self.rows) * self.w * (lanes if self.layout is Layout.NHWC else 1))

    @property
    def output_shape(self) -> Shape:
        return physical((self.n, self.c, len(self.rows), len(self.cols)), self.layout)

    def reference(self, x: np.ndarray) -> np.ndarray:
        """numpy: the rows blended, then the columns, in float64."""
        v = x.astype(np.float64)
        if self.layout is Layout.NHWC:
            v = v.transpose(0, 3, 1, 2)

        def blend(v: np.ndarray, taps: tuple[Tap, ...], axis: int) -> np.ndarray:
            lo = np.take(v, [t.lo for t in taps], axis=axis)
            hi = np.take(v, [t.hi for t in taps], axis=axis)
            shape = [1] * 4
            shape[axis] = len(taps)
            t = np.array([t.t for t in taps]).reshape(shape)
            return lo * (1 - t) + hi * t

        out = blend(blend(v, self.rows, 2), self.cols, 3).astype(np.float32)
        return to_layout(out, self.layout)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, im = NestBuilder(), self._image
        rows = runs(self.rows)
        cols = column_runs(im, self.cols, lanes)
        size, local = self.n * self.c, tuple[Buffer, ...]()
        if bodies(rows, cols)[0] <= MAX_BODIES:
            direct(b, im, rows, cols, lanes)
        else:
            separable(b, im, rows, cols, lanes)
            local = (self._scratch(lanes),)
        return b.kernel(name, (*params([("x", size * self.h * self.w)], size * im.oh * im.ow), *local))


def _attr(node: Node, name: str, default: str) -> str:
    value = node.attr(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


def _refusal(node: Node) -> str | None:
    """Why xtune does not run this Resize's attributes, or None."""
    mode, transform = (
        _attr(node, "mode", "nearest"),
        _attr(node, "coordinate_transformation_mode", "half_pixel"),
    )
    nearest, policy = (
        _attr(node, "nearest_mode", "round_prefer_floor"),
        _attr(node, "keep_aspect_ratio_policy", "stretch"),
    )
    checks = (
        (mode not in MODES, f"mode {mode} (xtune resizes nearest and linear)"),
        (transform not in TRANSFORMS, f"coordinate_transformation_mode {transform}"),
        (mode == "nearest" and nearest not in NEAREST_MODES, f"nearest_mode {nearest}"),
        (int(node.attr("antialias", 0)) != 0, "antialias=1"),  # type: ignore[arg-type]
        (int(node.attr("exclude_outside", 0)) != 0, "exclude_outside=1"),  # type: ignore[arg-type]
        (policy != "stretch", f"keep_aspect_ratio_policy {policy}"),
    )
    return next((f"{what} is not supported" for bad, what in checks if bad), None)


def _per_axis(graph: Graph, node: Node, index: int, rank: int, fill: float) -> np.ndarray | None:
    """Input `index` (scales or sizes) as one value per axis (opset 18's `axes` placing them), None when
    absent; refused when it is not a constant."""
    name = node.inputs[index] if len(node.inputs) > index else ""
    if not name:
        return None
    value = graph.constant(name)
    if value is None:
        raise refuse(
            graph, node, f"input '{name}' is not a constant (xtune resizes by constant scales or sizes)"
        )
    if value.size == 0:
        return None
    axes = [a + rank if a < 0 else a for a in node.ints("axes", tuple(range(rank)))]
    full = np.full(rank, fill, np.float64)
    if len(axes) != value.size or sorted(set(axes)) != sorted(axes) or not all(0 <= a < rank for a in axes):
        raise refuse(graph, node, f"input '{name}' has {value.size} values for axes {axes}")
    full[axes] = value.reshape(-1)
    return full


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x, out = node.inputs[0], node.outputs[0]
    shape, out_shape = graph.shape(x), graph.shape(out)
    if len(shape) != 4:
        raise refuse(
            graph, node, f"a resize of a {len(shape)}-D tensor (xtune resizes 4-D ones over H and W)"
        )
    if (why := _refusal(node)) is not None:
        raise refuse(graph, node, why)
    scales = _per_axis(graph, node, 2, 4, 1.0)
    sizes = _per_axis(graph, node, 3, 4, 0.0)
    if scales is None and sizes is None:
        raise refuse(graph, node, "neither scales nor sizes is given")
    if sizes is not None:
        sizes = np.where(sizes == 0, shape, sizes)
        scales = sizes.astype(np.float32) / np.array(shape, np.float32)
    assert scales is not None
    n, c, h, w = shape
    if tuple(out_shape[:2]) != (n, c) or any(s != 1 for s in scales[:2]):
        raise refuse(graph, node, f"scales {scales.tolist()}: xtune resizes H and W only (N and C scales 1)")
    if any(not (math.isfinite(s) and s > 0) for s in scales):
        raise refuse(graph, node, f"scales {scales.tolist()} must be positive")
    mode, transform = (
        _attr(node, "mode", "nearest"),
        _attr(node, "coordinate_transformation_mode", "half_pixel"),
    )
    nearest = _attr(node, "nearest_mode", "round_prefer_floor")
    rows = axis_taps(mode, transform, nearest, h, out_shape[2], float(scales[2]))
    cols = axis_taps(mode, transform, nearest, w, out_shape[3], float(scales[3]))
    with refusing(graph, node):
        return Mapped(kernel=Resize(n=n, c=c, h=h, w=w, rows=rows, cols=cols), inputs=(x,))


FAMILY = NodeFamily(kind="resize", onnx_ops=("Resize",), layouts=frozenset(Layout), from_node=from_node)
