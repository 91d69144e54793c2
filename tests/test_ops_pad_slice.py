"""The pad, slice and split families (xtune/ops/pad.py, slice.py, split.py, one kernel: xtune/ops/regions.py)
between two convolutions, built through the real build path in NCHW and NHWC and checked against ONNX
Runtime on the host and under qemu-aarch64; their one-line refusals; and the normalization that folds a
zero Pad into the Conv after it (xtune/frontend/padfold.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.opnets import LAYOUTS, SHAPES, check, kinds, net
from xtune.firmware.build import NetArtifact
from xtune.firmware.program import unsupported
from xtune.frontend.load import load_graph
from xtune.ops.transpose import Transpose

pytest.importorskip("onnxruntime")
node = helper.make_node
Inits = dict[str, np.ndarray]
Nodes = tuple[list[onnx.NodeProto], Inits]
SHAPE = (1, 5, 4, 6)  # 5 channels: no multiple of any target's vector width


def model(made: Nodes, channels: int, opset: int = 17, shape: tuple[int, ...] = SHAPE) -> onnx.ModelProto:
    """x -> 1x1 Conv -> the nodes (reading "a", the last writing "t" of `channels` channels) -> 1x1 Conv ->
    y: the operator runs inside a network, reading and writing the layout the convolutions run in."""
    nodes, inits = made
    w = np.random.default_rng(3).standard_normal((4, channels, 1, 1)).astype(np.float32)
    tail = node("Conv", ["t", "tail.w"], ["y"], name="tail")
    return net([*nodes, tail], shape, {**inits, "tail.w": w}, opset=opset)


def conversions(artifact: NetArtifact) -> int:
    """The layout conversions the build made: in NHWC, 2 (the input's and the output's) where the operator
    between the convolutions runs in NHWC too."""
    return sum(isinstance(c.kernel, Transpose) for c in artifact.program.calls)


def inputs(names: list[str]) -> list[str]:
    """A node's inputs without its trailing omitted ones."""
    while names and not names[-1]:
        names = names[:-1]
    return names


def pad(
    pads: list[int],
    mode: str = "constant",
    value: float | None = None,
    axes: list[int] | None = None,
    out: str = "t",
) -> Nodes:
    inits: Inits = {"pads": np.array(pads, np.int64)}
    if value is not None:
        inits["value"] = np.array(value, np.float32)
    if axes is not None:
        inits["axes"] = np.array(axes, np.int64)
    names = inputs(["a", "pads", "value" if value is not None else "", "axes" if axes is not None else ""])
    return [node("Pad", names, [out], name="pad", mode=mode)], inits


PADS = [
    ([0, 0, 1, 2, 0, 0, 2, 1], "constant", 1.5, None),  # asymmetric, a constant of its own
    ([0, 2, 0, 0, 0, 1, 0, 0], "constant", None, None),  # channels: 5 -> 8
    ([0, 1, -1, 0, 0, 2, 0, -2], "constant", -2.0, None),  # negative pads crop
    ([1, 0, 0, 0, 0, 0, 0, 0], "constant", None, None),  # the batch axis
    ([0, 0, 3, 1, 0, 0, 1, 5], "reflect", None, None),  # up to dim - 1 on a side
    ([0, 0, 2, 1, 0, 0, 1, 3], "edge", None, None),
    ([1, 2, 0, 1], "constant", 0.5, [-1, 2]),  # opset 18's axes input
]


