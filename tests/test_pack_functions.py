"""Pack functions of prepacked=1 kernels (`template.pack_kernel`, emitted beside each kernel by `xtune build
--workload ...,prepacked=1`): run on every board, they must write the bytes numpy's `kernel_inputs` gives
the kernel, and the kernel must then compute the plain reference from them."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.board_run import run_entry
from xtune.boards.board import get_board
from xtune.codegen.compile import compile_object
from xtune.codegen.link import link_flat
from xtune.codegen.lower import lower
from xtune.errors import InputError
from xtune.ops.conv2d.winograd import WinogradTemplate
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import RTOL, compare_output, random_inputs
from xtune.target import get_target

# Tails on every axis (channels no multiple of any vector width, several channel blocks in random configs),
# both layouts, strides 1 and 2, the epilogue; Winograd with odd sizes; the pointwise conv2d's matmul
# (weights as A for NCHW, as B for NHWC); a plain matmul; grouped conv2d (each group's blocks in turn),
# and grouped pointwise ones through one group's matmul (each group's panels in turn: NCHW, and NHWC with
# 32 channels per group, whole vectors on every target).
KEYS = (
    "conv2d:n=1,c=13,h=9,w=9,k=21,r=3,s=3,stride=1,pad=1,bias=1,relu=1,prepacked=1,algo=direct",
    "conv2d:n=2,c=7,h=11,w=10,k=19,r=3,s=3,stride=2,pad=1,layout=nhwc,prepacked=1",
    "conv2d:n=1,c=20,h=7,w=9,k=9,r=3,s=3,pad=1,algo=winograd,bias=1,residual=1,prepacked=1",
    "conv2d:n=1,c=11,h=10,w=8,k=19,r=3,s=3,pad=0,layout=nhwc,algo=winograd,prepacked=1",
    "conv2d:n=2,c=13,h=5,w=7,k=21,r=1,s=1,stride=1,pad=0,prepacked=1",
    "conv2d:n=1,c=13,h=5,w=7,k=21,r=1,s=1,stride=1,pad=0,layout=nhwc,prepacked=1",
    "matmul:m=7,n=37,k=20,bias=1,prepacked=1",
    "conv2d:n=1,c=21,h=7,w=6,k=15,r=3,s=3,stride=1,pad=1,groups=3,prepacked=1",
    "conv2d:n=1,c=24,h=5,w=6,k=40,r=1,s=1,stride=1,pad=0,groups=8,layout=nhwc,prepacked=1",
    "conv2d:n=2,c=21,h=5,w=7,k=12,r=1,s=1,stride=1,pad=0,groups=3,bias=1,prepacked=1",
    "conv2d:n=1,c=64,h=5,w=3,k=96,r=1,s=1,stride=1,pad=0,groups=2,layout=nhwc,prepacked=1",
)


def _configs(key: str, target_name: str) -> list[int]:
    """The default config and two random ones (fixed per workload and target)."""
    template = template_for(parse_workload(key), get_target(target_name))
    rng = random.Random(f"{key} {target_name}")
    return [template.default_config().index] + [rng.randrange(template.space.size) for _ in range(2)]


@pytest.mark.parametrize("key", KEYS)
def test_the_pack_function_writes_what_numpy_packs_and_the_kernel_reads_it_locally(key: str) -> None:
    check_packs("local", key)


@pytest.mark.parametrize("key", KEYS)
def test_the_pack_function_writes_what_numpy_packs_and_the_kernel_reads_it_under_qemu(
    qemu_board: str, key: str
) -> None:
    check_packs(qemu_board, key)


def check_packs(board: str, key: str, indices: list[int] | None = None) -> None:
    """Per config (`indices`, else the default and two random ones): the pack function's bytes are
    `kernel_inputs`' exactly, and the kernel computes the reference from them."""
    target = get_board(board).target
    wl = parse_workload(key)
    template = template_for(wl, target)
    indices = _configs(key, target.name) if indices is None else indices
    kernels, names = [], []
    for n, index in enumerate(indices):
        config = template.space.config(index)
        kernels += [template.pack_kernel(config, f"pack{n}"), template.kernel(config, f"kernel{n}")]
        names += [f"pack{n}", f"kernel{n}"]
    image = link_flat(compile_object(lower(kernels), target, tuple(names)))
    inputs = random_inputs(wl, 3)
    expected = wl.reference(inputs)
    slot = 1  # the weights: conv2d's `weights`, matmul's B
    for n, index in enumerate(indices):
        want = template.kernel_inputs(template.space.config(index), inputs)[slot].ravel()
        plain = np.asarray(inputs[slot], np.float32)
        # Filled with NaN: a float the pack function leaves unwritten shows.
        packed = run_entry(board, image, f"pack{n}", [plain, np.full(want.size, np.nan, np.float32)])[1]
        assert packed.tobytes() == want.tobytes(), (key, index, np.flatnonzero(packed != want)[:8])
        args = [*inputs[:slot], packed, *inputs[slot + 1 :], np.full(expected.shape, np.nan, np.float32)]
        out = run_entry(board, image, f"kernel{n}", args)[-1]
        assert compare_output(out, expected, RTOL) == "", (key, index)


def test_the_pack_function_takes_the_workloads_weights_and_writes_the_packed_size() -> None:
    target = get_target("arm-a72-neon")
    for key in KEYS:
        template = template_for(parse_workload(key), target)
        config = template.default_config()
        pack = template.pack_kernel(config, "p")
        plain, packed = pack.params
        tensor = parse_workload(key).tensors()[1]
        assert (plain.name, plain.size) == (tensor.name, tensor.size)
        assert packed.size == template.kernel_inputs(config, random_inputs(parse_workload(key)))[1].size
        # No scratch but NCHW Winograd's staging of lanes input channels of a strip (9 x 4 x nr floats).
        if isinstance(template, WinogradTemplate) and "nhwc" not in key:
            assert pack.stack_bytes == 4 * 9 * 4 * template.schedule(config).nr
        else:
            assert pack.stack_bytes == 0, key


def test_depthwise_has_no_pack_function() -> None:
    template = template_for(parse_workload("depthwise:n=1,c=8,h=6,w=6,r=3,s=3,pad=1"), get_target("x86-avx2"))
    with pytest.raises(InputError, match="never packed"):
        template.pack_kernel(template.default_config(), "p")
