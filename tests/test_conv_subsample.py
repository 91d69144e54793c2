"""Strided 1x1 convolutions that pack the subsampled image: workloads and configs in, the packing's
executed copies and checked kernel outputs on the local board and under qemu-aarch64 out."""

from __future__ import annotations

import math
import shutil

import pytest

from tests.test_conv import check
from xtune.boards.board import get_board
from xtune.ops.conv2d import Conv2dTemplate
from xtune.ops.registry import parse_workload, template_for
from xtune.schedule.loopnest import Store, walk
from xtune.target import get_target

# Odd sizes (9x11 at stride 2: 5x6 outputs, the last input row and column unread; 10x8 at stride 3),
# channels no multiple of any vector width (19 in blocks of 16 and 4 with a tail; 21 out), both layouts,
# prepacked and not, bias and ReLU.
SHAPES = (
    "conv2d:n=1,c=19,h=9,w=11,k=21,r=1,s=1,stride=2,pad=0,bias=1,relu=1",
    "conv2d:n=2,c=19,h=10,w=8,k=21,r=1,s=1,stride=3,pad=0,layout=nhwc,bias=1",
    "conv2d:n=1,c=19,h=9,w=11,k=21,r=1,s=1,stride=2,pad=0,prepacked=1,relu=1",
    "conv2d:n=1,c=19,h=9,w=11,k=21,r=1,s=1,stride=2,pad=0,layout=nhwc,prepacked=1,bias=1",
)


def subsampled_configs(key: str, target: str) -> list[int]:
    """Subsampled configs over both packed layouts, two channel blocks and both ends of the tile list."""
    template = template_for(parse_workload(key), get_target(target))
    base = template.default_config().as_dict()
    assert base["subsample"] == 1
    tiles = [str(t) for t in template.space.knobs[0].options]
    return [
        template.space.index_of({**base, "tile": tile, "tile_ic": ic, "pack_layout": pack})
        for tile, ic, pack in ((tiles[0], 16, "hwc"), (tiles[-1], 4, "chw"), (base["tile"], 19, "chw"))
    ]


def input_copies(template: Conv2dTemplate, index: int) -> int:
    """Floats the kernel stores into its packed input per call."""
    kernel = template.kernel(template.space.config(index), "k")
    return sum(
        math.prod(loop.extent for loop in loops) * stmt.lanes
        for stmt, loops in walk(kernel.body)
        if isinstance(stmt, Store) and stmt.buffer == "Ip"
    )


@pytest.mark.parametrize("key", SHAPES)
def test_subsampled_kernels_correct_on_host(key: str) -> None:
    check("local", key, subsampled_configs(key, get_board("local").target.name))


@pytest.mark.parametrize("key", SHAPES[::3])
def test_subsampled_kernels_correct_under_qemu_aarch64(key: str) -> None:
    board = get_board("qemu-aarch64")
    if shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary} (qemu-user)")
    check("qemu-aarch64", key, subsampled_configs(key, board.target.name))


def test_subsampling_copies_only_the_pixels_read_and_keeps_old_indices() -> None:
    """The subsampled copy is oh*ow pixels, stride^2 fewer than the whole image; a config logged before
    the knob existed (no `subsample`) is the same index with the old copy; elsewhere the knob has one
    option, so those spaces and their indices are unchanged."""
    key = "conv2d:n=1,c=8,h=12,w=12,k=16,r=1,s=1,stride=2,pad=0"
    template = template_for(parse_workload(key), get_target("x86-avx512"))
    assert isinstance(template, Conv2dTemplate)
    new = template.default_config()
    old_values = {**new.as_dict(), "subsample": 0, "transpose_out": 0, "transpose_in": 0}
    old = template.space.index_of(old_values)
    assert input_copies(template, old) == 8 * 12 * 12
    assert input_copies(template, new.index) == 8 * 6 * 6
    values = template.space.config(old).values
    logged = values[: [k for k, _ in values].index("subsample")]  # a record from before the knobs
    assert template.space.matches(old, logged) and not template.space.matches(new.index, logged)
    for other in ("r=3,s=3,stride=2,pad=1", "r=1,s=1,stride=2,pad=1"):
        spatial = template_for(
            parse_workload(f"conv2d:n=1,c=8,h=12,w=12,k=16,{other}"), get_target("x86-avx2")
        )
        assert {k.name: k.options for k in spatial.space.knobs}["subsample"] == (0,)


