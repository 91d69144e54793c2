"""The permutation family (xtune/ops/permute.py): Transpose of constant permutations of 3- to 5-D tensors
and ShuffleNet's channel shuffle (Reshape, Transpose, Reshape) after a convolution, built through the real
build path in NCHW and NHWC and checked against ONNX Runtime on the host and under qemu."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.opnets import LAYOUTS, check, kinds, net
from xtune.ops.permute import Permute

pytest.importorskip("onnxruntime")
node = helper.make_node


def shuffle(groups: int, shape: tuple[int, ...]) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    n, c, h, w = shape
    return [
        node("Reshape", ["a", "split"], ["g"], name="split"),
        node("Transpose", ["g"], ["t"], name="shuffle", perm=[0, 2, 1, 3, 4]),
        node("Reshape", ["t", "back"], ["s"], name="back"),
        node("Relu", ["s"], ["y"], name="relu"),
    ], {"split": np.array([n, groups, c // groups, h, w], np.int64), "back": np.array(shape, np.int64)}


@pytest.mark.parametrize("shape", [(1, 6, 1, 1), (2, 12, 3, 5), (1, 24, 4, 4)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_channel_shuffle_matches_onnx_runtime(layout: str, shape: tuple[int, ...]) -> None:
    nodes, inits = shuffle(3, shape)
    assert "permute" in kinds(check(net(nodes, shape, inits), layout))


PERMS = [(0, 2, 3, 1), (0, 3, 1, 2), (3, 2, 1, 0), (0, 1, 3, 2), (1, 0, 2, 3), None]


@pytest.mark.parametrize("perm", PERMS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_4d_permutation_matches_onnx_runtime(layout: str, perm: tuple[int, ...] | None) -> None:
    """None: no perm attribute, which reverses the axes."""
    t = node("Transpose", ["a"], ["t"], name="t")
    if perm is not None:
        t.attribute.append(helper.make_attribute("perm", list(perm)))
    check(net([t, node("Relu", ["t"], ["y"], name="relu")], (2, 5, 3, 7)), layout)


def test_merged_axes_and_the_reference() -> None:
    """The shuffle is three loops (the planes merged); numpy's transpose is the reference."""
    op = Permute(shape=(1, 3, 4, 5, 6), perm=(0, 2, 1, 3, 4))
    assert op._axes() == [(4, 30), (3, 120), (30, 1)]
    x = np.arange(360, dtype=np.float32).reshape(op.shape)
    assert np.array_equal(op.reference(x), x.transpose(0, 2, 1, 3, 4))


@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64"])
def test_transposes_under_qemu(board: str) -> None:
    nodes, inits = shuffle(2, (1, 10, 3, 3))
    check(net(nodes, (1, 10, 3, 3), inits), "nhwc", board)
    t = node("Transpose", ["a"], ["y"], name="t", perm=[0, 3, 1, 2])
    check(net([t], (1, 5, 3, 7)), "nchw", board)
