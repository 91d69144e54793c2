"""Grouped convolution: conv2d workloads with groups=G in, their keys, references against ONNX Runtime's
Conv, the form each grouped pointwise conv2d takes (the direct template's grouped kernel or one group's
matmul per group, `matmul_per_group`), kernels' outputs of both forms (local board, QEMU), and grouped
Conv nodes of a network and of the ONNX Model Zoo's ShuffleNet as tasks, built end to end."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests import exported
from tests.conftest import CliRunner
from tests.test_conv import FAST, check, configs
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.firmware.network_bench import bench_model
from xtune.frontend.tasks import extract_tasks
from xtune.ops.conv import conv_shape
from xtune.ops.conv2d import direct
from xtune.ops.conv2d.direct import Conv2dTemplate
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import RTOL, compare_output, random_inputs
from xtune.target import get_target
from xtune.tuning.measure import Candidate, Measurer, build_image
from xtune.tuning.peers import onnx_model, ort_available, ort_session

# Odd group counts (2, 3, 4, 8), channels per group not a multiple of any vector width (15, 3, 5, 7),
# ShuffleNet's pointwise group convs, ResNeXt's 3x3 with 4 channels per group, stride 2, both layouts,
# the epilogue, prepacked weights and asymmetric pads; pointwise ones (one group's matmul per group) whose
# groups are whole vectors of every target (16, 32 and 48 channels), and a batch of two in NCHW.
SHAPES = (
    "conv2d:n=1,c=60,h=7,w=9,k=60,r=1,s=1,stride=1,pad=0,groups=4,bias=1,relu=1",
    "conv2d:n=1,c=9,h=8,w=7,k=15,r=3,s=3,stride=1,pad=1,groups=3",
    "conv2d:n=2,c=16,h=9,w=10,k=8,r=3,s=3,stride=2,pad=1,groups=2,bias=1",
    "conv2d:n=1,c=32,h=6,w=6,k=32,r=3,s=3,stride=1,pad=1,groups=8,layout=nhwc,bias=1,relu=1",
    "conv2d:n=1,c=24,h=7,w=5,k=40,r=1,s=1,stride=1,pad=0,groups=8,layout=nhwc,prepacked=1",
    "conv2d:n=1,c=21,h=9,w=8,k=14,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1,groups=7,prepacked=1",
    "conv2d:n=1,c=12,h=5,w=6,k=18,r=3,s=3,stride=1,pad=1,groups=3,layout=nhwc,residual=1",
    "conv2d:n=1,c=64,h=5,w=6,k=32,r=1,s=1,stride=1,pad=0,groups=2,layout=nhwc,bias=1,residual=1,relu=1",
    "conv2d:n=2,c=64,h=3,w=7,k=96,r=1,s=1,stride=1,pad=0,groups=2,layout=nhwc,prepacked=1",
    "conv2d:n=2,c=45,h=4,w=5,k=30,r=1,s=1,stride=1,pad=0,groups=3,residual=1,relu6=1,prepacked=1",
)
POINTWISE = [key for key in SHAPES if "r=1,s=1,stride=1,pad=0," in key]


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


def per_group(key: str, target: str) -> bool:
    """Whether the registered template of `key` on `target` runs one group's matmul per group."""
    template = template_for(parse_workload(key), get_target(target))
    assert isinstance(template, Conv2dTemplate)
    return template.as_matmul is not None


