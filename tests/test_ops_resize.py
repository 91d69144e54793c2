"""The resize family (xtune/ops/resize.py): Resize between two convolutions, nearest and linear under every
coordinate transformation, by scales and by sizes, opset 18's axes, and the opset 7-10 Upsample and
Resize that normalization upgrades; built through the real build path in NCHW and NHWC against ONNX
Runtime on the host, a few on qemu-aarch64. The taps and their runs are checked on their own."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.opnets import LAYOUTS, check, kinds, net
from xtune.errors import InputError
from xtune.firmware.program import program
from xtune.ops.resize import Resize, Tap, axis_taps, runs

pytest.importorskip("onnxruntime")


def resize_net(
    shape: tuple[int, ...],
    opset: int = 17,
    scales: list[float] | None = None,
    sizes: list[int] | None = None,
    **attrs: Any,
) -> onnx.ModelProto:
    """conv 1x1 -> Resize (constant scales or sizes) -> conv 1x1: the resize reads and writes activations."""
    consts: dict[str, np.ndarray] = {}
    inputs = ["a", "", "", ""]
    if scales is not None:
        consts["scales"] = np.array(scales, np.float32)
        inputs[2] = "scales"
    if sizes is not None:
        consts["sizes"] = np.array(sizes, np.int64)
        inputs[3] = "sizes"
    c = shape[1]
    consts["w2"] = np.random.default_rng(3).standard_normal((c, c, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Resize", inputs[: 4 if sizes is not None else 3], ["r"], name="resize", **attrs),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
    ]
    return net(nodes, shape, consts, opset=opset)


CASES = {
    "nearest-x2-asymmetric-floor": dict(
        scales=[1, 1, 2, 2], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"
    ),
    "nearest-half-pixel-x3x1.5": dict(scales=[1, 1, 3, 1.5], mode="nearest"),
    "nearest-ceil-align-corners": dict(
        sizes=[2, 5, 7, 4],
        mode="nearest",
        coordinate_transformation_mode="align_corners",
        nearest_mode="ceil",
    ),
    "nearest-prefer-ceil-down": dict(
        scales=[1, 1, 0.5, 0.75], mode="nearest", nearest_mode="round_prefer_ceil"
    ),
    "linear-x2-half-pixel": dict(scales=[1, 1, 2, 2], mode="linear"),
    "linear-pytorch-sizes": dict(
        sizes=[2, 5, 9, 1], mode="linear", coordinate_transformation_mode="pytorch_half_pixel"
    ),
    "linear-align-corners": dict(
        sizes=[2, 5, 7, 11], mode="linear", coordinate_transformation_mode="align_corners"
    ),
    "linear-asymmetric-down": dict(
        scales=[1, 1, 0.6, 1.25], mode="linear", coordinate_transformation_mode="asymmetric"
    ),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(CASES))
def test_resize_between_convolutions_matches_onnx_runtime(case: str, layout: str) -> None:
    """2 images of 5 channels (no multiple of any vector width), 4x6 pixels."""
    artifact = check(resize_net((2, 5, 4, 6), **CASES[case]), layout)  # type: ignore[arg-type]
    assert "resize" in kinds(artifact)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_one_pixel_upscaled(mode: str, layout: str) -> None:
    """1x1 spatial to 3x2: every output reads the one pixel (in NCHW a row of one column: a partial load)."""
    check(resize_net((1, 5, 1, 1), sizes=[1, 5, 3, 2], mode=mode), layout)


def test_opset18_axes_and_sizes() -> None:
    model = resize_net((1, 3, 3, 5), opset=18, sizes=[6, 4], mode="linear", axes=[2, 3])
    check(model, "nhwc")


@pytest.mark.parametrize(
    ("opset", "scales"), [(7, [1.0, 1.0, 2.0, 1.5]), (9, [1.0, 1.0, 2.0, 1.5]), (10, [1.0, 1.0, 0.5, 0.75])]
)
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_old_upsample_and_resize_keep_their_semantics(opset: int, scales: list[float], mode: str) -> None:
    """Opset 7's Upsample (scales an attribute), opset 9's (an input), opset 10's Resize (downsampling):
    asymmetric coordinates, as ONNX Runtime runs them at their own opset, after normalization upgrades
    them."""
    rng = np.random.default_rng(5)
    inits = {"w2": rng.standard_normal((3, 3, 1, 1)).astype(np.float32)}
    if opset == 7:
        up = helper.make_node("Upsample", ["a"], ["r"], name="up", mode=mode, scales=scales)
    else:
        inits["s"] = np.array(scales, np.float32)
        up = helper.make_node("Upsample" if opset == 9 else "Resize", ["a", "s"], ["r"], name="up", mode=mode)
    model = net([up, helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2")], (1, 3, 4, 5), inits, opset)
    check(model, "nhwc")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_resize_on_qemu_aarch64(layout: str) -> None:
    check(resize_net((1, 5, 3, 4), **CASES["linear-x2-half-pixel"]), layout, board="qemu-aarch64")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("attrs", "words"),
    [
        (dict(scales=[1, 1, 2, 2], mode="cubic"), "mode cubic"),
        (
            dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="tf_crop_and_resize"),
            "tf_crop_and_resize",
        ),
        (dict(scales=[2, 1, 2, 2]), "H and W only"),
        (dict(scales=[1, 1, 2, 2], exclude_outside=1), "exclude_outside=1"),
    ],
)
def test_what_resize_refuses_is_one_line(attrs: dict[str, object], words: str) -> None:
    with pytest.raises(InputError, match=words):
        program(resize_net((1, 2, 3, 3), **attrs))  # type: ignore[arg-type]


def test_taps_repeat_in_one_period() -> None:
    """Nearest x2 asymmetric: every output column reads column o // 2: one run of period 2, step 1.
    Linear x2 half-pixel: the clamped first and last outputs, then a run of period 2."""
    taps = axis_taps("nearest", "asymmetric", "floor", 5, 10, 2.0)
    assert taps == tuple(Tap(o // 2, o // 2, 0.0) for o in range(10))
    assert [(r.start, r.period, r.count, r.step) for r in runs(taps)] == [(0, 2, 5, 1)]
    linear = axis_taps("linear", "half_pixel", "round_prefer_floor", 4, 8, 2.0)
    assert [(t.lo, t.hi, t.t) for t in linear[:3]] == [(0, 1, 0.0), (0, 1, 0.25), (0, 1, 0.75)]
    assert linear[-1] == Tap(3, 3, 0.0)
    assert [(r.start, r.period, r.count) for r in runs(linear)] == [(0, 1, 1), (1, 2, 3), (7, 1, 1)]
    # 40 -> 60: the weights repeat every 3 outputs (2 input rows) in float64, where float32 would not
    third = runs(axis_taps("linear", "half_pixel", "round_prefer_floor", 40, 60, 1.5))
    assert sum(r.period for r in third) <= 6 and max(r.count for r in third) >= 19


# 100x100 to 173x173: align_corners by sizes (period 172), asymmetric by scales 1.73 (period 173)
LARGE: dict[str, dict[str, Any]] = {
    "align_corners": {"sizes": [1, 3, 173, 173]},
    "asymmetric": {"scales": [1, 1, 1.73, 1.73]},
}


def large_net(transform: str) -> onnx.ModelProto:
    return resize_net(
        (1, 3, 100, 100), mode="linear", coordinate_transformation_mode=transform, **LARGE[transform]
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("transform", list(LARGE))
def test_a_large_resize_without_a_short_period_matches_onnx_runtime(transform: str, layout: str) -> None:
    """100x100 to 173x173: taps that repeat only every 172 or 173 outputs, built separable (rows into a
    scratch image, then its columns), 3 channels (no multiple of any vector width)."""
    check(large_net(transform), layout)


def test_a_large_resize_on_qemu_aarch64() -> None:
    check(large_net("align_corners"), "nchw", board="qemu-aarch64")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_a_strong_downscale_along_w(mode: str, layout: str) -> None:
    """40 columns to 12: a vector of NCHW outputs reads columns of up to four input vectors."""
    check(resize_net((1, 3, 9, 40), scales=[1, 1, 0.5, 0.3], mode=mode), layout)


def test_a_strong_downscale_on_qemu_riscv64() -> None:
    check(resize_net((1, 3, 9, 40), scales=[1, 1, 0.5, 0.3], mode="linear"), "nchw", board="qemu-riscv64")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_nchw_resize_is_vectors_along_w(mode: str) -> None:
    """The NCHW kernel's outputs are whole vectors (stores of <4 x float>, lanes picked by shufflevector),
    with no scalar store but a row's tail, in the direct kernel and (linear to 173) the separable one."""
    from xtune.codegen.lower import lower

    for size, transform in ((64, "asymmetric"), (173, "align_corners")):
        taps = axis_taps(mode, transform, "floor", 32, size, size / 32)
        kernel = Resize(n=1, c=2, h=32, w=32, rows=taps, cols=taps).kernel_nest("resize", 4)
        assert any(b.name == "T" for b in kernel.buffers) == (size == 173 and mode == "linear")
        ir = lower([kernel])
        assert "store <4 x float>" in ir and "shufflevector <4 x float>" in ir
        assert ("store float" in ir) == (size % 4 != 0)  # scalar stores only for a row's last few outputs


def test_what_no_kernel_can_hold_is_refused() -> None:
    """2100 outputs along each axis without a short period: more unrolled bodies than a kernel may have,
    even separable."""
    rows = axis_taps("linear", "align_corners", "round_prefer_floor", 100, 2100, 21.0)
    with pytest.raises(InputError, match="unrolled bodies"):
        Resize(n=1, c=1, h=100, w=100, rows=rows, cols=rows)
