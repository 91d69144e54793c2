"""The LRN family (xtune/ops/lrn.py) after a convolution, built through the real build path in NCHW and
NHWC on odd shapes and window sizes (ONNX Runtime takes odd ones only), against ONNX Runtime on the host
and under qemu."""

from __future__ import annotations

import pytest
from onnx import helper

from tests.opnets import LAYOUTS, SHAPES, check, kinds, net

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("size", [1, 3, 5])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_lrn_matches_onnx_runtime(layout: str, shape: tuple[int, ...], size: int) -> None:
    lrn = helper.make_node("LRN", ["a"], ["y"], name="lrn", size=size, alpha=0.02, beta=0.75, bias=2.0)
    assert "lrn" in kinds(check(net([lrn], shape), layout))


@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64"])
def test_lrn_under_qemu(board: str) -> None:
    lrn = helper.make_node("LRN", ["a"], ["y"], name="lrn", size=5, alpha=1e-4, beta=0.75)
    for layout in LAYOUTS:
        check(net([lrn], (1, 7, 3, 5)), layout, board)
