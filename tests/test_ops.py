"""Network operator tests: shapes in; kernels generated from loop nests, compiled, run once through the
agent on this machine and under QEMU, and compared with their numpy references (odd sizes, pads, tails)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from tests.board_run import image, run_entry
from tests.nest_interp import run_kernel
from xtune.boards.board import get_board
from xtune.codegen.lower import lower
from xtune.errors import InputError
from xtune.ops.bmm import BatchedMatmul
from xtune.ops.concat import Concat
from xtune.ops.elementwise import Elementwise, ElementwiseOp, relu
from xtune.ops.layout import Layout
from xtune.ops.opkit import GeneratedOp as Operator
from xtune.ops.pool2d import GlobalAveragePool, Pool2d, PoolKind
from xtune.ops.resize import Resize, axis_taps
from xtune.ops.softmax import Softmax
from xtune.ops.transpose import Transpose
from xtune.schedule.loopnest import (
    Assign,
    Buffer,
    BufferKind,
    Exp,
    Load,
    Log,
    NestBuilder,
    Shuffle,
    walk,
)

MAX, AVG = PoolKind.MAX, PoolKind.AVERAGE
NHWC = Layout.NHWC
CASES: dict[str, Operator] = {
    "maxpool3s2p1": Pool2d(kind=MAX, n=1, c=5, h=13, w=11, kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1)),
    "maxpool2s2": Pool2d(kind=MAX, n=2, c=3, h=8, w=9, kernel=(2, 2), stride=(2, 2)),
    "maxpool3s1-asym": Pool2d(kind=MAX, n=1, c=3, h=7, w=19, kernel=(3, 3), pads=(1, 0, 2, 1)),
    "avgpool3s1p1": Pool2d(kind=AVG, n=1, c=4, h=9, w=21, kernel=(3, 3), pads=(1, 1, 1, 1)),
    "avgpool2s2-end": Pool2d(kind=AVG, n=1, c=3, h=7, w=7, kernel=(2, 2), stride=(2, 2), pads=(0, 0, 1, 1)),
    "avgpool5x3s21": Pool2d(kind=AVG, n=1, c=2, h=11, w=13, kernel=(5, 3), stride=(2, 1), pads=(2, 1, 2, 1)),
    "gap7x7": GlobalAveragePool(n=1, c=13, h=7, w=7),
    "gap-batch": GlobalAveragePool(n=2, c=3, h=5, w=3),
    "add": Elementwise(op=ElementwiseOp.ADD, shape=(1, 5, 7, 9)),
    "add-relu": Elementwise(op=ElementwiseOp.ADD_RELU, shape=(1, 3, 11, 11)),
    "relu": relu((1, 7, 5, 3)),
    "relu6": Elementwise(op=ElementwiseOp.CLIP, shape=(1, 37, 3, 3), lo=0.0, hi=6.0),
    "clip": Elementwise(op=ElementwiseOp.CLIP, shape=(3,), lo=-1.0, hi=0.5),
    "softmax1000": Softmax(rows=1, length=1000),
    "softmax-rows": Softmax(rows=3, length=13),
    "softmax-short": Softmax(rows=2, length=5),
    "concat3": Concat(n=1, channels=(3, 5, 2), h=7, w=5),
    "concat-batch": Concat(n=2, channels=(4, 1), h=3, w=3),
    # NHWC (the layout pass's): channels as vectors, with a tail; windows clipped by the pads
    "maxpool3s2p1-nhwc": Pool2d(
        kind=MAX, n=1, c=21, h=13, w=11, kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1), layout=NHWC
    ),
    "avgpool5x3s21-nhwc": Pool2d(
        kind=AVG, n=2, c=5, h=11, w=13, kernel=(5, 3), stride=(2, 1), pads=(2, 1, 2, 1), layout=NHWC
    ),
    "gap7x7-nhwc": GlobalAveragePool(n=1, c=37, h=7, w=7, layout=NHWC),
    "gap-batch-nhwc": GlobalAveragePool(n=2, c=3, h=5, w=3, layout=NHWC),
    "to-nhwc": Transpose(n=2, c=5, h=7, w=3, to=NHWC),
    "to-nchw": Transpose(n=1, c=19, h=4, w=9, to=Layout.NCHW),
    # vector blocks of 4, 8 and 16 lanes with both edges left over
    "to-nhwc-blocks": Transpose(n=2, c=35, h=9, w=7, to=NHWC),
    "to-nchw-blocks": Transpose(n=1, c=37, h=5, w=11, to=Layout.NCHW),
    # fewer channels than lanes (an image's 3, the network's input): interleaving shuffles, and a tail
    "to-nhwc-rgb": Transpose(n=2, c=3, h=7, w=11, to=NHWC),
    "to-nhwc-2ch": Transpose(n=1, c=2, h=5, w=13, to=NHWC),
    # batch axes broadcast both ways; n = 19 (full vectors and a partial one)
    "batched-matmul": BatchedMatmul(a=(2, 1, 3, 5), b=(3, 5, 19)),
    # bilinear x2 half-pixel rows, nearest x1.5 columns; channels as vectors with a tail
    "resize-nhwc": Resize(
        n=1,
        c=11,
        h=4,
        w=6,
        rows=axis_taps("linear", "half_pixel", "round_prefer_floor", 4, 8, 2.0),
        cols=axis_taps("nearest", "asymmetric", "floor", 6, 9, 1.5),
        layout=NHWC,
    ),
    # NCHW: vectors of W outputs, lanes picked by shuffles, per-lane weights, a partial last vector
    "resize-nchw": Resize(
        n=2,
        c=3,
        h=4,
        w=6,
        rows=axis_taps("nearest", "asymmetric", "floor", 4, 6, 1.5),
        cols=axis_taps("linear", "half_pixel", "round_prefer_floor", 6, 13, 13 / 6),
    ),
}
BOARD_CASES = (
    "maxpool3s2p1",
    "maxpool3s1-asym",
    "avgpool5x3s21",
    "gap7x7",
    "add-relu",
    "relu6",
    "softmax1000",
    "softmax-short",
    "concat3",
    "maxpool3s2p1-nhwc",
    "avgpool5x3s21-nhwc",
    "gap7x7-nhwc",
    "to-nhwc",
    "to-nchw",
    "to-nhwc-blocks",
    "to-nchw-blocks",
    "to-nhwc-rgb",
)


def check(board: str, op: Operator) -> None:
    target = get_board(board).target
    rng = np.random.default_rng(7)
    inputs = [(rng.standard_normal(s) * 3).astype(np.float32) for s in op.input_shapes]
    out = np.full(op.output_shape, np.nan, np.float32)
    got = run_entry(board, image(op.kernel_nest("op", target.fp32_lanes), target), "op", [*inputs, out])
    for before, after in zip(inputs, got, strict=False):
        np.testing.assert_array_equal(after, before)  # inputs are read only
    np.testing.assert_allclose(got[-1], op.reference(*inputs), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("name", CASES)
def test_operators_on_host(name: str) -> None:
    check("local", CASES[name])


@pytest.mark.parametrize("name", BOARD_CASES)
def test_operators_under_qemu(qemu_board: str, name: str) -> None:
    check(qemu_board, CASES[name])


def check_in_place(board: str, op: Elementwise, slot: int) -> None:
    """The output is input `slot` itself, as the memory plan's in-place steps call it."""
    target = get_board(board).target
    rng = np.random.default_rng(5)
    inputs = [(rng.standard_normal(s) * 3).astype(np.float32) for s in op.input_shapes]
    args = (*range(len(inputs)), slot)
    got = run_entry(board, image(op.kernel_nest("op", target.fp32_lanes), target), "op", inputs, args)
    np.testing.assert_allclose(got[slot], op.reference(*inputs), rtol=2e-6, atol=1e-7)


