"""Anchors: a Conv, Gemm or MatMul node of an imported graph in, the workload sizes, weights and bias of
its kernel out (before any fusion), or an InputError naming the node for what the templates cannot run.

Conv: 2-D, NCHW, weights OIHW (the conv2d nchw layout), one stride, dilation and pad for both axes;
group 1 is conv2d, group == channels is depthwise (multiplier = out / in channels). Gemm: A @ B with
transA=0; a constant B stored transposed (transB=1, PyTorch's Linear) is transposed here, alpha folded
into it, beta * C into the bias. MatMul: constant (k, n) weights, the leading axes of A flattened into m;
or two 2-D activations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from xtune.frontend.refusal import UnsupportedNode
from xtune.graph import Graph, Node
from xtune.operators import ConvShape, winograd_eligible
from xtune.ops.layout import Layout
from xtune.ops.workload import ParamValue
from xtune.templates.winograd import fits_stack


@dataclass(frozen=True, kw_only=True)
class Anchor:
    node: Node
    op: Literal["conv2d", "depthwise", "matmul"]
    sizes: tuple[tuple[str, int], ...]  # the workload's keys before the epilogue, in its order
    out_shape: tuple[int, ...]
    channel_axis: int  # of the output: where bias and BatchNormalization apply
    weights: np.ndarray | None = field(default=None, compare=False, repr=False)
    bias: np.ndarray | None = field(default=None, compare=False, repr=False)
    transposed: bool = False

    @property
    def channels(self) -> int:
        return self.out_shape[self.channel_axis]

    def workload_key(self, bias: bool, flags: dict[str, int], layout: Layout = Layout.NCHW) -> str:
        """The workload, run in `layout` (xtune/ops/layout.py decides which). Constant weights are
        packed once, at build time (xtune/firmware/build.py), so the task is tuned as it runs: prepacked=1
        (workload.PREPACKED). Depthwise weights are too small to matter."""
        constant = self.weights is not None
        packed = {"prepacked": 1} if constant and self.op != "depthwise" else {}
        switches = {"bias": int(bias), **flags, **packed}
        where: tuple[tuple[str, str], ...] = (("layout", layout.value),) if layout is not Layout.NCHW else ()
        finite = self.weights is not None and bool(np.all(np.isfinite(self.weights)))
        sizes: dict[str, ParamValue] = {"dilation": 1, **dict(self.sizes)}
        if finite and self.op == "conv2d" and winograd_eligible(sizes) and _winograd_fits(sizes, layout):
            # 2.25x fewer multiplies than any direct kernel, with U = G g G^T made once at build time
            # (docs/design.md, Convolutions; docs/benchmarks.md, issue 18). Weights that are an activation
            # would be transformed on every call: those layers stay direct. So do non-finite weights:
            # the transform mixes each weight into 16 sums, and inf - inf makes NaN of outputs that a
            # direct convolution computes as +-inf (what ONNX Runtime gives).
            where += (("algo", "winograd"),)
        return f"{self.op}:" + ",".join(f"{k}={v}" for k, v in (*self.sizes, *where, *switches.items()))

    def channel_vector(self, graph: Graph, const: np.ndarray) -> np.ndarray | None:
        """A constant that broadcasts against the output along its channel axis only, as a (channels,)
        vector; None for any other constant (it is then no bias)."""
        rank = len(self.out_shape)
        if const.dtype != np.float32 or const.ndim > rank:
            return None
        shape = (1,) * (rank - const.ndim) + const.shape
        for axis, dim in enumerate(shape):
            if dim != 1 and (axis != self.channel_axis or dim != self.channels):
                return None
        return np.broadcast_to(const.reshape(-1), (self.channels,)).astype(np.float32)

    def scale_channels(self, weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """The weights with output channel j multiplied by scale[j]."""
        if self.op == "matmul":  # B is (k, n)
            return weights * scale[None, :]
        return weights * scale.reshape(-1, *([1] * (weights.ndim - 1)))


def _winograd_fits(sizes: Mapping[str, ParamValue], layout: Layout) -> bool:
    """Whether a Winograd kernel of these sizes keeps its padded image copy within its stack budget; a
    larger layer is tuned and built direct, rather than refused when its tasks are extracted."""
    n, c, h, w, k, r, s, stride, pad, dilation = (
        int(sizes[key]) for key in ("n", "c", "h", "w", "k", "r", "s", "stride", "pad", "dilation")
    )
    return fits_stack(ConvShape(n, c, h, w, k, r, s, stride, pad, dilation, layout is Layout.NHWC))


def anchor_of(graph: Graph, node: Node) -> Anchor:
    if node.op == "Conv":
        return _conv(graph, node)
    if node.op == "Gemm":
        return _gemm(graph, node)
    return _matmul(graph, node)


def _refuse(graph: Graph, node: Node, why: str) -> UnsupportedNode:
    return UnsupportedNode(graph.name, node.name, node.op, why)


def _float_constant(graph: Graph, node: Node, tensor: str, what: str) -> np.ndarray:
    value = graph.constant(tensor)
    if value is None:
        raise _refuse(graph, node, f"{what} '{tensor}' is not a constant (xtune tunes constant weights)")
    if value.dtype != np.float32:
        raise _refuse(graph, node, f"{what} '{tensor}' is {value.dtype}, xtune runs float32 only")
    return value


def _conv(graph: Graph, node: Node) -> Anchor:
    x = graph.shape(node.inputs[0])
    w = _float_constant(graph, node, node.inputs[1], "weight")
    if len(x) != 4 or w.ndim != 4:
        raise _refuse(graph, node, f"only 2-D convolutions (4-D NCHW input) are supported, the input is {x}")
    n, c, h, wd = x
    k, cg, r, s = w.shape
    stride, pad, dilation = _conv_geometry(graph, node, (h, wd), (r, s))
    group = int(node.attr("group", 1))  # type: ignore[arg-type]
    bias = (
        _float_constant(graph, node, node.inputs[2], "bias")
        if len(node.inputs) > 2 and node.inputs[2]
        else None
    )
    out = graph.shape(node.outputs[0])
    geometry = (("r", r), ("s", s), ("stride", stride), ("pad", pad))
    if group == 1:
        sizes = (("n", n), ("c", c), ("h", h), ("w", wd), ("k", k), *geometry, ("dilation", dilation))
        return Anchor(
            node=node, op="conv2d", sizes=sizes, out_shape=out, channel_axis=1, weights=w, bias=bias
        )
    if group == c and cg == 1 and k % c == 0:
        sizes = (
            ("n", n),
            ("c", c),
            ("h", h),
            ("w", wd),
            *geometry,
            ("multiplier", k // c),
            ("dilation", dilation),
        )
        return Anchor(
            node=node, op="depthwise", sizes=sizes, out_shape=out, channel_axis=1, weights=w, bias=bias
        )
    raise _refuse(
        graph, node, f"grouped convolution (group={group} of {c} channels) is not supported: "
        "only group=1 and depthwise (group = channels)",
    )  # fmt: skip


def _conv_geometry(
    graph: Graph, node: Node, hw: tuple[int, int], rs: tuple[int, int]
) -> tuple[int, int, int]:
    """(stride, pad, dilation), the same for both axes, or a refusal naming what differs."""
    strides = node.ints("strides", (1, 1))
    dilations = node.ints("dilations", (1, 1))
    auto_pad = str(node.attr("auto_pad", "NOTSET"))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # ONNX Conv: the output is ceil(in / stride); the total padding splits evenly or not at all here.
        totals = [max(0, (-(-size // st) - 1) * st + d * (r - 1) + 1 - size)
                  for size, st, d, r in zip(hw, strides, dilations, rs, strict=True)]  # fmt: skip
        pads = (*(t // 2 for t in totals), *(t - t // 2 for t in totals))
    elif auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    else:
        pads = node.ints("pads", (0, 0, 0, 0))
    if len(set(strides)) != 1:
        raise _refuse(graph, node, f"strides {strides} differ per axis (xtune takes one stride)")
    if len(set(dilations)) != 1:
        raise _refuse(graph, node, f"dilations {dilations} differ per axis (xtune takes one dilation)")
    if len(set(pads)) != 1:
        raise _refuse(graph, node, f"asymmetric padding {pads} (xtune pads every side alike)")
    return strides[0], pads[0], dilations[0]


def _gemm(graph: Graph, node: Node) -> Anchor:
    a = graph.shape(node.inputs[0])
    if int(node.attr("transA", 0)):  # type: ignore[arg-type]
        raise _refuse(graph, node, "transA=1 (a transposed activation) is not supported")
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))  # type: ignore[arg-type]
    transposed = bool(node.attr("transB", 0))
    weights: np.ndarray | None = None
    if graph.constant(node.inputs[1]) is not None:
        w = _float_constant(graph, node, node.inputs[1], "weight")
        w = w.T if transposed else w  # the workload takes B as (k, n)
        weights = np.ascontiguousarray(w * np.float32(alpha) if alpha != 1 else w, dtype=np.float32)
    elif transposed or alpha != 1:
        raise _refuse(graph, node, "an activation as B needs transB=0 and alpha=1")
    if len(a) != 2:
        raise _refuse(graph, node, f"A has shape {a}, Gemm takes 2-D A")
    m, k = a
    n = graph.shape(node.outputs[0])[1]
    anchor = Anchor(node=node, op="matmul", sizes=(("m", m), ("n", n), ("k", k)), out_shape=(m, n),
                    channel_axis=1, weights=weights, transposed=transposed)  # fmt: skip
    if len(node.inputs) < 3 or not node.inputs[2]:
        return anchor
    c = graph.constant(node.inputs[2])
    bias = anchor.channel_vector(graph, c * np.float32(beta)) if c is not None else None
    if bias is None:
        raise _refuse(graph, node, f"C '{node.inputs[2]}' is not a constant per-column bias")
    return replace(anchor, bias=bias)


def _matmul(graph: Graph, node: Node) -> Anchor:
    a, b = graph.shape(node.inputs[0]), graph.shape(node.inputs[1])
    out = graph.shape(node.outputs[0])
    weights = graph.constant(node.inputs[1])
    if weights is not None and len(a) >= 2 and len(b) == 2:
        weights = _float_constant(graph, node, node.inputs[1], "weight")
        m = int(np.prod(a[:-1]))  # B is shared: the leading axes of A are rows of one matmul
    elif weights is None and len(a) == 2 and len(b) == 2:
        m = a[0]
    else:
        raise _refuse(graph, node, f"MatMul of shapes {a} @ {b} is not supported (constant 2-D weights, "
                      "or two 2-D activations)")  # fmt: skip
    sizes = (("m", m), ("n", b[1]), ("k", a[-1]))
    return Anchor(
        node=node, op="matmul", sizes=sizes, out_shape=out, channel_axis=len(out) - 1, weights=weights
    )
