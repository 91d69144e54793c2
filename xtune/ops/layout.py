"""The layout a network runs in: one home for the choice (`Layout`, `DEFAULT`, `parse_layout`), for what
each operator runs in (`RUNS_IN`), and for the conversions between ONNX's order and ours.

A network runs in NHWC by default on every target: with channels innermost, the vectors of conv2d run
along output channels (a 1x1 convolution is one matmul of the pixels by the weights, whatever the spatial
size), which on a Zen 5 made 3x3 and pointwise layers 10-16 % faster than in NCHW (docs/networks.md,
"Layout"). NCHW stays available (`--layout nchw`) to compare. Whatever the layout, the model's input and
output keep the shapes and order ONNX declares: the pass (xtune/firmware/relayout.py) converts the input
once at entry, any 4-D output at exit, and a tensor between operators that run in different layouts.
Only 4-D activations have a layout; every other tensor is the same in both.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from xtune.errors import InputError
from xtune.ops.workload import Workload


class Layout(Enum):
    NCHW = "nchw"  # ONNX's order: what the model's input and output are
    NHWC = "nhwc"  # channels innermost


DEFAULT = Layout.NHWC

_BOTH = frozenset(Layout)
_NCHW = frozenset((Layout.NCHW,))
# What each operator runs in (its kind: a workload's op, an xtune/ops/generated.py class name lowered, or
# "view"). An operator runs in the network's layout when it can, else in NCHW with conversions around it.
# Conv2d and depthwise tasks carry their layout in the workload key (xtune/operators.py; weights through
# `task_weights`). Matmul reads the last axis of ONNX's order (a 4-D input's W) and Softmax normalizes
# it; a view that changes the shape reinterprets ONNX's byte order. Concat runs in NHWC when it joins
# channels (ops.py makes any axis an outer/channels/inner split; the pass maps the axis). Elementwise
# operators and views that keep the shape (Identity, Dropout) take the layout their first input has.
RUNS_IN: dict[str, frozenset[Layout]] = {
    "conv2d": _BOTH,
    "depthwise": _BOTH,
    "matmul": _NCHW,
    "pool2d": _BOTH,
    "globalaveragepool": _BOTH,
    "concat": _BOTH,
    "elementwise": _BOTH,
    "softmax": _NCHW,
    "view": _NCHW,
}
FOLLOWS_INPUT = frozenset(("elementwise",))  # run in the layout their first input has


def parse_layout(text: str | Layout) -> Layout:
    """`text` as a Layout, or InputError in one line."""
    if isinstance(text, Layout):
        return text
    try:
        return Layout(text)
    except ValueError:
        known = ", ".join(lay.value for lay in Layout)
        raise InputError(f"unknown layout '{text}' (known: {known})") from None


def runs_in(kind: str, network: Layout) -> Layout:
    """The layout an operator of `kind` runs in within a network of layout `network`."""
    return network if network in RUNS_IN[kind] else Layout.NCHW


def differs(shape: tuple[int, ...]) -> bool:
    """Whether a tensor's NCHW and NHWC bytes differ: a 4-D shape with more than one channel and more than
    one pixel (after a global pool, (n, c, 1, 1) is the same bytes in both, and needs no conversion)."""
    return len(shape) == 4 and shape[1] > 1 and shape[2] * shape[3] > 1


def physical(shape: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
    """The shape of an ONNX (NCHW) 4-D shape stored in `layout`."""
    if layout is Layout.NCHW or len(shape) != 4:
        return shape
    n, c, h, w = shape
    return (n, h, w, c)


def to_layout(array: np.ndarray, layout: Layout) -> np.ndarray:
    """A constant 4-D NCHW activation in `layout` (contiguous)."""
    if layout is Layout.NCHW or array.ndim != 4:
        return array
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1))


def workload_layout(wl: Workload) -> Layout:
    """The layout a task's workload runs in: its `layout` key, NCHW for operators without one."""
    return Layout(wl.value("layout")) if "layout" in wl.operator.keys else Layout.NCHW


def task_weights(wl: Workload, weights: np.ndarray) -> np.ndarray:
    """A task's ONNX weights (OIHW for a Conv; BatchNorm folded) in its workload's weight layout
    (xtune/operators.py): conv2d nhwc takes HWIO (r, s, c, k), depthwise nhwc (r, s, c*multiplier) from
    ONNX's (c*multiplier, 1, r, s); matmul's (k, n) have no layout."""
    if workload_layout(wl) is Layout.NCHW or wl.op not in ("conv2d", "depthwise"):
        return weights
    if wl.op == "depthwise":
        return np.ascontiguousarray(weights.reshape(weights.shape[0], *weights.shape[2:]).transpose(1, 2, 0))
    return np.ascontiguousarray(weights.transpose(2, 3, 1, 0))
