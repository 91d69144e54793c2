"""Asymmetric padding: conv2d and depthwise workloads with per-side pads in, their canonical keys, their
references against ONNX Runtime's Conv and their kernels' outputs (local board, QEMU) out."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.test_conv import check, configs
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.firmware.network_bench import bench_model
from xtune.ops.conv import conv_shape
from xtune.ops.registry import parse_workload
from xtune.ops.workload import RTOL, compare_output, random_inputs
from xtune.tuning.peers import onnx_model, ort_available, ort_session

# TensorFlow "same" at stride 2 (the odd pixel at the bottom and right), every side its own, a window
# taller than wide (DS-CNN's 10x4), both layouts, depthwise with a multiplier, one side only.
SHAPES = (
    "conv2d:n=1,c=3,h=9,w=8,k=5,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1",
    "conv2d:n=1,c=5,h=10,w=7,k=6,r=3,s=3,stride=1,pad=1,pad_left=2,pad_bottom=0,pad_right=3,bias=1",
    "conv2d:n=1,c=1,h=13,w=10,k=7,r=10,s=4,stride=2,pad=4,pad_left=1,pad_bottom=5,pad_right=2,relu=1",
    "conv2d:n=1,c=4,h=9,w=8,k=9,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1,layout=nhwc,bias=1",
    "conv2d:n=1,c=3,h=8,w=9,k=4,r=5,s=2,stride=1,pad=2,pad_left=0,pad_bottom=2,pad_right=1,layout=nhwc",
    "depthwise:n=1,c=5,h=9,w=11,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1,bias=1",
    "depthwise:n=1,c=3,h=10,w=9,r=3,s=3,stride=1,pad=1,pad_left=0,pad_right=2,multiplier=2",
    "depthwise:n=1,c=6,h=9,w=11,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1,layout=nhwc,relu=1",
    "depthwise:n=1,c=4,h=7,w=8,r=5,s=3,stride=1,pad=2,pad_top=0,pad_right=0,layout=nhwc",
)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            "conv2d:n=1,c=3,h=9,w=9,k=4,r=3,s=3,pad=1,pad_top=1,pad_left=1,pad_bottom=1,pad_right=1",
            "conv2d:n=1,c=3,h=9,w=9,k=4,r=3,s=3,stride=1,pad=1",
        ),
        (
            "conv2d:n=1,c=3,h=9,w=9,k=4,r=3,s=3,pad_top=2,pad_left=2,pad_bottom=2,pad_right=2",
            "conv2d:n=1,c=3,h=9,w=9,k=4,r=3,s=3,stride=1,pad=2",
        ),
        (
            "conv2d:n=1,c=3,h=9,w=9,k=4,r=3,s=3,pad_bottom=1,pad_right=1,pad_top=0",
            "conv2d:n=1,c=3,h=9,w=9,k=4,r=3,s=3,stride=1,pad=0,pad_bottom=1,pad_right=1",
        ),
        (
            "depthwise:n=1,c=3,h=9,w=9,r=3,s=3,pad=2,pad_top=1",
            "depthwise:n=1,c=3,h=9,w=9,r=3,s=3,stride=1,pad=1,pad_left=2,pad_bottom=2,pad_right=2",
        ),
    ],
)
def test_one_padding_has_one_key_and_a_symmetric_one_is_the_old_key(text: str, key: str) -> None:
    assert parse_workload(text).key == key
    assert parse_workload(key).key == key


def test_sides_set_the_output_size() -> None:
    sh = conv_shape(
        parse_workload(
            "conv2d:n=1,c=1,h=49,w=10,k=64,r=10,s=4,stride=2,pad=4,pad_left=1,pad_bottom=5,pad_right=2"
        )
    )
    assert (sh.top, sh.left, sh.bottom, sh.right) == (4, 1, 5, 2)
    assert (sh.oh, sh.ow) == (25, 5)  # TensorFlow "same": ceil(49 / 2), ceil(10 / 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("conv2d:n=1,c=1,h=4,w=4,k=1,r=3,s=3,pad_bottom=-2", "'pad_bottom' must be a non-negative"),
        ("depthwise:n=1,c=1,h=2,w=4,r=5,s=3,pad=1,pad_top=0", "more than the padded input's 3"),
        ("conv2d:n=1,c=1,h=9,w=9,k=1,r=3,s=3,pad=0,pad_right=1,algo=winograd", "one pad on every side"),
    ],
)
def test_impossible_sides_are_input_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_workload(text)


@pytest.mark.skipif(not ort_available(), reason="needs onnxruntime")
@pytest.mark.parametrize("key", SHAPES)
def test_references_match_onnx_runtime(key: str) -> None:
    wl = parse_workload(key)
    session = ort_session(onnx_model(wl).SerializeToString())
    x = random_inputs(wl)[0]
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert compare_output(got, wl.reference(random_inputs(wl)).astype(np.float32), RTOL) == ""


@pytest.mark.parametrize("key", SHAPES)
def test_kernels_correct_on_host(key: str) -> None:
    check("local", key, configs(key, get_board("local").target.name, 3))


@pytest.mark.parametrize("key", (SHAPES[0], SHAPES[3], SHAPES[6], SHAPES[7]))
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64"])
def test_kernels_correct_under_qemu(board: str, key: str) -> None:
    if shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    check(board, key, configs(key, get_board(board).target.name, 1))


def pooling_network(auto_pad: str) -> onnx.ModelProto:
    """A conv with TensorFlow's "same" at stride 2, then MaxPool and AveragePool whose windows overhang
    the bottom and right (explicit asymmetric pads, or auto_pad)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w")
    pads = {"auto_pad": auto_pad} if auto_pad != "NOTSET" else {"pads": [0, 0, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", strides=[2, 2], **pads),
        helper.make_node("MaxPool", ["c"], ["m"], name="max", kernel_shape=[3, 2], strides=[2, 2], **pads),
        helper.make_node("AveragePool", ["m"], ["y"], name="avg", kernel_shape=[2, 3], **pads),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 13, 11])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "pools", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER"])
def test_asymmetric_pads_of_conv_and_pooling_build_and_match_onnx_runtime(auto_pad: str, layout: str) -> None:
    report = bench_model(pooling_network(auto_pad), get_board("local"), repeat=0, layout=layout)
    assert report.correct, report.error
