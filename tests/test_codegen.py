"""Templates, lowering and compilation: the nest is right (interpreted), LLVM verifies it, and every
target gets a clean relocatable object (pyelftools: machine, no undefined symbols) that links flat."""

import random
import re

import numpy as np
import pytest

from tests.nest_interp import run_kernel
from xtune.boards.agent import RunRequest, RunStatus
from xtune.boards.board import get_board
from xtune.codegen.compile import compile_object, optimize, parse_verified, target_machine
from xtune.codegen.link import check_object, link_flat
from xtune.codegen.lower import lower
from xtune.codegen.transcend import float_literal
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import random_inputs
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Broadcast,
    Buffer,
    BufferKind,
    Const,
    Kernel,
    Load,
    LoopKind,
    MulAdd,
    NestBuilder,
)
from xtune.target import cpu_identity, get_target, load_targets

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


def test_avx512_kernels_use_zmm_registers() -> None:
    """x86-avx512 is worth having only if LLVM keeps its <16 x float> FMAs whole (docs/design.md)."""
    target = get_target("x86-avx512")
    template = template_for(parse_workload("matmul:m=64,n=64,k=64"), target)
    module = parse_verified(lower([template.kernel(template.default_config(), "k")]), target)
    machine = target_machine(target)
    optimize(module, machine)
    fmas = re.findall(r"vfmadd\w+\s+[^\n]*%(zmm|ymm|xmm)\d+$", machine.emit_assembly(module), re.MULTILINE)
    assert fmas and set(fmas) == {"zmm"}


def test_float_constants_are_the_exact_float_in_hex() -> None:
    """LangRef: a hex float constant is the double holding the float's exact value."""
    assert float_literal(0.1) == "0x3FB99999A0000000"  # 0.1f, not the double 0.1
    assert float_literal(-0.0) == "0x8000000000000000"
    assert float_literal(1.0) == "0x3FF0000000000000"


def memory_kernel() -> Kernel:
    """Loads that must not be reused across a store: out[0] is read back after each write, before
    and inside loops, plus tails, broadcasts, max and non-zero constants."""
    b = NestBuilder()
    acc = b.register("acc", 1)
    b.assign(acc, Load("out", Affine.of(0)))  # out[0] before any store: 0 from the caller
    with b.loop(4, "u", LoopKind.UNROLLED) as u:  # out[0] += inp[u], one block, no loop edge
        b.store("out", Affine.of(0), Binary(BinaryOp.ADD, Load("out", Affine.of(0)), Load("inp", u)))
    with b.loop(5, "i") as i:  # out[0] = out[0] * 2 + inp[i]: the load before the loop is stale here
        b.store("out", Affine.of(0), MulAdd(Load("out", Affine.of(0)), Const(2.0), Load("inp", i)))
        b.assign(acc, Binary(BinaryOp.ADD, Load("out", Affine.of(0)), acc))
    b.store("out", Affine.of(1), acc)
    # out[2:21] = max(inp[0:19] * 0.1, bcast(inp[20])) in vectors of 8 and a tail of 3, lane by lane
    splat = Broadcast(Load("inp", Affine.of(20)), 8)

    def tile(j: Affine, n: int) -> None:
        scaled = Binary(BinaryOp.MUL, Load("inp", j, 8, n % 8), Const(0.1, 8))
        b.store("out", j + 2, Binary(BinaryOp.MAX, scaled, splat), 8, n)

    b.split(19, 8, tile)
    return b.kernel("xt_kernel", (Buffer("inp", 21, BufferKind.INPUT), Buffer("out", 21, BufferKind.OUTPUT)))


def test_lowered_code_computes_what_the_nest_says() -> None:
    """The emitter reuses addresses, broadcasts and loads; run on this machine against the interpreter."""
    kernel = memory_kernel()
    inp = np.linspace(-1.0, 1.0, 21, dtype=np.float32)
    expected = np.zeros(21, dtype=np.float32)
    run_kernel(kernel, [inp, expected])
    board = get_board("local")
    image = link_flat(compile_object(lower([kernel]), board.target, ("xt_kernel",)))
    with board.open() as session:
        session.load_image(image.code)
        session.set_buffer(0, inp.tobytes())
        session.set_buffer(1, np.zeros(21, dtype=np.float32).tobytes())
        reply = session.run(RunRequest.check(image.entry("xt_kernel"), (0, 1)))
        got = np.frombuffer(session.read_buffer(1), dtype=np.float32)
    assert reply.status is RunStatus.OK
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_a_load_is_not_reused_across_a_store_or_a_loop_edge() -> None:
    text = lower([memory_kernel()])
    loads_of_out0 = [line for line in text.splitlines() if 'load float, ptr %"out"' in line]
    # out[0]: once at the start (the first unrolled step reuses it), again after each of the other
    # three unrolled stores, and twice in the loop body (not the value loaded before the loop)
    assert len(loads_of_out0) == 1 + 3 + 2, text


# /proc/cpuinfo as three kinds of board print it (abridged to the fields that matter, first core only).
ZEN5_KVM = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
)
ZEN3_KVM = ZEN5_KVM.replace("26", "25").replace("model\t\t: 2", "model\t\t: 1")
PI4 = (
    "processor\t: 0\nBogoMIPS\t: 108.00\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
    "CPU part\t: 0xd08\nprocessor\t: 1\nCPU part\t: 0xd03\n\nHardware\t: BCM2835\n"
    "Model\t\t: Raspberry Pi 4 Model B Rev 1.4\n"
)
VISIONFIVE2 = (
    "processor\t: 0\nhart\t\t: 1\nisa\t\t: rv64imafdc\nuarch\t\t: sifive,u74-mc\n"
    "marchid\t\t: 0x8000000000000007\n"
)


def test_cpu_identity_tells_apart_machines_a_hypervisor_names_alike() -> None:
    """Timings of one machine must not pass for another's (resume, the corpus): the name is not enough."""
    assert cpu_identity(ZEN5_KVM) == "AMD EPYC (family 26, model 2)"
    assert cpu_identity(ZEN3_KVM) != cpu_identity(ZEN5_KVM)
    # aarch64 kernels print no CPU name: the MIDR numbers of the first core say which core it is.
    assert cpu_identity(PI4) == "Raspberry Pi 4 Model B Rev 1.4 (implementer 0x41, part 0xd08)"
    assert cpu_identity(VISIONFIVE2) == "sifive,u74-mc (marchid 0x8000000000000007)"
    assert cpu_identity(PI4.replace("Model\t\t: Raspberry Pi 4 Model B Rev 1.4\n", "")) == (
        "implementer 0x41, part 0xd08"
    )
    assert cpu_identity("") == "unknown"
