"""Depthwise convolution in NHWC (layout=nhwc): the grammar, the numpy reference, the channel-vectorized
template (correct on every board, tuned with xgb), its features, and the ONNX Runtime peer."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import QEMU_BOARDS, CliRunner
from tests.nest_interp import run_kernel
from tests.test_conv import check, configs, direct_conv
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.ops.conv import conv_shape
from xtune.ops.depthwise.nhwc import DepthwiseNhwcTemplate
from xtune.ops.depthwise.nhwc_tiles import interiors, pair_registers, reuses_rows, tile_registers
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import compare_output, random_inputs
from xtune.schedule.loopnest import Binary, Const, For, Load, walk
from xtune.target import get_target
from xtune.tuning.database import TuningLog, log_target, read_logs
from xtune.tuning.features import estimate_prior, feature_names, features_op, featurize
from xtune.tuning.options import MeasureOptions, TuneOptions
from xtune.tuning.ranking import best
from xtune.tuning.run import run_tuning
from xtune.tuning.tuner import make_tuner

# Stride 2 with odd input sizes, pad 0 and 2, channels no multiple of any vector width (and more than
# one strip of the widest tile), multiplier 2 (with stride 2 and with dilation), bias + relu6, residual,
# dilation 2, a batch, a 5x5 window, an image smaller than the window's padding reach.
SHAPES = (
    "depthwise:n=1,c=37,h=11,w=13,r=3,s=3,stride=2,pad=1,layout=nhwc,bias=1,relu6=1",
    "depthwise:n=2,c=19,h=9,w=7,r=3,s=3,stride=2,pad=0,layout=nhwc,relu=1",
    "depthwise:n=1,c=21,h=10,w=12,r=5,s=5,stride=1,pad=2,layout=nhwc,bias=1,residual=1,relu=1",
    "depthwise:n=1,c=5,h=9,w=11,r=3,s=3,stride=2,pad=1,multiplier=2,layout=nhwc,bias=1",
    "depthwise:n=1,c=3,h=11,w=9,r=3,s=3,stride=1,pad=2,dilation=2,multiplier=2,layout=nhwc,relu6=1",
    "depthwise:n=1,c=70,h=7,w=7,r=3,s=3,stride=1,pad=1,layout=nhwc,bias=1,residual=1,relu6=1",
    "depthwise:n=1,c=9,h=2,w=3,r=3,s=3,stride=1,pad=2,layout=nhwc",
)


# ---- the grammar and the reference ----------------------------------------------------------------


def test_layout_round_trips_and_defaults_to_nchw() -> None:
    wl = parse_workload("depthwise:n=1,c=8,h=6,w=5,r=3,s=3,pad=1,multiplier=2,layout=nhwc,bias=1")
    assert wl.key == "depthwise:n=1,c=8,h=6,w=5,r=3,s=3,stride=1,pad=1,multiplier=2,layout=nhwc,bias=1"
    assert parse_workload(wl.key) == wl and conv_shape(wl).nhwc
    assert [(t.name, t.shape) for t in wl.tensors()] == [
        ("input", (1, 6, 5, 8)),
        ("weights", (3, 3, 16)),
        ("bias", (16,)),
        ("output", (1, 6, 5, 16)),
    ]
    nchw = parse_workload("depthwise:n=1,c=8,h=6,w=5,r=3,s=3,pad=1,layout=nchw")
    assert "layout" not in nchw.key and not conv_shape(nchw).nhwc
    assert nchw == parse_workload("depthwise:n=1,c=8,h=6,w=5,r=3,s=3,pad=1")


@pytest.mark.parametrize("value", ["NHWC", "nhcw", "1", ""])
def test_a_bad_layout_is_refused_naming_the_words(value: str) -> None:
    with pytest.raises(InputError, match="'layout' must be one of nchw, nhwc"):
        parse_workload(f"depthwise:n=1,c=3,h=8,w=8,r=3,s=3,layout={value}")


def test_a_bad_layout_is_one_line_and_exit_2(xtune_cli: CliRunner) -> None:
    out = xtune_cli("bench", "--workload", "depthwise:n=1,c=3,h=8,w=8,r=3,s=3,layout=hwc")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "'layout' must be one of nchw, nhwc" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("key", SHAPES)
def test_reference_matches_the_definition_and_the_nchw_form(key: str) -> None:
    wl = parse_workload(key)
    sh = conv_shape(wl)
    inputs = random_inputs(wl)
    got = wl.reference(inputs)
    np.testing.assert_allclose(got, _definition(key, inputs), rtol=1e-5, atol=1e-5)
    # The same convolution in NCHW, on the same numbers laid out as that form takes them.
    nchw = parse_workload(key.replace(",layout=nhwc", ""))
    x, w, *rest = inputs
    moved = [x.transpose(0, 3, 1, 2), w.transpose(2, 0, 1).reshape(sh.k, 1, sh.r, sh.s)]
    if wl["bias"]:
        moved.append(rest.pop(0))
    moved += [r.transpose(0, 3, 1, 2) for r in rest]  # the residual
    np.testing.assert_array_equal(nchw.reference(moved).transpose(0, 2, 3, 1), got)


def _definition(key: str, inputs: list[np.ndarray]) -> np.ndarray:
    """test_conv's loop-by-loop oracle (given the (r, s, k) weights as HWIO (r, s, 1, k)), plus the
    residual it leaves out, then the clamp."""
    wl = parse_workload(key)
    x, w, *rest = inputs
    plain = key.replace("relu6=1", "relu=0").replace("relu=1", "relu=0")
    out = direct_conv(plain, [x, w[:, :, None, :], *rest])
    if wl["residual"]:
        out = out + rest[-1]
    if wl["relu"] or wl["relu6"]:
        out = np.clip(out, 0, 6 if wl["relu6"] else None)
    return out


# ---- the template -----------------------------------------------------------------------------------


@pytest.mark.parametrize("board", ["local", *QEMU_BOARDS])
@pytest.mark.parametrize("key", SHAPES)
def test_correct_on_every_board(board: str, key: str) -> None:
    if board != "local" and shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    check(board, key, configs(key, get_board(board).target.name, 3))


@pytest.mark.parametrize("target_name", ["x86-avx512", "x86-avx2", "arm-a72-neon", "riscv64-gc"])
def test_channels_are_the_vectors_and_the_input_is_read_in_place(target_name: str) -> None:
    """Every input and weight load of the default kernel is a whole channel vector (a partial one only for
    the last channels), each weight vector is loaded once per kernel row of a tile, and with multiplier 1
    nothing is copied: no local buffer, padding is peeled borders, not a padded copy."""
    key = "depthwise:n=1,c=67,h=7,w=7,r=3,s=3,stride=2,pad=1,layout=nhwc,bias=1,relu6=1"
    target = get_target(target_name)
    template = template_for(parse_workload(key), target)
    assert isinstance(template, DepthwiseNhwcTemplate)
    kernel = template.kernel(template.default_config(), "k")
    assert kernel.stack_bytes == 0
    loads = [v for stmt, _ in walk(kernel.body) for v in _loads(stmt)]
    assert {ld.lanes for ld in loads if ld.buffer in ("input", "weights")} == {target.fp32_lanes}
    partial = {ld.count for ld in loads if ld.buffer == "input" and ld.count}
    assert partial <= {67 % target.fp32_lanes}


def _loads(stmt: object) -> list[Load]:
    found: list[Load] = []

    def visit(value: object) -> None:
        if isinstance(value, Load):
            found.append(value)
        for child in getattr(value, "__dict__", {}).values():
            if hasattr(child, "__dataclass_fields__"):
                visit(child)

    value = getattr(stmt, "value", None)
    if value is not None:
        visit(value)
    return found


@pytest.mark.parametrize("target_name", ["x86-avx512", "x86-avx2", "arm-a72-neon", "riscv64-gcv"])
def test_the_default_tile_leaves_a_register_spare(target_name: str) -> None:
    target = get_target(target_name)
    for key in (
        "depthwise:n=1,c=960,h=7,w=7,r=3,s=3,pad=1,layout=nhwc",
        "depthwise:n=1,c=96,h=112,w=112,r=3,s=3,stride=2,pad=1,layout=nhwc",
    ):
        template = template_for(parse_workload(key), target)
        assert isinstance(template, DepthwiseNhwcTemplate)
        s = template.schedule(template.default_config())
        live = pair_registers if s.rows == 2 else tile_registers
        assert live(template.shape, s.p, s.nv) < target.vector_registers


# Two-row tiles: stride 1 without epilogue (accumulators start as products) and an odd interior (a row
# left to the one-row tile), stride 2 with bias, 5x5 with residual, a multiplier (runs the one-row tile).
PAIR_SHAPES = (
    "depthwise:n=1,c=10,h=10,w=9,r=3,s=3,pad=1,layout=nhwc",
    "depthwise:n=1,c=37,h=11,w=13,r=3,s=3,stride=2,pad=1,layout=nhwc,bias=1,relu6=1",
    "depthwise:n=2,c=6,h=9,w=8,r=5,s=5,pad=2,layout=nhwc,residual=1,relu=1",
    "depthwise:n=1,c=5,h=9,w=11,r=3,s=3,stride=2,pad=1,multiplier=2,layout=nhwc,bias=1",
)


def _pair_configs(key: str, target_name: str) -> list[int]:
    """The default with two rows and with the tiles 1x1 and 3x2, interior rows in blocks of 1 (no pair:
    all one-row tiles) and of the whole interior."""
    template = template_for(parse_workload(key), get_target(target_name))
    default = template.default_config().as_dict()
    tiles = template.space.knobs[0].options
    blocks = template.space.knobs[2].options
    picks = [{**default, "rows": 2, "tile": tile} for tile in ("1x1", "3x2") if tile in tiles]
    picks += [{**default, "rows": 2, "tile_oh": oh} for oh in (min(blocks), max(blocks))]
    return [template.space.index_of(pick) for pick in picks]


@pytest.mark.parametrize("board", ["local", "qemu-aarch64"])
@pytest.mark.parametrize("key", PAIR_SHAPES)
def test_two_row_tiles_are_correct(board: str, key: str) -> None:
    if board != "local" and shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    check(board, key, _pair_configs(key, get_board(board).target.name))


def test_two_row_tiles_load_each_input_vector_once_and_the_weights_once_per_strip() -> None:
    """At stride 1 a 6x1 two-row tile loads its r+1 input rows' 6+2 columns once each (not 2*r rows),
    no weight (the strip's 9 are loaded outside the pixel loop), and starts its 12 accumulators by a
    multiply, not from zero."""
    key = "depthwise:n=1,c=8,h=16,w=14,r=3,s=3,pad=1,layout=nhwc"
    template = template_for(parse_workload(key), get_target("arm-a72-neon"))
    config = template.default_config()
    assert (config["rows"], config["tile"]) == (2, "6x1")
    kernel = template.kernel(config, "k")
    tile_loop = next(  # an interior pair's (a constant border pair leaves out the taps on padding)
        stmt
        for stmt, loops in walk(kernel.body)
        if isinstance(stmt, For) and stmt.var.startswith("px") and any(f.var.startswith("yp") for f in loops)
    )
    body = [stmt for stmt, _ in walk(tile_loop.body)]
    loads = [ld for stmt in body for ld in _loads(stmt)]
    assert sum(ld.buffer == "input" for ld in loads) == 4 * 8
    assert not [ld for ld in loads if ld.buffer == "weights"]
    multiplies = [stmt for stmt in body if isinstance(getattr(stmt, "value", None), Binary)]
    assert len(multiplies) == 12 and not [s for s in body if isinstance(getattr(s, "value", None), Const)]


@pytest.mark.parametrize("target_name", ["x86-avx512", "x86-avx2", "x86-sse42", "riscv64-gcv"])
def test_defaults_off_aarch64_keep_the_one_row_tile(target_name: str) -> None:
    """The knob is the space's last, its first option the one-row tile: a config logged before it still
    means its config, and the x86 defaults (and objects) are what they were."""
    for key in PAIR_SHAPES[:3]:
        template = template_for(parse_workload(key), get_target(target_name))
        default = template.default_config()
        assert default["rows"] == 1 and template.space.knobs[-1].name == "rows"
        older = tuple((k, v) for k, v in default.values if k != "rows")
        assert template.space.matches(default.index, older)


@pytest.mark.parametrize("target_name", ["x86-avx512", "x86-avx2", "arm-a72-neon", "riscv64-gcv"])
def test_the_default_channel_block_keeps_its_rows_in_l1(target_name: str) -> None:
    """The default's channel block, as the schedule resolves it (whole strips of the tile), is one whose
    input rows stay in L1 for the next output row whenever a block of the space can: a strip wider than
    that block would round it up past L1 (112-wide rows of 96 channels: 16 channels fit, 32 do not)."""
    target = get_target(target_name)
    for key in (
        "depthwise:n=1,c=96,h=112,w=112,r=3,s=3,stride=2,pad=1,layout=nhwc",
        "depthwise:n=1,c=32,h=112,w=112,r=3,s=3,pad=1,layout=nhwc",
        "depthwise:n=1,c=144,h=56,w=56,r=3,s=3,pad=1,layout=nhwc",
        "depthwise:n=1,c=960,h=7,w=7,r=3,s=3,pad=1,layout=nhwc",
    ):
        template = template_for(parse_workload(key), target)
        assert isinstance(template, DepthwiseNhwcTemplate)
        s = template.schedule(template.default_config())
        smallest = min(int(o) for o in template.space.knobs[1].options)  # tile_k
        assert reuses_rows(template.shape, s.kb, target) or not reuses_rows(template.shape, smallest, target)


def test_interiors_are_the_outputs_whose_window_misses_the_padding() -> None:
    sh = conv_shape(parse_workload("depthwise:n=1,c=8,h=14,w=15,r=3,s=3,stride=2,pad=1,layout=nhwc"))
    (ylo, yhi), (xlo, xhi) = interiors(sh)
    for lo, hi, extent, out in ((ylo, yhi, sh.h, sh.oh), (xlo, xhi, sh.w, sh.ow)):
        inside = [
            o for o in range(out) if o * sh.stride - sh.pad >= 0 and o * sh.stride - sh.pad + 2 < extent
        ]
        assert list(range(lo, hi)) == inside


def test_features_are_their_own_operator_and_finite() -> None:
    template = template_for(parse_workload(SHAPES[0]), get_target("x86-avx512"))
    assert features_op(template) == "depthwise_nhwc"
    indices = np.arange(min(template.space.size, 300))
    x = featurize(template, indices)
    assert x.shape == (len(indices), len(feature_names("depthwise_nhwc"))) and np.isfinite(x).all()
    nchw = template_for(parse_workload(SHAPES[0].replace(",layout=nhwc", "")), get_target("x86-avx512"))
    assert features_op(nchw) == "depthwise"


def test_a_short_xgb_tuning_run_finds_a_correct_best(tmp_path: Path) -> None:
    key = "depthwise:n=1,c=40,h=9,w=9,r=3,s=3,stride=1,pad=1,layout=nhwc,bias=1,relu6=1"
    wl, board = parse_workload(key), get_board("local")
    quick = MeasureOptions(repeat=2, min_repeat_ms=1.0, timeout_ms=2000)
    log = TuningLog(tmp_path / "log.jsonl")
    options = TuneOptions(tuner="xgb", trials=12, batch_size=4, seed=1, measure=quick, confirm=0)
    report = run_tuning(wl, [board], options, log)
    assert {k: v for k, v in report.counts if v} == {"ok": 12}
    (record,) = best(read_logs([tmp_path / "log.jsonl"]), wl.key, log_target(wl, board.target))
    assert record.index == report.best_index
    check("local", key, [record.index])  # the best config, built again, matches numpy
    # and so does its nest, run by the IR interpreter on other inputs
    template = template_for(wl, board.target)
    inputs = random_inputs(wl, seed=5)
    out = np.full(next(t for t in wl.tensors() if t.is_output).shape, np.nan, np.float32)
    run_kernel(template.kernel(template.space.config(record.index), "k"), [*inputs, out])
    assert compare_output(out, wl.reference(inputs), 1e-4) == ""


@pytest.mark.parametrize("board", ["local", *QEMU_BOARDS])
def test_the_estimates_pick_is_a_correct_kernel_on_every_board(board: str) -> None:
    """A cold xgb search's first batch is the default and the analytic estimate's top pick (no pretrained
    model has depthwise_nhwc): the pick is a config of the space that scores at least as well as 200
    random ones, and a correct kernel for odd channel counts, stride 2, padding 0 and 2 and multiplier 2."""
    if board != "local" and shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    target = get_board(board).target
    for key in SHAPES:
        template = template_for(parse_workload(key), target)
        prior = estimate_prior(features_op(template))
        assert prior is not None
        default = template.default_config().index
        tuner = make_tuner(
            "xgb", template.space, 0, partial(featurize, template), seeds=[default], estimate=prior
        )
        assert tuner.first_picks() == 2
        head = tuner.next_batch(2)
        assert head[0] == default and 0 <= head[1] < template.space.size
        drawn = np.random.default_rng(0).integers(template.space.size, size=200)
        scores = prior.predict(featurize(template, [head[1], *drawn.tolist()]))
        assert scores[0] >= scores[1:].max()
        check(board, key, head)
