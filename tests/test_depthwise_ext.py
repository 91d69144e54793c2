"""The NCHW depthwise template's "ext" taps (the `taps` knob): correct on the host and under qemu-aarch64
and qemu-riscv64 for tails, pads 0/1/2, strides 1/2, dilation, a multiplier and every epilogue; their
tiles load each input row's aligned vectors once and shift them by shuffles; the knob is the space's
last, and targets off AArch64 keep the "load" taps."""

from __future__ import annotations

import shutil

import pytest

from tests.test_conv import check
from xtune.boards.board import get_board
from xtune.ops.registry import parse_workload, template_for
from xtune.schedule.loopnest import For, Load, Shuffle, walk
from xtune.target import get_target

# Widths that leave a partial vector and a tail tile, pads 0/1/2, stride 2 with odd sizes (pad 2: both
# phases shifted by a lead), dilation 2, multiplier 2, bias + relu6, residual + relu, a batch, a 5x5 window.
SHAPES = (
    "depthwise:n=1,c=3,h=11,w=13,r=3,s=3,pad=1,bias=1,relu6=1",
    "depthwise:n=2,c=2,h=9,w=10,r=3,s=3,stride=2,pad=1,residual=1,relu=1",
    "depthwise:n=1,c=2,h=8,w=7,r=3,s=3,stride=2,pad=0",
    "depthwise:n=1,c=2,h=9,w=18,r=5,s=5,pad=2,dilation=2,multiplier=2,bias=1",
    "depthwise:n=1,c=3,h=10,w=9,r=3,s=3,stride=2,pad=1,multiplier=2,residual=1",
    "depthwise:n=1,c=2,h=11,w=21,r=3,s=3,stride=2,pad=2,relu=1",
)


def _ext_configs(key: str, target_name: str) -> list[int]:
    """The default with "ext" taps and with the tiles 1x1, 3x2 and 4x3, kh rolled and unrolled, both
    orders."""
    template = template_for(parse_workload(key), get_target(target_name))
    default = {**template.default_config().as_dict(), "taps": "ext"}
    tiles = template.space.knobs[0].options
    picks = [default, {**default, "order": "xy", "unroll_kh": 0}]
    picks += [{**default, "tile": tile} for tile in ("1x1", "3x2", "4x3") if tile in tiles]
    return [template.space.index_of(pick) for pick in picks]


@pytest.mark.parametrize("board", ["local", "qemu-aarch64", "qemu-riscv64"])
@pytest.mark.parametrize("key", SHAPES)
def test_ext_taps_are_correct(board: str, key: str) -> None:
    if board != "local" and shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    check(board, key, _ext_configs(key, get_board(board).target.name))


def test_an_ext_tile_loads_each_input_row_once_and_shifts_it() -> None:
    """At stride 1 a 4x3 tile reads its 4 + 2 input rows' 3 + 1 aligned vectors once each (not one load per
    tap), shifts out kw = 1 and 2 by 2 * 3 shuffles per row, and loads its 9 weights as 3 vectors."""
    key = "depthwise:n=1,c=2,h=16,w=48,r=3,s=3,pad=1"
    template = template_for(parse_workload(key), get_target("arm-a72-neon"))
    values = {**template.default_config().as_dict(), "tile": "4x3", "taps": "ext"}
    kernel = template.kernel(template.space.config(template.space.index_of(values)), "k")
    tile_loop = next(
        stmt for stmt, _ in walk(kernel.body) if isinstance(stmt, For) and stmt.var.startswith("x")
    )
    values_of = [getattr(stmt, "value", None) for stmt, _ in walk(tile_loop.body)]
    loads = [v for v in values_of if isinstance(v, Load)]
    assert [ld.buffer for ld in loads].count("Ip") == 6 * 4
    # Aligned: every Ip index a multiple of the 4 lanes (its constant and every coefficient).
    ip = [ld.index for ld in loads if ld.buffer == "Ip"]
    assert all(a.const % 4 == 0 and all(c % 4 == 0 for _, c in a.terms) for a in ip)
    assert sum(isinstance(v, Shuffle) for v in values_of) == 6 * 2 * 3
    assert [ld.buffer for ld in loads].count("weights") == 3


@pytest.mark.parametrize("target_name", ["x86-avx512", "x86-avx2", "x86-sse42", "riscv64-gcv"])
def test_defaults_off_aarch64_keep_the_load_taps(target_name: str) -> None:
    """The knob is the space's last, its first option the "load" taps: a config logged before it still
    means its config, and the defaults off AArch64 (and their objects) are what they were."""
    for key in SHAPES[:3]:
        template = template_for(parse_workload(key), get_target(target_name))
        default = template.default_config()
        assert default["taps"] == "load" and template.space.knobs[-1].name == "taps"
        older = tuple((k, v) for k, v in default.values if k != "taps")
        assert template.space.matches(default.index, older)


def test_aarch64_defaults_take_ext_taps() -> None:
    for name in ("arm-a72-neon", "arm-a53-neon", "arm-a76-dotprod"):
        template = template_for(parse_workload(SHAPES[0]), get_target(name))
        assert template.default_config()["taps"] == "ext"
