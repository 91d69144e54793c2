"""Whole-network firmware (`xtune build --model`, `xtune bench --model`): the small test networks built into
one object, run through the agent locally and under QEMU and checked against ONNX Runtime; the object's
promises (only the entry points global, nothing undefined or writable, a flat image equal to GNU ld's);
the examples/ program linked by gcc and cross gcc; bad input as one line and exit 2, nothing written."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import xtune
from tests import networks
from tests.test_artifact import CROSS, _need, _run, _runner, _write_log
from tests.test_link import TARGETS, gnu_ld_image
from xtune.boards.board import get_board
from xtune.cli import main
from xtune.codegen.compile import ObjectCode
from xtune.codegen.link import inspect_object, link_flat
from xtune.firmware.build import build_model
from xtune.firmware.entry import NetArtifact
from xtune.firmware.network_bench import REFERENCE_MAGIC, random_input, run_network
from xtune.firmware.program import program
from xtune.ops.layout import Layout, workload_layout
from xtune.ops.registry import family
from xtune.ops.transpose import Transpose
from xtune.ops.workload import RTOL, Workload, compare_output
from xtune.target import get_target
from xtune.tuning.measure import MeasureStatus
from xtune.tuning.peers import ort_network

pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parent.parent
NETWORKS = ("resnet_small", "mobilenet_v2_small")
LAYOUTS = ("nhwc", "nchw")
Capture = pytest.CaptureFixture[str]


@cache
def model(name: str) -> onnx.ModelProto:
    return networks.NETWORKS[name]()


@cache
def built(name: str, target: str, layout: str = "nhwc") -> NetArtifact:
    return build_model(model(name), target, layout=layout)


def check_network(board_name: str, name: str, layout: str) -> None:
    board = get_board(board_name)
    artifact = built(name, board.target.name, layout)
    assert artifact.program.layout.value == layout
    x = random_input(artifact.program.input_shape)
    got, _ = run_network(board, artifact, x)
    ref, _ = ort_network(model(name).SerializeToString(), x)
    assert compare_output(got, ref, RTOL) == "", (board_name, name, layout)
    assert np.argmax(got) == np.argmax(ref)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", NETWORKS)
def test_small_networks_match_onnx_runtime_on_the_host(name: str, layout: str) -> None:
    check_network("local", name, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", NETWORKS)
def test_small_networks_match_onnx_runtime_under_qemu(qemu_board: str, name: str, layout: str) -> None:
    check_network(qemu_board, name, layout)


def test_the_layout_pass_converts_only_where_layouts_differ() -> None:
    """NHWC: every conv2d task runs NHWC on HWIO weights, the input is converted once at entry, and where
    depthwise runs NCHW only a conversion stands on each side of every depthwise call; NCHW: none. The
    pass is the program's, which every target's build takes as it is: no object is compiled here."""
    for name in NETWORKS:
        nchw, nhwc = program(model(name), "nchw"), program(model(name), "nhwc")
        assert not any(isinstance(c.kernel, Transpose) for c in nchw.calls)
        calls = nhwc.calls
        convs = [c for c in calls if isinstance(c.kernel, Workload) and c.kernel.op == "conv2d"]
        assert convs and all(c.kernel.value("layout") == "nhwc" for c in convs)  # type: ignore[union-attr]
        weights = dict(nhwc.weights)
        for c in convs:  # HWIO: (r, s, c, k)
            wl = c.kernel
            assert isinstance(wl, Workload)
            assert weights[c.args[1]].shape == (wl["r"], wl["s"], wl["c"], wl["k"])
        for c in calls:  # every task's weights as its workload takes them
            if isinstance(c.kernel, Workload) and c.args[1] in weights:
                assert weights[c.args[1]].shape == c.kernel.tensors()[1].shape, c.kernel.key
        first = calls[0]
        assert isinstance(first.kernel, Transpose) and first.args[0] == nhwc.input
        depthwise = [c.kernel for c in calls if isinstance(c.kernel, Workload) and c.kernel.op == "depthwise"]
        nchw_only = Layout.NHWC not in family("depthwise").layouts
        assert all(workload_layout(wl) is (Layout.NCHW if nchw_only else Layout.NHWC) for wl in depthwise)
        assert sum(isinstance(c.kernel, Transpose) for c in calls) == 1 + 2 * len(depthwise) * nchw_only
        plan = nhwc.memory  # conversion buffers are planned like any intermediate
        assert plan.workspace_bytes == plan.lower_bound


def test_the_plan_and_the_header_state_what_the_entry_needs() -> None:
    artifact = built("mobilenet_v2_small", "x86-avx2")
    plan = artifact.program.memory
    assert plan.lower_bound <= plan.workspace_bytes <= 1.1 * plan.lower_bound
    assert plan.workspace_bytes < plan.intermediate_bytes  # buffers are reused
    largest = max(k.stack_bytes for k in artifact.kernels)
    assert artifact.stack_bytes > largest
    header = artifact.header
    assert f"#define NET_WORKSPACE_BYTES {plan.workspace_bytes}u" in header
    assert f"#define NET_STACK_BYTES {artifact.stack_bytes}u" in header
    assert "#define NET_INPUT_SHAPE {1, 3, 96, 96}" in header
    assert "int net_run(const float *input, float *output, void *workspace);" in header
    # Every task's kernel and every generated operator, ops built once per distinct shape.
    sources = {k.source for k in artifact.kernels}
    assert sources == {"default", "generated"}
    assert sum(k.calls for k in artifact.kernels) == len(artifact.program.calls)
    assert artifact.warnings == ("default config used for all 31 tasks (no log given)",)


@pytest.mark.parametrize("target", TARGETS)
def test_object_exports_only_the_entry_points_and_links_as_gnu_ld_does(target: str, tmp_path: Path) -> None:
    artifact = built("resnet_small", target)
    info = inspect_object(artifact.object)
    assert sorted(name for name, _ in info.functions) == sorted(artifact.entry_points)
    assert info.undefined == ()
    obj = ObjectCode(target, get_target(target).arch, artifact.object, artifact.entry_points)
    image = link_flat(obj, 0x10000)  # check_object ran in the build: no writable or zero-initialised data
    assert image.code == gnu_ld_image(obj, image, tmp_path)


@pytest.mark.host_runs("x86-avx2")
def test_a_logged_config_is_built_and_still_right(tmp_path: Path) -> None:
    artifact = built("resnet_small", "x86-avx2")
    task = next(k for k in artifact.kernels if k.what.startswith("conv2d:") and "residual=1" in k.what)
    log = tmp_path / "log.jsonl"
    _write_log(log, "x86-avx2", [(task.what, (task.config_index or 0) + 1, MeasureStatus.OK, 1e-6)])
    tuned = xtune.build_model(model("resnet_small"), "x86-avx2", logs=[log])
    row = next(k for k in tuned.kernels if k.what == task.what)
    assert (row.source, row.config_index) == ("log", (task.config_index or 0) + 1)
    assert "for 12 workload(s)" in tuned.warnings[0] and task.what not in tuned.warnings[0]
    board = get_board("local", target="x86-avx2")
    x = random_input(tuned.program.input_shape)
    got, _ = run_network(board, tuned, x)
    ref, _ = ort_network(model("resnet_small").SerializeToString(), x)
    assert compare_output(got, ref, RTOL) == ""
    # The log was tuned in NHWC: built in NCHW, that task has no best and takes its template's default.
    nchw = xtune.build_model(model("resnet_small"), "x86-avx2", logs=[log], layout="nchw")
    assert task.what not in {k.what for k in nchw.kernels}
    assert {k.source for k in nchw.kernels} == {"default", "generated"}
    assert "for 13 workload(s)" in nchw.warnings[0]


# ---- the command line ---------------------------------------------------------------------------------


def test_cli_build_and_bench_model(tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(model("resnet_small"), path)
    files = ["-o", str(tmp_path / "net.o"), "--header", str(tmp_path / "net.h")]
    assert (
        main(["build", "--model", str(path), "--target", "x86-avx2", *files, "--prefix", "rn", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["entry"] == "rn_run" and report["workspace_bytes"] == report["workspace_lower_bound"]
    assert (tmp_path / "net.o").read_bytes()[:4] == b"\x7fELF"
    assert "rn_run(" in (tmp_path / "net.h").read_text()
    assert main(["bench", "--model", str(path), "--board", "local", "--json"]) == 0
    bench = json.loads(capsys.readouterr().out)
    assert bench["correct"] and bench["seconds"] > 0 and bench["ort_seconds"] > 0


def _tiny(
    op: str = "Relu", dims: list[int | str] | None = None, elem: int = TensorProto.FLOAT
) -> onnx.ModelProto:
    """input -> Conv(weights) -> `op` -> output."""
    shape = dims or [1, 2, 4, 4]
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node(op, ["c"], ["y"], name="act"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, shape)],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


BAD = {
    "unsupported operator": (lambda: _tiny("Floor"), "node 'act' (Floor)"),
    "dynamic shape": (lambda: _tiny(dims=["N", 2, 4, 4]), "dynamic shape"),
    "non-float model": (lambda: _tiny(elem=TensorProto.DOUBLE), "float32 only"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_models_are_one_line_exit_2_and_nothing_written(
    case: str, tmp_path: Path, capsys: Capture
) -> None:
    make, expected = BAD[case]
    path = tmp_path / "m.onnx"
    onnx.save(make(), path)
    check_refused(["--model", str(path)], expected, tmp_path, capsys)


def test_unreadable_model_and_foreign_log_are_refused(tmp_path: Path, capsys: Capture) -> None:
    (tmp_path / "junk.onnx").write_text("not a model")
    check_refused(["--model", str(tmp_path / "junk.onnx")], "not an ONNX model", tmp_path, capsys)
    check_refused(["--model", str(tmp_path / "none.onnx")], "no such model file", tmp_path, capsys)
    path = tmp_path / "m.onnx"
    onnx.save(_tiny(), path)
    log = tmp_path / "arm.jsonl"
    _write_log(log, "arm-a72-neon", [("matmul:m=8,n=16,k=4", None, MeasureStatus.OK, 1e-6)])
    check_refused(["--model", str(path), "--log", str(log)], "a log for arm-a72-neon", tmp_path, capsys)


def check_refused(args: list[str], expected: str, tmp: Path, capsys: Capture) -> None:
    before = sorted(tmp.iterdir())
    outputs = ["-o", str(tmp / "net.o"), "--header", str(tmp / "net.h"), "--reference", str(tmp / "net.ref")]
    assert main(["build", "--target", "x86-avx2", *args, *outputs]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("xtune: error:") and expected in err, err
    assert sorted(tmp.iterdir()) == before


# ---- the examples/ program, linked by the target's gcc ------------------------------------------------


@pytest.mark.parametrize("target", ["arm-a72-neon", "riscv64-gcv"])
def test_example_program_cross_links_runs_under_qemu_and_matches(target: str, tmp_path: Path) -> None:
    tgt = get_target(target)
    cc = CROSS[tgt.arch]
    _need(cc)
    runner = _runner(tgt)
    path = tmp_path / "m.onnx"
    onnx.save(model("resnet_small"), path)  # the example's own code is what is checked: the smaller network
    files = [
        "-o",
        str(tmp_path / "net.o"),
        "--header",
        str(tmp_path / "net.h"),
        "--reference",
        str(tmp_path / "net.ref"),
    ]
    assert main(["build", "--model", str(path), "--target", target, *files]) == 0
    ref = (tmp_path / "net.ref").read_bytes()
    assert ref[:8] == REFERENCE_MAGIC and struct.unpack_from("<I", ref, 8) == (1,)
    static = ["-static"] if tgt.arch != "x86_64" else []
    demo = tmp_path / "demo"
    main_c = ROOT / "examples" / "network" / "main.c"
    _run(
        [
            cc,
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-std=c11",
            "-I",
            tmp_path,
            main_c,
            tmp_path / "net.o",
            *static,
            "-lm",
            "-o",
            demo,
        ]
    )
    out = _run([*runner, demo, tmp_path / "net.ref"]).stdout
    assert out.startswith("match: max abs error"), out
    # A reference that is not this network's output is caught: flip one expected float.
    (tmp_path / "bad.ref").write_bytes(ref[:-4] + struct.pack("<f", struct.unpack("<f", ref[-4:])[0] + 1.0))
    done = subprocess.run([*runner, str(demo), str(tmp_path / "bad.ref")], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout.startswith("MISMATCH"), done.stdout


@pytest.mark.host_runs("x86-avx2")
def test_example_makefile_builds_and_runs_on_the_host(tmp_path: Path) -> None:
    _need("make", "gcc")
    path = tmp_path / "m.onnx"
    onnx.save(model("resnet_small"), path)
    build = tmp_path / "build"
    xtune_cmd = f"{sys.executable} -m xtune.cli"
    example = ROOT / "examples" / "network"
    _run(
        [
            "make",
            "-C",
            example,
            f"MODEL={path}",
            f"BUILD={build}",
            f"XTUNE={xtune_cmd}",
            "TARGET=x86-avx2",
            "CC=gcc",
        ]
    )
    out = _run([build / "demo", build / "net.ref"]).stdout
    assert out.startswith("match: max abs error"), out


def operators_model() -> onnx.ModelProto:
    """A small network holding every generated operator: MaxPool and AveragePool (pads), Add then its only
    reader Relu (one Add+ReLU call), Clip, Concat along channels, Relu, GlobalAveragePool, Reshape (a
    view), Gemm, and Softmax as the output."""
    rng = np.random.default_rng(3)

    def const(name: str, value: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(
            np.asarray(value, np.float32) if value.dtype.kind == "f" else value, name
        )

    inits = [
        const("w1", rng.standard_normal((8, 4, 3, 3)) * 0.3),
        const("w2", rng.standard_normal((8, 4, 1, 1))),
        const("fc", rng.standard_normal((10, 16)) * 0.3),
        const("lo", np.array(-0.5)),
        const("hi", np.array(1.5)),
        numpy_helper.from_array(np.array([1, 16], np.int64), "shape"),
    ]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        node("Conv", ["x", "w2"], ["c2"], name="c2"),
        node("MaxPool", ["c1"], ["p1"], name="p1", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        node("AveragePool", ["c2"], ["p2"], name="p2", kernel_shape=[2, 2], strides=[2, 2]),
        node("Add", ["p1", "p2"], ["sum"], name="sum"),
        node("Relu", ["sum"], ["r"], name="r"),
        node("Clip", ["p1", "lo", "hi"], ["clip"], name="clip"),
        node("Concat", ["r", "clip"], ["cat"], name="cat", axis=1),
        node("Relu", ["cat"], ["rc"], name="rc"),
        node("GlobalAveragePool", ["rc"], ["gap"], name="gap"),
        node("Reshape", ["gap", "shape"], ["flat"], name="flat"),
        node("Gemm", ["flat", "fc"], ["logits"], name="fc", transB=1),
        node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "operators",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def check_operators(board_name: str, layout: str) -> None:
    board = get_board(board_name)
    m = operators_model()
    artifact = build_model(m, board.target, layout=layout)
    kinds = {k.what.split(":")[0] for k in artifact.kernels}
    ops = {"conv2d", "pool2d", "elementwise", "concat", "globalaveragepool", "matmul", "softmax"}
    # NHWC: the input is converted at entry; every operator then runs NHWC, the pooled (1, 16, 1, 1) is
    # the same bytes in both layouts, so the Reshape needs no conversion.
    assert kinds == (ops | {"transpose"} if layout == "nhwc" else ops)
    assert sum(isinstance(c.kernel, Transpose) for c in artifact.program.calls) == (layout == "nhwc")
    pools = [k.what for k in artifact.kernels if k.what.split(":")[0] in ("pool2d", "globalaveragepool")]
    assert pools and all(f"layout={layout}" in what for what in pools)
    assert any("op=add_relu" in k.what for k in artifact.kernels)
    x = random_input(artifact.program.input_shape)
    got, _ = run_network(board, artifact, x)
    ref, _ = ort_network(m.SerializeToString(), x)
    assert compare_output(got, ref, RTOL) == ""


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_generated_operator_matches_onnx_runtime_on_the_host(layout: str) -> None:
    check_operators("local", layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_generated_operator_matches_onnx_runtime_under_qemu(qemu_board: str, layout: str) -> None:
    check_operators(qemu_board, layout)


def conversion_models() -> dict[str, onnx.ModelProto]:
    """Tiny graphs where NHWC needs a conversion inside: a Flatten of a 7x7 feature map (ONNX's byte order
    is what it reshapes), a 4-D network output (converted back at exit), an Add of a 4-D constant
    (converted at build time) and a Concat that is not along channels (runs NCHW); and one that needs
    none but the input's: a depthwise conv with multiplier 2 (weights (r, s, c*2)), pooled to 1x1."""
    rng = np.random.default_rng(4)
    node = helper.make_node

    def f32(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    conv = node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1])
    graphs = {
        "flatten7x7": (
            [
                conv,
                node("Flatten", ["c"], ["f"], name="flatten"),
                node("Gemm", ["f", "fc"], ["y"], name="fc", transB=1),
            ],
            {"w": f32(4, 3, 3, 3), "fc": f32(10, 4 * 7 * 7) * 0.1},
            [1, 10],
        ),
        "output4d": (
            [conv, node("Add", ["c", "k"], ["y"], name="addk")],
            {"w": f32(4, 3, 3, 3), "k": f32(1, 4, 7, 7)},
            [1, 4, 7, 7],
        ),
        "concat-w": (
            [conv, node("Concat", ["c", "c"], ["y"], name="cat", axis=3)],
            {"w": f32(4, 3, 3, 3)},
            [1, 4, 7, 14],
        ),
        "depthwise-m2": (
            [
                conv,
                node("Conv", ["c", "dw"], ["d"], name="dw", group=4, strides=[2, 2], pads=[1, 1, 1, 1]),
                node("GlobalAveragePool", ["d"], ["g"], name="gap"),
                node("Flatten", ["g"], ["y"], name="flat"),
            ],
            {"w": f32(4, 3, 3, 3), "dw": f32(8, 1, 3, 3)},
            [1, 8],
        ),
    }
    models = {}
    for name, (nodes, inits, out) in graphs.items():
        graph = helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 7])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
            [numpy_helper.from_array(v, k) for k, v in inits.items()],
        )
        models[name] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return models