def test_a_grouped_pointwise_conv_runs_one_groups_matmul_whatever_its_group_width() -> None:
    """Groups of whole vectors of every target (32, 16 channels), of none (15, 3, 5), of some (68: whole
    on 4-lane NEON only; 32 in and 12 out), in both layouts, on every target: one group's matmul per
    group. A window, a stride or a pad keeps the grouped direct kernel."""
    targets = ("arm-a72-neon", "x86-avx2", "riscv64-gcv", "x86-avx512", "riscv64-gc")
    widths = ("c=64,k=32,groups=2", "c=272,k=272,groups=4", "c=64,k=24,groups=2", "c=60,k=60,groups=4")
    for channels, layout in ((c, lay) for c in (*widths, "c=24,k=40,groups=8") for lay in ("nchw", "nhwc")):
        key = f"conv2d:n=1,h=5,w=6,r=1,s=1,{channels},layout={layout}"
        assert all(per_group(key, t) for t in targets), key
    windows = ("r=3,s=3,pad=1", "r=1,s=1,stride=2", "r=1,s=1,pad=1")
    for window, layout in ((w, lay) for w in windows for lay in ("nchw", "nhwc")):
        key = f"conv2d:n=1,h=5,w=6,{window},c=64,k=32,groups=2,layout={layout}"
        assert not any(per_group(key, t) for t in targets), key


def test_one_groups_matmul_is_the_template_space_of_every_group() -> None:
    """One task, tuned once for all G groups: the space and default are one group's matmul's."""
    template = template_for(parse_workload(SHAPES[8]), get_target("x86-avx512"))
    assert isinstance(template, Conv2dTemplate) and template.as_matmul is not None
    gemm = template.as_matmul.workload
    assert (gemm["m"], gemm["n"], gemm["k"]) == (2 * 3 * 7, 48, 32)
    nchw = template_for(parse_workload(SHAPES[9]), get_target("x86-avx512"))
    assert isinstance(nchw, Conv2dTemplate) and nchw.as_matmul is not None
    assert [nchw.as_matmul.workload[x] for x in "mnk"] == [10, 20, 15]
    direct = Conv2dTemplate(parse_workload(SHAPES[8]), get_target("x86-avx512"), matmul=False)
    assert direct.as_matmul is None and (direct.shape.c, direct.shape.k, direct.groups) == (32, 48, 2)


