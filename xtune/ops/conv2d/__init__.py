"""The conv2d family: 2-D convolution with the fused epilogue, direct (direct.py) or by Winograd's
F(2x2, 3x3) or F(4x4, 3x3) (winograd.py), forced by the workload's `algo` key or, where Winograd applies
and `algo` is not given, both in one space (the tuner's choice: a SumTemplate); a pointwise one lowers
through the matmul template and is featured as a matmul (a grouped one too, one group's matmul for each
group, where `direct.matmul_per_group` says). Its workload keys, validation, tensors, numpy reference
and flops; the ONNX Conv nodes of group 1 it runs (2-D, NCHW, OIHW weights, one stride, dilation and
pad for both axes); its weights in the layout its workload takes; its features (features.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor
from xtune.ops.conv import (
    SIDE_DEFAULTS,
    SIDES,
    ConvShape,
    canonical_pads,
    conv_nodes,
    conv_shape,
    pad_sides,
    read_conv,
    validate_conv,
    windows,
)
from xtune.ops.conv2d.direct import Conv2dTemplate
from xtune.ops.conv2d.features import AUTO, DIRECT, WINOGRAD, auto_features
from xtune.ops.conv2d.winograd import WinogradTemplate, fits_stack
from xtune.ops.epilogue import (
    ACTIVATION,
    ACTIVATION_WORDS,
    EPILOGUE,
    PREPACKED,
    apply_epilogue,
    epilogue_tensors,
)
from xtune.ops.featurize import FeatureSet
from xtune.ops.layout import Layout, layout_key
from xtune.ops.matmul.features import FEATURES as MATMUL_FEATURES
from xtune.ops.template import ScheduleTemplate, SumTemplate
from xtune.ops.workload import Inits, ParamValue, TensorSpec, Workload
from xtune.target import Target

if TYPE_CHECKING:
    import onnx


def winograd_eligible(params: dict[str, ParamValue] | Workload) -> bool:
    """Whether a conv2d may take algo=winograd (F(m x m, 3x3), ops/conv2d/winograd.py): a 3x3 window at
    stride 1 without dilation, ungrouped, the same padding on every side (its buffers assume the
    symmetric border). The one home of the rule: validation and task extraction call it."""
    window = (("r", 3), ("s", 3), ("stride", 1), ("dilation", 1))
    ungrouped = (params.get("groups", 1) if isinstance(params, dict) else params["groups"]) == 1
    symmetric = len(set(pad_sides(params))) == 1
    return ungrouped and symmetric and all(params[key] == value for key, value in window)


def winograd_applies(params: dict[str, ParamValue] | Workload, layout: Layout) -> bool:
    """Whether Winograd joins the direct template in the space of a conv2d that leaves `algo` to the
    tuner: it may take it (`winograd_eligible`) and its padded image copy fits the stack (`fits_stack`).
    The one home of that rule: the template, the canonical key and the network's task keys call it."""
    return winograd_eligible(params) and _winograd_fits(params, layout)


def require_winograd(params: dict[str, ParamValue]) -> None:
    if not winograd_eligible(params):
        raise InputError(
            "conv2d: algo=winograd needs r=3, s=3, stride=1, dilation=1, got "
            f"r={params['r']}, s={params['s']}, stride={params['stride']}, dilation={params['dilation']}"
            f" (and groups=1 and one pad on every side, got groups={params['groups']}, pads "
            f"{pad_sides(params)})"
        )