def check_conversions(board_name: str) -> None:
    board = get_board(board_name)
    for name, m in conversion_models().items():
        artifact = build_model(m, board.target)  # NHWC, the default
        calls = artifact.program.calls
        where = [(c.kernel.to.value, c.nodes[0]) for c in calls if isinstance(c.kernel, Transpose)]
        # in at entry; back to NCHW before the Flatten, at exit after the Add (whose constant is converted
        # at build time), or before the Concat along W (once for both its reads, then none at exit)
        back = {"flatten7x7": "flatten", "output4d": "addk", "concat-w": "cat", "depthwise-m2": None}[name]
        assert where == [("nhwc", "conv"), *([("nchw", back)] if back else [])], (name, where)
        if name == "output4d":  # the constant is in the object once, converted
            assert [n for n, _ in artifact.program.weights if n.startswith("k")] == ["k@nhwc"]
        x = random_input(artifact.program.input_shape)
        got, _ = run_network(board, artifact, x)
        ref, _ = ort_network(m.SerializeToString(), x)
        assert compare_output(got, ref, RTOL) == "", (board_name, name)


def test_conversions_inside_a_network_match_onnx_runtime_on_the_host() -> None:
    check_conversions("local")


def test_conversions_inside_a_network_match_onnx_runtime_under_qemu(qemu_board: str) -> None:
    check_conversions(qemu_board)


