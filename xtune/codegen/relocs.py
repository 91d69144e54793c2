"""Relocation recipes of the three psABIs the flat linker serves: how each type patches its field.

`xtune.codegen.link` finds the relocation sites; this module knows, per ELF machine and relocation type,
the field width and the patch `(old bits, S + A, P) -> new bits`, with the psABI's overflow checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from elftools.elf.enums import ENUM_RELOC_TYPE_AARCH64, ENUM_RELOC_TYPE_x64

from xtune.errors import LinkError

_M32, _M64 = (1 << 32) - 1, (1 << 64) - 1


class _Overflow(Exception):
    """A displacement does not fit its field or breaks its alignment; the caller adds context."""


@dataclass(frozen=True)
class _Recipe:
    """How one relocation type patches `width` little-endian bytes: (old, S + A, P) -> new."""

    name: str
    width: int
    apply: Callable[[int, int, int], int]


def _fits(x: int, bits: int, align: int = 1) -> int:
    """`x` if it is a signed `bits`-bit value that is a multiple of `align`, else _Overflow."""
    if not -(1 << (bits - 1)) <= x < (1 << (bits - 1)):
        raise _Overflow(f"displacement {x:#x} does not fit in {bits} signed bits")
    if x % align:
        raise _Overflow(f"displacement {x:#x} is not a multiple of {align}")
    return x


# --- System V AMD64 psABI §4.4 (Relocation Types): PC32/PLT32 are S+A-P in a signed 32-bit field
# ("word32" with overflow check); PLT32 is L+A-P, and L = S because there is no PLT here.
def _x86_pc32(old: int, sa: int, p: int) -> int:
    return _fits(sa - p, 32) & _M32


def _pc64(old: int, sa: int, p: int) -> int:
    return (sa - p) & _M64


_X86_64: dict[int, _Recipe] = {
    2: _Recipe("R_X86_64_PC32", 4, _x86_pc32),
    4: _Recipe("R_X86_64_PLT32", 4, _x86_pc32),
    24: _Recipe("R_X86_64_PC64", 8, _pc64),
}


# --- ELF for the Arm 64-bit Architecture (AArch64), §5.7.3 (Static relocations). Page(x) clears the
# low 12 bits; ADR/ADRP split their 21-bit immediate into immlo (bits 29-30) and immhi (bits 5-23).
def _adr(insn: int, imm21: int) -> int:
    return (insn & ~(0x3 << 29 | 0x7FFFF << 5)) | (imm21 & 0x3) << 29 | ((imm21 >> 2) & 0x7FFFF) << 5


def _a64_adrp(old: int, sa: int, p: int) -> int:
    # §5.7.3.2 R_AARCH64_ADR_PREL_PG_HI21: Page(S+A) - Page(P), checked -2^32 <= X < 2^32.
    return _adr(old, _fits((sa & ~0xFFF) - (p & ~0xFFF), 33) >> 12)


def _a64_adr(old: int, sa: int, p: int) -> int:
    # §5.7.3.2 R_AARCH64_ADR_PREL_LO21: S+A-P, checked -2^20 <= X < 2^20.
    return _adr(old, _fits(sa - p, 21))


def _a64_lo12(shift: int) -> Callable[[int, int, int], int]:
    # §5.7.3.2 ADD_ABS_LO12_NC / LDSTn_ABS_LO12_NC: bits [11:shift] of S+A into imm12 (bits 10-21),
    # scaled by the access size. "No check" in the ABI, but a misaligned low part would silently
    # drop bits, so we refuse it instead of loading from the wrong address.
    def apply(old: int, sa: int, p: int) -> int:
        lo = sa & 0xFFF
        if lo % (1 << shift):
            raise _Overflow(f"address {sa:#x} is not {1 << shift}-byte aligned for a scaled load/store")
        return (old & ~(0xFFF << 10)) | (lo >> shift) << 10

    return apply


def _a64_branch(bits: int, lsb: int) -> Callable[[int, int, int], int]:
    # §5.7.3.3 control-flow relocations: (S+A-P) >> 2 into a `bits`-bit field starting at `lsb`.
    # CALL26/JUMP26: 26 bits at 0 (±128 MiB); CONDBR19: 19 at 5 (±1 MiB); TSTBR14: 14 at 5 (±32 KiB).
    mask = ((1 << bits) - 1) << lsb

    def apply(old: int, sa: int, p: int) -> int:
        x = _fits(sa - p, bits + 2, align=4)
        return (old & ~mask) | ((x >> 2) << lsb & mask)

    return apply


def _a64_prel32(old: int, sa: int, p: int) -> int:
    # §5.7.3.1 R_AARCH64_PREL32: S+A-P, checked -2^31 <= X < 2^32.
    x = sa - p
    if not -(1 << 31) <= x < (1 << 32):
        raise _Overflow(f"displacement {x:#x} does not fit in 32 bits")
    return x & _M32


_AARCH64: dict[int, _Recipe] = {
    260: _Recipe("R_AARCH64_PREL64", 8, _pc64),
    261: _Recipe("R_AARCH64_PREL32", 4, _a64_prel32),
    274: _Recipe("R_AARCH64_ADR_PREL_LO21", 4, _a64_adr),
    275: _Recipe("R_AARCH64_ADR_PREL_PG_HI21", 4, _a64_adrp),
    277: _Recipe("R_AARCH64_ADD_ABS_LO12_NC", 4, _a64_lo12(0)),
    278: _Recipe("R_AARCH64_LDST8_ABS_LO12_NC", 4, _a64_lo12(0)),
    284: _Recipe("R_AARCH64_LDST16_ABS_LO12_NC", 4, _a64_lo12(1)),
    285: _Recipe("R_AARCH64_LDST32_ABS_LO12_NC", 4, _a64_lo12(2)),
    286: _Recipe("R_AARCH64_LDST64_ABS_LO12_NC", 4, _a64_lo12(3)),
    299: _Recipe("R_AARCH64_LDST128_ABS_LO12_NC", 4, _a64_lo12(4)),
    279: _Recipe("R_AARCH64_TSTBR14", 4, _a64_branch(14, 5)),
    280: _Recipe("R_AARCH64_CONDBR19", 4, _a64_branch(19, 5)),
    282: _Recipe("R_AARCH64_JUMP26", 4, _a64_branch(26, 0)),
    283: _Recipe("R_AARCH64_CALL26", 4, _a64_branch(26, 0)),
}


# --- RISC-V ELF psABI, "Relocations" and "Pc-Relative Symbol Addresses". A 32-bit pc-relative
# offset is split hi20/lo12 with the +0x800 rounding because the lo12 immediate is sign-extended.
def _hi_lo(x: int) -> tuple[int, int]:
    hi = (x + 0x800) >> 12
    if not -(1 << 19) <= hi < (1 << 19):
        raise _Overflow(f"pc-relative offset {x:#x} does not fit in 32 bits")
    return hi, x - (hi << 12)


def _u_type(insn: int, hi: int) -> int:
    return (insn & 0xFFF) | (hi & 0xFFFFF) << 12


def _i_type(insn: int, lo: int) -> int:
    return (insn & 0xFFFFF) | (lo & 0xFFF) << 20


def _s_type(insn: int, lo: int) -> int:
    return (insn & 0x01FFF07F) | ((lo >> 5) & 0x7F) << 25 | (lo & 0x1F) << 7


def _rv_hi20(old: int, sa: int, p: int) -> int:
    return _u_type(old, _hi_lo(sa - p)[0])


# PCREL_LO12_I/S: the relocation's own symbol is the auipc label; the linker calls these with the
# S+A and P *of that auipc's PCREL_HI20*, so the low part completes exactly the same offset.
def _rv_lo12_i(old: int, sa: int, p: int) -> int:
    return _i_type(old, _hi_lo(sa - p)[1])


def _rv_lo12_s(old: int, sa: int, p: int) -> int:
    return _s_type(old, _hi_lo(sa - p)[1])


def _rv_call(old: int, sa: int, p: int) -> int:
    # CALL/CALL_PLT cover an auipc+jalr pair: 8 bytes, the auipc in the low word (little endian).
    hi, lo = _hi_lo(sa - p)
    return _u_type(old & _M32, hi) | _i_type(old >> 32, lo) << 32


def _rv_branch(old: int, sa: int, p: int) -> int:
    # B-type: imm[12|10:5] in bits 31:25, imm[4:1|11] in bits 11:7; ±4 KiB.
    x = _fits(sa - p, 13, align=2)
    imm = (x >> 12 & 1) << 31 | (x >> 5 & 0x3F) << 25 | (x >> 1 & 0xF) << 8 | (x >> 11 & 1) << 7
    return (old & 0x01FFF07F) | imm


def _rv_jal(old: int, sa: int, p: int) -> int:
    # J-type: imm[20|10:1|11|19:12] in bits 31:12; ±1 MiB.
    x = _fits(sa - p, 21, align=2)
    imm = (x >> 20 & 1) << 31 | (x >> 1 & 0x3FF) << 21 | (x >> 11 & 1) << 20 | (x >> 12 & 0xFF) << 12
    return (old & 0xFFF) | imm


def _rv_c_branch(old: int, sa: int, p: int) -> int:
    # CB format (c.beqz/c.bnez): offset[8|4:3] in bits 12:10, offset[7:6|2:1|5] in bits 6:2; ±256 B.
    x = _fits(sa - p, 9, align=2)
    imm = (x >> 8 & 1) << 12 | (x >> 3 & 3) << 10 | (x >> 6 & 3) << 5 | (x >> 1 & 3) << 3 | (x >> 5 & 1) << 2
    return (old & ~0x1C7C) | imm


def _rv_c_jump(old: int, sa: int, p: int) -> int:
    # CJ format (c.j): offset[11|4|9:8|10|6|7|3:1|5] in bits 12:2; ±2 KiB.
    x = _fits(sa - p, 12, align=2)
    imm = (
        (x >> 11 & 1) << 12
        | (x >> 4 & 1) << 11
        | (x >> 8 & 3) << 9
        | (x >> 10 & 1) << 8
        | (x >> 6 & 1) << 7
        | (x >> 7 & 1) << 6
        | (x >> 1 & 7) << 3
        | (x >> 5 & 1) << 2
    )
    return (old & ~0x1FFC) | imm


def _rv_pcrel32(old: int, sa: int, p: int) -> int:
    return _fits(sa - p, 32) & _M32


_RV_PCREL_HI20, _RV_PCREL_LO12 = 23, (24, 25)
_RV_RELAX, _RV_ALIGN = 51, 43
_RISCV: dict[int, _Recipe] = {
    16: _Recipe("R_RISCV_BRANCH", 4, _rv_branch),
    17: _Recipe("R_RISCV_JAL", 4, _rv_jal),
    18: _Recipe("R_RISCV_CALL", 8, _rv_call),
    19: _Recipe("R_RISCV_CALL_PLT", 8, _rv_call),
    23: _Recipe("R_RISCV_PCREL_HI20", 4, _rv_hi20),
    24: _Recipe("R_RISCV_PCREL_LO12_I", 4, _rv_lo12_i),
    25: _Recipe("R_RISCV_PCREL_LO12_S", 4, _rv_lo12_s),
    # Label differences (jump tables, DWARF): the pair ADDn/SUMn leaves the link-time difference.
    35: _Recipe("R_RISCV_ADD32", 4, lambda old, sa, p: (old + sa) & _M32),
    36: _Recipe("R_RISCV_ADD64", 8, lambda old, sa, p: (old + sa) & _M64),
    39: _Recipe("R_RISCV_SUB32", 4, lambda old, sa, p: (old - sa) & _M32),
    40: _Recipe("R_RISCV_SUB64", 8, lambda old, sa, p: (old - sa) & _M64),
    44: _Recipe("R_RISCV_RVC_BRANCH", 2, _rv_c_branch),
    45: _Recipe("R_RISCV_RVC_JUMP", 2, _rv_c_jump),
    57: _Recipe("R_RISCV_32_PCREL", 4, _rv_pcrel32),
}
# Names of types we refuse, for messages (pyelftools 0.33 has no RISC-V table).
_RISCV_NAMES = {
    1: "R_RISCV_32",
    2: "R_RISCV_64",
    20: "R_RISCV_GOT_HI20",
    26: "R_RISCV_HI20",
    27: "R_RISCV_LO12_I",
    28: "R_RISCV_LO12_S",
    41: "R_RISCV_GOT32_PCREL",
    43: "R_RISCV_ALIGN",
    51: "R_RISCV_RELAX",
    59: "R_RISCV_PLT32",
}
_RECIPES = {"EM_X86_64": _X86_64, "EM_AARCH64": _AARCH64, "EM_RISCV": _RISCV}


_NAMES = {
    "EM_X86_64": {v: k for k, v in ENUM_RELOC_TYPE_x64.items()},
    "EM_AARCH64": {v: k for k, v in ENUM_RELOC_TYPE_AARCH64.items()},
    "EM_RISCV": _RISCV_NAMES,
}


def _type_name(machine: str, rtype: int) -> str:
    recipe = _RECIPES[machine].get(rtype)
    return recipe.name if recipe else _NAMES[machine].get(rtype, f"relocation type {rtype}")


def _refuse(machine: str, rtype: int, where: str) -> NoReturn:
    name = _type_name(machine, rtype)
    if "GOT" in name:
        raise LinkError(
            f"{where}: GOT relocations need a dynamic linker; compile with reloc='pic', "
            "codemodel='small' and make every global internal or hidden"
        )
    if machine == "EM_RISCV" and rtype == _RV_ALIGN:
        raise LinkError(f"{where}: R_RISCV_ALIGN asks the linker to relax; compile without +relax")
    raise LinkError(
        f"{where}: unsupported relocation (absolute or unknown); the flat image needs "
        "PC-relative code (reloc='pic', codemodel='small')"
    )
