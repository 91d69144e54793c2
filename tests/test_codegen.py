"""Templates, lowering and compilation: the nest is right (interpreted), LLVM verifies it, and every
target gets a clean relocatable object (pyelftools: machine, no undefined symbols) that links flat."""

import random

import numpy as np
import pytest

from tests.nest_interp import run_kernel
from xtune.compile import compile_object, parse_verified
from xtune.link import check_object, link_flat
from xtune.loopnest import Affine, Buffer, BufferKind, Const, Load, NestBuilder
from xtune.lower import lower
from xtune.target import get_target, load_targets
from xtune.templates import template_for
from xtune.workload import parse_workload, random_inputs

ELF_MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "riscv64": "EM_RISCV"}


def test_split_covers_every_element_once_with_a_constant_tail() -> None:
    b = NestBuilder()
    b.split(23, 8, lambda off, size: b.store("out", off, Load("inp", off, 8, size % 8), 8, size))
    kernel = b.kernel("copy", (Buffer("inp", 23, BufferKind.INPUT), Buffer("out", 23, BufferKind.OUTPUT)))
    src, dst = np.arange(23, dtype=np.float32), np.full(23, np.nan, dtype=np.float32)
    run_kernel(kernel, [src, dst])
    np.testing.assert_array_equal(dst, src)


def test_affine_arithmetic() -> None:
    i = Affine.of("i")
    expr = (i * 4 + 3) * 2 + "j"
    assert expr.coeff("i") == 8 and expr.coeff("j") == 1 and expr.const == 6
    assert expr.substitute("i", 2).const == 22


@pytest.mark.parametrize("shape", [(7, 13, 5), (1, 1, 1), (9, 17, 33), (16, 24, 8)])
@pytest.mark.parametrize("target_name", ["x86-avx2", "arm-a72-neon", "riscv64-gc"])
def test_matmul_nests_compute_the_product(shape: tuple[int, int, int], target_name: str) -> None:
    """Default and random configs, interpreted: tails, packing and k-blocking are exact."""
    m, n, k = shape
    wl = parse_workload(f"matmul:m={m},n={n},k={k}")
    template = template_for(wl, get_target(target_name))
    rng = random.Random(hash(shape) & 0xFFFF)
    configs = [template.default_config()] + [
        template.space.config(rng.randrange(template.space.size)) for _ in range(3)
    ]
    a, b = random_inputs(wl)
    for config in configs:
        c = np.full((m, n), np.nan, dtype=np.float32)
        run_kernel(template.kernel(config, "k"), [a, b, c])
        np.testing.assert_allclose(c, wl.reference([a, b]), rtol=1e-4, atol=1e-4, err_msg=str(config.values))


def test_lowered_ir_carries_the_attributes_the_linker_relies_on() -> None:
    wl = parse_workload("matmul:m=16,n=16,k=16")
    target = get_target("x86-avx2")
    template = template_for(wl, target)
    text = lower([template.kernel(template.default_config(), "xt_kernel")])
    parse_verified(text, target)  # LLVM's verifier accepts it
    assert '"no-builtins"' in text and "nounwind" in text and "noalias" in text
    calls = {line.split("@")[1].split("(")[0].strip('"') for line in text.splitlines() if " call " in line}
    assert calls <= {"llvm.fmuladd.v8f32", "llvm.fmuladd.f32"}, calls


def test_a_zero_loop_does_not_become_memset() -> None:
    """LoopIdiomRecognize would emit memset; "no-builtins" must keep the object self-contained."""
    b = NestBuilder()
    with b.loop(1000) as i:
        b.store("out", i, Const(0.0))
    kernel = b.kernel("zero", (Buffer("out", 1000, BufferKind.OUTPUT),))
    for name in ("x86-avx2", "arm-a72-neon", "riscv64-gc"):
        obj = compile_object(lower([kernel]), get_target(name), ("zero",))
        assert check_object(obj, get_target(name)).undefined == ()


@pytest.mark.parametrize("target_name", sorted(load_targets()))
def test_every_target_gets_a_checked_object_that_links_flat(target_name: str) -> None:
    target = get_target(target_name)
    wl = parse_workload("matmul:m=37,n=45,k=29")
    template = template_for(wl, target)
    rng = random.Random(7)
    configs = [template.default_config()] + [
        template.space.config(rng.randrange(template.space.size)) for _ in range(2)
    ]
    for config in configs:
        obj = compile_object(lower([template.kernel(config, "xt_kernel")]), target, ("xt_kernel",))
        info = check_object(obj, target)
        assert info.machine == ELF_MACHINES[target.arch]
        assert info.elf_class == 64 and info.little_endian and info.undefined == ()
        assert dict(info.functions)["xt_kernel"] > 0
        image = link_flat(obj)
        assert image.entry("xt_kernel") < len(image.code)
