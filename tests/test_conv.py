"""Convolution tests: conv2d/depthwise workloads and templates (and matmul's fused epilogue) in,
parsing, numpy references, errors and checked kernel outputs on the local board and under QEMU out."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest

from tests.conftest import QEMU_BOARDS
from tests.nest_interp import run_kernel
from xtune.boards.board import get_board
from xtune.codegen.compile import parse_verified
from xtune.codegen.lower import lower
from xtune.errors import InputError
from xtune.ops.conv import conv_shape
from xtune.ops.conv2d import Conv2dTemplate
from xtune.ops.registry import features_of, parse_workload, template_for
from xtune.ops.workload import random_inputs
from xtune.schedule.loopnest import Const, For, Stmt, Store, walk
from xtune.target import get_target
from xtune.tuning.features import feature_names, features_op, featurize
from xtune.tuning.measure import Candidate, Measurer, MeasureStatus, build_image
from xtune.tuning.options import MeasureOptions

FAST = MeasureOptions(number=1, repeat=1, min_repeat_ms=0.0, warmup=0)

# Odd sizes, stride 2, pad 0 and 3, 1x1, 7x7/2, channels not multiples of any vector width,
# bias/relu on and off, both layouts, dilation, batch 2, depthwise with multiplier 1 and 2.
HOST_SHAPES = (
    "conv2d:n=1,c=5,h=9,w=11,k=13,r=3,s=3,stride=1,pad=1",
    "conv2d:n=2,c=4,h=12,w=10,k=16,r=3,s=3,stride=2,pad=0,bias=1",
    "conv2d:n=1,c=3,h=17,w=15,k=9,r=7,s=7,stride=2,pad=3,relu=1",
    "conv2d:n=1,c=20,h=7,w=9,k=24,r=1,s=1,stride=1,pad=0,bias=1,relu=1",
    "conv2d:n=1,c=6,h=8,w=7,k=10,r=3,s=3,stride=1,pad=1,layout=nhwc,bias=1,relu=1",
    "conv2d:n=2,c=3,h=15,w=13,k=12,r=7,s=7,stride=2,pad=3,layout=nhwc",
    "conv2d:n=1,c=4,h=11,w=11,k=8,r=3,s=3,stride=1,pad=2,dilation=2,bias=1",
    "conv2d:n=1,c=7,h=6,w=5,k=3,r=1,s=1,stride=2,pad=0,layout=nhwc,relu=1",
    "depthwise:n=1,c=5,h=9,w=11,r=3,s=3,stride=1,pad=1,bias=1,relu=1",
    "depthwise:n=2,c=3,h=10,w=9,r=3,s=3,stride=2,pad=1,multiplier=2",
    "depthwise:n=1,c=4,h=12,w=20,r=5,s=5,stride=1,pad=0,relu=1",
    "depthwise:n=1,c=2,h=9,w=13,r=3,s=3,stride=2,pad=3,dilation=2,multiplier=2,bias=1",
    "matmul:m=13,n=21,k=17,bias=1,relu=1",
    "matmul:m=9,n=19,k=300,bias=1,relu=1",
)
BOARD_SHAPES = (
    "conv2d:n=1,c=5,h=9,w=11,k=13,r=3,s=3,stride=1,pad=1,bias=1,relu=1",
    "conv2d:n=1,c=3,h=13,w=11,k=6,r=7,s=7,stride=2,pad=3,layout=nhwc",
    "conv2d:n=1,c=9,h=5,w=6,k=7,r=1,s=1,stride=1,pad=0,relu=1",
    "conv2d:n=1,c=4,h=12,w=10,k=16,r=3,s=3,stride=2,pad=0,layout=nhwc,bias=1",
    "depthwise:n=1,c=3,h=10,w=9,r=3,s=3,stride=2,pad=1,multiplier=2,bias=1",
    "depthwise:n=1,c=5,h=9,w=11,r=5,s=3,stride=1,pad=2,relu=1",
    "matmul:m=7,n=11,k=40,bias=1,relu=1",
)
RANDOM_CONFIGS = 2


def configs(key: str, target_name: str, extra: int) -> list[int]:
    """The default config and `extra` random ones (fixed seed per workload)."""
    template = template_for(parse_workload(key), get_target(target_name))
    rng = random.Random(key)
    return [template.default_config().index] + [rng.randrange(template.space.size) for _ in range(extra)]


def check(board_name: str, key: str, indices: list[int]) -> None:
    """Compile in-process (no worker pool: a test may die with LLVM, a tuner may not) and compare."""
    board = get_board(board_name)
    measurer = Measurer(board, parse_workload(key), FAST)
    try:
        for index in indices:
            candidate = Candidate(workload=measurer.workload, target=board.target, index=index)
            result = measurer.run(build_image(candidate))
            assert result.status is MeasureStatus.OK, (key, index, result.status, result.error)
    finally:
        measurer.close()


# --- workloads: pure, no toolchain -----------------------------------------------------------------


def test_keys_are_canonical_and_omit_default_options() -> None:
    assert parse_workload("matmul:k=8,m=4,n=2,bias=0,relu=0").key == "matmul:m=4,n=2,k=8"
    wl = parse_workload("conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1")
    assert wl.key == "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1"
    assert wl == parse_workload(wl.key + ",layout=nchw,dilation=1,bias=0")
    assert parse_workload("conv2d:n=1,c=2,h=5,w=5,k=3,r=3,s=3").key.endswith("stride=1,pad=0")
    nhwc = parse_workload("conv2d:n=1,c=2,h=5,w=5,k=3,r=3,s=3,layout=nhwc,relu=1")
    assert nhwc.value("layout") == "nhwc" and nhwc["relu"] == 1 and nhwc["bias"] == 0
    assert nhwc.symbol == "conv2d_n1_c2_h5_w5_k3_r3_s3_stride1_pad0_layoutnhwc_relu1"
    assert parse_workload(nhwc.key) == nhwc


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("conv2d:n=1,c=3,h=2,w=8,k=4,r=5,s=3", "kernel spans 5"),
        ("conv2d:n=1,c=3,h=8,w=8,k=4,r=3,s=3,dilation=4", "kernel spans 9"),
        ("conv2d:n=1,c=3,h=8,w=8,k=4,r=3,s=3,stride=0", "'stride' must be a positive"),
        ("conv2d:n=1,c=3,h=8,w=8,k=4,r=3,s=3,pad=-1", "'pad' must be a non-negative"),
        ("conv2d:n=1,c=0,h=8,w=8,k=4,r=3,s=3", "'c' must be a positive"),
        ("conv2d:n=1,c=3,h=8,w=8,r=3,s=3", "missing size 'k'"),
        ("conv2d:n=1,c=3,h=8,w=8,k=4,r=3,s=3,layout=nchwc", "one of nchw, nhwc"),
        ("conv2d:n=1,c=3,h=8,w=8,k=4,r=3,s=3,stride=two", "must be an integer"),
        ("depthwise:n=1,c=3,h=8,w=8,r=3,s=3,multiplier=0", "'multiplier' must be a positive"),
        ("depthwise:n=1,c=3,h=8,w=8,r=3,s=3,layout=hwc", "'layout' must be one of nchw, nhwc"),
        ("matmul:m=2,n=2,k=2,relu=2", "'relu' must be 0 or 1"),
    ],
)
def test_impossible_shapes_are_input_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_workload(text)


def direct_conv(key: str, inputs: list[np.ndarray]) -> np.ndarray:
    """The definition, loop by loop over the window in float64: the oracle for the im2col references."""
    wl = parse_workload(key)
    sh = conv_shape(wl)
    x, w = inputs[0].astype(np.float64), inputs[1].astype(np.float64)
    if sh.nhwc:
        x, w = x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)
    x = np.pad(x, ((0, 0), (0, 0), (sh.pad, sh.pad), (sh.pad, sh.pad)))
    out = np.zeros((sh.n, sh.k, sh.oh, sh.ow))
    for o in range(sh.k):
        for ci in [o // sh.multiplier] if wl.op == "depthwise" else range(sh.c):
            for i in range(sh.r):
                for j in range(sh.s):
                    y0, x0 = i * sh.dilation, j * sh.dilation
                    patch = x[
                        :,
                        ci,
                        y0 : y0 + sh.stride * (sh.oh - 1) + 1 : sh.stride,
                        x0 : x0 + sh.stride * (sh.ow - 1) + 1 : sh.stride,
                    ]
                    out[:, o] += w[o, 0 if wl.op == "depthwise" else ci, i, j] * patch
    if wl["bias"]:
        out += inputs[2].reshape(1, -1, 1, 1)
    if wl["relu"]:
        out = np.maximum(out, 0)
    return out.transpose(0, 2, 3, 1) if sh.nhwc else out


@pytest.mark.parametrize("key", [k for k in HOST_SHAPES if not k.startswith("matmul")])
def test_references_match_the_definition(key: str) -> None:
    wl = parse_workload(key)
    inputs = random_inputs(wl)
    got = wl.reference(inputs)
    out_spec = next(t for t in wl.tensors() if t.is_output)
    assert got.dtype == np.float32 and got.shape == out_spec.shape
    np.testing.assert_allclose(got, direct_conv(key, inputs), rtol=1e-5, atol=1e-5)


def test_flops_and_tensors() -> None:
    wl = parse_workload("conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1,bias=1")
    assert wl.flops() == 2 * 64 * 56 * 56 * 64 * 9
    assert [t.shape for t in wl.tensors()] == [(1, 64, 56, 56), (64, 64, 3, 3), (64,), (1, 64, 56, 56)]
    nhwc = parse_workload("conv2d:n=1,c=3,h=224,w=224,k=64,r=7,s=7,stride=2,pad=3,layout=nhwc")
    assert [t.shape for t in nhwc.tensors()] == [(1, 224, 224, 3), (7, 7, 3, 64), (1, 112, 112, 64)]
    dw = parse_workload("depthwise:n=1,c=32,h=112,w=112,r=3,s=3,stride=2,pad=1,multiplier=2")
    assert [t.shape for t in dw.tensors()] == [(1, 32, 112, 112), (64, 1, 3, 3), (1, 64, 56, 56)]
    assert dw.flops() == 2 * 64 * 56 * 56 * 9
    mm = parse_workload("matmul:m=4,n=5,k=6,bias=1")
    assert [t.name for t in mm.tensors()] == ["A", "B", "bias", "C"]


@pytest.mark.parametrize("target", ["x86-avx2", "arm-a72-neon", "riscv64-gc", "riscv64-gcv"])
@pytest.mark.parametrize("key", [HOST_SHAPES[0], HOST_SHAPES[5], HOST_SHAPES[9]])
def test_spaces_defaults_and_features(key: str, target: str) -> None:
    template = template_for(parse_workload(key), get_target(target))
    indices = configs(key, target, 40)
    features = featurize(template, indices)
    assert features.shape == (len(indices), len(feature_names(features_op(template))))
    assert np.all(np.isfinite(features))
    kernel = template.kernel(template.default_config(), "k")
    parse_verified(lower([kernel]), template.target)  # LLVM's verifier, for every target's vector width


# --- host: compile and run on this machine ------------------------------------------------------


@pytest.mark.parametrize("key", HOST_SHAPES)
def test_kernels_correct_on_host(key: str) -> None:
    check("local", key, configs(key, get_board("local").target.name, RANDOM_CONFIGS))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_channel_blocks_accumulate_then_apply_relu(layout: str) -> None:
    """Several input-channel blocks (first, middle loop, tail): bias once, ReLU only at the end."""
    key = f"conv2d:n=1,c=9,h=6,w=7,k=11,r=3,s=3,stride=1,pad=1,layout={layout},bias=1,relu=1,algo=direct"
    template = template_for(parse_workload(key), get_board("local").target)
    values = {**template.default_config().as_dict(), "tile_ic": 2, "tile_oc": 8, "tile_ow": 4, "tile_oh": 2}
    indices = [
        template.space.index_of(values),
        template.space.index_of({**values, "order": "kp", "tile_ic": 4}),
    ]
    check("local", key, indices)


# --- boards: the same kernels under QEMU ------------------------------------------------------------


@pytest.mark.parametrize("key", BOARD_SHAPES)
def test_kernels_correct_under_qemu(qemu_board: str, key: str) -> None:
    check(qemu_board, key, configs(key, get_board(qemu_board).target.name, 1))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_every_packing_and_reduction_order(layout: str) -> None:
    """Packed CHW/HWC from either caller layout (vector copies or a transposition), both reduction
    orders, kw rolled and unrolled, with a partial pixel tile and a partial channel strip."""
    key = f"conv2d:n=1,c=3,h=7,w=9,k=10,r=3,s=3,stride=2,pad=1,layout={layout},bias=1"
    template = template_for(parse_workload(key), get_board("local").target)
    base = template.default_config().as_dict()
    indices = [
        template.space.index_of(
            {**base, "pack_layout": pack, "reduction": red, "unroll_kw": unroll, "unroll": 2}
        )
        for pack in ("chw", "hwc")
        for red in ("crs", "rsc")
        for unroll in (0, 1)
    ]
    check("local", key, indices)


@pytest.mark.parametrize("board", ["local", *QEMU_BOARDS])
def test_transposed_weight_packing_on_every_board(board: str) -> None:
    """Reduction order crs packs NCHW's OIHW weights per call by lanes x lanes shuffle transposes: rows
    past k (21 output channels: a partial strip of one vector and of several), columns past the block's
    c*r*s (blocks of 4 or 16 of the 18 channels, then 2: 36, 144 and 18 floats, 18 no multiple of any
    vector width)."""
    if board != "local" and shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    key = "conv2d:n=1,c=18,h=6,w=7,k=21,r=3,s=3,stride=1,pad=1,algo=direct,bias=1"
    template = template_for(parse_workload(key), get_board(board).target)
    base = template.default_config().as_dict()
    tiles = [str(t) for t in template.space.knobs[0].options]
    indices = [
        template.space.index_of({**base, "tile": tile, "tile_ic": ic, "tile_oc": 21, "reduction": "crs"})
        for tile in (tiles[0], tiles[-1])
        for ic in (4, 16)
    ]
    check(board, key, indices)


# --- pointwise through the matmul template, stride 2 without a cliff ----------------------

# Pointwise layers (NCHW and NHWC, a batch, bias and ReLU), stride 2 with odd input sizes, padding 0 and
# 2, channel counts that are no multiple of any vector width, depthwise with multiplier 2 and rows wide
# enough for whole stride-2 deinterleave chunks on every board (2 x 16 lanes) plus a tail.
LAYER_SHAPES = (
    "conv2d:n=1,c=19,h=7,w=9,k=21,r=1,s=1,stride=1,pad=0,bias=1,relu=1",
    "conv2d:n=2,c=33,h=5,w=7,k=10,r=1,s=1,stride=1,pad=0,bias=1",
    "conv2d:n=2,c=13,h=5,w=3,k=35,r=1,s=1,stride=1,pad=0,layout=nhwc,bias=1,relu=1",
    "conv2d:n=1,c=7,h=6,w=5,k=3,r=1,s=1,stride=2,pad=0,relu=1",
    "conv2d:n=1,c=5,h=13,w=15,k=11,r=3,s=3,stride=2,pad=2,bias=1",
    "conv2d:n=1,c=6,h=11,w=9,k=17,r=3,s=3,stride=2,pad=0,layout=nhwc,relu=1",
    "depthwise:n=1,c=3,h=11,w=37,r=3,s=3,stride=2,pad=1,bias=1,relu=1",
    "depthwise:n=1,c=2,h=9,w=67,r=3,s=3,stride=2,pad=0,multiplier=2",
    "depthwise:n=2,c=3,h=7,w=35,r=5,s=5,stride=2,pad=2,multiplier=2,bias=1",
    "depthwise:n=1,c=5,h=9,w=33,r=3,s=3,stride=1,pad=2,relu=1",
)


@pytest.mark.parametrize("board", ["local", *QEMU_BOARDS])
@pytest.mark.parametrize("key", LAYER_SHAPES)
def test_layer_table_correct_on_every_board(board: str, key: str) -> None:
    if board != "local" and shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    check(board, key, configs(key, get_board(board).target.name, 2))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_pointwise_conv2d_is_tuned_as_its_matmul(layout: str) -> None:
    """A 1x1, stride 1, pad 0 conv2d has the matmul's space, default and features (so its models and
    analytic estimate), and its kernel is the matmul nest over the conv's tensors: no transposing tile."""
    key = f"conv2d:n=1,c=128,h=56,w=56,k=128,r=1,s=1,layout={layout},bias=1"
    target = get_target("x86-avx512")
    conv = template_for(parse_workload(key), target)
    mn = "m=128,n=3136" if layout == "nchw" else "m=3136,n=128"
    gemm = template_for(parse_workload(f"matmul:{mn},k=128,bias=1"), target)
    assert features_of(conv)[1].workload == gemm.workload and features_of(conv)[0].name == "matmul"
    assert conv.space == gemm.space and conv.default_config() == gemm.default_config()
    indices = configs(key, target.name, 20)
    np.testing.assert_array_equal(featurize(conv, indices), featurize(gemm, indices))
    kernel = conv.kernel(conv.default_config(), "k")
    assert [b.name for b in kernel.params] == ["input", "weights", "bias", "output"]
    assert "Ot" not in {b.name for b in kernel.buffers}