IN_PLACE = (("add", 0), ("add-relu", 1), ("relu6", 0))


@pytest.mark.parametrize(("name", "slot"), IN_PLACE)
def test_elementwise_in_place_on_host(name: str, slot: int) -> None:
    op = CASES[name]
    assert isinstance(op, Elementwise)
    check_in_place("local", op, slot)


@pytest.mark.parametrize(("name", "slot"), IN_PLACE)
def test_elementwise_in_place_under_qemu(qemu_board: str, name: str, slot: int) -> None:
    op = CASES[name]
    assert isinstance(op, Elementwise)
    check_in_place(qemu_board, op, slot)


def exp_values() -> np.ndarray:
    edges = [-np.inf, -200, -104, -103.5, -100, -90, -87.5, -1e-30, 0, 1e-30, 88.7, 88.73, 89, np.inf]
    return np.concatenate([np.linspace(-87.3, 88.7, 20011), edges]).astype(np.float32)


def check_exp(board: str) -> None:
    """Exp against numpy in float64: within 1e-6 relative where the result is a normal float."""
    target = get_board(board).target
    x = exp_values()
    b, lanes = NestBuilder(), target.fp32_lanes
    b.split(x.size, lanes, lambda i, n: b.store("y", i, Exp(Load("x", i, lanes, n)), lanes, n))
    kernel = b.kernel("exp", (Buffer("x", x.size, BufferKind.INPUT), Buffer("y", x.size, BufferKind.OUTPUT)))
    _, y = run_entry(board, image(kernel, target), "exp", [x, np.full_like(x, np.nan)])
    want = np.exp(x.astype(np.float64))
    normal = (want >= np.finfo(np.float32).tiny) & (want <= np.finfo(np.float32).max)
    rel = np.abs(y[normal] - want[normal]) / want[normal]
    assert rel.max() <= 1e-6, (rel.max(), x[normal][rel.argmax()])
    tiny = ~normal & (want < 1)
    np.testing.assert_allclose(y[tiny], want[tiny], rtol=0, atol=2.0**-149)  # subnormal: within one step
    assert np.all(np.isposinf(y[want > np.finfo(np.float32).max]))


