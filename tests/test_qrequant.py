"""The compiled requantizing epilogue on its edge cases: inputs built so that every output of a qmatmul is
an exact .5 tie or a value beyond a clamp bound, run on the host and under qemu-aarch64 (FCVTNS), each
compared bit for bit with the reference (round half to even, the clamp, the zero point)."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest

from xtune.boards.board import get_board
from xtune.ops.qmatmul.reference import NUMPY_TYPES, RANGES
from xtune.ops.registry import parse_workload
from xtune.target import host_cannot_run
from xtune.tuning import measure
from xtune.tuning.measure import CompilePool, Measurer, MeasureStatus
from xtune.tuning.options import MeasureOptions

FAST = MeasureOptions(number=1, repeat=1, min_repeat_ms=0.0, warmup=0, timeout_ms=20_000)
M, N, K = 10, 64, 4


def edge_inputs(a_type: str, clamp: str, scale: float = 0.5) -> list[np.ndarray]:
    """A row r holds (r, 0, 0, 0) and only the first row of B is non-zero (ones), so the sum of output
    (r, c) is r + bias[c]: with bias -300 + 10c every integer from -300 to 339 once. The scale 0.5 makes
    each odd sum an exact tie, and [-150, 170) passes both bounds of every clamp below: the full type
    range, or a fused ReLU6's (zy .. zy + 12, 6 / 0.5 steps), with an odd zero point. A larger `scale`
    puts the scaled sums beyond the int16 range (AArch64 narrows with saturation before it clamps) or,
    at 1e8, beyond the int32 range (FCVTNS saturates)."""
    lo, hi = RANGES[a_type]
    zy = {"s8": 3, "u8": 131}[a_type]
    bounds = (lo, hi) if clamp == "full" else (zy, zy + 12)
    a = np.zeros((M, K), NUMPY_TYPES[a_type])
    a[:, 0] = np.arange(M)
    b = np.zeros((K, N), np.int8)
    b[0] = 1
    bias = (-300 + 10 * np.arange(N)).astype(np.int32)
    qparams = np.array([0, zy, *bounds], np.int32)
    return [a, b, bias, np.array([scale], np.float32), qparams]


def test_the_inputs_hit_every_edge() -> None:
    """The edges are there: ties rounding both up and down on both signs, and both clamps saturating."""
    a, _, bias, scale, qparams = edge_inputs("s8", "full")
    f = (a[:, :1].astype(np.int32) + bias) * scale[0]
    zy, lo, hi = qparams[1:]
    inside = (f > lo - zy) & (f < hi - zy)
    ties = f[inside & (f % 1 == 0.5)]
    assert {-1.5, -0.5, 0.5, 1.5, 2.5} <= set(ties.tolist())
    assert (f < lo - zy).any() and (f > hi - zy).any()


def check(
    board: str,
    key: str,
    a_type: str,
    clamp: str,
    pool: CompilePool,
    mp: pytest.MonkeyPatch,
    scale: float = 0.5,
) -> None:
    """The default config and two random ones, on the edge inputs: every output must equal the reference."""
    mp.setattr(measure, "random_inputs", lambda wl: edge_inputs(a_type, clamp, scale))
    measurer = Measurer(get_board(board), parse_workload(key), FAST, pool)
    space = measurer.template.space
    rng = random.Random(key)
    indices = [measurer.template.default_config().index] + [rng.randrange(space.size) for _ in range(2)]
    try:
        results = measurer.measure(indices)
    finally:
        measurer.close()
    assert set(np.unique(measurer.expected).tolist()) >= {int(x) for x in edge_inputs(a_type, clamp)[-1][2:]}
    for index, result in zip(indices, results, strict=True):
        assert result.status is MeasureStatus.OK, (board, space.config(index).values, result.error)


@pytest.mark.parametrize("clamp", ["full", "relu6"])
@pytest.mark.parametrize("a_type", ["s8", "u8"])
def test_ties_and_bounds_on_the_host(
    a_type: str, clamp: str, compile_pool: CompilePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = get_board("local")
    why = host_cannot_run(board.target)
    if why is not None:
        pytest.skip(why)
    check("local", f"qmatmul:m={M},n={N},k={K},a={a_type}", a_type, clamp, compile_pool, monkeypatch)


@pytest.mark.board
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-aarch64-dotprod"])
@pytest.mark.parametrize("clamp", ["full", "relu6"])
def test_ties_and_bounds_under_qemu_aarch64(
    board: str, clamp: str, compile_pool: CompilePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip("needs qemu-user")
    check(board, f"qmatmul:m={M},n={N},k={K},a=s8", "s8", clamp, compile_pool, monkeypatch)


@pytest.mark.board
@pytest.mark.parametrize("scale", [1000.0, 1e8])
def test_sums_far_beyond_the_bounds_under_qemu_aarch64(
    scale: float, compile_pool: CompilePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scaled sums past the int16 range and past the int32 range still clamp to the bounds."""
    board = "qemu-aarch64-dotprod"
    if shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip("needs qemu-user")
    check(board, f"qmatmul:m={M},n={N},k={K},a=u8", "u8", "relu6", compile_pool, monkeypatch, scale)
