"""Register budgets: the default config of every template on every target, compiled by llvmlite and
disassembled by the target's binutils objdump, keeps its hot loops free of stack accesses (spills and
reloads); on AArch64 the matmul's k steps multiply by lanes of vectors of A (FMLA by element)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import pytest

from xtune.codegen.compile import compile_object
from xtune.codegen.lower import lower
from xtune.ops.registry import parse_workload, template_for
from xtune.target import Target, get_target, load_targets

OBJDUMP = {
    "x86_64": "objdump",
    "aarch64": "aarch64-linux-gnu-objdump",
    "riscv64": "riscv64-linux-gnu-objdump",
}
# A spill or reload addresses the frame at a constant offset from the stack (or frame) pointer; the packed
# panels on the stack are addressed through a register computed once (`add x9, sp, #64`), or with an index
# register on x86 (`(%rsp,%rax,4)`). RVV spills whole registers (vs1r.v / vl1re32.v, RVV 1.0 §7.9).
STACK_ACCESS = {
    "x86_64": re.compile(r"(?<![\w)])(-?0x[0-9a-f]+)?\(%r[sb]p\)"),
    "aarch64": re.compile(r"\[(sp|x29)(, #-?(0x)?[0-9a-f]+)?\]"),
    "riscv64": re.compile(r"\b-?\d+\((sp|s0)\)|\bvs\dr\.v|\bvl\dre\d+\.v"),
}
# A hot loop multiplies: FMAs, or SSE's MULPS before its ADDPS.
MULTIPLY = {
    "x86_64": re.compile(r"^(vfn?m(add|sub)|v?mulp|v?mulss)"),
    "aarch64": re.compile(r"^(fmla|fmadd|fmul|fmls)"),
    "riscv64": re.compile(r"^(vfn?m(acc|add)|fn?madd|fmul|vfmul)"),
}
BRANCH = re.compile(r"^(j\w*|b\.\w+|b|cbn?z|tbn?z|b(eq|ne|lt|ge|ltu|geu|nez|eqz|gtz|lez|gt|le|gtu|leu))\s")

WORKLOADS = {
    "matmul": "matmul:m=64,n=64,k=64",
    "conv_nchw": "conv2d:n=1,c=16,h=14,w=14,k=32,r=3,s=3,pad=1,algo=direct",
    "conv_nhwc": "conv2d:n=1,c=16,h=14,w=14,k=32,r=3,s=3,pad=1,layout=nhwc,algo=direct",
    "conv_stride2": "conv2d:n=1,c=16,h=14,w=14,k=32,r=3,s=3,stride=2,pad=1,layout=nhwc",
    "pointwise": "conv2d:n=1,c=32,h=14,w=14,k=64,r=1,s=1,layout=nhwc",
    # Wide enough rows that the tiles along one are a loop (at 28 they are straight-line code).
    "depthwise_nchw": "depthwise:n=1,c=8,h=112,w=112,r=3,s=3,pad=1",
    "depthwise_nhwc": "depthwise:n=1,c=32,h=28,w=28,r=3,s=3,pad=1,layout=nhwc",
    "winograd_nhwc": "conv2d:n=1,c=16,h=14,w=14,k=32,r=3,s=3,pad=1,layout=nhwc,algo=winograd",
    "winograd_nchw": "conv2d:n=1,c=16,h=14,w=14,k=32,r=3,s=3,pad=1,algo=winograd",
    # Prepacked U (a network's layer): the default is F(4x4, 3x3), its transforms multiply too.
    "winograd4": "conv2d:n=1,c=64,h=28,w=28,k=64,r=3,s=3,pad=1,layout=nhwc,algo=winograd,relu=1,prepacked=1",
}
AARCH64 = tuple(name for name, target in load_targets().items() if target.arch == "aarch64")
# Hot loops that still spill, each for the reason found in its disassembly. strict: one that stops
# spilling fails here, so the list only shrinks.
SPILLING = {
    # Scalar FP: LLVM hoists the loads of every unrolled k step (adjacent addresses are clustered), so a
    # tile holds `unroll` steps of operands beside its accumulators.
    **{
        ("riscv64-gc", w): "loads of all unrolled steps hoisted"
        for w in WORKLOADS
        if w not in ("conv_nhwc", "conv_stride2")
    },
    # Without FMA the products need registers of their own beyond the budget's one.
    **{
        ("x86-sse42", w): "MULPS + ADDPS"
        for w in ("matmul", "pointwise", "conv_nchw", "depthwise_nchw", "winograd4")
    },
    # Its s * V weight vectors, V input vectors and the accumulators: a pointer or vector too many.
    **{
        (t, "depthwise_nhwc"): "weights of a kernel row"
        for t in (
            "riscv64-gcv",
            "x86-avx512",
            "x86-avx512-vnni",
            "x86-sse42",
        )
    },
    ("riscv64-gcv", "winograd_nhwc"): "a GPR (a row pointer) reloaded in the tile loop",
    ("riscv64-gcv", "winograd4"): "GPRs (row pointers) reloaded in the tile loops",
    # Its rows of input vectors and weight broadcasts beside the P x V accumulators: more than the
    # p * v + 2 its register rule counts (AArch64's "ext" taps keep within their bounds).
    **{
        (t, "depthwise_nchw"): "input rows and weights beyond p * v + 2"
        for t in ("riscv64-gcv", "x86-avx2", "x86-avx2-vnni")
    },
    **{
        (t, "depthwise_nchw"): "its tiles along a row are straight-line code, no loop to check"
        for t in ("x86-avx512", "x86-avx512-vnni")
    },
}


def disassembly(data: bytes, arch: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every instruction of a relocatable object."""
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(data)
        f.flush()
        out = subprocess.run(
            [OBJDUMP[arch], "-d", "--no-show-raw-insn", f.name], capture_output=True, text=True, check=True
        ).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S.*)", line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2).strip()))
    return rows


