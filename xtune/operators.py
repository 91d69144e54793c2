"""Operators: what each op of a workload owns (its keys and their defaults, validation, tensors, numpy
reference and flop count), the fused epilogue every op takes, and the convolution geometry the
references and templates share. xtune/ops/registry.py finds them by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from xtune.errors import InputError
from xtune.ops.workload import ParamValue, TensorSpec, Workload

# The fused epilogue switches every operator takes, in the order they apply: out = conv/matmul
# (+ bias[channel]) (+ residual[same index as out]), then max(., 0) (relu) or min(max(., 0), 6) (relu6,
# the Clip(0, 6) of MobileNetV2). residual is a whole extra input tensor shaped like the output (ResNet's
# skip connection). All default to 0 and are left out of the text then, so older logs stay valid.
EPILOGUE = {"bias": 0, "residual": 0, "relu": 0, "relu6": 0}
# How the kernel reads its weights (conv2d's weights, matmul's B): prepacked=1, already in the packed
# layout of the kernel's config, as a network's constant weights are laid out at build time (the
# template's `kernel_inputs`, docs/design.md "Convolutions"); 0, as the tensors() say, packed per call as
# the config asks. The reference, the tensors and the flops are the same either way.
PREPACKED = {"prepacked": 0}


class Matmul:
    """C[m,n] = A[m,k] @ B[k,n] (+ bias[n]) (+ residual[m,n]) (then ReLU/ReLU6), float32; overwrites C.
    prepacked=1: B holds the weights, passed in the packed layout of the kernel's config."""

    name: ClassVar[str] = "matmul"
    keys: ClassVar[tuple[str, ...]] = ("m", "n", "k", *EPILOGUE, *PREPACKED)
    defaults: ClassVar[dict[str, ParamValue]] = {**EPILOGUE, **PREPACKED}
    optional: ClassVar[frozenset[str]] = frozenset((*EPILOGUE, *PREPACKED))
    words: ClassVar[dict[str, tuple[str, ...]]] = {}

    def validate(self, params: dict[str, ParamValue]) -> None:
        require_positive(self.name, params, ("m", "n", "k"))
        _require_switches(self.name, params)

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        m, n, k = wl["m"], wl["n"], wl["k"]
        return (
            TensorSpec("A", (m, k)),
            TensorSpec("B", (k, n), axes="k, n"),
            *_epilogue_tensors(wl, n, (m, n)),
            TensorSpec("C", (m, n), is_output=True),
        )

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        out = np.matmul(inputs[0], inputs[1], dtype=np.float32)
        return _epilogue(wl, out, inputs[2:], axis=1)

    def flops(self, wl: Workload) -> int:
        return 2 * wl["m"] * wl["n"] * wl["k"]


def _epilogue_tensors(wl: Workload, channels: int, out_shape: tuple[int, ...]) -> tuple[TensorSpec, ...]:
    """The epilogue's extra inputs, between the operator's own inputs and its output: bias, residual."""
    bias = (TensorSpec("bias", (channels,)),) if wl["bias"] else ()
    residual = (TensorSpec("residual", out_shape),) if wl["residual"] else ()
    return (*bias, *residual)


def _epilogue(wl: Workload, out: np.ndarray, extra: list[np.ndarray], axis: int) -> np.ndarray:
    """out + bias along `axis` + residual, then ReLU or ReLU6: the numpy side of the fused epilogue.
    `extra` are the inputs after the operator's own (the `_epilogue_tensors`)."""
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
    return out.astype(np.float32, copy=False)


def require_positive(op: str, params: dict[str, ParamValue], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key not in params:
            raise InputError(f"{op}: missing size '{key}'")
        value = params[key]
        if not isinstance(value, int) or value <= 0:
            raise InputError(f"{op}: '{key}' must be a positive integer, got {value}")


def _require_switches(op: str, params: dict[str, ParamValue]) -> None:
    for key in (*EPILOGUE, *(k for k in PREPACKED if k in params)):
        if params[key] not in (0, 1):
            raise InputError(f"{op}: '{key}' must be 0 or 1, got {params[key]}")
    if params["relu"] and params["relu6"]:
        raise InputError(f"{op}: 'relu' and 'relu6' exclude each other (relu6 already clamps at 0)")


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

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.pad - self.dilation * (self.r - 1) - 1) // self.stride + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.pad - self.dilation * (self.s - 1) - 1) // self.stride + 1


def conv_shape(wl: Workload) -> ConvShape:
    depthwise = wl.op == "depthwise"
    mult = wl["multiplier"] if depthwise else 1
    k = wl["c"] * mult if depthwise else wl["k"]
    return ConvShape(
        wl["n"], wl["c"], wl["h"], wl["w"], k, wl["r"], wl["s"], wl["stride"], wl["pad"], wl["dilation"],
        wl.value("layout") == "nhwc", mult,
    )  # fmt: skip