# NCHW tiles stored by transposes: a partial strip (21 channels), partial pixel tiles (odd widths), two
# channel blocks (the second starts from the output through Ot, then stores transposed), a residual, a
# grouped conv2d, the stride-2 stem's 7x7 window and a subsampled 1x1.
TRANSPOSED = (
    "conv2d:n=1,c=5,h=9,w=11,k=21,r=3,s=3,stride=2,pad=1,bias=1,relu=1",
    "conv2d:n=2,c=3,h=17,w=15,k=9,r=7,s=7,stride=2,pad=3,residual=1",
    "conv2d:n=1,c=12,h=7,w=9,k=18,r=3,s=3,stride=1,pad=1,groups=3,algo=direct,prepacked=1,bias=1",
    "conv2d:n=1,c=19,h=9,w=11,k=21,r=1,s=1,stride=2,pad=0,relu=1",
)


def transposed_configs(key: str, target: str) -> list[int]:
    """transpose_out=1 over both ends of the tile list and two channel blockings (one block; two or more)."""
    template = template_for(parse_workload(key), get_target(target))
    base = {**template.default_config().as_dict(), "transpose_out": 1}
    tiles = [str(t) for t in template.space.knobs[0].options]
    blocks = sorted(int(o) for o in template.space.knobs[1].options)
    whole, split = blocks[-1], blocks[-2]
    return [
        template.space.index_of({**base, "tile": tile, "tile_ic": ic})
        for tile, ic in ((tiles[0], split), (tiles[-1], whole), (base["tile"], split))
    ]


@pytest.mark.parametrize("key", TRANSPOSED)
def test_transposed_output_tiles_correct_on_host(key: str) -> None:
    check("local", key, transposed_configs(key, get_board("local").target.name))


@pytest.mark.parametrize("key", TRANSPOSED[:2])
def test_transposed_output_tiles_correct_under_qemu_aarch64(key: str) -> None:
    board = get_board("qemu-aarch64")
    if shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary} (qemu-user)")
    check("qemu-aarch64", key, transposed_configs(key, board.target.name))


def test_transposed_tiles_store_no_output_through_ot() -> None:
    """With transpose_out=1 and one channel block, every output is a vector store and Ot is unused."""
    key = "conv2d:n=1,c=8,h=12,w=12,k=16,r=3,s=3,stride=2,pad=1"
    template = template_for(parse_workload(key), get_target("x86-avx512"))
    for value, scalar in ((0, 16 * 6 * 6), (1, 0)):
        config = template.space.config(
            template.space.index_of({**template.default_config().as_dict(), "transpose_out": value})
        )
        kernel = template.kernel(config, "k")
        stores = [
            math.prod(loop.extent for loop in loops)
            for stmt, loops in walk(kernel.body)
            if isinstance(stmt, Store) and stmt.buffer == "output" and stmt.lanes == 1
        ]
        assert sum(stores) == scalar


# NCHW input copied into the hwc block by transposes: blocks of 4, 8 and 16 of 20 channels (whole vectors
# on every board, then a tail block: zeros past its channels), rows of 21 and 13 columns (a partial chunk
# after whole ones, or only partial ones), a batch, padding on both sides.
TRANSPOSED_IN = (
    "conv2d:n=2,c=20,h=7,w=21,k=13,r=3,s=3,stride=2,pad=1,bias=1",
    "conv2d:n=1,c=20,h=9,w=13,k=8,r=3,s=3,stride=1,pad=2,algo=direct,prepacked=1,relu=1",
)


def transposed_in_configs(key: str, target: str) -> list[int]:
    template = template_for(parse_workload(key), get_target(target))
    base = {**template.default_config().as_dict(), "transpose_in": 1, "pack_layout": "hwc"}
    return [template.space.index_of({**base, "tile_ic": ic}) for ic in (4, 8, 16)]


@pytest.mark.parametrize("key", TRANSPOSED_IN)
def test_transposed_input_copies_correct_on_host(key: str) -> None:
    check("local", key, transposed_in_configs(key, get_board("local").target.name))


def test_transposed_input_copies_correct_under_qemu_aarch64() -> None:
    board = get_board("qemu-aarch64")
    if shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary} (qemu-user)")
    check("qemu-aarch64", TRANSPOSED_IN[0], transposed_in_configs(TRANSPOSED_IN[0], board.target.name))


def test_transposed_input_copy_has_no_scalar_store() -> None:
    """A block of whole vectors of channels is copied by vector stores only, the old copy by scalars."""
    key = TRANSPOSED_IN[0]
    template = template_for(parse_workload(key), get_target("x86-avx512"))
    base = {**template.default_config().as_dict(), "tile_ic": 16, "pack_layout": "hwc"}
    for value, scalar in ((0, 2 * 20 * 7 * 21), (1, 0)):
        kernel = template.kernel(
            template.space.config(template.space.index_of({**base, "transpose_in": value})), "k"
        )
        stores = [
            math.prod(loop.extent for loop in loops)
            for stmt, loops in walk(kernel.body)
            if isinstance(stmt, Store) and stmt.buffer == "Ip" and stmt.lanes == 1
        ]
        assert sum(stores) == scalar
