"""Convolution geometry the conv2d and depthwise families share: a workload in, its `ConvShape` (output
size, channels, layout) out; the checks of its window keys; the strided windows the numpy references
read; and the stride, pads and dilation of an ONNX Conv node.

Padding: `pad` pads every side alike; the optional keys `pad_top`, `pad_left`, `pad_bottom` and
`pad_right` (SIDES) override one side each (TensorFlow's "same" padding puts the odd pixel at the bottom
and right: ONNX pads=[0,0,1,1]). A side at its default, -1, is `pad`; the canonical key sets `pad` to
the top side and leaves out every side equal to it, so a symmetric key is exactly the old `pad=P`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor, float_constant, refuse
from xtune.ops.epilogue import require_positive, require_switches
from xtune.ops.workload import ParamValue, Workload

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class ConvShape:
    """The geometry of a conv2d or depthwise workload, resolved once for references and templates."""

    n: int
    c: int  # input channels
    h: int
    w: int
    k: int  # output channels (c * multiplier for depthwise)
    r: int  # kernel height
    s: int  # kernel width
    stride: int
    pad: int
    dilation: int
    nhwc: bool
    multiplier: int = 1
    sides: tuple[int, int, int, int] | None = None  # (top, left, bottom, right); None: `pad` on each
    groups: int = 1  # conv2d: c and k split into this many independent convolutions (ONNX Conv's group)

    @property
    def per_group(self) -> ConvShape:
        """One group's convolution: c / groups input and k / groups output channels (the template's
        blocking and the features work on it; the tensors' strides stay the whole shape's)."""
        return replace(self, c=self.c // self.groups, k=self.k // self.groups, groups=1)

    @property
    def top(self) -> int:
        return self.pad if self.sides is None else self.sides[0]

    @property
    def left(self) -> int:
        return self.pad if self.sides is None else self.sides[1]

    @property
    def bottom(self) -> int:
        return self.pad if self.sides is None else self.sides[2]

    @property
    def right(self) -> int:
        return self.pad if self.sides is None else self.sides[3]

    @property
    def padded(self) -> tuple[int, int]:
        """Rows and columns of the zero-padded input."""
        return self.h + self.top + self.bottom, self.w + self.left + self.right

    @property
    def oh(self) -> int:
        return (self.padded[0] - self.dilation * (self.r - 1) - 1) // self.stride + 1

    @property
    def ow(self) -> int:
        return (self.padded[1] - self.dilation * (self.s - 1) - 1) // self.stride + 1


SIDES = ("pad_top", "pad_left", "pad_bottom", "pad_right")
SIDE_DEFAULTS: dict[str, ParamValue] = dict.fromkeys(SIDES, -1)  # -1: the side is `pad`


def pad_sides(params: dict[str, ParamValue] | Workload) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) of a convolution's keys: each side's own key, else `pad`."""
    pad = int(params["pad"])
    values = [int(params.get(k, -1)) if isinstance(params, dict) else params[k] for k in SIDES]
    top, left, bottom, right = (pad if v == -1 else v for v in values)
    return top, left, bottom, right


def canonical_pads(params: dict[str, ParamValue]) -> dict[str, ParamValue]:
    """The one spelling of a padding: `pad` is the top side, a side equal to it is left out (-1)."""
    if not all(isinstance(params[k], int) for k in ("pad", *SIDES)):
        return params
    sides = pad_sides(params)
    return {
        **params,
        "pad": sides[0],
        **{k: -1 if v == sides[0] else v for k, v in zip(SIDES, sides, strict=True)},
    }


def conv_shape(wl: Workload) -> ConvShape:
    """The geometry of a convolution workload: output channels are `k`, or, for a family with a channel
    `multiplier` (depthwise), c * multiplier."""
    grouped = "multiplier" in wl.operator.keys
    mult = wl["multiplier"] if grouped else 1
    k = wl["c"] * mult if grouped else wl["k"]
    sides = pad_sides(wl)
    return ConvShape(
        wl["n"],
        wl["c"],
        wl["h"],
        wl["w"],
        k,
        wl["r"],
        wl["s"],
        wl["stride"],
        wl["pad"],
        wl["dilation"],
        wl.value("layout") == "nhwc",
        mult,
        None if len(set(sides)) == 1 else sides,
        wl["groups"] if "groups" in wl.operator.keys else 1,
    )


