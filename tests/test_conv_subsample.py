"""Strided 1x1 convolutions that pack the subsampled image: workloads and configs in, the packing's
executed copies and checked kernel outputs on the local board and under qemu-aarch64 out."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable

import pytest

from tests.test_conv import check
from xtune.boards.board import get_board
from xtune.ops.conv2d import Conv2dTemplate
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import ScheduleTemplate
from xtune.schedule.loopnest import Store, walk
from xtune.schedule.space import KnobValue
from xtune.target import get_target

# Odd sizes (9x11 at stride 2: 5x6 outputs, the last input row and column unread; 10x8 at stride 3; 31
# columns at stride 2: 16 outputs, whole chunks of even columns whose odd last float is past the row),
# channels no multiple of any vector width (19 in blocks of 16 and 4 with a tail; 21 out), both layouts,
# prepacked and not, bias and ReLU.
SHAPES = (
    "conv2d:n=1,c=19,h=9,w=11,k=21,r=1,s=1,stride=2,pad=0,bias=1,relu=1",
    "conv2d:n=2,c=19,h=10,w=8,k=21,r=1,s=1,stride=3,pad=0,layout=nhwc,bias=1",
    "conv2d:n=1,c=19,h=9,w=11,k=21,r=1,s=1,stride=2,pad=0,prepacked=1,relu=1",
    "conv2d:n=1,c=19,h=9,w=11,k=21,r=1,s=1,stride=2,pad=0,layout=nhwc,prepacked=1,bias=1",
    "conv2d:n=2,c=19,h=5,w=31,k=13,r=1,s=1,stride=2,pad=0,bias=1",
)

# Which configs a test checks: knob overrides from the space's tiles and channel blocks (ascending).
Pick = Callable[[list[str], list[int]], list[dict[str, KnobValue]]]


def variants(key: str, target: str, fixed: dict[str, KnobValue], pick: Pick) -> list[int]:
    """Indices of the default config with `fixed` set, then each of pick(tiles, channel blocks)'s knobs."""
    template = template_for(parse_workload(key), get_target(target))
    base = {**template.default_config().as_dict(), **fixed}
    tiles = [str(t) for t in template.space.knobs[0].options]
    blocks = sorted(int(o) for o in template.space.knobs[1].options)
    return [template.space.index_of({**base, **knobs}) for knobs in pick(tiles, blocks)]


def subsampled_configs(key: str, target: str) -> list[int]:
    """Subsampled configs: hwc copies by transposes (blocks of whole vectors) and by scalars, the chw copy;
    two channel blockings, both ends of the tile list."""
    return variants(
        key,
        target,
        {"subsample": 1},
        lambda tiles, _: [
            {"tile": tiles[0], "tile_ic": 16, "pack_layout": "hwc"},
            {"tile": tiles[-1], "tile_ic": 4, "pack_layout": "hwc"},
            {"tile_ic": 19, "pack_layout": "chw"},
        ],
    )


def stored(
    template: ScheduleTemplate, knobs: dict[str, KnobValue], buffer: str, scalars: bool = False
) -> int:
    """Floats (or, with `scalars`, scalar stores) one call of the default config with `knobs` writes into
    `buffer`."""
    config = template.space.config(template.space.index_of({**template.default_config().as_dict(), **knobs}))
    return sum(
        math.prod(loop.extent for loop in loops) * stmt.lanes
        for stmt, loops in walk(template.kernel(config, "k").body)
        if isinstance(stmt, Store) and stmt.buffer == buffer and (stmt.lanes == 1 or not scalars)
    )


