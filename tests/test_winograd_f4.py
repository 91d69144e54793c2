"""Winograd F(4x4, 3x3) (the `m` knob at 4): Lavin & Gray's matrices and the nest's formulas in, exact
transforms, U packed on the host equal to the pack kernel's, float32 accuracy on ResNet-18's ranges, and
kernels (both weight paths, both layouts, the epilogue, partial tiles) checked on the host and under QEMU
out."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.board_run import run_entry
from tests.nest_interp import run_kernel
from tests.test_conv import check
from tests.test_winograd import SHAPES as WINOGRAD_SHAPES
from tests.test_winograd import check_in_interpreter
from xtune.boards.board import get_board
from xtune.codegen.compile import compile_object
from xtune.codegen.link import link_flat
from xtune.codegen.lower import lower
from xtune.ops.conv2d.winograd import WinogradTemplate
from xtune.ops.conv2d.winograd_transforms import (
    AT4,
    BT4,
    G4,
    Arith,
    NumpyArith,
    filter_transform4,
    input_rows4,
    output_rows4,
)
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import RTOL, random_inputs
from xtune.schedule.space import Config
from xtune.target import get_target

# test_winograd.py's shapes: output sizes no multiple of 4 too (7: a last tile of 3 pixels, 13: of 1,
# 8 x 6: of 2 across), pad 0 to 2, channels no multiple of any vector width, the epilogue, a batch of 2;
# NHWC and NCHW (its 17-channel 13x11 one left out: the same cases, for time).
SHAPES = tuple(key for key in WINOGRAD_SHAPES if ",c=17," not in key)


def f4_configs(template: WinogradTemplate, extra: int) -> list[int]:
    """F(4x4)'s default and `extra` random configs of tile side 4 (fixed seed per workload)."""
    rng = random.Random(template.workload.key)
    space = template.space
    out = [template.default_config(4).index]
    while len(out) < 1 + extra:
        values = space.config(rng.randrange(space.size)).as_dict()
        out.append(space.index_of({**values, "m": 4}))
    return out


def side(template: WinogradTemplate, index: int) -> int:
    return template.schedule(template.space.config(index)).m


# --- the transforms ------------------------------------------------------------------------------------


def test_lavins_matrices_compute_the_correlation_exactly() -> None:
    """A^T [(G g) * (B^T d)] is the 4 outputs of the 1-D correlation of 6 inputs with 3 taps (float64)."""
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal(6), rng.standard_normal(3)
    direct = np.array([d[i : i + 3] @ g for i in range(4)])
    np.testing.assert_allclose(AT4 @ ((G4 @ g) * (BT4 @ d)), direct, rtol=1e-12, atol=1e-12)