@pytest.mark.parametrize("matmul", [True, False], ids=["matmul_per_group", "grouped_kernel"])
@pytest.mark.parametrize("key", POINTWISE)
def test_both_forms_of_a_grouped_pointwise_conv_compute_the_reference(key: str, matmul: bool) -> None:
    board = get_board("local")
    wl = parse_workload(key)
    template = Conv2dTemplate(wl, board.target, matmul)
    measurer = Measurer(board, wl, FAST, template=template)
    try:
        for index in (template.default_config().index, template.space.size // 3):
            result = measurer.run(
                build_image(Candidate(workload=wl, target=board.target, index=index), template)
            )
            assert result.ok, (key, index, result.status, result.error)
    finally:
        measurer.close()


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


@pytest.mark.parametrize("key", (SHAPES[1], SHAPES[4], SHAPES[8], SHAPES[9]))
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64"])
def test_kernels_correct_under_qemu(board: str, key: str) -> None:
    if shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    check(board, key, configs(key, get_board(board).target.name, 1))


def grouped_network(seed: int = 0) -> onnx.ModelProto:
    """A ShuffleNet-style stem: a 3x3 conv, a group-3 pointwise conv, a group-4 3x3 conv with
    BatchNormalization and Relu, a depthwise conv (group = channels), a group-8 pointwise conv and a
    group-2 one of 16 channels per group (whole vectors on every target, where the group-8 one has 3 and 4
    channels per group)."""
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
        node("Conv", ["f", weights("w4", 32, 3, 1), vector("b4", 32, -0.1, 0.1)], ["g"], name="g8", group=8),
        node("Relu", ["g"], ["h"], name="relu2"),
        node("Conv", ["h", weights("w5", 32, 16, 1)], ["y"], name="pw_g2", group=2),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 11, 10])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 11, 10])
    graph = helper.make_graph(nodes, "grouped", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_grouped_conv_nodes_are_conv2d_tasks_with_their_groups() -> None:
    keys = [t.workload.key for t in extract_tasks(grouped_network(), "x86-avx2", "nchw").tasks]
    assert [k.split(":")[0] for k in keys] == ["conv2d", "conv2d", "conv2d", "depthwise", "conv2d", "conv2d"]
    assert [k.split("groups=")[1].split(",")[0] for k in keys if "groups=" in k] == ["3", "4", "8", "2"]
    # The pointwise ones run one group's matmul per group, the 3x3 one the grouped kernel.
    for layout in ("nchw", "nhwc"):
        tasks = extract_tasks(grouped_network(), "x86-avx512", layout).tasks
        keys = [t.workload.key for t in tasks if "groups=" in t.workload.key]
        assert [per_group(k, "x86-avx512") for k in keys] == [True, False, True, True], layout


@pytest.fixture
def grouped_kernel_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The rule as it was before grouped pointwise convs ran their matmul per group: only an ungrouped
    pointwise conv2d is a matmul (templates are cached per workload: emptied before and after)."""
    monkeypatch.setattr(
        direct, "matmul_per_group", lambda wl: wl["groups"] == 1 and direct.is_pointwise(conv_shape(wl))
    )
    template_for.cache_clear()
    yield
    template_for.cache_clear()


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_the_network_built_with_the_grouped_kernel_everywhere_matches_onnx_runtime_too(
    layout: str, grouped_kernel_only: None
) -> None:
    tasks = extract_tasks(grouped_network(), "x86-avx512", layout).tasks
    assert not any(per_group(t.workload.key, "x86-avx512") for t in tasks if "groups=" in t.workload.key)
    report = bench_model(grouped_network(), get_board("local"), repeat=0, layout=layout)
    assert report.correct, report.error


@pytest.mark.parametrize(
    ("board", "layout"), [("local", "nchw"), ("local", "nhwc"), ("qemu-aarch64", "nhwc")]
)
def test_a_network_of_grouped_convs_builds_and_matches_onnx_runtime(board: str, layout: str) -> None:
    if board != "local" and shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    report = bench_model(grouped_network(), get_board(board), repeat=0, layout=layout)
    assert report.correct, report.error


def test_xtune_tasks_lists_shufflenets_grouped_convs_once_per_shape_as_one_groups_matmul(
    xtune_cli: CliRunner,
) -> None:
    """The zoo's ShuffleNet (group 4: 6 -> 28, 28, 34, 68 and 136 channels per group): one task per
    distinct grouped shape, covering every grouped Conv node, each tuned once for its 4 groups as one
    group's matmul (m, n, k: NHWC pixels, k/4, c/4; NCHW k/4, pixels, c/4), in both layouts."""
    path = exported.light_models()["shufflenet"]
    grouped = [
        n for n in onnx.load(str(path)).graph.node if any(a.name == "group" and a.i == 4 for a in n.attribute)
    ]
    target = get_target("x86-avx512")
    for layout in ("nhwc", "nchw"):
        run = xtune_cli("tasks", str(path), "--target", target.name, "--layout", layout, "--json")
        assert run.returncode == 0, run.stderr
        tasks = [t for t in json.loads(run.stdout)["tasks"] if "groups=4" in t["workload"]]
        assert len({t["workload"] for t in tasks}) == len(tasks) == 10
        assert sum(t["count"] for t in tasks) == len(grouped)
        widths = set()
        for task in tasks:
            wl = parse_workload(task["workload"])
            template = template_for(wl, target)
            assert isinstance(template, Conv2dTemplate) and template.as_matmul is not None
            gemm = template.as_matmul.workload
            pixels, one = wl["h"] * wl["w"], (wl["k"] // 4, wl["c"] // 4)
            want = (pixels, *one) if layout == "nhwc" else (one[0], pixels, one[1])
            assert (gemm["m"], gemm["n"], gemm["k"]) == want, task["workload"]
            widths.add(one)
        assert widths == {(28, 6), (28, 28), (34, 34), (68, 68), (136, 136)}