def executed_scalar_stores(stmts: tuple[Stmt, ...], buffer: str, trips: int = 1) -> int:
    """How many one-float stores to `buffer` the nest executes."""
    count = 0
    for stmt in stmts:
        if isinstance(stmt, For):
            count += executed_scalar_stores(stmt.body, buffer, trips * stmt.extent)
        elif isinstance(stmt, Store) and stmt.buffer == buffer and stmt.lanes == 1:
            count += trips
    return count


@pytest.mark.parametrize("target_name", ["x86-avx512", "x86-avx2", "arm-a72-neon"])
def test_stride_2_depthwise_packs_rows_with_vectors(target_name: str) -> None:
    """Stride 2 deinterleaves chunks of 2 vectors per row (loads + shuffles), the last one overlapping:
    only an odd row's last column is copied alone (before, every column was)."""
    key = "depthwise:n=1,c=3,h=10,w=75,r=3,s=3,stride=2,pad=1"
    target = get_target(target_name)
    template = template_for(parse_workload(key), target)
    kernel = template.kernel(template.default_config(), "k")
    assert executed_scalar_stores(kernel.body, "Ip") == 3 * 10 * 1
    assert "shufflevector" in lower([kernel])


STEM = "conv2d:n=2,c=3,h=11,w=10,k=8,r=3,s=3,stride=2,pad=1,layout=nhwc,bias=1,relu6=1,prepacked=1"