def test_exp_accuracy_on_host() -> None:
    check_exp("local")


def test_exp_accuracy_under_qemu(qemu_board: str) -> None:
    check_exp(qemu_board)


def check_log(board: str) -> None:
    """Log against numpy in float64 over the positive normal floats (every binade, both sides of each
    mantissa fold at sqrt(1/2)): within 2e-7 absolute near 1 (where ln x is near 0) and 1e-6 relative
    elsewhere."""
    target = get_board(board).target
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            np.float32(2.0) ** np.arange(-126, 128, dtype=np.float32),
            np.exp2(rng.uniform(-126, 127.9, 20000)),
            rng.uniform(0.5, 2.0, 5000),
            [
                np.float32(0.70710677),
                np.float32(0.7071068),
                np.finfo(np.float32).max,
                np.finfo(np.float32).tiny,
            ],
        ]
    ).astype(np.float32)
    b, lanes = NestBuilder(), target.fp32_lanes
    b.split(x.size, lanes, lambda i, n: b.store("y", i, Log(Load("x", i, lanes, n)), lanes, n))
    kernel = b.kernel("log", (Buffer("x", x.size, BufferKind.INPUT), Buffer("y", x.size, BufferKind.OUTPUT)))
    _, y = run_entry(board, image(kernel, target), "log", [x, np.full_like(x, np.nan)])
    want = np.log(x.astype(np.float64))
    err = np.abs(y - want) / np.maximum(np.abs(want), 0.2)
    assert err.max() <= 1e-6, (err.max(), x[err.argmax()])


def test_log_accuracy_on_host() -> None:
    check_log("local")


def test_log_accuracy_under_qemu(qemu_board: str) -> None:
    check_log(qemu_board)