def test_the_formulas_are_the_matrices() -> None:
    """The shared-subexpression formulas the nest emits are B^T, A^T and G (float32 roundings apart)."""
    rng = np.random.default_rng(1)
    ar: Arith[np.ndarray] = NumpyArith()
    d = rng.standard_normal((6, 50)).astype(np.float32)
    got: list[np.ndarray] = input_rows4(ar, list(d))
    np.testing.assert_allclose(np.stack(got), BT4 @ d, rtol=1e-5, atol=1e-5)
    out: list[np.ndarray] = output_rows4(ar, list(d))
    np.testing.assert_allclose(np.stack(out), AT4 @ d, rtol=1e-5, atol=1e-5)
    w = rng.standard_normal((3, 3, 7)).astype(np.float32)
    np.testing.assert_allclose(
        filter_transform4(w), np.einsum("ai,ijk,bj->abk", G4, w, G4), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("key", [SHAPES[0], SHAPES[5]])
def test_the_pack_kernel_writes_the_hosts_u_to_the_bit(key: str) -> None:
    """`prepack` (numpy) and the pack kernel (the nest's filter transform) give the same bits."""
    template = template_for(parse_workload(key + ",prepacked=1"), get_target("x86-sse42"))
    assert isinstance(template, WinogradTemplate)
    weights = random_inputs(template.workload)[1]
    for index in f4_configs(template, 2):
        config = template.space.config(index)
        u = template.prepack(config, weights)
        packed = np.full(u.shape, np.nan, np.float32)
        run_kernel(template.pack_kernel(config, "p"), [weights, packed])
        np.testing.assert_array_equal(packed, u)


# --- kernels -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", SHAPES)
def test_f4_gives_the_reference_in_the_interpreter(key: str) -> None:
    """Both weight paths on SSE's width: block tails, channel blocks, partial tiles, both orders."""

    def pick(template: WinogradTemplate) -> list[int]:
        indices = f4_configs(template, 2)
        assert {side(template, i) for i in indices} == {4}
        return indices

    check_in_interpreter(key, pick)


@pytest.mark.parametrize("packed", ["", ",prepacked=1"])
@pytest.mark.parametrize("key", [SHAPES[1], SHAPES[4]])
def test_f4_kernels_correct_on_host(key: str, packed: str) -> None:
    template = template_for(parse_workload(key + packed), get_board("local").target)
    assert isinstance(template, WinogradTemplate)
    check("local", key + packed, f4_configs(template, 1))


@pytest.mark.board
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64-v"])
@pytest.mark.parametrize("key", [SHAPES[0] + ",prepacked=1", SHAPES[5]])
def test_f4_kernels_correct_under_qemu(board: str, key: str) -> None:
    """NEON and RVV: NHWC with prepacked U, NCHW with U per call (partial tiles on both)."""
    template = template_for(parse_workload(key), get_board(board).target)
    assert isinstance(template, WinogradTemplate)
    check(board, key, f4_configs(template, 1))


# --- accuracy ------------------------------------------------------------------------------------------


def resnet_like_inputs(c: int, size: int, k: int) -> list[np.ndarray]:
    """A ReLU'd activation and He-scaled weights (a trained network's ranges), NHWC/HWIO, and a bias."""
    rng = np.random.default_rng(2)
    x = np.maximum(rng.standard_normal((1, size, size, c)), 0).astype(np.float32)
    w = (rng.standard_normal((3, 3, c, k)) * np.sqrt(2 / (9 * c))).astype(np.float32)
    return [x, w, (0.1 * rng.standard_normal(k)).astype(np.float32)]


def exact_conv(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The pad-1 3x3 convolution in float64."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    size = x.shape[1]
    out = np.zeros((1, size, size, w.shape[3])) + bias
    for i in range(3):
        for j in range(3):
            out += xp[:, i : i + size, j : j + size, :] @ w[i, j].astype(np.float64)
    return out


def test_f4_float32_error_on_a_resnet18_layer_is_within_the_tolerance() -> None:
    """ResNet-18's 256-channel 14x14 layer (the deepest accumulation of its 3x3 layers that runs in a
    second), compiled for the host: F(4x4)'s error against the exact convolution stays within
    compare_output's tolerance with room to spare, and is larger than F(2x2)'s (the points' price)."""
    key = "conv2d:n=1,c=256,h=14,w=14,k=256,r=3,s=3,pad=1,layout=nhwc,algo=winograd,bias=1,prepacked=1"
    template = template_for(parse_workload(key), get_board("local").target)
    assert isinstance(template, WinogradTemplate)
    inputs = resnet_like_inputs(256, 14, 256)
    exact = exact_conv(*inputs)
    errors = {}
    for m in (2, 4):
        config: Config = template.default_config(m)
        image = link_flat(compile_object(lower([template.kernel(config, "k")]), template.target, ("k",)))
        args = [*template.kernel_inputs(config, inputs), np.full(exact.shape, np.nan, np.float32)]
        out = run_entry("local", image, "k", args)[-1].reshape(exact.shape)
        errors[m] = float(np.abs(out - exact).max()) / max(1.0, float(np.abs(exact).max()))
    assert errors[4] < RTOL / 5, errors
    assert errors[2] < errors[4], errors