def _validate_conv(op: str, params: dict[str, ParamValue], sizes: tuple[str, ...]) -> None:
    require_positive(op, params, (*sizes, "stride", "dilation"))
    _require_switches(op, params)
    pad = params["pad"]
    if not isinstance(pad, int) or pad < 0:
        raise InputError(f"{op}: 'pad' must be a non-negative integer, got {pad}")
    for size, kernel in (("h", "r"), ("w", "s")):
        span = int(params["dilation"]) * (int(params[kernel]) - 1) + 1
        if span > int(params[size]) + 2 * pad:
            raise InputError(
                f"{op}: the kernel spans {span} along {size} (dilation {params['dilation']}), more than "
                f"the padded input's {int(params[size]) + 2 * pad}"
            )


def winograd_eligible(params: dict[str, ParamValue] | Workload) -> bool:
    """Whether a conv2d may take algo=winograd (F(2x2, 3x3), templates/winograd.py): a 3x3 window at
    stride 1 without dilation. The one home of the rule: validation and task extraction call it."""
    return all(params[key] == value for key, value in (("r", 3), ("s", 3), ("stride", 1), ("dilation", 1)))


def _require_winograd(params: dict[str, ParamValue]) -> None:
    if not winograd_eligible(params):
        raise InputError(
            "conv2d: algo=winograd needs r=3, s=3, stride=1, dilation=1, got "
            f"r={params['r']}, s={params['s']}, stride={params['stride']}, dilation={params['dilation']}"
        )


def _windows(x: np.ndarray, sh: ConvShape, axes: tuple[int, int]) -> np.ndarray:
    """A view of the padded input with two (window, output) axis pairs per spatial axis, no copy."""
    pads = [(0, 0)] * x.ndim
    for axis in axes:
        pads[axis] = (sh.pad, sh.pad)
    x = np.pad(x, pads)
    shape, strides = list(x.shape), list(x.strides)
    ha, wa = axes
    shape[ha : wa + 1] = [sh.r, sh.s]
    strides[ha : wa + 1] = [x.strides[ha] * sh.dilation, x.strides[wa] * sh.dilation]
    out_shape = (sh.oh, sh.ow)
    out_strides = (x.strides[ha] * sh.stride, x.strides[wa] * sh.stride)
    return np.lib.stride_tricks.as_strided(x, (*shape, *out_shape), (*strides, *out_strides), writeable=False)


