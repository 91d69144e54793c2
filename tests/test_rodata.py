"""Weights section tests: float arrays in; an object whose read-only section is patched with them, linked
flat (byte for byte as GNU ld would), and kernels reading the weights locally and under QEMU."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from tests.board_run import run_entry
from tests.test_link import TARGETS, gnu_ld_image, reloc_types
from xtune.boards.board import get_board
from xtune.codegen.compile import ObjectCode, compile_object
from xtune.codegen.link import check_object, link_flat
from xtune.codegen.lower import lower
from xtune.codegen.rodata import (
    WEIGHTS_ALIGN,
    WEIGHTS_SECTION,
    WeightsLayout,
    pack_weights,
    patch_weights,
    weights_base,
    weights_global,
)
from xtune.errors import InputError, LinkError
from xtune.schedule.loopnest import Binary, BinaryOp, Buffer, BufferKind, Load, NestBuilder
from xtune.target import Target, get_target

N = 100_003  # floats per array: not a multiple of any vector width or of the alignment
BASE = 0x10000
RELOCS = {  # what addressing the section brings (xtune/codegen/rodata.py's docstring)
    "x86_64": {"R_X86_64_PC32"},
    "aarch64": {"R_AARCH64_ADR_PREL_PG_HI21", "R_AARCH64_ADD_ABS_LO12_NC"},
    "riscv64": {"R_RISCV_PCREL_HI20", "R_RISCV_PCREL_LO12_I"},
}


def add_module(target: Target, layout: WeightsLayout) -> str:
    """A lowered vector kernel add(out, a, b) and an entry run(out) that passes it two weights arrays."""
    lanes = target.fp32_lanes
    b = NestBuilder()
    b.split(
        N,
        lanes,
        lambda i, n: b.store(
            "out", i, Binary(BinaryOp.ADD, Load("a", i, lanes, n), Load("b", i, lanes, n)), lanes, n
        ),
    )
    out, ins = Buffer("out", N, BufferKind.OUTPUT), (Buffer(x, N, BufferKind.INPUT) for x in "ab")
    buffers = (out, *ins)
    entry = f"""
{weights_global(layout.nbytes)}
define void @run(ptr noalias %out) #0 {{
  {weights_base("%w")}
  %a = getelementptr inbounds i8, ptr %w, i64 {layout.offset("a")}
  %b = getelementptr inbounds i8, ptr %w, i64 {layout.offset("b")}
  call void @add(ptr %out, ptr %a, ptr %b)
  ret void
}}
"""
    return lower([b.kernel("add", buffers)]) + entry


def build(target_name: str, pad_mb: int = 0) -> tuple[ObjectCode, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
    arrays = [("a", a), ("pad", np.zeros(pad_mb << 18, np.float32)), ("b", b)]
    layout, blob = pack_weights(arrays)
    target = get_target(target_name)
    obj = compile_object(add_module(target, layout), target, ("run", "add"))
    return patch_weights(obj, blob), a, b


def test_pack_weights_aligns_every_array() -> None:
    layout, blob = pack_weights([("x", np.arange(3, dtype=np.float64)), ("y", np.ones((2, 5), np.float32))])
    assert layout.arrays == (("x", 0, 12), ("y", WEIGHTS_ALIGN, 40)) and layout.nbytes == 2 * WEIGHTS_ALIGN
    assert np.frombuffer(blob[:12], "<f4").tolist() == [0, 1, 2] and blob[12:WEIGHTS_ALIGN] == bytes(52)
    with pytest.raises(InputError, match="twice"):
        pack_weights([("x", np.ones(1)), ("x", np.ones(1))])
    with pytest.raises(InputError, match="at least one byte"):
        weights_global(0)


@pytest.mark.parametrize("target", TARGETS)
def test_section_is_read_only_progbits_and_patched(target: str) -> None:
    obj, a, _ = build(target)
    elf = ELFFile(io.BytesIO(obj.data))
    sec = elf.get_section_by_name(WEIGHTS_SECTION)
    assert sec is not None and sec["sh_type"] == "SHT_PROGBITS" and sec["sh_flags"] == 0x2  # SHF_ALLOC only
    assert sec["sh_addralign"] >= WEIGHTS_ALIGN and sec["sh_offset"] % WEIGHTS_ALIGN == 0
    weights = np.frombuffer(sec.data(), "<f4")
    np.testing.assert_array_equal(weights[:N], a)
    assert RELOCS[obj.arch] <= reloc_types(obj)
    check_object(obj, get_target(target))
    with pytest.raises(LinkError, match="has 800"):
        patch_weights(obj, bytes(100))
    bare = compile_object(lower([]), get_target(target), ())
    with pytest.raises(LinkError, match="found 0"):
        patch_weights(bare, bytes(64))


@pytest.mark.parametrize("target", TARGETS)
def test_far_weights_image_matches_gnu_ld(target: str, tmp_path: Path) -> None:
    """24 MB of weights between the two arrays: the second is far beyond ADR's ±1 MiB and RISC-V's 12-bit
    low part, still well inside every psABI range; the image is byte-identical to GNU ld's."""
    obj, _, _ = build(target, pad_mb=24)
    image = link_flat(obj, BASE)
    _, offset, size = next(s for s in image.sections if s[0] == WEIGHTS_SECTION)
    assert size > 24 << 20 and offset % WEIGHTS_ALIGN == 0
    assert image.code == gnu_ld_image(obj, image, tmp_path)


def check_add(board: str) -> None:
    obj, a, b = build(get_board(board).target.name, pad_mb=3)
    out = np.full(N, np.nan, np.float32)
    (got,) = run_entry(board, link_flat(obj), "run", [out])
    np.testing.assert_array_equal(got, a + b)  # folded loads from the zero constant would give 0.0


def test_kernel_reads_patched_weights_on_host() -> None:
    check_add("local")


def test_kernel_reads_patched_weights_under_qemu(qemu_board: str) -> None:
    check_add(qemu_board)
