"""TFLite's int8 and uint8 MEAN over H and W as an integer kernel: TFLite's arithmetic (the int32 sum
minus n times the input's zero point, rescaled by the multiplier QuantizeMultiplier makes of the two scales
folded with 1/n, gemmlowp's two roundings, plus the output's zero point; a float mean rounded by
QuantizeLinear rounds elsewhere). The arithmetic (qpool.ScaledMean.reference) against LiteRT's reference
kernels on models written here, every case of scales, zero points and kept dimensions; the kernel against
it on the host, under qemu-aarch64 and through the loop-nest interpreter, in both layouts; whole models (a
MEAN alone, keep_dims true and false, and a Keras-style CONV -> MEAN -> FULLY_CONNECTED head) built and
compared with LiteRT's reference kernels, on the host and on qemu-aarch64."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.board_run import run_cases
from tests.nest_interp import check_one_input_op
from tests.tflite_nets import SAME, Net
from tests.tflite_run import feeds, litert, litert_ranges
from xtune.boards.board import get_board
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import random_input, run_network
from xtune.frontend.load import load_graph
from xtune.ops.layout import Layout
from xtune.ops.pool2d import GlobalAveragePool
from xtune.ops.qpool import ScaledMean
from xtune.ops.quantize import QType

pytest.importorskip("ai_edge_litert")

SHAPE = (2, 4, 6, 16)  # NHWC: 24 pixels a plane, not a power of two (and an even count: ties)


def _means(net: Net, axes: tuple[int, ...], keep: bool, same: bool) -> list[int]:
    x = net.input(SHAPE)
    if net.ranges is not None:  # an int8 input zero point away from 0 (its range is the tests' choice)
        net.tensors[x].zero_point = np.array([-9 + net.offset], np.int64)
    return [net.mean(x, axes, keep, same_quantization=same)]


def _model(kind: str, axes: tuple[int, ...], keep: bool, same: bool) -> tuple[bytes, Net]:
    calibration = Net()
    data = calibration.tflite(_means(calibration, axes, keep, same))
    net = Net(litert_ranges(data, feeds(data, seed=7)), unsigned=kind == "uint8")
    return net.tflite(_means(net, axes, keep, same)), net


def _scaled(net: Net, count: int) -> ScaledMean:
    """The ScaledMean of the model's MEAN (its input is tensor 0, its output the last tensor)."""
    x, y = net.tensors[0], net.tensors[-1]
    assert (
        x.scale is not None and x.zero_point is not None and y.scale is not None and y.zero_point is not None
    )
    qtype: QType = "uint8" if net.quantized == "uint8" else "int8"
    return ScaledMean.of(
        qtype, count, float(x.scale[0]), int(x.zero_point[0]), float(y.scale[0]), int(y.zero_point[0])
    )


@pytest.mark.parametrize("kind", ["int8", "uint8"])
@pytest.mark.parametrize(("axes", "keep"), [((1, 2), True), ((1, 2), False), ((2,), True), ((1, 3), False)])
@pytest.mark.parametrize("same", [True, False], ids=["same-scale", "other-scale"])
def test_the_scaled_mean_is_litert_reference_mean(
    kind: str, axes: tuple[int, ...], keep: bool, same: bool
) -> None:
    """QuantizedMeanOrSum, the path LiteRT's reference kernels take for every int8 and uint8 MEAN, equals
    ScaledMean on every output, over any axes."""
    data, net = _model(kind, axes, keep, same)
    mean = _scaled(net, int(np.prod([SHAPE[a] for a in axes])))
    assert (mean.multiplier, mean.shift) != (1 << 30, 1) or same
    for seed in range(3):
        x = random_input(SHAPE, seed, kind)
        want = litert(data, [x], reference=True)[0]
        np.testing.assert_array_equal(mean.reference(x.astype(np.int64).sum(axis=axes, keepdims=keep)), want)


def tflite_mean(x: np.ndarray, mean: ScaledMean, axes: tuple[int, int]) -> np.ndarray:
    """QuantizedMeanOrSum (tensorflow/lite/kernels/internal/reference/reduce.h) transcribed for one
    multiplier and shift, Python integers, with gemmlowp's SaturatingRoundingDoublingHighMul and
    RoundingDivideByPOT (fixedpoint.h) written out."""
    sums = x.astype(np.int64).sum(axis=axes, keepdims=True)
    out = np.zeros(sums.shape, mean.qtype)
    lo, hi = np.iinfo(mean.qtype).min, np.iinfo(mean.qtype).max
    left, right = max(mean.shift, 0), max(-mean.shift, 0)
    for at, total in np.ndenumerate(sums):
        v = int(total) - mean.x_zero * mean.count
        v = ((v << left) + (1 << 31)) % (1 << 32) - (1 << 31)  # int32 wrap-around of the shift
        ab = v * mean.multiplier
        nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
        high = int((ab + nudge) / (1 << 31))  # C's division truncates toward zero
        mask = (1 << right) - 1
        threshold = (mask >> 1) + (1 if high < 0 else 0)
        rounded = (high >> right) + (1 if (high & mask) > threshold else 0)
        out[at] = min(max(rounded + mean.y_zero, lo), hi)
    return out


