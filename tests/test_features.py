"""Features: finite, relative to the target, an analytic estimate that orders the obvious cases, and the
blocks and register tiles the templates resolve (never a restatement of them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from xtune.ops.conv import conv_shape
from xtune.ops.conv2d import direct as conv2d_template
from xtune.ops.conv2d.direct import stack_clamped
from xtune.ops.conv2d.direct_schedule import padded
from xtune.ops.depthwise import nchw_tiles as depthwise_template
from xtune.ops.depthwise import nhwc_tiles as nhwc_template
from xtune.ops.matmul import template as matmul_template
from xtune.ops.matmul.features import MATMUL_FEATURES
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.tiles import tile_registers
from xtune.target import get_target, load_targets
from xtune.tuning.features import estimate_prior, feature_names, features_op, featurize

EST = MATMUL_FEATURES.index("est_eff")
VECTOR_TARGETS = ("x86-avx2", "x86-sse42", "x86-avx512", "arm-a72-neon", "riscv64-gcv")
SHAPES = ("matmul:m=512,n=512,k=512", "matmul:m=127,n=255,k=63", "matmul:m=1,n=1,k=1")


@pytest.mark.parametrize("target_name", sorted(load_targets()))
@pytest.mark.parametrize("workload", SHAPES)
def test_features_are_finite_and_the_estimate_is_a_fraction_of_peak(workload: str, target_name: str) -> None:
    template = template_for(parse_workload(workload), get_target(target_name))
    rng = np.random.default_rng(0)
    indices = rng.integers(template.space.size, size=200)
    x = featurize(template, indices)
    assert x.shape == (200, len(feature_names("matmul"))) and np.isfinite(x).all()
    assert ((x[:, EST] > 0) & (x[:, EST] <= 1.0)).all()


@pytest.mark.parametrize("target_name", VECTOR_TARGETS)
def test_the_estimate_prefers_the_default_over_a_degenerate_schedule(target_name: str) -> None:
    """A 1x1 register tile (of single registers on RVV: lmul 1), nothing packed, k in blocks of 8 and no
    unrolling is slow on any vector CPU: one FMA per two loads and a call per 8 k steps."""
    template = template_for(parse_workload("matmul:m=256,n=256,k=256"), get_target(target_name))
    default = template.default_config()
    single = {"lmul": 1} if "lmul" in default.as_dict() else {}
    degenerate = template.space.index_of(
        {**dict(default.values), "tile": "1x1", "kc": 8, "pack_a": 0, "pack_b": 0, "unroll_k": 1, **single}
    )
    est = featurize(template, [default.index, degenerate])[:, EST]
    assert est[0] > 2 * est[1]


def test_the_estimate_sees_register_tiles_that_hide_fma_latency() -> None:
    """Fewer accumulators than FMA latency x FMA ports leave the FMA units idle (Zen 3 / Intel
    optimization manuals: 4-cycle FMA latency, 2 ports), so 1x2 must score below 4x3 on AVX2."""
    template = template_for(parse_workload("matmul:m=240,n=240,k=256"), get_target("x86-avx2"))
    base = dict(template.default_config().values)
    small, large = (template.space.index_of({**base, "tile": t}) for t in ("1x2", "4x3"))
    est = featurize(template, [small, large])[:, EST]
    assert est[1] > 1.5 * est[0]


def test_the_prior_scores_by_the_estimate_column() -> None:
    template = template_for(parse_workload("matmul:m=64,n=64,k=64"), get_target("x86-avx2"))
    x = featurize(template, np.arange(50))
    prior = estimate_prior("matmul")
    assert prior is not None
    np.testing.assert_array_equal(prior.predict(x), x[:, EST])
    assert estimate_prior("conv2d") is None  # no estimate column: a cold tuner starts from random configs


# ---- the templates are the one home of what a config resolves to -------------------------------------

RESOLVED = (
    "matmul:m=512,n=512,k=512",
    "matmul:m=37,n=200,k=71",
    "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1,algo=direct",
    "conv2d:n=1,c=512,h=14,w=14,k=512,r=3,s=3,pad=1,algo=direct",  # the stack budget shrinks some blocks
    "conv2d:n=1,c=3,h=224,w=224,k=30,r=3,s=3,stride=2,pad=1,layout=nhwc",
    "depthwise:n=1,c=32,h=112,w=112,r=3,s=3,pad=1",
    "depthwise:n=1,c=16,h=33,w=57,r=5,s=5,stride=2,pad=2",
    "depthwise:n=1,c=960,h=7,w=7,r=3,s=3,pad=1,layout=nhwc",
    "depthwise:n=1,c=24,h=57,w=31,r=5,s=5,stride=2,pad=2,multiplier=2,dilation=2,layout=nhwc",
)


def _resolved_by_features(template: Any, indices: np.ndarray) -> list[dict[str, float]]:
    """The block sizes (and register use) the feature columns were computed from, recovered from them."""
    t, op = template.target, features_op(template)
    x = featurize(template, indices)

    def col(name: str) -> np.ndarray:
        return x[:, feature_names(op).index(name)]

    out: dict[str, np.ndarray] = {"acc": col("acc_regs_frac") * t.vector_registers}
    if op != "depthwise":
        out["used"] = col("regs_used_frac") * t.vector_registers
    if op == "depthwise_nhwc":
        sh = conv_shape(template.workload)
        reach = (sh.r - 1) * sh.dilation + 1
        out["dw_kb"] = 2 ** col("weights_l1") * t.l1d_bytes / (4 * sh.r * sh.s)
        block_rows = 2 ** col("row_block_l2") * t.l2_bytes * reach / (2 ** col("rows_l1") * t.l1d_bytes)
        out["dw_ohb"] = (block_rows - reach) / sh.stride + 1
    if op == "matmul":
        kc = np.array([template.space.config(i).int("kc") for i in indices.tolist()])
        out.update(mc=2 ** col("a_block_l2") * t.l2_bytes / (4 * kc), kc=kc)
        out["nc"] = 2 ** col("c_block_l2") * t.l2_bytes / (4 * out["mc"])
    elif op == "conv2d":
        sh = conv_shape(template.workload)
        hp, wp = padded(sh)
        cb = 2 ** col("input_block_l2") * t.l2_bytes / (4 * hp * wp)
        rows = 2 ** col("input_rows_l1") * t.l1d_bytes / (4 * wp * cb)
        out.update(cb=cb, kb=2 ** col("weight_block_l2") * t.l2_bytes / (4 * cb * sh.r * sh.s))
        out["ohb"] = (rows - (sh.r - 1) * sh.dilation - 1) / sh.stride + 1
    elif op == "depthwise":
        out["owb"] = col("block_cols_frac") * conv_shape(template.workload).ow
    return [{name: float(v[n]) for name, v in out.items()} for n in range(len(indices))]


@pytest.mark.parametrize("target_name", ["x86-avx2", "x86-sse42", "x86-avx512", "arm-a53-neon", "riscv64-gc"])
@pytest.mark.parametrize("workload", RESOLVED)
def test_features_see_the_blocks_the_template_resolves(workload: str, target_name: str) -> None:
    template: Any = template_for(parse_workload(workload), get_target(target_name))
    indices = np.random.default_rng(3).integers(0, template.space.size, 250)
    regs = template.target.vector_registers
    for i, seen in zip(indices.tolist(), _resolved_by_features(template, indices), strict=True):
        s = template.schedule(template.space.config(i))
        tile = (s.mr, s.nv) if hasattr(s, "mr") else (s.p, s.nv)
        rows = getattr(s, "rows", 1)  # NHWC depthwise: two-row tiles hold two rows of accumulators
        assert seen["acc"] == pytest.approx(rows * tile[0] * tile[1])
        if "dw_kb" in seen:  # NHWC depthwise: its own register count (s weight vectors per channel vector)
            live = nhwc_template.pair_registers if rows == 2 else nhwc_template.tile_registers
            assert seen["used"] == live(template.shape, *tile)
            assert (seen["dw_kb"], seen["dw_ohb"]) == pytest.approx((s.kb, s.ohb))
        elif "used" in seen:  # the tile the config names fits the register file, as the features count it
            assert seen["used"] == tile_registers(*tile) <= regs
        if template.workload.op == "matmul":
            assert (seen["mc"], seen["nc"], seen["kc"]) == pytest.approx((s.mc, s.nc, s.kc))
        elif template.workload.op == "conv2d":
            assert (seen["cb"], seen["ohb"]) == pytest.approx((s.cb, s.ohb))
            # The features see the output block the config asks for; the stack budget may then shrink it.
            kb = round(seen["kb"])
            assert kb == pytest.approx(seen["kb"]) and stack_clamped(template.shape, s.nr, s.cb, kb) == s.kb
        elif "owb" in seen:
            assert seen["owb"] == pytest.approx(s.owb)


def test_a_changed_block_rule_moves_template_and_features_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rule has one home in its template: change it there, and both the nest and the features follow."""
    whole_axis = lambda block, extent, tile: np.where(np.asarray(block) >= 0, extent, block)  # noqa: E731
    monkeypatch.setattr(matmul_template, "whole_tiles", whole_axis)

    def one_strip(sh: object, nr: object, ic: object, oc: object, oh: object) -> tuple[np.ndarray, ...]:
        ones = np.ones_like(np.asarray(ic, dtype=np.float64))
        return ones, ones * nr, ones  # type: ignore[operator]

    monkeypatch.setattr(conv2d_template, "channel_blocks", one_strip)
    monkeypatch.setattr(
        depthwise_template, "column_block", lambda sh, width, ow: whole_axis(ow, sh.ow, width)
    )
    monkeypatch.setattr(nhwc_template, "channel_block", lambda sh, nr, tile_k: whole_axis(tile_k, sh.k, nr))
    for workload in (
        "matmul:m=300,n=200,k=64",
        "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1,algo=direct",
        "depthwise:n=1,c=32,h=112,w=112,r=3,s=3,pad=1",
        "depthwise:n=1,c=96,h=14,w=14,r=3,s=3,pad=1,layout=nhwc",
    ):
        template: Any = template_for(parse_workload(workload), get_target("x86-avx2"))
        indices = np.random.default_rng(4).integers(0, template.space.size, 50)
        for i, seen in zip(indices.tolist(), _resolved_by_features(template, indices), strict=True):
            s = template.schedule(template.space.config(i))
            if template.workload.op == "matmul":
                assert s.mc == 300 and s.nc == 200 and (seen["mc"], seen["nc"]) == pytest.approx((300, 200))
            elif template.workload.op == "conv2d":
                assert s.cb == 1 and s.kb == s.nr and (seen["cb"], seen["kb"]) == pytest.approx((1, s.nr))
            elif "dw_kb" in seen:
                assert s.kb == 96 and seen["dw_kb"] == pytest.approx(96)
            else:
                assert s.owb == 112 and seen["owb"] == pytest.approx(112)


