"""The direct conv2d template's resolved schedule (a config against a shape: block sizes and switches) and
the rules both its loop nest (direct_nest.py) and its features (features.py) ask: the packed image's
size, whether the input is subsampled, whether the NCHW copies and stores go by transposes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xtune.ops.conv import ConvShape


@dataclass(frozen=True)
class ConvSchedule:
    """A config resolved against the shape: effective block sizes and switches."""

    p: int  # output pixels per register tile
    nv: int  # output-channel vectors per register tile
    lanes: int
    cb: int  # input channels per block
    kb: int  # output channels per block, a multiple of nr
    ohb: int
    owb: int  # a multiple of p unless it covers the whole row
    order: str  # "pk": pixel tiles outside channel strips, "kp": strips outside
    red: str
    hwc: bool  # packed input layout: channel-minor (HWC) or planes (CHW)
    unroll_kw: bool
    unroll: int
    # The target's lane FMA, where the tile's input vectors fit (`tile_registers` with lanes of A): the
    # input of `lanes` consecutive channels (contiguous in the hwc copy) is loaded as one vector and each
    # lane feeds the FMAs of its channel, as matmul's `a_value` reads A.
    lane_fma: bool = False
    # A 1x1 window at a stride (`subsamples`): the packed input holds only the pixels the outputs read,
    # (y*stride, x*stride), so the copy moves stride^2 times fewer floats and the tile reads it at stride 1.
    subsample: bool = False
    # NCHW: store a tile by transposing each channel vector's pixels (`transposed_tile`) instead of a
    # scalar load and store per output through Ot.
    transpose_out: bool = False
    # NCHW into the hwc copy: whole vectors of the block's channels transposed by shuffles
    # (`transposed_copy`, where the block is whole vectors of channels) instead of a float at a time.
    transpose_in: bool = False
    integer_clamp: bool = False  # the target's: ReLU/ReLU6 on the accumulators' bits (`Epilogue.bits`)

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


def padded(sh: ConvShape) -> tuple[int, int]:
    return sh.padded


def transposes_input(on: Any, hwc: Any, subsample: Any, cb: Any, lanes: int, stride: int) -> Any:
    """Whether the NCHW input is copied into the hwc block by transposes (`transpose_in`): whole vectors of
    channels, the whole image or (stride 2) its even pixels. Scalars or numpy arrays of configs (the
    features' columns) alike."""
    return (on != 0) & (hwc != 0) & ((subsample == 0) | (stride == 2)) & (cb % lanes == 0) & (lanes > 1)


def transposes_output(on: Any, pixels: Any, lanes: int) -> Any:
    """Whether an NCHW tile of `pixels` pixels is stored by transposes (`transpose_out`): its pixels fit a
    vector (a tile of one pixel has nothing to transpose). Scalars or numpy arrays alike."""
    return (on != 0) & (pixels >= 2) & (pixels <= lanes)


def subsamples(sh: ConvShape) -> bool:
    """A strided 1x1 window without padding: each output pixel reads one input pixel, and only one in
    stride^2 of them is read at all; on the subsampled image the convolution is pointwise (a matmul)."""
    return sh.r == 1 and sh.s == 1 and sh.stride > 1 and sh.padded == (sh.h, sh.w)