@pytest.mark.parametrize("board", ["local", "qemu-aarch64"])
def test_a_stem_copies_its_rows_by_whole_vectors(board: str) -> None:
    """A pixel of 3 channels is no whole vector: an NHWC stem whose block holds every channel copies each
    input row (30 floats here) as one contiguous run of vectors, the last one partial, and no float alone;
    other channel blocks (tile_ic 1, 2) keep the copy per pixel. Each is checked against numpy."""
    target = get_board(board).target
    if board != "local" and shutil.which(target.qemu_binary) is None:
        pytest.skip(f"needs {target.qemu_binary} (qemu-user)")
    template = template_for(parse_workload(STEM), target)
    default = template.default_config()
    assert default["tile_ic"] == 3 and default["pack_layout"] == "hwc"
    kernel = template.kernel(default, "k")
    assert executed_scalar_stores(kernel.body, "Ip") == 0
    runs = [s for s, _ in walk(kernel.body) if isinstance(s, Store) and s.buffer == "Ip" and s.lanes > 1]
    assert len([s for s in runs if not isinstance(s.value, Const)]) == 2  # the whole vectors, the partial one
    indices = [default.index] + [
        template.space.index_of({**default.as_dict(), "tile_ic": ic, "reduction": red})
        for ic, red in ((3, "crs"), (2, "rsc"), (1, "crs"))
    ]
    check(board, STEM, indices)


