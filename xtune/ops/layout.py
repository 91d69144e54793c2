"""The layout a network runs in: one home for the choice (`Layout`, `DEFAULT`, `parse_layout`), for the
rule of what an operator runs in (`layout_for`: each family declares its `layouts`), and for the
conversions between ONNX's order and ours.

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


def layout_key(layout: Layout) -> tuple[tuple[str, str], ...]:
    """The `layout` item of a workload run in `layout`: none for NCHW, the key's default."""
    return (("layout", layout.value),) if layout is not Layout.NCHW else ()


def layout_for(layouts: frozenset[Layout], network: Layout) -> Layout:
    """The layout an operator that runs in `layouts` runs in within a network of layout `network`."""
    return network if network in layouts else Layout.NCHW


def parse_layout(text: str | Layout) -> Layout:
    """`text` as a Layout, or InputError in one line."""
    if isinstance(text, Layout):
        return text
    try:
        return Layout(text)
    except ValueError:
        known = ", ".join(lay.value for lay in Layout)
        raise InputError(f"unknown layout '{text}' (known: {known})") from None


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
    """The layout a task's workload runs in: its `layout` key; for an operator without one, the one layout
    its family runs in (the int8 convolutions: NHWC), else NCHW."""
    if "layout" in wl.operator.keys:
        return Layout(wl.value("layout"))
    only: frozenset[Layout] = getattr(wl.operator, "layouts", frozenset())  # a Family's (ops/family.py)
    return next(iter(only)) if len(only) == 1 else Layout.NCHW