def hot_loops(rows: list[tuple[int, str]], arch: str) -> list[list[str]]:
    """The instructions of each innermost loop that multiplies. A loop is a backward branch and the code
    from its target to it; innermost: no other loop inside it."""
    ranges = []
    for addr, text in rows:
        m = re.search(r"\b([0-9a-f]+) <", text)
        if m and BRANCH.match(text + " ") and int(m.group(1), 16) <= addr:
            ranges.append((int(m.group(1), 16), addr))
    inner = [r for r in ranges if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in ranges)]
    bodies = [[text for addr, text in rows if lo <= addr <= hi] for lo, hi in inner]
    return [body for body in bodies if any(MULTIPLY[arch].match(text) for text in body)]


def default_object(target: Target, key: str) -> list[tuple[int, str]]:
    template = template_for(parse_workload(key), target)
    kernel = template.kernel(template.default_config(), "xt_kernel")
    return disassembly(compile_object(lower([kernel]), target, ("xt_kernel",)).data, target.arch)


CASES = [
    pytest.param(
        name,
        workload,
        marks=[pytest.mark.xfail(strict=True, reason=SPILLING[(name, workload)])]
        if (name, workload) in SPILLING
        else [],
        id=f"{name}-{workload}",
    )
    for name in load_targets()
    for workload in WORKLOADS
]


@pytest.mark.parametrize(("name", "workload"), CASES)
def test_default_hot_loops_have_no_stack_access(name: str, workload: str) -> None:
    target = get_target(name)
    if shutil.which(OBJDUMP[target.arch]) is None:
        pytest.skip(f"needs {OBJDUMP[target.arch]} (binutils for {target.arch})")
    loops = hot_loops(default_object(target, WORKLOADS[workload]), target.arch)
    assert loops, "no multiplying loop found: the loop finder no longer reads this disassembly"
    spills = [text for body in loops for text in body if STACK_ACCESS[target.arch].search(text)]
    assert not spills, spills


def test_the_pattern_sees_a_spill_and_not_a_panel_access() -> None:
    assert STACK_ACCESS["aarch64"].search("ldr\tq12, [sp, #48]")
    assert not STACK_ACCESS["aarch64"].search("ldp\tq10, q13, [x17, #-160]")
    assert STACK_ACCESS["x86_64"].search("vmovaps %ymm2,0x20(%rsp)")
    assert not STACK_ACCESS["x86_64"].search("movaps %xmm0,(%rsp,%rax,1)")
    assert STACK_ACCESS["riscv64"].search("fsw\tft8,124(sp)") and STACK_ACCESS["riscv64"].search(
        "vs1r.v\tv8,(a0)"
    )
    assert not STACK_ACCESS["riscv64"].search("add\ta0,sp,576")


@pytest.mark.parametrize("workload", ["matmul", "conv_nhwc", "conv_stride2"])
@pytest.mark.parametrize("name", AARCH64)
def test_aarch64_defaults_multiply_by_lanes(name: str, workload: str) -> None:
    """Four k steps of A (direct conv2d: four input channels of a pixel) in one q register, each lane an
    FMLA (by element) operand: no ld1r, no scalar loads of A, in the hot loops of the full tiles."""
    if shutil.which(OBJDUMP["aarch64"]) is None:
        pytest.skip("needs aarch64-linux-gnu-objdump")
    loops = hot_loops(default_object(get_target(name), WORKLOADS[workload]), "aarch64")
    text = [t for body in loops for t in body]
    lanes = {m.group(1) for t in text if t.startswith("fmla") and (m := re.search(r"\.s\[(\d)\]", t))}
    assert lanes == set("0123")
    assert not [t for t in text if t.startswith("ld1r")]


def test_rvv_matmul_multiplies_by_register_groups() -> None:
    """riscv64-gcv's matmul vectors are groups of 4 registers (LMUL=4): in the hot loop one vle32 per
    group of a B row and one FMA per group of each tile row, per k step (the default's 2x2 tile of
    32-lane groups, 4 k steps unrolled: 8 loads, 16 FMAs), and nothing spilled."""
    if shutil.which(OBJDUMP["riscv64"]) is None:
        pytest.skip("needs riscv64-linux-gnu-objdump")
    target = get_target("riscv64-gcv")
    rows = default_object(target, WORKLOADS["matmul"])
    assert any(",e32,m4," in text for _, text in rows if text.startswith("vset"))
    (loop,) = hot_loops(rows, "riscv64")
    assert len([t for t in loop if t.startswith("vle32")]) == 8
    assert len([t for t in loop if MULTIPLY["riscv64"].match(t)]) == 16
