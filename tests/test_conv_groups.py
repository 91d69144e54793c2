"""Grouped convolution: conv2d workloads with groups=G in, their keys, references against ONNX Runtime's
Conv, kernels' outputs (local board, QEMU) and grouped Conv nodes of a network built end to end out."""

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
from xtune.frontend.tasks import extract_tasks
from xtune.ops.conv2d.direct import Conv2dTemplate
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import RTOL, compare_output, random_inputs
from xtune.target import get_target
from xtune.tuning.peers import onnx_model, ort_available, ort_session

# Odd group counts (2, 3, 4, 8), channels per group not a multiple of any vector width (15, 3, 5, 7),
# ShuffleNet's pointwise group convs, ResNeXt's 3x3 with 4 channels per group, stride 2, both layouts,
# the epilogue, prepacked weights and asymmetric pads.
SHAPES = (
    "conv2d:n=1,c=60,h=7,w=9,k=60,r=1,s=1,stride=1,pad=0,groups=4,bias=1,relu=1",
    "conv2d:n=1,c=9,h=8,w=7,k=15,r=3,s=3,stride=1,pad=1,groups=3",
    "conv2d:n=2,c=16,h=9,w=10,k=8,r=3,s=3,stride=2,pad=1,groups=2,bias=1",
    "conv2d:n=1,c=32,h=6,w=6,k=32,r=3,s=3,stride=1,pad=1,groups=8,layout=nhwc,bias=1,relu=1",
    "conv2d:n=1,c=24,h=7,w=5,k=40,r=1,s=1,stride=1,pad=0,groups=8,layout=nhwc,prepacked=1",
    "conv2d:n=1,c=21,h=9,w=8,k=14,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1,groups=7,prepacked=1",
    "conv2d:n=1,c=12,h=5,w=6,k=18,r=3,s=3,stride=1,pad=1,groups=3,layout=nhwc,residual=1",
)


def test_groups_one_is_the_old_key_and_groups_must_divide_the_channels() -> None:
    assert parse_workload("conv2d:n=1,c=4,h=5,w=5,k=4,r=3,s=3,groups=1").key == (
        "conv2d:n=1,c=4,h=5,w=5,k=4,r=3,s=3,stride=1,pad=0"
    )
    wl = parse_workload("conv2d:n=1,c=6,h=5,w=5,k=9,r=3,s=3,groups=3")
    assert [t.shape for t in wl.tensors()] == [(1, 6, 5, 5), (9, 2, 3, 3), (1, 9, 3, 3)]
    assert wl.flops() == 2 * 9 * 3 * 3 * 2 * 3 * 3
    bad_keys = (
        ("c=6,k=8,groups=3", "must divide"),
        ("c=6,k=6,groups=0", "groups"),
        ("c=6,k=6,groups=2,algo=winograd", "groups=1"),
    )
    for bad, why in bad_keys:
        with pytest.raises(InputError, match=why):
            parse_workload(f"conv2d:n=1,h=5,w=5,r=3,s=3,{bad}")


def test_a_grouped_pointwise_conv_is_the_direct_template_over_one_groups_channels() -> None:
    template = template_for(parse_workload(SHAPES[0]), get_target("x86-avx2"))
    assert isinstance(template, Conv2dTemplate)
    assert template.as_matmul is None and (template.shape.c, template.shape.k) == (15, 15)


@pytest.mark.skipif(not ort_available(), reason="needs onnxruntime")
@pytest.mark.parametrize("key", SHAPES)
def test_references_match_onnx_runtime(key: str) -> None:
    wl = parse_workload(key.replace(",prepacked=1", ""))
    session = ort_session(onnx_model(wl).SerializeToString())
    inputs = random_inputs(wl)
    feed = {session.get_inputs()[0].name: inputs[0]}
    got = session.run(None, feed)[0]
    assert compare_output(got, wl.reference(inputs).astype(np.float32), RTOL) == ""


@pytest.mark.parametrize("key", SHAPES)
def test_kernels_correct_on_host(key: str) -> None:
    check("local", key, configs(key, get_board("local").target.name, 3))


@pytest.mark.parametrize("key", (SHAPES[1], SHAPES[4]))
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64"])
def test_kernels_correct_under_qemu(board: str, key: str) -> None:
    if shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    check(board, key, configs(key, get_board(board).target.name, 1))


def grouped_network(seed: int = 0) -> onnx.ModelProto:
    """A ShuffleNet-style stem: a 3x3 conv, a group-3 pointwise conv, a group-4 3x3 conv with
    BatchNormalization and Relu, a group-8 pointwise conv, a depthwise conv (group = channels) between."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []

    def weights(name: str, k: int, cg: int, r: int) -> str:
        w = (rng.standard_normal((k, cg, r, r)) * np.sqrt(2 / (cg * r * r))).astype(np.float32)
        inits.append(numpy_helper.from_array(w, name))
        return name

    def vector(name: str, n: int, lo: float, hi: float) -> str:
        inits.append(numpy_helper.from_array(rng.uniform(lo, hi, n).astype(np.float32), name))
        return name

    node = helper.make_node
    ranges = (("g", 0.5, 1.5), ("b", -0.2, 0.2), ("m", -0.2, 0.2), ("v", 0.5, 1.5))
    bn = [vector(f"bn.{p}", 24, lo, hi) for p, lo, hi in ranges]
    nodes = [
        node("Conv", ["x", weights("w0", 12, 3, 3)], ["a"], name="stem", pads=[1, 1, 1, 1]),
        node("Conv", ["a", weights("w1", 24, 4, 1)], ["b"], name="pw_g3", group=3),
        node("Conv", ["b", weights("w2", 24, 6, 3)], ["c"], name="g4", group=4, pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c", *bn], ["d"], name="bn"),
        node("Relu", ["d"], ["e"], name="relu"),
        node("Conv", ["e", weights("w3", 24, 1, 3)], ["f"], name="dw", group=24, pads=[1, 1, 1, 1]),
        node("Conv", ["f", weights("w4", 16, 3, 1), vector("b4", 16, -0.1, 0.1)], ["y"], name="g8", group=8),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 11, 10])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 11, 10])
    graph = helper.make_graph(nodes, "grouped", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_grouped_conv_nodes_are_conv2d_tasks_with_their_groups() -> None:
    keys = [t.workload.key for t in extract_tasks(grouped_network(), "x86-avx2", "nchw").tasks]
    assert [k.split(":")[0] for k in keys] == ["conv2d", "conv2d", "conv2d", "depthwise", "conv2d"]
    assert [k.split("groups=")[1].split(",")[0] for k in keys if "groups=" in k] == ["3", "4", "8"]


@pytest.mark.parametrize(
    ("board", "layout"), [("local", "nchw"), ("local", "nhwc"), ("qemu-aarch64", "nhwc")]
)
def test_a_network_of_grouped_convs_builds_and_matches_onnx_runtime(board: str, layout: str) -> None:
    if board != "local" and shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    report = bench_model(grouped_network(), get_board(board), repeat=0, layout=layout)
    assert report.correct, report.error