def test_the_stems_border_is_zeroed_by_a_few_vectors() -> None:
    """MobileNetV2's stem (224x224x3, pad 1) on AArch64: 788 vector stores of zeros around the copied rows,
    where zeroing all of its 226x226x3 Ip took 38,307."""
    key = STEM.replace("n=2,c=3,h=11,w=10", "n=1,c=3,h=224,w=224")
    template = template_for(parse_workload(key), get_target("arm-a72-neon"))
    kernel = template.kernel(template.default_config(), "k")
    assert executed_zero_stores(kernel.body) == 788
    assert next(b.size for b in kernel.buffers if b.name == "Ip") == 38_307 * 4


def executed_zero_stores(stmts: tuple[Stmt, ...], trips: int = 1) -> int:
    """How many stores of zeros to Ip the nest executes (vectors or floats alike)."""
    count = 0
    for stmt in stmts:
        if isinstance(stmt, For):
            count += executed_zero_stores(stmt.body, trips * stmt.extent)
        elif isinstance(stmt, Store) and stmt.buffer == "Ip" and isinstance(stmt.value, Const):
            count += trips
    return count


@pytest.mark.parametrize(
    "key",
    [
        STEM,
        "conv2d:n=1,c=6,h=5,w=9,k=4,r=3,s=3,stride=1,pad=2,dilation=2",
        "conv2d:n=1,c=9,h=8,w=8,k=8,r=3,s=3,stride=2,pad=1,layout=nhwc,bias=1",
        "conv2d:n=1,c=2,h=1,w=5,k=3,r=3,s=3,stride=1,pad=1",
        "conv2d:n=1,c=3,h=9,w=7,k=5,r=7,s=7,stride=2,pad=3,layout=nhwc",
    ],
)
@pytest.mark.parametrize("target_name", ["arm-a72-neon", "x86-avx2"])
def test_only_the_border_of_the_packed_input_is_zeroed(key: str, target_name: str) -> None:
    """Ip's padding is zeroed by the vectors around the rows the copies write, not all of Ip; in the
    interpreter, which fills local buffers with NaN, every layout (hwc: one plane, chw: one a channel),
    channel block and tile still gives the reference's output."""
    wl = parse_workload(key)
    template = template_for(wl, get_target(target_name))
    inputs = random_inputs(wl)
    expected = wl.reference(inputs)
    rng = random.Random(key)
    for index in [template.default_config().index] + [rng.randrange(template.space.size) for _ in range(8)]:
        config = template.space.config(index)
        out = np.full(expected.shape, np.nan, dtype=np.float32)
        run_kernel(template.kernel(config, "k"), [*template.kernel_inputs(config, inputs), out])
        np.testing.assert_allclose(out, expected, atol=1e-5, err_msg=str(config.as_dict()))