# ---- the analytic estimates of the conv templates without a pretrained model ---------------------------

CONV_ESTIMATED = (
    "depthwise:n=1,c=96,h=112,w=112,r=3,s=3,stride=2,pad=1,layout=nhwc",
    "depthwise:n=1,c=37,h=11,w=13,r=3,s=3,stride=2,pad=1,layout=nhwc,bias=1,relu6=1",
    "depthwise:n=1,c=5,h=9,w=11,r=3,s=3,stride=2,pad=1,multiplier=2,layout=nhwc,bias=1",
    "depthwise:n=1,c=960,h=7,w=7,r=3,s=3,pad=1,layout=nhwc",
    "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1,layout=nhwc,algo=winograd,prepacked=1",
    "conv2d:n=1,c=17,h=13,w=11,k=40,r=3,s=3,pad=0,layout=nhwc,algo=winograd",
)


@pytest.mark.parametrize("target_name", sorted(load_targets()))
@pytest.mark.parametrize("workload", CONV_ESTIMATED)
def test_depthwise_nhwc_and_winograd_have_an_estimate_that_is_a_fraction_of_peak(
    workload: str, target_name: str
) -> None:
    """A cold search of these spaces ranks its first batch by the estimate (no pretrained model has them):
    finite, in (0, 1], and not the same for every config."""
    template = template_for(parse_workload(workload), get_target(target_name))
    op = features_op(template)
    prior = estimate_prior(op)
    assert op in ("depthwise_nhwc", "winograd") and prior is not None
    indices = np.random.default_rng(0).integers(template.space.size, size=300)
    est = prior.predict(featurize(template, indices))
    assert np.isfinite(est).all() and ((est > 0) & (est <= 1.0)).all()
    assert est.max() > est.min()