class Conv2d:
    """2-D convolution (cross-correlation, as in every framework), float32, the kernel overwrites out.

    layout=nchw: input (n,c,h,w), weights (k,c,r,s) [OIHW, PyTorch/ONNX], output (n,k,oh,ow).
    layout=nhwc: input (n,h,w,c), weights (r,s,c,k) [HWIO, TensorFlow's tf.nn.conv2d], output (n,oh,ow,k).
    bias=1 adds a (k,) tensor, residual=1 a tensor shaped like the output; relu=1 clamps at 0, relu6=1
    to [0, 6]. prepacked=1: the weights are passed in the packed layout of the kernel's config.
    oh = (h+2pad-dil(r-1)-1)//stride+1. algo=winograd (3x3, stride 1, dilation 1 only) picks the Winograd
    F(2x2, 3x3) template: the same tensors and reference, fewer multiplies."""

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
        "dilation",
        "layout",
        "algo",
        *EPILOGUE,
        *PREPACKED,
    )
    defaults: ClassVar[dict[str, ParamValue]] = {
        "stride": 1,
        "pad": 0,
        "dilation": 1,
        "layout": "nchw",
        "algo": "direct",
        **EPILOGUE,
        **PREPACKED,
    }
    optional: ClassVar[frozenset[str]] = frozenset(("dilation", "layout", "algo", *EPILOGUE, *PREPACKED))
    words: ClassVar[dict[str, tuple[str, ...]]] = {"layout": ("nchw", "nhwc"), "algo": ("direct", "winograd")}

    def validate(self, params: dict[str, ParamValue]) -> None:
        _validate_conv(self.name, params, ("n", "c", "h", "w", "k", "r", "s"))
        if params["algo"] == "winograd":
            _require_winograd(params)

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        sh = conv_shape(wl)
        if sh.nhwc:
            io = (
                TensorSpec("input", (sh.n, sh.h, sh.w, sh.c)),
                TensorSpec("weights", (sh.r, sh.s, sh.c, sh.k), axes="r, s, c, k: HWIO"),
            )
            out = TensorSpec("output", (sh.n, sh.oh, sh.ow, sh.k), is_output=True)
        else:
            io = (
                TensorSpec("input", (sh.n, sh.c, sh.h, sh.w)),
                TensorSpec("weights", (sh.k, sh.c, sh.r, sh.s), axes="k, c, r, s: OIHW"),
            )
            out = TensorSpec("output", (sh.n, sh.k, sh.oh, sh.ow), is_output=True)
        return (*io, *_epilogue_tensors(wl, sh.k, out.shape), out)

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        """im2col + one np.matmul: also the "numpy" baseline that benchmarks compare against."""
        sh = conv_shape(wl)
        x, wt = inputs[0], inputs[1]
        if sh.nhwc:  # view (n, r, s, c, oh, ow) -> columns (n, oh, ow, r, s, c) @ (r*s*c, k)
            win = _windows(x, sh, (1, 2)).transpose(0, 4, 5, 1, 2, 3)
            rows = win.reshape(sh.n * sh.oh * sh.ow, sh.r * sh.s * sh.c)
            out = np.matmul(rows, wt.reshape(-1, sh.k)).reshape(sh.n, sh.oh, sh.ow, sh.k)
            return _epilogue(wl, out, inputs[2:], axis=3)
        cols = _windows(x, sh, (2, 3)).reshape(sh.n, sh.c * sh.r * sh.s, sh.oh * sh.ow)
        out = np.matmul(wt.reshape(sh.k, -1), cols).reshape(sh.n, sh.k, sh.oh, sh.ow)
        return _epilogue(wl, out, inputs[2:], axis=1)

    def flops(self, wl: Workload) -> int:
        sh = conv_shape(wl)
        return 2 * sh.n * sh.k * sh.oh * sh.ow * sh.c * sh.r * sh.s


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
        "multiplier",
        "dilation",
        "layout",
        *EPILOGUE,
    )
    defaults: ClassVar[dict[str, ParamValue]] = {
        "stride": 1,
        "pad": 0,
        "multiplier": 1,
        "dilation": 1,
        "layout": "nchw",
        **EPILOGUE,
    }
    optional: ClassVar[frozenset[str]] = frozenset(("multiplier", "dilation", "layout", *EPILOGUE))
    words: ClassVar[dict[str, tuple[str, ...]]] = {"layout": ("nchw", "nhwc")}

    def validate(self, params: dict[str, ParamValue]) -> None:
        _validate_conv(self.name, params, ("n", "c", "h", "w", "r", "s", "multiplier"))

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        sh = conv_shape(wl)
        wt: tuple[int, ...]
        if sh.nhwc:
            x, wt, out = (sh.n, sh.h, sh.w, sh.c), (sh.r, sh.s, sh.k), (sh.n, sh.oh, sh.ow, sh.k)
        else:
            x, wt, out = (sh.n, sh.c, sh.h, sh.w), (sh.k, 1, sh.r, sh.s), (sh.n, sh.k, sh.oh, sh.ow)
        return (
            TensorSpec("input", x), TensorSpec("weights", wt),
            *_epilogue_tensors(wl, sh.k, out), TensorSpec("output", out, is_output=True),
        )  # fmt: skip

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        sh = conv_shape(wl)
        if sh.nhwc:  # view (n, r, s, c, oh, ow) -> taps (n, oh, ow, c) per (i, j)
            win = _windows(inputs[0], sh, (1, 2)).transpose(0, 1, 2, 4, 5, 3)
            wt = inputs[1].reshape(sh.r, sh.s, sh.c, sh.multiplier)
            out = np.zeros((sh.n, sh.oh, sh.ow, sh.c, sh.multiplier), dtype=np.float32)
            for i in range(sh.r):  # the same r*s multiply-adds in the same order as NCHW's
                for j in range(sh.s):
                    out += win[:, i, j, ..., None] * wt[i, j]
            return _epilogue(wl, out.reshape(sh.n, sh.oh, sh.ow, sh.k), inputs[2:], axis=3)
        win = _windows(inputs[0], sh, (2, 3))  # (n, c, r, s, oh, ow)
        wt = inputs[1].reshape(1, sh.c, sh.multiplier, sh.r, sh.s, 1, 1)
        out = np.zeros((sh.n, sh.c, sh.multiplier, sh.oh, sh.ow), dtype=np.float32)
        for i in range(sh.r):  # r*s whole-tensor multiply-adds: vectorized, and exact in fp32 order
            for j in range(sh.s):
                out += win[:, :, None, i, j] * wt[:, :, :, i, j]
        return _epilogue(wl, out.reshape(sh.n, sh.k, sh.oh, sh.ow), inputs[2:], axis=1)

    def flops(self, wl: Workload) -> int:
        sh = conv_shape(wl)
        return 2 * sh.n * sh.k * sh.oh * sh.ow * sh.r * sh.s