class Conv2d:
    """2-D convolution (cross-correlation, as in every framework), float32, the kernel overwrites out.

    layout=nchw: input (n,c,h,w), weights (k,c,r,s) [OIHW, PyTorch/ONNX], output (n,k,oh,ow).
    layout=nhwc: input (n,h,w,c), weights (r,s,c,k) [HWIO, TensorFlow's tf.nn.conv2d], output (n,oh,ow,k).
    bias=1 adds a (k,) tensor, residual=1 a tensor shaped like the output; relu=1 clamps at 0, relu6=1
    to [0, 6]. prepacked=1: the weights are passed in the packed layout of the kernel's config.
    oh = (h+2pad-dil(r-1)-1)//stride+1. algo=winograd (3x3, stride 1, dilation 1 only) forces the Winograd
    F(2x2, 3x3) template (the same tensors and reference, fewer multiplies), algo=direct the direct one;
    algo=auto (the default) is the tuner's choice: both in one space where Winograd applies
    (`winograd_applies`), its indices the direct template's first (docs/design.md, Convolutions)."""

    name: ClassVar[str] = "conv2d"
    keys: ClassVar[tuple[str, ...]] = (
        "n",
        "c",
        "h",
        "w",
        "k",
        "r",
        "s",
        "stride",
        "pad",
        *SIDES,
        "dilation",
        "groups",
        "layout",
        "algo",
        *EPILOGUE,
        *PREPACKED,
        *ACTIVATION,
    )
    defaults: ClassVar[dict[str, ParamValue]] = {
        "stride": 1,
        "pad": 0,
        **SIDE_DEFAULTS,
        "dilation": 1,
        "groups": 1,
        "layout": "nchw",
        "algo": "auto",
        **EPILOGUE,
        **PREPACKED,
        **ACTIVATION,
    }
    optional: ClassVar[frozenset[str]] = frozenset(
        (*SIDES, "dilation", "groups", "layout", "algo", *EPILOGUE, *PREPACKED, *ACTIVATION)
    )
    words: ClassVar[dict[str, tuple[str, ...]]] = {
        "layout": ("nchw", "nhwc"),
        "algo": ("auto", "direct", "winograd"),
        **ACTIVATION_WORDS,
    }

    def validate(self, params: dict[str, ParamValue]) -> None:
        validate_conv(self.name, params, ("n", "c", "h", "w", "k", "r", "s", "groups"))
        groups = int(params["groups"])
        if int(params["c"]) % groups or int(params["k"]) % groups:
            raise InputError(
                f"conv2d: groups={groups} must divide both c={params['c']} and k={params['k']} (ONNX Conv)"
            )
        if params["algo"] == "winograd":
            require_winograd(params)

    def canonical(self, params: dict[str, ParamValue]) -> dict[str, ParamValue]:
        """One-sided pads folded, and algo=direct where Winograd does not apply is the default (auto is
        direct there): one key, and one log, for one space."""
        out = canonical_pads(params)
        if out["algo"] == "direct" and not winograd_applies(out, Layout(out["layout"])):
            out = {**out, "algo": "auto"}
        return out

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        sh = conv_shape(wl)
        cg = sh.per_group.c  # grouped weights hold one group's input channels (ONNX's (k, c/group, r, s))
        per = "c" if sh.groups == 1 else "c/groups"
        if sh.nhwc:
            io = (
                TensorSpec("input", (sh.n, sh.h, sh.w, sh.c)),
                TensorSpec("weights", (sh.r, sh.s, cg, sh.k), axes=f"r, s, {per}, k: HWIO", constant=True),
            )
            out = TensorSpec("output", (sh.n, sh.oh, sh.ow, sh.k), is_output=True)
        else:
            io = (
                TensorSpec("input", (sh.n, sh.c, sh.h, sh.w)),
                TensorSpec("weights", (sh.k, cg, sh.r, sh.s), axes=f"k, {per}, r, s: OIHW", constant=True),
            )
            out = TensorSpec("output", (sh.n, sh.k, sh.oh, sh.ow), is_output=True)
        return (*io, *epilogue_tensors(wl, sh.k, out.shape), out)

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        """im2col + one np.matmul per group: also the "numpy" baseline that benchmarks compare against."""
        sh = conv_shape(wl)
        g, one = sh.groups, sh.per_group
        x, wt = inputs[0], inputs[1]
        if sh.nhwc:  # view (n, r, s, c, oh, ow) -> columns (n, oh, ow, r, s, c) @ (r*s*c, k), per group
            win = windows(x, sh, (1, 2)).transpose(0, 4, 5, 1, 2, 3)
            rows = win.reshape(sh.n * sh.oh * sh.ow, sh.r * sh.s, g, one.c)
            hwio = wt.reshape(sh.r * sh.s, one.c, g, one.k)
            per = [rows[:, :, i].reshape(len(rows), -1) @ hwio[:, :, i].reshape(-1, one.k) for i in range(g)]
            out = np.stack(per, axis=1).reshape(sh.n, sh.oh, sh.ow, sh.k)
            return apply_epilogue(wl, out, inputs[2:], axis=3)
        cols = windows(x, sh, (2, 3)).reshape(sh.n, g, one.c * sh.r * sh.s, sh.oh * sh.ow)
        oihw = wt.reshape(g, one.k, -1)
        out = np.stack([np.matmul(oihw[i], cols[:, i]) for i in range(g)], axis=1)
        return apply_epilogue(wl, out.reshape(sh.n, sh.k, sh.oh, sh.ow), inputs[2:], axis=1)

    def flops(self, wl: Workload) -> int:
        sh = conv_shape(wl)
        return 2 * sh.n * sh.k * sh.oh * sh.ow * sh.per_group.c * sh.r * sh.s

    onnx_ops: ClassVar[tuple[str, ...]] = ("Conv",)
    layouts: ClassVar[frozenset[Layout]] = frozenset(Layout)
    feature_sets: ClassVar[tuple[FeatureSet, ...]] = (DIRECT, WINOGRAD, AUTO)

    def template(self, wl: Workload, target: Target) -> ScheduleTemplate:
        algo = wl.value("algo")
        if algo == "winograd":
            return WinogradTemplate(wl, target)
        if algo == "auto" and winograd_applies(wl, Layout(wl.value("layout"))):
            parts = (("direct", Conv2dTemplate(wl, target)), ("winograd", WinogradTemplate(wl, target)))
            both = SumTemplate(wl, target, parts)
            # An untuned build runs the algorithm whose default config the analytic estimate rates higher
            # (the estimate in the direct's units, AUTO's last column): Winograd on the deep 3x3 layers,
            # direct where few channels leave its transforms unpaid.
            # (set on the sum itself: the estimate reads the sum's configs, so it cannot come first)
            estimates = auto_features(both, np.array([c.index for c in both.seeds()]))[:, -1]
            both.default_part = int(np.argmax(estimates))
            return both
        return Conv2dTemplate(wl, target)

    def features(self, template: ScheduleTemplate) -> tuple[FeatureSet, ScheduleTemplate]:
        """Winograd's own, the sum's (both blocks, AUTO), or the matmul's of the template a pointwise
        conv2d lowers through (the same space), or the direct template's."""
        if isinstance(template, SumTemplate):
            return AUTO, template
        if isinstance(template, WinogradTemplate):
            return WINOGRAD, template
        if isinstance(template, Conv2dTemplate) and template.as_matmul is not None:
            return MATMUL_FEATURES, template.as_matmul
        return DIRECT, template

    def anchor(self, graph: Graph, node: Node) -> Anchor | None:
        """A Conv of any group but depthwise's (group = channels, one input channel per group: that
        family's own template); a grouped one is `groups` independent convolutions in one kernel."""
        conv = read_conv(graph, node)
        if conv.depthwise:
            return None
        k = conv.weights.shape[0]
        groups = (("groups", conv.group),) if conv.group != 1 else ()
        sizes = (*conv.sizes((("k", k),)), ("dilation", conv.geometry[2]), *groups)
        return conv.anchor(node, self.name, sizes)

    def task_key(self, anchor: Anchor, switches: dict[str, ParamValue], layout: Layout) -> str:
        """In `layout`, prepacked=1 for constant weights (packed once at build time, xtune/firmware/build.py),
        and the algorithm left to the tuner where Winograd may run with constant weights (the sum of both
        spaces; Winograd has 2.25x fewer multiplies, with U = G g G^T made once at build time,
        docs/design.md, Convolutions). Weights that are an activation would be transformed on every call:
        those layers are direct (algo=direct)."""
        constant = anchor.weights is not None
        extra: tuple[tuple[str, ParamValue], ...] = layout_key(layout)
        # So do non-finite weights: the transform mixes each weight into 16 sums, and inf - inf makes NaN
        # of outputs that a direct convolution computes as +-inf (what ONNX Runtime gives); and a layer
        # whose padded image copy would exceed Winograd's stack budget is tuned and built direct.
        finite = anchor.weights is not None and bool(np.all(np.isfinite(anchor.weights)))
        sizes: dict[str, ParamValue] = {"dilation": 1, **dict(anchor.sizes)}
        if not finite and winograd_applies(sizes, layout):
            extra += (("algo", "direct"),)
        packed = {"prepacked": 1} if constant else {}
        return anchor.key(extra, {**switches, **packed})

    def onnx_nodes(self, wl: Workload, x: str, out: str, inits: Inits) -> list[onnx.NodeProto]:
        return conv_nodes(wl, wl["groups"], x, out, inits)

    def task_weights(self, wl: Workload, weights: np.ndarray) -> np.ndarray:
        """ONNX's OIHW weights (BatchNorm folded) in the workload's layout: HWIO (r, s, c, k) for nhwc
        (grouped: (k, c/groups, r, s) -> (r, s, c/groups, k), TensorFlow's grouped filter)."""
        if wl.value("layout") != "nhwc":
            return weights
        return np.ascontiguousarray(weights.transpose(2, 3, 1, 0))


def _winograd_fits(sizes: dict[str, ParamValue] | Workload, layout: Layout) -> bool:
    """Whether a Winograd kernel of these sizes keeps its padded image copy within its stack budget; a
    larger layer is tuned and built direct, rather than refused when its tasks are extracted."""
    n, c, h, w, k, r, s, stride, pad, dilation = (
        int(sizes[key]) for key in ("n", "c", "h", "w", "k", "r", "s", "stride", "pad", "dilation")
    )
    return fits_stack(ConvShape(n, c, h, w, k, r, s, stride, pad, dilation, layout is Layout.NHWC))
