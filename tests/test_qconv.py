"""int8 convolutions (qconv2d, qdepthwise): the integer reference against a direct loop and ONNX Runtime's
QLinearConv (mapped through the families' QLinearConv anchors); the templates' nests per dot route in the
interpreter; the kernels on the local board (VNNI and vpmaddwd routes), qemu-aarch64 (A72 smull+sadalp,
A76 sdot) and qemu-riscv64-v equal it exactly; the instruction each route promises is in the object."""

from __future__ import annotations

import dataclasses
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import CliRunner
from tests.nest_interp import run_kernel
from tests.test_qmatmul import FAST, disassemble, measure_some
from xtune.boards.board import get_board
from xtune.errors import InputError, UnsupportedNode
from xtune.graph import AttrValue, Graph, Node
from xtune.ops.layout import Layout
from xtune.ops.qconv2d.template import QConv2dTemplate
from xtune.ops.qdepthwise.grouped import block_rows
from xtune.ops.qdepthwise.template import QDepthwiseTemplate
from xtune.ops.qmatmul import reference as ref
from xtune.ops.registry import anchor_of, family, parse_workload, template_for
from xtune.ops.workload import Workload, random_inputs
from xtune.target import get_target, host_cannot_run
from xtune.tuning.features import featurize
from xtune.tuning.measure import CompilePool, Measurer, MeasureStatus
from xtune.tuning.options import MeasureOptions

# c not a multiple of 4, strides 1 and 2, asymmetric pads, 1x1, dilation, both activation types, per
# tensor and per channel, both requantizations; the last two fold their s taps into the channels.
CONV = (
    "qconv2d:n=1,c=5,h=7,w=6,k=9,r=3,s=3,pad=1",
    "qconv2d:n=2,c=8,h=7,w=8,k=20,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1,a=u8,requant=tflite,perchannel=1",
    "qconv2d:n=1,c=16,h=4,w=5,k=24,r=1,s=1,a=u8,perchannel=1",  # read in place where u8 needs no flip
    "qconv2d:n=1,c=2,h=8,w=8,k=6,r=3,s=3,pad=2,dilation=2,requant=none",
    "qconv2d:n=2,c=1,h=13,w=10,k=9,r=5,s=4,stride=2,pad=2,pad_left=1,pad_bottom=3,a=u8,perchannel=1",
)
DEPTHWISE = (
    "qdepthwise:n=1,c=5,h=6,w=7,r=3,s=3,pad=1",
    "qdepthwise:n=2,c=40,h=7,w=6,r=3,s=3,stride=2,pad=1,pad_bottom=0,a=u8,requant=tflite,perchannel=1",
    "qdepthwise:n=1,c=16,h=9,w=5,r=5,s=5,pad=2,a=u8,perchannel=1",
    "qdepthwise:n=1,c=24,h=7,w=6,r=3,s=3,stride=2",  # nothing to pad: the input read in place
)


# --- the reference -------------------------------------------------------------------------------------