def validate_conv(op: str, params: dict[str, ParamValue], sizes: tuple[str, ...]) -> None:
    validate_window(op, params, sizes)
    require_switches(op, params)


def validate_window(op: str, params: dict[str, ParamValue], sizes: tuple[str, ...]) -> None:
    """The sizes positive, the pads non-negative, the (dilated) kernel within the padded input."""
    require_positive(op, params, (*sizes, "stride", "dilation"))
    pad = params["pad"]
    if not isinstance(pad, int) or pad < 0:
        raise InputError(f"{op}: 'pad' must be a non-negative integer, got {pad}")
    for side in SIDES:
        value = params[side]
        if not isinstance(value, int) or value < -1:
            raise InputError(f"{op}: '{side}' must be a non-negative integer (or -1: as 'pad'), got {value}")
    top, left, bottom, right = pad_sides(params)
    for size, kernel, extra in (("h", "r", top + bottom), ("w", "s", left + right)):
        span = int(params["dilation"]) * (int(params[kernel]) - 1) + 1
        if span > int(params[size]) + extra:
            raise InputError(
                f"{op}: the kernel spans {span} along {size} (dilation {params['dilation']}), more than "
                f"the padded input's {int(params[size]) + extra}"
            )


def windows(x: np.ndarray, sh: ConvShape, axes: tuple[int, int]) -> np.ndarray:
    """A view of the padded input with two (window, output) axis pairs per spatial axis, no copy."""
    pads = [(0, 0)] * x.ndim
    pads[axes[0]], pads[axes[1]] = (sh.top, sh.bottom), (sh.left, sh.right)
    x = np.pad(x, pads)
    shape, strides = list(x.shape), list(x.strides)
    ha, wa = axes
    shape[ha : wa + 1] = [sh.r, sh.s]
    strides[ha : wa + 1] = [x.strides[ha] * sh.dilation, x.strides[wa] * sh.dilation]
    out_shape = (sh.oh, sh.ow)
    out_strides = (x.strides[ha] * sh.stride, x.strides[wa] * sh.stride)
    return np.lib.stride_tricks.as_strided(x, (*shape, *out_shape), (*strides, *out_strides), writeable=False)


