"""The fused epilogue's ReLU6 and residual add: workload keys, numpy references, and checked
kernels of all three templates on the local board and under QEMU."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_conv import check, configs
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.ops.registry import parse_workload
from xtune.ops.workload import random_inputs

# Every template and layout with residual, relu6, both, and residual + relu (ResNet's block end);
# odd sizes so that vector tails and several reduction blocks are exercised.
HOST_SHAPES = (
    "conv2d:n=1,c=5,h=9,w=11,k=13,r=3,s=3,stride=1,pad=1,bias=1,residual=1,relu=1",
    "conv2d:n=1,c=20,h=7,w=9,k=24,r=1,s=1,stride=1,pad=0,bias=1,residual=1",
    "conv2d:n=1,c=6,h=8,w=7,k=10,r=3,s=3,stride=2,pad=1,layout=nhwc,bias=1,residual=1,relu=1",
    "conv2d:n=1,c=9,h=6,w=7,k=11,r=3,s=3,stride=1,pad=1,relu6=1",
    "conv2d:n=2,c=3,h=9,w=8,k=12,r=1,s=1,stride=1,pad=0,layout=nhwc,bias=1,relu6=1",
    "conv2d:n=1,c=8,h=5,w=6,k=7,r=1,s=1,stride=1,pad=0,residual=1,relu6=1",
    "depthwise:n=1,c=5,h=9,w=11,r=3,s=3,stride=1,pad=1,bias=1,relu6=1",
    "depthwise:n=1,c=3,h=10,w=9,r=3,s=3,stride=2,pad=1,multiplier=2,bias=1,residual=1,relu=1",
    "matmul:m=13,n=21,k=17,bias=1,residual=1,relu=1",
    "matmul:m=9,n=19,k=300,bias=1,relu6=1",
    "matmul:m=7,n=10,k=300,residual=1,relu6=1",
)
BOARD_SHAPES = tuple(HOST_SHAPES[i] for i in (0, 2, 3, 7, 9, 10))


def test_new_keys_keep_old_workload_strings_and_take_a_residual_tensor() -> None:
    old = "conv2d:n=1,c=4,h=8,w=8,k=4,r=3,s=3,stride=1,pad=1,bias=1,relu=1"
    assert parse_workload(old + ",residual=0,relu6=0").key == old
    wl = parse_workload("conv2d:n=1,c=4,h=8,w=8,k=6,r=3,s=3,stride=2,pad=1,relu6=1,residual=1,bias=1")
    assert wl.key.endswith("bias=1,residual=1,relu6=1")
    assert [(t.name, t.shape) for t in wl.tensors()] == [
        ("input", (1, 4, 8, 8)),
        ("weights", (6, 4, 3, 3)),
        ("bias", (6,)),
        ("residual", (1, 6, 4, 4)),
        ("output", (1, 6, 4, 4)),
    ]
    mm = parse_workload("matmul:m=3,n=5,k=2,residual=1")
    assert [t.name for t in mm.tensors()] == ["A", "B", "residual", "C"]
    with pytest.raises(InputError, match="'relu' and 'relu6' exclude each other"):
        parse_workload("matmul:m=2,n=2,k=2,relu=1,relu6=1")
    with pytest.raises(InputError, match="'residual' must be 0 or 1"):
        parse_workload("matmul:m=2,n=2,k=2,residual=2")


@pytest.mark.parametrize("key", HOST_SHAPES)
def test_reference_adds_the_residual_then_clamps(key: str) -> None:
    """The epilogue's reference against the plain operator's, the epilogue applied here in float64."""
    wl = parse_workload(key)
    plain = parse_workload(key.split(",bias")[0].split(",residual")[0].split(",relu")[0])
    inputs = [4 * x for x in random_inputs(wl)]  # values past 6, so that ReLU6 clamps something
    n_own = len(plain.tensors()) - 1
    expected = plain.reference(inputs[:n_own]).astype(np.float64)
    extra = iter(inputs[n_own:])
    if wl["bias"]:
        bias = next(extra).astype(np.float64)
        nhwc = wl.op == "conv2d" and wl.value("layout") == "nhwc"
        expected += bias if wl.op == "matmul" or nhwc else bias[:, None, None]
    if wl["residual"]:
        expected += next(extra)
    if wl["relu"] or wl["relu6"]:
        expected = np.clip(expected, 0, 6 if wl["relu6"] else None)
    got = wl.reference(inputs)
    assert got.dtype == np.float32
    if wl["relu6"]:
        assert got.max() == 6.0 and got.min() == 0.0
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("key", HOST_SHAPES)
def test_epilogue_kernels_correct_on_host(key: str) -> None:
    check("local", key, configs(key, get_board("local").target.name, 2))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_residual_is_added_once_across_channel_blocks(layout: str) -> None:
    """Several input-channel blocks: the residual starts the first one only, the clamp ends the last."""
    from xtune.ops.registry import template_for

    key = f"conv2d:n=1,c=9,h=6,w=7,k=11,r=3,s=3,pad=1,layout={layout},bias=1,residual=1,relu6=1,algo=direct"
    template = template_for(parse_workload(key), get_board("local").target)
    values = {**template.default_config().as_dict(), "tile_ic": 2, "tile_oc": 8, "tile_ow": 4, "tile_oh": 2}
    check("local", key, [template.space.index_of(values), template.space.index_of({**values, "order": "kp"})])


@pytest.mark.board
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64", "qemu-riscv64-v"])
@pytest.mark.parametrize("key", BOARD_SHAPES)
def test_epilogue_kernels_correct_under_qemu(board: str, key: str) -> None:
    check(board, key, configs(key, get_board(board).target.name, 1))


def test_integer_clamp_is_the_float_clamp_on_every_non_nan_float() -> None:
    """`Epilogue.bits`: max(bits, 0) and min(., bits of 6) as int32 give ReLU and ReLU6 of the floats,
    edges included (-0, denormals, the neighbours of 0 and 6, the infinities)."""
    from xtune.ops.tiles import SIX_BITS

    six = np.float32(6)
    edges = [0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, np.nextafter(six, 0), six, np.nextafter(six, 7)]
    x = np.concatenate(
        [np.array([*edges, np.inf, -np.inf], np.float32), np.random.default_rng(0).normal(0, 8, 4096)]
    ).astype(np.float32)
    relu = np.maximum(x.view(np.int32), 0)
    relu6 = np.minimum(relu, SIX_BITS)
    np.testing.assert_array_equal(relu.view(np.float32), np.maximum(x, 0) + 0)  # + 0: -0 as +0
    np.testing.assert_array_equal(relu6.view(np.float32), np.clip(x, 0, 6) + 0)
    assert np.float32(6).view(np.int32) == SIX_BITS


@pytest.mark.parametrize(
    ("target", "clamp", "absent"), [("arm-a72-neon", "smin", "fminnm"), ("x86-avx2", "vminps", "")]
)
def test_aarch64_clamps_relu6_on_integer_lanes(target: str, clamp: str, absent: str) -> None:
    """On AArch64 (`Target.integer_clamp`) the ReLU6 of a kernel's epilogue is SMAX/SMIN on the bits, not
    FMAXNM/FMINNM (one 128-bit FP max a cycle on a Cortex-A72, two integer ones); x86 keeps VMAXPS/VMINPS."""
    from xtune.codegen.compile import optimize, parse_verified, target_machine
    from xtune.codegen.lower import lower
    from xtune.ops.registry import template_for
    from xtune.target import get_target

    t = get_target(target)
    for key in ("matmul:m=9,n=19,k=30,bias=1,relu6=1", HOST_SHAPES[6]):
        template = template_for(parse_workload(key), t)
        module = parse_verified(lower([template.kernel(template.default_config(), "kernel")]), t)
        tm = target_machine(t)
        optimize(module, tm)
        words = {line.split()[0] for line in tm.emit_assembly(module).splitlines() if line.startswith("\t")}
        assert clamp in words and absent not in words, (key, sorted(words))


@pytest.mark.board
def test_peeled_k_groups_and_bias_copies_correct_under_qemu_aarch64() -> None:
    """`Target.peel_reduction`: the last unrolled group of each k block runs after its loop, beside the
    stores (a loop of one group vanishes); every unroll and block size, with and without lane FMAs.
    `Target.load_initial`: each tile row's bias from its own copy, per n block, in every loop order."""
    from xtune.ops.registry import template_for

    board = get_board("qemu-aarch64")
    assert board.target.peel_reduction and board.target.load_initial
    for key in ("matmul:m=7,n=21,k=32,bias=1,relu6=1", "matmul:m=5,n=8,k=32,bias=1,relu=1"):
        template = template_for(parse_workload(key), board.target)
        base = template.default_config().as_dict()
        nc = min(next(k.options for k in template.space.knobs if k.name == "nc"))  # several n blocks
        values = [
            {**base, "unroll_k": u, "kc": kc, "pack_a": pa, "order": order, "nc": nc}
            for u, kc, pa, order in (
                (1, 8, 0, "nkm"),
                (2, 16, 1, "mkn"),
                (4, 16, 0, "kmn"),
                (8, 32, 0, "mnk"),
                (8, 8, 1, "knm"),
                (4, 32, 1, "nmk"),
            )
        ]
        check("qemu-aarch64", key, [template.space.index_of(v) for v in values])
