"""The depthwise family: depthwise 2-D convolution with the fused epilogue, in NCHW (nchw.py) or NHWC
(nhwc.py, channels as vectors), picked by the workload's own `layout` key. Its workload keys, validation,
tensors, numpy reference and flops; the ONNX Conv nodes whose group is their channel count (multiplier =
output / input channels); its weights in the layout its workload takes; its features (features.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor
from xtune.ops.conv import (
    SIDE_DEFAULTS,
    SIDES,
    canonical_pads,
    conv_nodes,
    conv_shape,
    read_conv,
    validate_conv,
    windows,
)
from xtune.ops.depthwise.features import NCHW, NHWC
from xtune.ops.depthwise.nchw import DepthwiseTemplate
from xtune.ops.depthwise.nhwc import DepthwiseNhwcTemplate
from xtune.ops.epilogue import ACTIVATION, ACTIVATION_WORDS, EPILOGUE, apply_epilogue, epilogue_tensors
from xtune.ops.featurize import FeatureSet
from xtune.ops.layout import Layout, layout_key
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import Inits, ParamValue, TensorSpec, Workload
from xtune.target import Target

if TYPE_CHECKING:
    import onnx


class Depthwise:
    """Depthwise 2-D convolution; output channel o reads input channel o // multiplier (ONNX's group order).

    layout=nchw: input (n,c,h,w), weights (c*multiplier,1,r,s) [ONNX's grouped OIHW], output
    (n,c*multiplier,oh,ow). layout=nhwc: input (n,h,w,c), weights (r,s,c*multiplier) [TensorFlow's
    depthwise filter (r,s,c,multiplier) with its last two axes flattened], output (n,oh,ow,c*multiplier).
    Optional bias (c*multiplier,) and residual (like the output)."""

    name: ClassVar[str] = "depthwise"
    keys: ClassVar[tuple[str, ...]] = (
        "n",
        "c",
        "h",
        "w",
        "r",
        "s",
        "stride",
        "pad",
        *SIDES,
        "multiplier",
        "dilation",
        "layout",
        *EPILOGUE,
        *ACTIVATION,
    )
    defaults: ClassVar[dict[str, ParamValue]] = {
        "stride": 1,
        "pad": 0,
        **SIDE_DEFAULTS,
        "multiplier": 1,
        "dilation": 1,
        "layout": "nchw",
        **EPILOGUE,
        **ACTIVATION,
    }
    optional: ClassVar[frozenset[str]] = frozenset(
        (*SIDES, "multiplier", "dilation", "layout", *EPILOGUE, *ACTIVATION)
    )
    words: ClassVar[dict[str, tuple[str, ...]]] = {"layout": ("nchw", "nhwc"), **ACTIVATION_WORDS}

    def validate(self, params: dict[str, ParamValue]) -> None:
        validate_conv(self.name, params, ("n", "c", "h", "w", "r", "s", "multiplier"))

    def canonical(self, params: dict[str, ParamValue]) -> dict[str, ParamValue]:
        return canonical_pads(params)

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        sh = conv_shape(wl)
        wt: tuple[int, ...]
        if sh.nhwc:
            x, wt, out = (sh.n, sh.h, sh.w, sh.c), (sh.r, sh.s, sh.k), (sh.n, sh.oh, sh.ow, sh.k)
        else:
            x, wt, out = (sh.n, sh.c, sh.h, sh.w), (sh.k, 1, sh.r, sh.s), (sh.n, sh.k, sh.oh, sh.ow)
        return (
            TensorSpec("input", x),
            TensorSpec("weights", wt, constant=True),
            *epilogue_tensors(wl, sh.k, out),
            TensorSpec("output", out, is_output=True),
        )

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        sh = conv_shape(wl)
        if sh.nhwc:  # view (n, r, s, c, oh, ow) -> taps (n, oh, ow, c) per (i, j)
            win = windows(inputs[0], sh, (1, 2)).transpose(0, 1, 2, 4, 5, 3)
            wt = inputs[1].reshape(sh.r, sh.s, sh.c, sh.multiplier)
            out = np.zeros((sh.n, sh.oh, sh.ow, sh.c, sh.multiplier), dtype=np.float32)
            for i in range(sh.r):  # the same r*s multiply-adds in the same order as NCHW's
                for j in range(sh.s):
                    out += win[:, i, j, ..., None] * wt[i, j]
            return apply_epilogue(wl, out.reshape(sh.n, sh.oh, sh.ow, sh.k), inputs[2:], axis=3)
        win = windows(inputs[0], sh, (2, 3))  # (n, c, r, s, oh, ow)
        wt = inputs[1].reshape(1, sh.c, sh.multiplier, sh.r, sh.s, 1, 1)
        out = np.zeros((sh.n, sh.c, sh.multiplier, sh.oh, sh.ow), dtype=np.float32)
        for i in range(sh.r):  # r*s whole-tensor multiply-adds: vectorized, and exact in fp32 order
            for j in range(sh.s):
                out += win[:, :, None, i, j] * wt[:, :, :, i, j]
        return apply_epilogue(wl, out.reshape(sh.n, sh.k, sh.oh, sh.ow), inputs[2:], axis=1)

    def flops(self, wl: Workload) -> int:
        sh = conv_shape(wl)
        return 2 * sh.n * sh.k * sh.oh * sh.ow * sh.r * sh.s

    onnx_ops: ClassVar[tuple[str, ...]] = ("Conv",)
    layouts: ClassVar[frozenset[Layout]] = frozenset(Layout)
    feature_sets: ClassVar[tuple[FeatureSet, ...]] = (NCHW, NHWC)

    def template(self, wl: Workload, target: Target) -> ScheduleTemplate:
        """NHWC's channels, not rows, are its vectors: another template and space than NCHW's."""
        if conv_shape(wl).nhwc:
            return DepthwiseNhwcTemplate(wl, target)
        return DepthwiseTemplate(wl, target)

    def features(self, template: ScheduleTemplate) -> tuple[FeatureSet, ScheduleTemplate]:
        return (NHWC if conv_shape(template.workload).nhwc else NCHW), template

    def anchor(self, graph: Graph, node: Node) -> Anchor | None:
        """A Conv of group = channels (one input channel per group); None for any other (conv2d's)."""
        conv = read_conv(graph, node)
        if not conv.depthwise:
            return None
        c, k = conv.input[1], conv.weights.shape[0]
        sizes = (*conv.sizes(()), ("multiplier", k // c), ("dilation", conv.geometry[2]))
        return conv.anchor(node, self.name, sizes)

    def task_key(self, anchor: Anchor, switches: dict[str, ParamValue], layout: Layout) -> str:
        """In `layout`; never prepacked: depthwise weights are too small to matter."""
        extra: tuple[tuple[str, ParamValue], ...] = layout_key(layout)
        return anchor.key(extra, switches)

    def onnx_nodes(self, wl: Workload, x: str, out: str, inits: Inits) -> list[onnx.NodeProto]:
        """A Conv of group = channels and c*multiplier output channels."""
        return conv_nodes(wl, conv_shape(wl).c, x, out, inits)

    def task_weights(self, wl: Workload, weights: np.ndarray) -> np.ndarray:
        """ONNX's (c*multiplier, 1, r, s) weights in the workload's layout: (r, s, c*multiplier) for nhwc."""
        if wl.value("layout") != "nhwc":
            return weights
        return np.ascontiguousarray(weights.reshape(weights.shape[0], *weights.shape[2:]).transpose(1, 2, 0))