PREPACK_CASES = (  # tails, strides, padding, epilogues, the nhwc layout, pointwise; the per-call weight copy
    ("conv2d:n=1,c=5,h=7,w=9,k=19,r=3,s=3,stride=1,pad=1,prepacked=1", "Wp"),
    ("conv2d:n=2,c=9,h=8,w=8,k=13,r=3,s=3,stride=2,pad=1,bias=1,residual=1,relu=1,prepacked=1", "Wp"),
    ("conv2d:n=1,c=6,h=5,w=5,k=11,r=1,s=1,stride=1,pad=0,layout=nhwc,bias=1,relu6=1,prepacked=1", "Bp"),
    ("conv2d:n=2,c=7,h=3,w=5,k=13,r=1,s=1,stride=1,pad=0,bias=1,relu=1,prepacked=1", "Ap"),  # weights = A
    ("matmul:m=9,n=21,k=70,bias=1,prepacked=1", "Bp"),  # k blocked
)


@pytest.mark.parametrize(("text", "copy"), PREPACK_CASES)
def test_weights_packed_at_build_time_are_what_the_kernel_reads(text: str, copy: str) -> None:
    """Random configs of a prepacked workload (any blocking, reduction order, register tile, pack knobs):
    the nest on `kernel_inputs`' weights computes the workload's reference from the plain weights
    (loop-nest interpreter, no LLVM), and packs no weights per call."""
    from tests.nest_interp import run_kernel
    from xtune.ops.registry import parse_workload, template_for
    from xtune.ops.workload import random_inputs

    wl = parse_workload(text)
    template = template_for(wl, get_target("x86-avx2"))
    inputs = random_inputs(wl)
    expected = wl.reference(inputs)
    rng = np.random.default_rng(1)
    packed = 0
    for index in [template.default_config().index, *rng.integers(0, template.space.size, 8).tolist()]:
        config = template.space.config(int(index))
        kernel = template.kernel(config, "k")
        assert copy not in {b.name for b in kernel.buffers}  # no weights packed per call
        params = template.kernel_inputs(config, inputs)
        packed += params[1].size != inputs[1].size or not np.array_equal(params[1].ravel(), inputs[1].ravel())
        out = np.full(expected.shape, np.nan, np.float32)
        run_kernel(kernel, [*params, out])
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4, err_msg=f"config {index}")
    assert packed  # some configs read their weights in panels


def test_bench_model_counts_the_instructions_of_one_inference_under_qemu(qemu_board: str) -> None:
    from xtune.firmware.network_bench import bench_model

    report = bench_model(model("resnet_small"), get_board(qemu_board))
    assert report.correct and report.error == "" and report.max_abs_error < 1e-4
    assert report.instructions is not None and report.instructions > 1e6  # ~10 MFLOP of convolutions
    assert report.seconds is None and report.ort_seconds is None  # emulated: no wall time to compare