def _est(template: Any, values: list[dict[str, object]]) -> np.ndarray:
    prior = estimate_prior(features_op(template))
    assert prior is not None
    base = dict(template.default_config().values)
    return prior.predict(featurize(template, [template.space.index_of({**base, **v}) for v in values]))


@pytest.mark.parametrize("target_name", VECTOR_TARGETS)
def test_the_depthwise_estimate_prefers_tiles_that_share_loads(target_name: str) -> None:
    """A layer whose tensors stay in L2 is bound by its loads: one pixel per tile reloads every weight
    vector per pixel and reads 3 input columns per pixel where a wide tile shares them."""
    template = template_for(
        parse_workload("depthwise:n=1,c=960,h=7,w=7,r=3,s=3,pad=1,layout=nhwc"), get_target(target_name)
    )
    wide, single = _est(template, [{}, {"tile": "1x1", "unroll_kh": 0}])
    assert wide > 1.3 * single


def test_the_depthwise_estimate_prefers_channel_blocks_whose_rows_stay_in_l1() -> None:
    """Input rows an output row shares with the next come again from L2 when its channel block's rows do
    not stay in L1 (depthwise_nhwc.reuses_rows): with the same register tile, the L1-sized block wins."""
    target = get_target("x86-avx512")
    template: Any = template_for(
        parse_workload("depthwise:n=1,c=96,h=112,w=112,r=3,s=3,stride=2,pad=1,layout=nhwc"), target
    )
    sh = template.shape
    assert nhwc_template.reuses_rows(sh, 16, target) and not nhwc_template.reuses_rows(sh, 96, target)
    small, whole = _est(template, [{"tile": "4x1", "tile_k": 16}, {"tile": "4x1", "tile_k": 96}])
    assert small > whole


@pytest.mark.parametrize("target_name", VECTOR_TARGETS)
def test_the_winograd_estimate_prefers_the_default_over_a_degenerate_schedule(target_name: str) -> None:
    """A 1x1 register tile (an FMA per two loads), 8 input channels per call and one tile per block (U
    streamed once per tile) is slow on any vector CPU."""
    key = "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1,layout=nhwc,algo=winograd,prepacked=1"
    template = template_for(parse_workload(key), get_target(target_name))
    degenerate = {"tile": "1x1", "tile_ic": 8, "tile_ty": 1, "tile_tx": 1, "unroll": 1}
    default, slow = _est(template, [{}, degenerate])
    assert default > 2 * slow