MEANS = {
    "int8-same": ScaledMean.of("int8", 35, 0.02, -3, 0.02, -3),
    "int8-other": ScaledMean.of("int8", 35, 0.05, -9, 0.0125, 40),
    "uint8-other": ScaledMean.of("uint8", 35, 0.011, 131, 0.004, 122),
    "int8-shift-left": ScaledMean.of("int8", 35, 0.9, 5, 0.01, -2),  # a scale ratio the plane does not undo
}


def _case(name: str, layout: Layout) -> tuple[GlobalAveragePool, np.ndarray, np.ndarray]:
    mean = MEANS[name]
    n, h, w, c = SHAPE
    x = random_input(SHAPE, 3, mean.qtype)
    want = tflite_mean(x, mean, (1, 2)).reshape(n, c, 1, 1)
    pool = GlobalAveragePool(n=n, c=c, h=h, w=w, layout=layout, quantized=mean)
    if layout is Layout.NCHW:
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return pool, x, want


def test_a_left_shifted_case_is_covered() -> None:
    assert MEANS["int8-shift-left"].shift > 0 and MEANS["int8-other"].shift < 0


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("name", MEANS)
def test_the_integer_mean_is_tflites_transcribed(name: str, layout: Layout) -> None:
    check_one_input_op(*_case(name, layout), lanes=(1, 4))


@pytest.mark.parametrize("board", ["local", "qemu-aarch64"])
def test_the_integer_mean_runs_exactly_on_the_boards(board: str) -> None:
    run_cases(board, "mean", ((f"{n} {lay.value}", *_case(n, lay)) for n in MEANS for lay in Layout))


def _head(net: Net) -> list[int]:
    """A Keras classifier head: CONV 3x3 (ReLU) -> MEAN over H and W (keep_dims false: Keras's
    GlobalAveragePooling2D) -> FULLY_CONNECTED."""
    x = net.input((1, 6, 6, 5))
    y = net.conv(x, 8, 3, 1, padding=SAME, act="RELU")
    return [net.fc(net.mean(y, (1, 2), keep_dims=False), 4)]


def _kept(net: Net) -> list[int]:
    """MEAN over H and W, keep_dims true, the input's scale and zero point."""
    return [net.mean(net.input(SHAPE), (1, 2), keep_dims=True, same_quantization=True)]


def _flat(net: Net) -> list[int]:
    """MEAN over H and W, keep_dims false, its own scale and zero point, the model's output."""
    return [net.mean(net.input(SHAPE), (1, 2), keep_dims=False)]


NETS = {"head": (_head, (1, 6, 6, 5)), "kept": (_kept, SHAPE), "flat": (_flat, SHAPE)}


@pytest.fixture(scope="module", params=[(n, k) for n in NETS for k in ("int8", "uint8")], ids=str)
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[bytes, Path, str]:
    name, kind = request.param
    build, _ = NETS[name]
    calibration = Net()
    data = calibration.tflite(build(calibration))
    net = Net(litert_ranges(data, feeds(data, seed=7)), unsigned=kind == "uint8")
    data = net.tflite(build(net))
    path = tmp_path_factory.mktemp("tflite") / f"{name}_{kind}.tflite"
    path.write_bytes(data)
    return data, path, name


def test_a_tflite_mean_becomes_an_integer_global_pool(built: tuple[bytes, Path, str]) -> None:
    _, path, _ = built
    graph = load_graph(path)
    means = [n for n in graph.nodes if n.op == "com.microsoft.QLinearGlobalAveragePool"]
    assert len(means) == 1 and means[0].attrs["requant"] == "tflite"
    kind = graph.dtype(graph.inputs[0])
    assert graph.dtype(means[0].inputs[0]) == graph.dtype(means[0].outputs[0]) == kind


def test_a_tflite_mean_equals_litert_reference_kernels(built: tuple[bytes, Path, str]) -> None:
    data, path, name = built
    shape, kind = NETS[name][1], path.stem.split("_")[-1]
    artifact = build_model(path, get_board("local").target)
    for seed in range(3):
        x = random_input(shape, seed, kind)
        got, _ = run_network(get_board("local"), artifact, x)
        np.testing.assert_array_equal(got, litert(data, [x], reference=True)[0], err_msg=f"seed {seed}")


def test_a_keras_head_equals_litert_reference_kernels_on_qemu_aarch64(tmp_path: Path) -> None:
    board = get_board("qemu-aarch64")
    if shutil.which(board.target.qemu_binary or "") is None:
        pytest.skip(f"needs {board.target.qemu_binary}")
    calibration = Net()
    data = calibration.tflite(_head(calibration))
    net = Net(litert_ranges(data, feeds(data, seed=7)))
    data = net.tflite(_head(net))
    path = tmp_path / "head.tflite"
    path.write_bytes(data)
    artifact = build_model(path, board.target)
    for seed in range(2):
        x = random_input((1, 6, 6, 5), seed, "int8")
        got, _ = run_network(board, artifact, x)
        np.testing.assert_array_equal(got, litert(data, [x], reference=True)[0], err_msg=f"seed {seed}")