def test_nhwc_operators_compute_the_nchw_ones_transposed() -> None:
    """An NHWC pool is the NCHW pool of the transposed input, transposed: not just its own reference."""
    rng = np.random.default_rng(2)
    for name in ("maxpool3s2p1-nhwc", "avgpool5x3s21-nhwc", "gap7x7-nhwc"):
        op = CASES[name]
        assert isinstance(op, Pool2d | GlobalAveragePool)
        nchw = replace(op, layout=Layout.NCHW)
        x = rng.standard_normal(nchw.input_shapes[0]).astype(np.float32)
        to_nhwc = Transpose(n=x.shape[0], c=x.shape[1], h=x.shape[2], w=x.shape[3], to=NHWC)
        out = np.full(op.output_shape, np.nan, np.float32)
        run_kernel(op.kernel_nest("op", 4), [to_nhwc.reference(x), out])
        want = nchw.reference(x)
        got = out if want.shape[2:] == (1, 1) else out.transpose(0, 3, 1, 2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_pool_output_shapes_follow_onnx() -> None:
    """floor((in + pads - kernel) / stride) + 1 (ceil_mode=0): ResNet's stem pool; one that drops a row."""
    assert Pool2d(
        kind=MAX, n=1, c=64, h=112, w=112, kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1)
    ).output_shape == (1, 64, 56, 56)
    assert CASES["maxpool2s2"].output_shape == (2, 3, 4, 4)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Pool2d(kind=MAX, n=1, c=1, h=5, w=5, kernel=(3, 3), pads=(3, 0, 0, 0)), "smaller than"),
        (lambda: Pool2d(kind=AVG, n=1, c=1, h=2, w=5, kernel=(3, 3)), "does not fit"),
        (lambda: Pool2d(kind=AVG, n=1, c=0, h=5, w=5, kernel=(3, 3)), "'c' must be a positive"),
        (lambda: Elementwise(op=ElementwiseOp.CLIP, shape=(4,), lo=1.0, hi=0.0), "above max"),
        (lambda: Concat(n=1, channels=(2, 0), h=1, w=1), "'channels1' must be a positive"),
    ],
)
def test_impossible_operators_are_input_errors(make: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        make()  # type: ignore[operator]


@pytest.mark.parametrize("name", CASES)
def test_nests_match_the_references_without_llvm(name: str) -> None:
    """The loop nests themselves, through the reference interpreter, at a width no target has (3 lanes)."""
    op = CASES[name]
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in op.input_shapes]
    out = np.full(op.output_shape, np.nan, np.float32)
    run_kernel(op.kernel_nest("op", 3), [*inputs, out])
    np.testing.assert_allclose(out, op.reference(*inputs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lanes", [2, 4, 8])
def test_transposes_in_vector_blocks_without_llvm(lanes: int) -> None:
    """The shuffle rounds of a block transpose, at every width a target has (the interpreter)."""
    for name in ("to-nhwc-blocks", "to-nchw-blocks"):
        op = CASES[name]
        x = np.random.default_rng(lanes).standard_normal(op.input_shapes[0]).astype(np.float32)
        out = np.full(op.output_shape, np.nan, np.float32)
        kernel = op.kernel_nest("op", lanes)
        assert any(isinstance(s, Assign) and isinstance(s.value, Shuffle) for s, _ in walk(kernel.body))
        run_kernel(kernel, [x, out])
        np.testing.assert_array_equal(out, op.reference(x), err_msg=name)


def test_only_elementwise_kernels_may_alias() -> None:
    """An in-place call would break a noalias promise (undefined behaviour): elementwise kernels make none."""
    for name, op in CASES.items():
        text = lower([op.kernel_nest("op", 8)])
        assert ("noalias" in text) != isinstance(op, Elementwise), name


def test_random_pools_match_the_reference_without_llvm() -> None:
    """Windows clipped by any mix of kernel, stride and pads (each pad below the kernel, as ONNX requires),
    in either layout."""
    rng = random.Random(0)
    for seed in range(300):
        kh, kw, sh, sw = rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 3), rng.randint(1, 3)
        pads = (rng.randrange(kh), rng.randrange(kw), rng.randrange(kh), rng.randrange(kw))
        h, w = rng.randint(1, 9), rng.randint(1, 9)
        if h + pads[0] + pads[2] < kh or w + pads[1] + pads[3] < kw:
            continue
        kind, layout = rng.choice(list(PoolKind)), rng.choice(list(Layout))
        c = rng.randint(1, 9)
        op = Pool2d(kind=kind, n=1, c=c, h=h, w=w, kernel=(kh, kw), stride=(sh, sw), pads=pads, layout=layout)
        x = np.random.default_rng(seed).standard_normal(op.input_shapes[0]).astype(np.float32)
        out = np.full(op.output_shape, np.nan, np.float32)
        run_kernel(op.kernel_nest("p", rng.choice([1, 3, 4])), [x, out])
        np.testing.assert_allclose(out, op.reference(x), rtol=1e-5, atol=1e-6, err_msg=str(op))