def same_pads(
    auto_pad: str, hw: Sequence[int], strides: Sequence[int], dilations: Sequence[int], rs: Sequence[int]
) -> tuple[int, ...]:
    """(top, left, bottom, right) of ONNX's auto_pad SAME_UPPER or SAME_LOWER (Conv, MaxPool,
    AveragePool): the output is ceil(in / stride); SAME_UPPER puts the odd pixel at the end (bottom,
    right: TensorFlow's "same"), SAME_LOWER at the beginning."""
    totals = [
        max(0, (-(-size // st) - 1) * st + d * (r - 1) + 1 - size)
        for size, st, d, r in zip(hw, strides, dilations, rs, strict=True)
    ]
    small, large = tuple(t // 2 for t in totals), tuple(t - t // 2 for t in totals)
    return (*small, *large) if auto_pad == "SAME_UPPER" else (*large, *small)


def conv_geometry(
    graph: Graph, node: Node, hw: tuple[int, int], rs: tuple[int, int]
) -> tuple[int, tuple[int, int, int, int], int]:
    """(stride, pads as (top, left, bottom, right), dilation), stride and dilation the same for both
    axes, or a refusal naming what differs."""
    strides = node.ints("strides", (1, 1))
    dilations = node.ints("dilations", (1, 1))
    auto_pad = str(node.attr("auto_pad", "NOTSET"))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(auto_pad, hw, strides, dilations, rs)
    elif auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    else:
        pads = node.ints("pads", (0, 0, 0, 0))
    if len(set(strides)) != 1:
        raise refuse(graph, node, f"strides {strides} differ per axis (xtune takes one stride)")
    if len(set(dilations)) != 1:
        raise refuse(graph, node, f"dilations {dilations} differ per axis (xtune takes one dilation)")
    if len(pads) != 4 or min(pads) < 0:
        raise refuse(graph, node, f"pads {pads} are not four non-negative sides of a 2-D window")
    return strides[0], (pads[0], pads[1], pads[2], pads[3]), dilations[0]


@dataclass(frozen=True, kw_only=True)
class ConvNode:
    """What an ONNX Conv node says, before a family claims it (group 1: conv2d; group = channels:
    depthwise): input (n, c, h, w), OIHW weights (k, c / group, r, s), geometry, group, bias."""

    input: tuple[int, int, int, int]
    weights: np.ndarray
    geometry: tuple[int, tuple[int, int, int, int], int]  # stride, pads (top, left, bottom, right), dilation
    group: int
    bias: np.ndarray | None
    out: tuple[int, ...]

    @property
    def depthwise(self) -> bool:
        """group = channels with one input channel per group (and k a multiple of c): the depthwise
        family's; any other group is conv2d's `groups`."""
        c, (k, cg) = self.input[1], self.weights.shape[:2]
        return self.group == c and cg == 1 and k % c == 0 and self.group != 1

    def sizes(self, extra: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
        """The workload's sizes in the order the families' keys take them: n, c, h, w, `extra` (conv2d's
        k), r, s, stride, pad (the top side), then the other sides that differ from it (`canonical_pads`)."""
        n, c, h, w = self.input
        _, _, r, s = self.weights.shape
        stride, pads, _ = self.geometry
        sides = tuple((k, v) for k, v in zip(SIDES[1:], pads[1:], strict=True) if v != pads[0])
        return (
            ("n", n),
            ("c", c),
            ("h", h),
            ("w", w),
            *extra,
            ("r", r),
            ("s", s),
            ("stride", stride),
            ("pad", pads[0]),
            *sides,
        )

    def anchor(self, node: Node, op: str, sizes: tuple[tuple[str, int], ...]) -> Anchor:
        """The kernel call of family `op` with the workload `sizes`: output channels on axis 1, OIHW's O."""
        return Anchor(
            node=node,
            op=op,
            sizes=sizes,
            out_shape=self.out,
            channel_axis=1,
            weights=self.weights,
            bias=self.bias,
        )


def read_conv(graph: Graph, node: Node) -> ConvNode:
    """The Conv node's shapes, geometry and constants, or a refusal naming it."""
    x = graph.shape(node.inputs[0])
    w = float_constant(graph, node, node.inputs[1], "weight")
    if len(x) != 4 or w.ndim != 4:
        raise refuse(graph, node, f"only 2-D convolutions (4-D NCHW input) are supported, the input is {x}")
    n, c, h, wd = x
    geometry = conv_geometry(graph, node, (h, wd), (w.shape[2], w.shape[3]))
    bias = (
        float_constant(graph, node, node.inputs[2], "bias")
        if len(node.inputs) > 2 and node.inputs[2]
        else None
    )
    group = int(node.attr("group", 1))  # type: ignore[arg-type]
    return ConvNode(
        input=(n, c, h, wd),
        weights=w,
        geometry=geometry,
        group=group,
        bias=bias,
        out=graph.shape(node.outputs[0]),
    )


def conv_nodes(
    wl: Workload, group: int, x: str, out: str, inits: dict[str, np.ndarray]
) -> list[onnx.NodeProto]:
    """An ONNX Conv computing `wl` (with its bias) from `x` into `out`, its weights in `inits`. ONNX's
    Conv is NCHW only, so an nhwc workload is wrapped in Transposes, with its HWIO (depthwise: (r, s,
    c*multiplier)) weights stored as OIHW: the graph a converter (tf2onnx) writes for an NHWC model.
    ONNX's grouped weights (M, C/group, kH, kW) are exactly depthwise's nchw (c*multiplier, 1, r, s)."""
    from onnx import helper

    sh = conv_shape(wl)
    nodes = []
    conv_in, conv_out = (x, out) if not sh.nhwc else ("x_nchw", "y_nchw")
    if sh.nhwc:  # HWIO -> OIHW; a depthwise filter (r, s, c*multiplier) -> (c*multiplier, 1, r, s)
        w = inits["weights"]
        inits["weights"] = w.transpose(3, 2, 0, 1) if w.ndim == 4 else w.transpose(2, 0, 1)[:, None]
        nodes.append(helper.make_node("Transpose", [x], [conv_in], perm=[0, 3, 1, 2]))
    bias = ["bias"] if wl["bias"] else []
    nodes.append(
        helper.make_node(
            "Conv",
            [conv_in, "weights", *bias],
            [conv_out],
            kernel_shape=[sh.r, sh.s],
            strides=[sh.stride] * 2,
            pads=[sh.top, sh.left, sh.bottom, sh.right],
            dilations=[sh.dilation] * 2,
            group=group,
        )
    )
    if sh.nhwc:
        nodes.append(helper.make_node("Transpose", [conv_out], [out], perm=[0, 2, 3, 1]))
    return nodes