def test_a_pointwise_kernel_is_its_matmuls_nest_over_the_conv_tensors() -> None:
    """NCHW, one image: the lowered body is the equivalent matmul's with A = weights, B = input, C = output
    (so a 64-trial run tunes exactly what the matmul's would)."""
    target = get_target("x86-avx512")
    conv = template_for(parse_workload("conv2d:n=1,c=40,h=6,w=9,k=24,r=1,s=1,relu=1"), target)
    gemm = template_for(parse_workload("matmul:m=24,n=54,k=40,relu=1"), target)
    for index in configs("conv2d:n=1,c=40,h=6,w=9,k=24,r=1,s=1,relu=1", target.name, 5):
        ir = lower([conv.kernel(conv.space.config(index), "k")]).splitlines()
        renamed = lower([gemm.kernel(gemm.space.config(index), "k")])
        for old, new in (('"A"', '"weights"'), ('"B"', '"input"'), ('"C"', '"output"')):
            renamed = renamed.replace(old, new)
        body = [line for line in ir if not line.startswith("define")]
        assert body == [line for line in renamed.splitlines() if not line.startswith("define")]


@pytest.mark.parametrize(
    "key",
    [
        "depthwise:n=1,c=2,h=13,w=9,r=3,s=3,stride=2,pad=1",
        "depthwise:n=2,c=2,h=10,w=6,r=3,s=3,stride=2,pad=3,dilation=2,multiplier=2",
        "depthwise:n=1,c=2,h=9,w=9,r=1,s=1,stride=2,pad=0",
        "depthwise:n=1,c=2,h=7,w=9,r=3,s=3,stride=3,pad=0",
        "depthwise:n=1,c=2,h=11,w=7,r=5,s=3,stride=1,pad=2",
    ],
)
def test_depthwise_row_tiles_pack_every_row_before_reading_it(key: str) -> None:
    """Order "yx" packs each tile's new input rows just before the tile (first and last tiles peeled and
    clipped to the input, the tail too): for every tile height, in the interpreter, over two planes (a row
    left unpacked would hold the other plane's values) the output is the reference's."""
    wl = parse_workload(key)
    template = template_for(wl, get_target("x86-sse42"))
    base = template.default_config().as_dict()
    inputs = random_inputs(wl)
    expected = wl.reference(inputs)
    for p in range(1, 9):
        for order in ("yx", "xy"):
            config = template.space.config(
                template.space.index_of({**base, "tile": f"{p}x1", "order": order})
            )
            out = np.full(expected.shape, np.nan, dtype=np.float32)
            run_kernel(template.kernel(config, "k"), [*inputs, out])
            np.testing.assert_allclose(out, expected, atol=1e-5, err_msg=f"{p} rows, {order}")