@pytest.mark.parametrize(("pads", "mode", "value", "axes"), PADS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pad_matches_onnx_runtime(
    layout: str, pads: list[int], mode: str, value: float | None, axes: list[int] | None
) -> None:
    channels = SHAPE[1] + (pads[1] + pads[5] if axes is None else 0)
    batch = 1 + (
        pads[0] + pads[4] if axes is None else 0
    )  # a padded batch axis: the tail conv runs two images
    artifact = check(model(pad(pads, mode, value, axes), channels, opset=18), layout)
    assert "pad" in kinds(artifact) and artifact.program.output_shape[0] == batch
    assert conversions(artifact) == (2 if layout == "nhwc" else 0)


def test_pad_of_opset_2_attributes_is_upgraded_and_runs() -> None:
    """An opset 10 model's Pad (pads and value attributes) through onnx's version converter."""
    made: Nodes = [node("Pad", ["a"], ["t"], name="pad", pads=[0, 0, 2, 0, 0, 0, 0, 1], value=0.25)], {}
    assert "pad" in kinds(check(model(made, SHAPE[1], opset=10), "nhwc"))


def slice_(
    starts: list[int],
    ends: list[int],
    axes: list[int] | None,
    steps: list[int] | None,
    src: str = "a",
    out: str = "t",
) -> Nodes:
    inits: Inits = {"starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64)}
    for name, given in (("axes", axes), ("steps", steps)):
        if given is not None:
            inits[name] = np.array(given, np.int64)
    names = inputs(
        [src, "starts", "ends", "axes" if axes is not None else "", "steps" if steps is not None else ""]
    )
    return [node("Slice", names, [out], name="slice")], inits


BIG = 2**63 - 1
SLICES = [
    ([1], [4], [1], None, 3),  # channels 1..3
    ([0, 1, 5], [BIG, -1, 0], None, [1, 2, -2], 2),  # no axes: the first three; a step 2, a negative step 2
    ([-1, -BIG], [-BIG, BIG], [3, 2], [-1, 3], 5),  # reversed columns, clamped ends; every third row
    ([-10], [-20], [1], [-1], 1),  # ONNX clamps a start below 0 to 0 for a negative step: channel 0
    ([4, 0], [0, 1], [1, -4], [-2, 1], 2),  # channels 4 and 2
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps", "channels"), SLICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_slice_matches_onnx_runtime(
    layout: str,
    starts: list[int],
    ends: list[int],
    axes: list[int] | None,
    steps: list[int] | None,
    channels: int,
) -> None:
    artifact = check(model(slice_(starts, ends, axes, steps), channels), layout)
    assert "slice" in kinds(artifact) and conversions(artifact) == (2 if layout == "nhwc" else 0)


def test_slice_of_opset_1_attributes_is_upgraded_and_runs() -> None:
    made: Nodes = [node("Slice", ["a"], ["t"], name="slice", starts=[1, -3], ends=[3, 100], axes=[1, 3])], {}
    assert "slice" in kinds(check(model(made, 2, opset=9), "nhwc"))


def split(axis: int, parts: int, sizes: list[int] | None, how: str, src: str = "a") -> Nodes:
    """Split into `parts`, the parts joined again in reverse order by a Concat ("t"); the middle part of
    three is left unread. `how`: "attribute" (opset 11), "input" (13), "count" (18: num_outputs)."""
    outs = [f"s{k}" for k in range(parts)]
    attrs: dict[str, Any] = {"axis": axis}
    inits: Inits = {}
    names = [src]
    if how == "attribute" and sizes is not None:
        attrs["split"] = sizes
    elif how == "input" and sizes is not None:
        inits["sizes"], names = np.array(sizes, np.int64), [src, "sizes"]
    elif how == "count":
        attrs["num_outputs"] = parts
    joined = outs[::-1] if parts != 3 else [outs[2], outs[0]]
    return [
        node("Split", names, outs, name="split", **attrs),
        node("Concat", joined, ["t"], name="join", axis=axis),
    ], inits


SPLITS = [  # axis, parts, sizes, how, opset, the channels of the joined parts
    (1, 3, [1, 3, 1], "attribute", 11, 2),
    (1, 2, [2, 3], "input", 13, 5),
    (1, 2, None, "count", 18, 5),  # uneven: 3 and 2
    (-2, 3, [2, 1, 1], "attribute", 11, 5),  # rows 2, 1 (unread), 1
    (3, 3, None, "input", 13, 5),  # columns in equal thirds: no sizes, as many as there are outputs
]


@pytest.mark.parametrize(("axis", "parts", "sizes", "how", "opset", "channels"), SPLITS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_matches_onnx_runtime(
    layout: str, axis: int, parts: int, sizes: list[int] | None, how: str, opset: int, channels: int
) -> None:
    artifact = check(model(split(axis, parts, sizes, how), channels, opset), layout)
    calls = [c for c in artifact.program.calls if c.nodes == ("split",)]
    assert len(calls) == parts  # one call per output, the unread one included


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_odd_shapes(layout: str, shape: tuple[int, ...]) -> None:
    """1x1 spatial, 3 channels and two images, 16 channels: a Pad of channels and pixels, a reversed
    every-other-channel Slice, a Split of the channels into halves (the first the larger)."""
    c = shape[1]
    made = [
        (pad([0, 1, 1, 0, 0, 0, 1, 2], "constant", 0.5), c + 1),
        (slice_([-1], [-BIG], [1], [-2]), len(range(c - 1, -1, -2))),
        (split(1, 2, None, "count"), c),
    ]
    for nodes, channels in made:
        check(model(nodes, channels, opset=18, shape=shape), layout)


def test_refusals_name_each_pad_with_its_reason() -> None:
    """Every node a build cannot run is named in the one refusal, each with its reason."""
    made = (
        [
            node("Pad", ["a", "pads"], ["p"], name="wrap", mode="wrap"),
            node("Pad", ["p", "long"], ["t"], name="reflect", mode="reflect"),
        ],
        {
            "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
            "long": np.array([0, 0, 6, 0, 0, 0, 0, 0], np.int64),
        },
    )
    (refused,) = unsupported(load_graph(model(made, SHAPE[1], opset=19)))
    text = str(refused)
    assert refused.op == "Pad" and refused.count == 2, text
    for words in ("mode 'wrap'", "reflect pad as long as its axis"):
        assert words in text, text


def test_the_three_under_qemu_aarch64() -> None:
    """Pad (reflect), Slice (negative step) and Split in one network, both layouts, on an AArch64 board."""
    p, pi = pad([0, 0, 1, 2, 0, 0, 2, 1], "reflect", out="p")
    s, si = slice_([-1], [-BIG], [3], [-2], src="p", out="r")
    parts, partsi = split(1, 2, [2, 3], "input", src="r")
    for layout in LAYOUTS:
        check(model(([*p, *s, *parts], {**pi, **si, **partsi}), 5, opset=18), layout, "qemu-aarch64")


def test_a_zero_pad_folds_into_the_conv_or_counting_average_pool_after_it() -> None:
    """tf2onnx's "same" padding with stride 2: an explicit asymmetric Pad, then a Conv with pads of its own
    or none. It folds into the Conv, and into an AveragePool that counts the padding; before a MaxPool
    (which pads with -inf), or where a pooling window would be no larger than its pads, it stays, and
    runs as the pad family's kernel."""
    rng = np.random.default_rng(5)
    pads = {
        f"p{k}": np.array(p, np.int64)
        for k, p in enumerate([[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 2, 0, 0, 0, 0, 0]])
    }
    made: Nodes = (
        [
            node("Pad", ["a", "p0"], ["pa"], name="pad_conv"),
            node("Conv", ["pa", "w"], ["c"], name="strided", strides=[2, 2], pads=[1, 0, 0, 1]),
            node("Pad", ["c", "p1", "zero"], ["pc"], name="pad_avg"),
            node("AveragePool", ["pc"], ["v"], name="avg", kernel_shape=[2, 2], count_include_pad=1),
            node("Pad", ["v", "p1"], ["pv"], name="pad_max"),
            node("MaxPool", ["pv"], ["m"], name="max", kernel_shape=[2, 2]),
            node("Pad", ["m", "p2"], ["pm"], name="pad_wide"),  # 2 rows: as large as the window
            node("AveragePool", ["pm"], ["t"], name="wide", kernel_shape=[2, 2], count_include_pad=1),
        ],
        {**pads, "w": rng.standard_normal((6, 5, 3, 3)).astype(np.float32), "zero": np.zeros((), np.float32)},
    )
    onnx_model = model(made, 6)
    graph = load_graph(onnx_model)
    ops = {n.name: n for n in graph.nodes}
    assert "pad_conv" not in ops and "pad_avg" not in ops and "pad_max" in ops and "pad_wide" in ops
    assert ops["strided"].inputs[0] == "a" and ops["strided"].ints("pads", ()) == (1, 0, 1, 2)
    assert ops["avg"].ints("pads", ()) == (1, 1, 1, 1)
    for layout in LAYOUTS:
        assert "pad" in kinds(check(onnx_model, layout))


@pytest.mark.parametrize(
    ("pads", "value", "mode", "why"),
    [
        ([0, 0, 1, 1, 0, 0, 1, 1], 1.0, "constant", "a border of 1 is no convolution's padding"),
        ([0, 1, 0, 0, 0, 0, 0, 0], 0.0, "constant", "a channel is no spatial axis"),
        ([0, 0, 1, 1, 0, 0, 1, 1], 0.0, "reflect", "a reflected border is no padding of zeros"),
        ([0, 0, -1, 0, 0, 0, 0, 0], 0.0, "constant", "a crop"),
    ],
)
def test_a_pad_that_is_no_conv_padding_stays(pads: list[int], value: float, mode: str, why: str) -> None:
    """Only a zero constant Pad of the spatial axes folds; these stay (and run: ONNX Runtime agrees)."""
    channels = SHAPE[1] + pads[1] + pads[5]
    nodes, inits = pad(pads, mode, value, out="p")
    w = np.random.default_rng(2).standard_normal((5, channels, 3, 3)).astype(np.float32)
    conv = node("Conv", ["p", "w"], ["t"], name="padded", pads=[1, 1, 1, 1])
    onnx_model = model(([*nodes, conv], {**inits, "w": w}), 5, opset=18)
    assert "pad" in {n.name for n in load_graph(onnx_model).nodes}, why
    check(onnx_model, "nhwc")