def test_subsampling_copies_only_the_pixels_read_and_keeps_old_indices() -> None:
    """The subsampled copy is oh*ow pixels, stride^2 fewer than the whole image; a config logged before
    the knob existed (no `subsample`) is the same index with the old copy; elsewhere the knob has one
    option, so those spaces and their indices are unchanged."""
    key = "conv2d:n=1,c=8,h=12,w=12,k=16,r=1,s=1,stride=2,pad=0"
    template = template_for(parse_workload(key), get_target("x86-avx512"))
    assert isinstance(template, Conv2dTemplate)
    new = template.default_config()
    before: dict[str, KnobValue] = {"subsample": 0, "transpose_out": 0, "transpose_in": 0}
    old = template.space.index_of({**new.as_dict(), **before})
    assert stored(template, before, "Ip") == 8 * 12 * 12
    assert stored(template, {}, "Ip") == 8 * 6 * 6
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
    return variants(
        key,
        target,
        {"transpose_out": 1},
        lambda tiles, blocks: [
            {"tile": tiles[0], "tile_ic": blocks[-2]},
            {"tile": tiles[-1], "tile_ic": blocks[-1]},
            {"tile_ic": blocks[-2]},
        ],
    )


def test_transposed_tiles_store_no_output_through_ot() -> None:
    """With transpose_out=1 and one channel block, every output is a vector store and Ot is unused."""
    key = "conv2d:n=1,c=8,h=12,w=12,k=16,r=3,s=3,stride=2,pad=1"
    template = template_for(parse_workload(key), get_target("x86-avx512"))
    assert stored(template, {"transpose_out": 0}, "output", scalars=True) == 16 * 6 * 6
    assert stored(template, {"transpose_out": 1}, "output", scalars=True) == 0
    assert stored(template, {"transpose_out": 1}, "Ot") == 0


# NCHW input copied into the hwc block by transposes: blocks of 4, 8 and 16 of 20 channels (whole vectors
# on every board, then a tail block: zeros past its channels), rows of 21 and 13 columns (a partial chunk
# after whole ones, or only partial ones), a batch, padding on both sides.
TRANSPOSED_IN = (
    "conv2d:n=2,c=20,h=7,w=21,k=13,r=3,s=3,stride=2,pad=1,bias=1",
    "conv2d:n=1,c=20,h=9,w=13,k=8,r=3,s=3,stride=1,pad=2,algo=direct,prepacked=1,relu=1",
)


def transposed_in_configs(key: str, target: str) -> list[int]:
    fixed: dict[str, KnobValue] = {"transpose_in": 1, "pack_layout": "hwc"}
    return variants(key, target, fixed, lambda *_: [{"tile_ic": ic} for ic in (4, 8, 16)])


def test_transposed_input_copy_has_no_scalar_store() -> None:
    """A block of whole vectors of channels is copied by vector stores only, the old copy by scalars."""
    template = template_for(parse_workload(TRANSPOSED_IN[0]), get_target("x86-avx512"))
    knobs: dict[str, KnobValue] = {"tile_ic": 16, "pack_layout": "hwc"}
    assert stored(template, {**knobs, "transpose_in": 0}, "Ip", scalars=True) == 2 * 20 * 7 * 21
    assert stored(template, {**knobs, "transpose_in": 1}, "Ip", scalars=True) == 0


# (workload, its configs): every case on the host, one of each kind under qemu-aarch64 (4 lanes).
CASES = (
    *((key, subsampled_configs) for key in SHAPES),
    *((key, transposed_configs) for key in TRANSPOSED),
    *((key, transposed_in_configs) for key in TRANSPOSED_IN),
)
QEMU_CASES = (CASES[0], CASES[3], CASES[4], CASES[len(SHAPES)], CASES[len(SHAPES) + 1], CASES[-2])


@pytest.mark.parametrize(("key", "configs"), CASES)
def test_kernels_correct_on_host(key: str, configs: Callable[[str, str], list[int]]) -> None:
    check("local", key, configs(key, get_board("local").target.name))


@pytest.mark.parametrize(("key", "configs"), QEMU_CASES)
def test_kernels_correct_under_qemu_aarch64(key: str, configs: Callable[[str, str], list[int]]) -> None:
    board = get_board("qemu-aarch64")
    if shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary} (qemu-user)")
    check("qemu-aarch64", key, configs(key, board.target.name))