def test_lane_fma_direct_conv_correct_under_qemu_aarch64() -> None:
    """On AArch64 the direct template's default loads 4 input channels of a pixel as one vector and
    multiplies by its lanes: 10 channels in blocks of 10 and 8 (+2: groups, then a remainder broadcast
    a channel at a time), unrolled by 4 and 2 (no groups), with partial pixel tiles and a partial strip,
    stride 1 and 2, the hwc copy (lanes) and the chw one (broadcasts)."""
    board = get_board("qemu-aarch64")
    if shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary} (qemu-user)")
    for stride in (1, 2):
        key = f"conv2d:n=1,c=10,h=9,w=11,k=13,r=3,s=3,stride={stride},pad=1,layout=nhwc,algo=direct,bias=1"
        template = template_for(parse_workload(key), board.target)
        assert isinstance(template, Conv2dTemplate)
        default = template.default_config()
        assert default["unroll"] == 4 and template.schedule(default).lane_fma
        base = default.as_dict()
        indices = [
            template.space.index_of({**base, "tile_ic": ic, "unroll": unroll, "pack_layout": pack})
            for ic, unroll, pack in ((10, 4, "hwc"), (8, 4, "hwc"), (10, 2, "hwc"), (8, 4, "chw"))
        ]
        check("qemu-aarch64", key, indices)