def direct(wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
    """The convolution tap by tap, skipping taps outside the image (TFLite's reference kernels' way of
    padding with the zero point), requantized by qmatmul's reference."""
    x, w, bias, *scales, qparams = inputs
    za = int(qparams[0])
    depthwise = wl.op == "qdepthwise"
    h, wd = x.shape[1:3]
    stride, dil, top, left = wl["stride"], wl["dilation"], wl["pad"], wl["pad"]
    top = wl["pad_top"] if wl["pad_top"] >= 0 else top
    left = wl["pad_left"] if wl["pad_left"] >= 0 else left
    out_shape = wl.tensors()[-1].shape
    acc = np.zeros(out_shape, np.int64)
    for b, oy, ox in np.ndindex(*out_shape[:3]):
        for i, j in np.ndindex(w.shape[0], w.shape[1]):
            y, xx = oy * stride + i * dil - top, ox * stride + j * dil - left
            if 0 <= y < h and 0 <= xx < wd:
                pixel = x[b, y, xx].astype(np.int64) - za
                acc[b, oy, ox] += pixel * w[i, j] if depthwise else pixel @ w[i, j].astype(np.int64)
    return ref.output(ref.wrap32(acc + bias), scales, qparams, str(wl.value("a")), str(wl.value("requant")))  # type: ignore[arg-type]


@pytest.mark.parametrize("key", [*CONV, *DEPTHWISE])
def test_the_reference_equals_a_direct_loop(key: str) -> None:
    wl = parse_workload(key)
    inputs = random_inputs(wl, seed=2)
    got = wl.reference(inputs)
    assert got.shape == wl.tensors()[-1].shape and np.array_equal(got, direct(wl, inputs))
    if wl.value("requant") != "none":
        lo, hi = ref.RANGES[str(wl.value("a"))]
        assert ((got == lo) | (got == hi)).any() and ((got > lo) & (got < hi)).any()


def test_few_channels_fold_the_filter_row_into_the_dot_groups() -> None:
    """A 1-channel 10x4 stem reads r groups of 4 taps, not r*s groups of one byte and three of za'."""
    stem = QConv2dTemplate(parse_workload(CONV[4]), get_target("arm-a76-dotprod"))
    assert stem.folded and stem.groups == 5
    rgb = QConv2dTemplate(
        parse_workload("qconv2d:n=1,c=3,h=8,w=8,k=8,r=3,s=3"), get_target("arm-a76-dotprod")
    )
    assert not rgb.folded and rgb.groups == 9  # 3 x 3 taps of 4 bytes either way: nothing to gain


def test_the_image_is_copied_only_to_pad_round_or_flip() -> None:
    vnni, a72 = get_target("x86-avx512-vnni"), get_target("arm-a72-neon")
    assert not QConv2dTemplate(parse_workload(CONV[2]), vnni).image(16).copied  # u8 as vpdpbusd takes it
    assert QConv2dTemplate(parse_workload(CONV[2]), a72).image(4).copied  # u8 flipped to s8 for smull
    assert QConv2dTemplate(parse_workload(CONV[0]), vnni).image(16).copied  # padded, c=5 rounded to 8


def test_workload_keys_and_their_refusals() -> None:
    wl = parse_workload("qconv2d:n=1,c=3,h=4,w=4,k=8,r=3,s=3,pad=1,pad_top=1,a=u8,requant=tflite")
    assert wl.key == "qconv2d:n=1,c=3,h=4,w=4,k=8,r=3,s=3,stride=1,pad=1,a=u8,requant=tflite"
    assert [(t.name, t.dtype, t.shape) for t in wl.tensors()] == [
        ("input", "uint8", (1, 4, 4, 3)),
        ("weights", "int8", (3, 3, 3, 8)),
        ("bias", "int32", (8,)),
        ("multiplier", "int32", (1,)),
        ("shift", "int32", (1,)),
        ("qparams", "int32", (4,)),
        ("output", "uint8", (1, 4, 4, 8)),
    ]
    assert parse_workload("qdepthwise:n=1,c=3,h=4,w=4,r=3,s=3,stride=2").tensors()[1].shape == (3, 3, 3)
    for bad, why in (
        ("qconv2d:n=1,c=3,h=4,w=4,k=8,r=5,s=5", "kernel spans 5"),
        ("qconv2d:n=1,c=8192,h=4,w=4,k=8,r=3,s=3,pad=1", "int32"),
        ("qdepthwise:n=1,c=3,h=4,w=4,r=3,s=3,requant=none,perchannel=1", "no 'perchannel'"),
        ("qdepthwise:n=1,c=3,h=4,w=4,r=3,s=3,a=u16", "'a' must be one of"),
    ):
        with pytest.raises(InputError, match=why):
            parse_workload(bad)


# --- ONNX: QLinearConv, mapped by the families and run by ONNX Runtime ---------------------------------


def qlinearconv(
    shape: tuple[int, int, int, int], k: int, rs: int, attrs: dict[str, AttrValue], a: str, per_channel: bool
) -> tuple[Graph, dict[str, np.ndarray], np.ndarray]:
    """A one-node QLinearConv network: the Graph the families read, its constants, and an input."""
    rng = np.random.default_rng(sum(shape) + k + rs)
    n, c, h, w = shape
    group = int(attrs.get("group", 1))  # type: ignore[arg-type]
    lo, hi = ref.RANGES[a]
    act = ref.NUMPY_TYPES[a]
    channels = k if per_channel else 1
    consts: dict[str, np.ndarray] = {
        "x_scale": np.array(0.02, np.float32),
        "x_zp": np.array(rng.integers(lo, hi + 1), act),
        "w": rng.integers(-128, 128, (k, c // group, rs, rs)).astype(np.int8),
        "w_scale": rng.uniform(0.002, 0.01, channels).astype(np.float32).reshape(() if channels == 1 else -1),
        "w_zp": np.zeros(() if channels == 1 else channels, np.int8),
        "y_scale": np.array(0.05 * np.sqrt(c // group * rs * rs), np.float32),
        "y_zp": np.array(rng.integers(lo + 40, hi - 39), act),
        "B": rng.integers(-3000, 3000, k).astype(np.int32),
    }
    node = Node(name="conv", op="QLinearConv", inputs=(*(("x",)), *list(consts)), outputs=("y",), attrs=attrs)
    x = rng.integers(lo, hi + 1, shape).astype(act)
    from xtune.ops.conv import conv_geometry

    probe = Graph(name="t", opset=13, nodes=(node,), inputs=("x",), outputs=("y",), constants={}, shapes={})
    stride, pads, dil = conv_geometry(probe, node, (h, w), (rs, rs))
    oh = (h + pads[0] + pads[2] - dil * (rs - 1) - 1) // stride + 1
    ow = (w + pads[1] + pads[3] - dil * (rs - 1) - 1) // stride + 1
    graph = Graph(
        name="qlinearconv",
        opset=13,
        nodes=(node,),
        inputs=("x",),
        outputs=("y",),
        constants=consts,
        shapes={"x": shape, "y": (n, k, oh, ow), **{name: v.shape for name, v in consts.items()}},
        dtypes={"x": str(x.dtype), "y": str(x.dtype)},
    )
    return graph, consts, x


def ort_qlinearconv(graph: Graph, consts: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from xtune.tuning.peers import ort_session

    node = graph.nodes[0]
    elem = TensorProto.UINT8 if x.dtype == np.uint8 else TensorProto.INT8
    attrs: dict[str, Any] = dict(node.attrs)
    proto = helper.make_node("QLinearConv", list(node.inputs), ["y"], **attrs)
    model = helper.make_model(
        helper.make_graph(
            [proto],
            "qlinearconv",
            [helper.make_tensor_value_info("x", elem, list(x.shape))],
            [helper.make_tensor_value_info("y", elem, list(graph.shape("y")))],
            [numpy_helper.from_array(v, name) for name, v in consts.items()],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    return np.asarray(ort_session(model.SerializeToString()).run(None, {"x": x})[0])


# (input NCHW, filters, kernel size, attributes, activation, per channel): group 1 -> qconv2d,
# group = channels -> qdepthwise.
Case = tuple[tuple[int, int, int, int], int, int, dict[str, AttrValue], str, bool]
ORT_CASES: tuple[Case, ...] = (
    ((1, 5, 9, 8), 12, 3, {"pads": (1, 1, 1, 1)}, "u8", False),
    ((1, 8, 9, 10), 16, 3, {"strides": (2, 2), "pads": (0, 1, 1, 0)}, "s8", True),
    ((2, 16, 5, 6), 24, 1, {}, "u8", True),
    ((1, 6, 8, 8), 10, 3, {"pads": (1, 1, 1, 1), "auto_pad": "NOTSET"}, "s8", False),
    ((1, 12, 8, 9), 12, 3, {"group": 12, "pads": (1, 1, 1, 1)}, "u8", True),
    ((1, 8, 9, 9), 8, 3, {"group": 8, "strides": (2, 2), "pads": (1, 0, 0, 1)}, "s8", False),
)


@pytest.mark.parametrize("case", ORT_CASES, ids=lambda case: f"{case[0]}-{case[1]}-{case[3]}-{case[4]}")
def test_qlinearconv_maps_to_a_workload_whose_reference_equals_onnxruntime(case: Case) -> None:
    graph, consts, x = qlinearconv(*case)
    anchor = anchor_of(graph, graph.nodes[0])
    assert anchor is not None and anchor.quant is not None
    assert anchor.weights is not None and anchor.bias is not None
    depthwise = "group" in case[3]
    assert anchor.op == ("qdepthwise" if depthwise else "qconv2d")
    fam = family(anchor.op)
    wl = parse_workload(fam.task_key(anchor, {"bias": 1}, Layout.NHWC))
    constants = [
        fam.task_weights(wl, anchor.weights),
        anchor.bias,
        anchor.quant["scale"],
        anchor.quant["qparams"],
    ]
    got = wl.reference([np.ascontiguousarray(x.transpose(0, 2, 3, 1)), *constants])
    expected = ort_qlinearconv(graph, consts, x).transpose(0, 2, 3, 1)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_qlinearconv_refusals() -> None:
    graph, consts, _ = qlinearconv((1, 4, 6, 6), 8, 3, {}, "u8", False)
    asym = Graph(
        name=graph.name,
        opset=13,
        nodes=graph.nodes,
        inputs=graph.inputs,
        outputs=graph.outputs,
        constants={**consts, "w_zp": np.array(3, np.int8)},
        shapes=graph.shapes,
        dtypes=graph.dtypes,
    )
    with pytest.raises(UnsupportedNode, match="asymmetric"):
        anchor_of(asym, asym.nodes[0])
    anchor = anchor_of(graph, graph.nodes[0])
    assert anchor is not None
    with pytest.raises(InputError, match="qparams clamp"):
        family("qconv2d").task_key(anchor, {"bias": 1, "relu": 1}, Layout.NHWC)
    relu, _, _ = qlinearconv((1, 4, 6, 6), 8, 3, {"out_lo": 100}, "u8", False)
    clamped = anchor_of(relu, relu.nodes[0])
    assert clamped is not None and clamped.quant is not None
    assert list(clamped.quant["qparams"][2:]) == [100, 255]  # a fused ReLU's clamp (docs/int8.md)
    grouped, _, _ = qlinearconv((1, 4, 6, 6), 8, 3, {"group": 2}, "u8", False)
    with pytest.raises(UnsupportedNode, match="group 2"):
        anchor_of(grouped, grouped.nodes[0])


# --- the nests, per dot route ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target", ["x86-avx512-vnni", "x86-avx512", "arm-a76-dotprod", "arm-a72-neon", "riscv64-gcv"]
)
@pytest.mark.parametrize("key", [CONV[0], CONV[1], CONV[4], DEPTHWISE[1]])
def test_the_nests_equal_the_reference_in_the_interpreter(key: str, target: str) -> None:
    """The padded image (zero point, flip, channel rounding), the packed taps, the tails and the epilogue,
    per route, default and random configs, without LLVM."""
    wl = parse_workload(key)
    template = template_for(wl, get_target(target))
    inputs = random_inputs(wl, seed=1)
    expected = wl.reference(inputs)
    rng = random.Random(key + target)
    for config in [template.default_config(), template.space.config(rng.randrange(template.space.size))]:
        out = np.zeros(expected.shape, expected.dtype)
        run_kernel(template.kernel(config, "k"), [*template.kernel_inputs(config, inputs), out])
        assert np.array_equal(out, expected), (target, config.values)


@pytest.mark.parametrize(
    "target", ["x86-avx512-vnni", "x86-avx2", "arm-a76-dotprod", "arm-a72-neon", "riscv64-gcv"]
)
@pytest.mark.parametrize(
    "key",
    [
        DEPTHWISE[0],
        DEPTHWISE[1],
        DEPTHWISE[3],
        "qdepthwise:n=1,c=20,h=6,w=7,r=3,s=2,pad=1,dilation=2,a=u8,perchannel=1",
        "qdepthwise:n=1,c=20,h=6,w=7,r=2,s=4,pad=1,perchannel=1",
    ],
)
def test_the_grouped_taps_equal_the_reference_in_the_interpreter(key: str, target: str) -> None:
    """route=dot: the groups built from the padded image (tails, stride 2, dilation, s < 4 and s = 4, u8
    and s8 flipped to the dot's type), the prepacked weights and the corrected bias, random tiles."""
    wl = parse_workload(key)
    template = template_for(wl, get_target(target))
    inputs = random_inputs(wl, seed=1)
    expected = wl.reference(inputs)
    rng = random.Random(key + target)
    for _ in range(2):
        values = {k.name: rng.choice(k.options) for k in template.space.knobs} | {"route": "dot"}
        config = template.space.config(template.space.index_of(values))
        out = np.zeros(expected.shape, expected.dtype)
        run_kernel(template.kernel(config, "k"), [*template.kernel_inputs(config, inputs), out])
        assert np.array_equal(out, expected), (target, config.values)


@pytest.mark.parametrize(
    "key", [DEPTHWISE[0], DEPTHWISE[1], "qdepthwise:n=1,c=8,h=9,w=4,r=3,s=3,pad=2,dilation=2"]
)
@pytest.mark.parametrize("l2", [1024, 2048])
def test_grouped_taps_in_row_blocks_equal_the_reference(key: str, l2: int) -> None:
    """A small L2 cuts the output rows into blocks (`block_rows`: 1 to 3 rows here, a tail block), each
    building the groups of its window rows again: equal to the reference."""
    wl = parse_workload(key)
    target = dataclasses.replace(get_target("x86-avx512-vnni"), l2_bytes=l2)
    template = QDepthwiseTemplate(wl, target)
    assert block_rows(template.sh, target) < template.sh.oh
    inputs = random_inputs(wl, seed=4)
    expected = wl.reference(inputs)
    config = template.default_config()
    out = np.zeros(expected.shape, expected.dtype)
    run_kernel(template.kernel(config, "k"), [*template.kernel_inputs(config, inputs), out])
    assert config["route"] == "dot" and np.array_equal(out, expected)


def test_wide_filter_rows_keep_the_widening_route() -> None:
    """A 5-tap filter row does not fit one 4-byte group: no dot route is offered."""
    template = template_for(parse_workload(DEPTHWISE[2]), get_target("arm-a76-dotprod"))
    (route,) = [k for k in template.space.knobs if k.name == "route"]
    assert route.options == ("widen",) and template.default_config()["route"] == "widen"


@pytest.mark.parametrize("key", [CONV[1], DEPTHWISE[0]])
def test_features_describe_every_config(key: str) -> None:
    template = template_for(parse_workload(key), get_target("riscv64-gcv"))
    rows = featurize(template, range(0, template.space.size, 5))
    assert rows.shape[0] == len(range(0, template.space.size, 5)) and np.isfinite(rows).all()


# --- the kernels ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["x86-avx512-vnni", "x86-avx2"])
@pytest.mark.parametrize("key", [*CONV, DEPTHWISE[1], DEPTHWISE[2], DEPTHWISE[3]])
def test_kernels_are_exact_on_the_local_board(key: str, target: str, compile_pool: CompilePool) -> None:
    why = host_cannot_run(get_target(target))
    if why is not None:
        pytest.skip(why)
    measure_some("local", key, compile_pool, target)


# AArch64's rows narrowed together (`Requantizer.apply_row`) with a narrower last strip (24 = 16 + 8), the
# A72's pairs and both routes' stride-2 taps unrolled in even and odd classes (`tap_classes`), tail tiles.
STRIDED = "qconv2d:n=1,c=16,h=9,w=11,k=24,r=3,s=3,stride=2,pad=1,a=u8,perchannel=1"


@pytest.mark.board
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-aarch64-dotprod", "qemu-riscv64-v"])
@pytest.mark.parametrize("key", [CONV[1], CONV[4], DEPTHWISE[1], STRIDED])
def test_kernels_are_exact_under_qemu(board: str, key: str, compile_pool: CompilePool) -> None:
    if shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip("needs qemu-user")
    measure_some(board, key, compile_pool, extra=1)


# The grouped taps compiled: a channel tail (c=20: 16 + 4), stride 1 and 2, s8 and u8 (flipped to the dot's
# type on x86 and AArch64), per-channel scales; every board's build of the groups (vpmovzxbd words on x86,
# st4 on AArch64) and dot (vpdpbusd, vpmaddwd, sdot, smull + sadalp).
GROUPED = (
    "qdepthwise:n=1,c=20,h=7,w=9,r=3,s=3,pad=1,perchannel=1",
    "qdepthwise:n=1,c=36,h=9,w=8,r=3,s=3,stride=2,pad=1,pad_bottom=0,a=u8,requant=tflite,perchannel=1",
)


@pytest.mark.parametrize(
    ("board", "target"),
    [
        ("local", "x86-avx512-vnni"),
        ("local", "x86-avx2"),
        ("qemu-aarch64", None),
        ("qemu-aarch64-dotprod", None),
    ],
)
@pytest.mark.parametrize("key", GROUPED)
def test_grouped_tap_kernels_are_exact(
    key: str, board: str, target: str | None, compile_pool: CompilePool
) -> None:
    if target is not None and host_cannot_run(get_target(target)) is not None:
        pytest.skip(str(host_cannot_run(get_target(target))))
    b = get_board(board, target=target) if board == "local" else get_board(board)
    if board != "local" and shutil.which(b.target.qemu_binary) is None:
        pytest.skip("needs qemu-user")
    measurer = Measurer(b, parse_workload(key), FAST, compile_pool)
    template, rng = measurer.template, random.Random(key + board)
    values = [
        {k.name: rng.choice(k.options) for k in template.space.knobs} | {"route": "dot"} for _ in range(2)
    ]
    indices = [template.space.index_of(v) for v in values]
    try:
        results = measurer.measure(indices)
    finally:
        measurer.close()
    for v, result in zip(values, results, strict=True):
        assert result.status is MeasureStatus.OK, (board, key, v, result.error)


def extreme_inputs(wl: Workload, rng: np.random.Generator, everywhere: bool) -> list[np.ndarray]:
    """Random inputs whose weights are -128 or 127 and whose activations are the dot's -128 (u8: 0,
    flipped) or its 127 (u8: 255); `everywhere`: -128 in every weight and activation, so every i16 lane
    of the A72 route's product pairs is at its limit (-128 * -128 twice overflows an i16)."""
    x, w, *rest = random_inputs(wl, seed=3)
    low, high = (0, 255) if wl.value("a") == "u8" else (-128, 127)
    if everywhere:
        return [np.full_like(x, low), np.full_like(w, -128), *rest]
    return [
        rng.choice([low, high], x.shape).astype(x.dtype),
        rng.choice([-128, 127], w.shape).astype(np.int8),
        *rest,
    ]


@pytest.mark.board
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-aarch64-dotprod"])
@pytest.mark.parametrize("a", ["s8", "u8"])
def test_kernels_are_exact_at_the_extremes_under_qemu(board: str, a: str, compile_pool: CompilePool) -> None:
    """int32 sums (requant=none) of -128 weights against -128 activations, and a mix of the extremes: the
    default config (A72: the smull/smlsl pairs of complemented odd channel groups) and a random one."""
    if shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip("needs qemu-user")
    wl = parse_workload(f"qconv2d:n=1,c=16,h=4,w=5,k=8,r=3,s=3,pad=1,a={a},requant=none")
    rng = np.random.default_rng(5)
    for everywhere in (True, False):
        measurer = Measurer(get_board(board), wl, FAST, compile_pool)
        measurer.inputs = extreme_inputs(wl, rng, everywhere)
        measurer.expected = wl.reference(measurer.inputs).astype(measurer.out_dtype)
        space = measurer.template.space
        indices = [measurer.template.default_config().index, int(rng.integers(space.size))]
        try:
            results = measurer.measure(indices)
        finally:
            measurer.close()
        for index, result in zip(indices, results, strict=True):
            assert result.status is MeasureStatus.OK, (
                board,
                everywhere,
                space.config(index).values,
                result.error,
            )


# qemu-aarch64 instructions per multiply-add of the default config of ResNet-8's stack-3 3x3 (MLPerf Tiny,
# docs/benchmarks.md "Issue 29"): the goals, A72 0.25 (0.236 measured) and A76 sdot 0.08 (0.076).
INSN_PER_MAC = {"qemu-aarch64": 0.25, "qemu-aarch64-dotprod": 0.08}


@pytest.mark.board
@pytest.mark.parametrize("board", list(INSN_PER_MAC))
def test_the_default_3x3_conv_keeps_its_instructions_per_multiply_add(
    board: str, compile_pool: CompilePool
) -> None:
    if shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip("needs qemu-user")
    wl = parse_workload("qconv2d:n=1,c=64,h=8,w=8,k=64,r=3,s=3,pad=1,a=u8,perchannel=1")
    measurer = Measurer(get_board(board), wl, MeasureOptions(), compile_pool)
    try:
        (result,) = measurer.measure([measurer.template.default_config().index])
    finally:
        measurer.close()
    assert result.status is MeasureStatus.OK, result.error
    assert result.cost / (wl.flops() // 2) <= INSN_PER_MAC[board]


def test_a_missing_zero_point_correction_is_a_wrong_answer(
    compile_pool: CompilePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is exact and the bias slot's za' terms matter: the plain bias fails."""
    wl = parse_workload(CONV[0])
    template = type(template_for(wl, get_target("x86-avx512")))
    packed = template.kernel_inputs
    monkeypatch.setattr(
        template,
        "kernel_inputs",
        lambda self, config, inputs: [*packed(self, config, inputs)[:2], *inputs[2:]],
    )
    measurer = Measurer(get_board("local"), wl, FAST, compile_pool)
    try:
        (result,) = measurer.measure([measurer.template.default_config().index])
    finally:
        measurer.close()
    assert result.status is MeasureStatus.WRONG_ANSWER and "differ from the reference" in result.error


def test_bench_of_an_int8_convolution_has_no_float_peer(xtune_cli: CliRunner) -> None:
    out = xtune_cli("bench", "--workload", DEPTHWISE[0])
    assert out.returncode == 0 and "correct" in out.stdout and "Traceback" not in out.stderr


# What each route must assemble to: the dot of qconv2d, the widening multiplies of qdepthwise (s8 and u8
# activations: their products take different instructions).
S8_DW, U8_DW = "qdepthwise:n=1,c=32,h=8,w=8,r=3,s=3,pad=1", "qdepthwise:n=1,c=32,h=8,w=8,r=3,s=3,pad=1,a=u8"
INSTRUCTIONS = {
    (CONV[0], "x86-avx512-vnni"): r"vpdpbusd\s+%zmm",
    (CONV[0], "arm-a76-dotprod"): r"\bsdot\s+v\d+\.4s",
    (CONV[0], "arm-a72-neon"): r"\bsadalp\s+v\d+\.4s, v\d+\.8h",
    (CONV[2], "arm-a72-neon"): r"\bsmlsl2\s+v\d+\.8h, v\d+\.16b",  # channel groups in pairs (DotDiff)
    (CONV[2], "arm-a76-dotprod"): r"\bsdot\s+v\d+\.4s, v\d+\.16b, v\d+\.4b\[\d\]",  # by element
    (S8_DW, "arm-a72-neon"): r"\bsmull\s+v\d+\.8h",
    (U8_DW, "arm-a72-neon"): r"\bsmlal\s+v\d+\.4s",
    (S8_DW, "x86-avx512"): r"vpmullw",  # no VNNI: the widening multiplies
    (U8_DW, "x86-avx512-vnni"): r"vpdpbusd\s+%zmm",  # the taps grouped per channel (route=dot)
    (U8_DW, "arm-a76-dotprod"): r"\bsdot\s+v\d+\.4s, v\d+\.16b, v\d+\.16b",
    (S8_DW, "arm-a76-dotprod"): r"\bst4\s+\{\s*v\d+\.16b",  # the groups built by one interleaved store
    (U8_DW, "x86-avx2"): r"vpmaddwd",
    (S8_DW, "riscv64-gcv"): r"\bvwmacc\.vv",
    (U8_DW, "riscv64-gcv"): r"\bvwmaccsu\.vv",
}


@pytest.mark.parametrize(("key", "target"), list(INSTRUCTIONS))
def test_each_route_assembles_its_instruction(key: str, target: str, tmp_path: Path) -> None:
    text = disassemble(key, target, tmp_path)
    assert re.search(INSTRUCTIONS[key, target], text), f"{key} on {target}: no {INSTRUCTIONS[key, target]}"


# --- a whole quantized network -------------------------------------------------------------------------


def _conv_net(path: Path) -> Path:
    """x[1,3,12,12] -> Conv 3x3 (3 -> 8, bias) -> Relu -> depthwise 3x3 stride 2 -> Relu -> Conv 1x1
    (8 -> 16): a float model that `quantize_static` quantizes (QDQ, per channel, int8 activations)."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime.quantization")
    from onnx import TensorProto, helper, numpy_helper

    from tests.networks import quantize_qdq

    rng = np.random.default_rng(9)
    inits = {
        "w1": rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32),
        "b1": rng.normal(0, 0.1, 8).astype(np.float32),
        "w2": rng.normal(0, 0.4, (8, 1, 3, 3)).astype(np.float32),
        "b2": rng.normal(0, 0.1, 8).astype(np.float32),
        "w3": rng.normal(0, 0.4, (16, 8, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "Conv", ["r1", "w2", "b2"], ["c2"], name="dw", group=8, strides=[2, 2], pads=[1] * 4
        ),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["y"], name="pw"),
    ]
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    source = path.with_name("float.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)

    batches = [rng.uniform(-1, 1, (1, 3, 12, 12)).astype(np.float32) for _ in range(4)]
    return quantize_qdq(source, path, batches)


@pytest.mark.parametrize("board", ["local", "qemu-aarch64-dotprod", "qemu-aarch64"])
def test_a_quantized_conv_net_builds_to_int8_conv_tasks_that_equal_onnxruntime(
    board: str, tmp_path: Path
) -> None:
    import xtune
    from xtune.firmware.build import build_model
    from xtune.firmware.network_bench import network_input, run_network
    from xtune.tuning.peers import ort_network

    b = get_board(board, target="x86-avx512-vnni" if board == "local" else None)
    if board == "local" and host_cannot_run(b.target) is not None:
        b = get_board("local")
    if b.target.qemu_binary and shutil.which(b.target.qemu_binary) is None:
        pytest.skip(f"needs {b.target.qemu_binary}")
    path = _conv_net(tmp_path / "qconvnet.onnx")
    keys = [t.workload.key for t in xtune.tasks(path, b.target).tasks]
    assert [k.split(":")[0] for k in keys] == ["qconv2d", "qdepthwise", "qconv2d"], keys
    artifact = build_model(path, b.target)
    x = network_input(artifact)
    got, _ = run_network(b, artifact, x)
    assert np.array_equal(got, ort_network(path.read_bytes(), x)[0])
