"""Flat linking: a relocatable ELF `ObjectCode` in, a position-independent `FlatImage` (code, entries) out."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.enums import ENUM_RELOC_TYPE_AARCH64, ENUM_RELOC_TYPE_x64
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from xtune.codegen.compile import ObjectCode
from xtune.errors import LinkError
from xtune.target import Target

PAGE = 4096  # the image base must be page aligned: AArch64 ADRP computes page differences
_MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "riscv64": "EM_RISCV"}
_M32, _M64 = (1 << 32) - 1, (1 << 64) - 1
# Allocated but never needed to run a kernel: unwind tables (we compile nounwind), notes, and
# bookkeeping. Their relocations are skipped with them.
_SKIPPED_PREFIXES = (".eh_frame", ".note", ".comment", ".llvm_addrsig", ".gcc_except_table", ".group")


@dataclass(frozen=True)
class FlatImage:
    """One flat position-independent image, valid when loaded at any 4 KiB-aligned address."""

    arch: str
    code: bytes
    entries: tuple[tuple[str, int], ...]  # entry symbol, offset in `code`
    sections: tuple[tuple[str, int, int], ...]  # input section name, offset, size (for oracle tests)

    def entry(self, name: str) -> int:
        for entry_name, offset in self.entries:
            if entry_name == name:
                return offset
        known = ", ".join(n for n, _ in self.entries)
        raise LinkError(f"'{name}' is not an entry point of this image (have: {known})")


@dataclass(frozen=True)
class ObjectInfo:
    """What a firmware build needs to know about a relocatable object before linking it."""

    elf_class: int
    little_endian: bool
    machine: str  # pyelftools' e_machine name, e.g. EM_AARCH64
    functions: tuple[tuple[str, int], ...]  # global function symbols and their sizes in bytes
    undefined: tuple[str, ...]


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


def _open(data: bytes) -> ELFFile:
    try:
        return ELFFile(io.BytesIO(data))
    except ELFError as err:
        raise LinkError(f"not an ELF object: {err}") from None


def _check_header(elf: ELFFile, arch: str) -> None:
    machine = str(elf["e_machine"])
    if elf.elfclass != 64 or not elf.little_endian:
        raise LinkError(f"expected a 64-bit little-endian object, got ELF{elf.elfclass}")
    if _MACHINES.get(arch) != machine:
        raise LinkError(f"object is {machine}, but the target architecture is {arch}")
    if elf["e_type"] != "ET_REL":
        raise LinkError(f"expected a relocatable object, got {elf['e_type']}")


def _loaded_sections(sections: list[Any]) -> Iterator[tuple[int, Any]]:
    """Allocated sections we must load, after refusing the ones a flat image cannot hold."""
    for index, sec in enumerate(sections):
        flags = sec["sh_flags"]
        if not flags & 0x2 or sec.name.startswith(_SKIPPED_PREFIXES):  # SHF_ALLOC
            continue
        if sec["sh_size"] == 0:
            continue
        if flags & 0x1:  # SHF_WRITE: the agent maps code read+execute, and firmware has no loader for it
            raise LinkError(
                f"writable section {sec.name} ({sec['sh_size']} bytes): kernels must not have "
                "mutable globals; make constants `constant` and internal"
            )
        if sec["sh_type"] == "SHT_NOBITS":
            raise LinkError(f"zero-initialised section {sec.name} ({sec['sh_size']} bytes) is writable data")
        if flags & 0x400:  # SHF_TLS
            raise LinkError(f"thread-local section {sec.name} is not supported")
        yield index, sec


def _layout(sections: list[Any]) -> tuple[dict[int, int], list[tuple[str, int, int]], bytearray]:
    """Executable sections first, then read-only data, each at its own alignment."""
    loaded = list(_loaded_sections(sections))
    ordered = sorted(loaded, key=lambda s: not s[1]["sh_flags"] & 0x4)  # SHF_EXECINSTR; stable sort
    placed: dict[int, int] = {}
    table: list[tuple[str, int, int]] = []
    offset = 0
    for index, sec in ordered:
        align = max(int(sec["sh_addralign"]), 1)
        if align > PAGE:
            raise LinkError(f"section {sec.name} wants {align}-byte alignment, more than the 4 KiB base")
        offset = -(-offset // align) * align
        placed[index] = offset
        table.append((sec.name, offset, int(sec["sh_size"])))
        offset += int(sec["sh_size"])
    image = bytearray(offset)
    for index, sec in ordered:
        image[placed[index] : placed[index] + sec["sh_size"]] = sec.data()
    return placed, table, image


@dataclass(frozen=True)
class _Site:
    recipe: _Recipe
    at: int  # image offset patched
    sa: int  # S + A, absolute at the chosen base
    p: int
    where: str  # "R_... against 'sym' at .text+0x10", for messages


class _Symbol(NamedTuple):
    name: str
    bind: int  # STB_*: 0 local, 1 global, 2 weak
    kind: int  # STT_*: 2 function, 3 section
    shndx: int  # 0 undefined, >= 0xff00 reserved (SHN_ABS, SHN_COMMON)
    value: int  # section-relative in a relocatable object
    size: int


def _symbols(elf: ELFFile, sections: list[Any]) -> list[_Symbol]:
    """The symbol table, decoded with `struct`: pyelftools' per-symbol parsing dominated link time."""
    symtab = next((sec for sec in sections if isinstance(sec, SymbolTableSection)), None)
    if symtab is None:
        return []
    strtab = sections[symtab["sh_link"]].data()
    end = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:  # Elf64_Sym: name, info, other, shndx, value, size
        rows = [(n, i, x, v, z) for n, i, _, x, v, z in struct.iter_unpack(end + "IBBHQQ", symtab.data())]
    else:  # Elf32_Sym: name, value, size, info, other, shndx
        rows = [(n, i, x, v, z) for n, v, z, i, _, x in struct.iter_unpack(end + "IIIBBH", symtab.data())]
    return [
        _Symbol(strtab[n : strtab.index(b"\0", n)].decode(), i >> 4, i & 0xF, x, v, z)
        for n, i, x, v, z in rows
    ]


def _symbol_name(sym: _Symbol, sections: list[Any]) -> str:
    if sym.name or sym.shndx == 0 or sym.shndx >= 0xFF00:
        return sym.name
    return str(sections[sym.shndx].name)  # STT_SECTION symbols are named by their section


def _symbol_address(sym: _Symbol, sections: list[Any], placed: dict[int, int], base: int) -> int:
    if sym.shndx == 0:  # SHN_UNDEF
        raise LinkError(
            f"undefined symbol '{sym.name}': the kernel calls a function not in the object "
            '(a libcall such as memset/memcpy/expf? add "no-builtins" or expand it in IR)'
        )
    if sym.shndx >= 0xFF00:  # SHN_ABS would make the image depend on its base; SHN_COMMON is writable
        raise LinkError(f"symbol '{sym.name}' has reserved section index {sym.shndx:#x}, not a section")
    if sym.shndx not in placed:
        raise LinkError(
            f"symbol '{_symbol_name(sym, sections)}' is in section {sections[sym.shndx].name}, "
            "which is not loaded"
        )
    return base + placed[sym.shndx] + sym.value


def _sites(elf: ELFFile, sections: list[Any], placed: dict[int, int], base: int) -> Iterator[_Site]:
    machine = str(elf["e_machine"])
    recipes = _RECIPES[machine]
    symbols = _symbols(elf, sections)
    for rel in sections:
        if not isinstance(rel, RelocationSection) or rel["sh_info"] not in placed:
            continue  # relocations of skipped sections (.rela.eh_frame, debug info)
        target = sections[rel["sh_info"]]
        if not rel.is_RELA():
            raise LinkError(f"{rel.name}: REL relocations are not produced by LLVM for {machine}")
        for offset, info, addend in struct.iter_unpack("<QQq", rel.data()):  # Elf64_Rela
            rtype, sym = info & 0xFFFFFFFF, symbols[info >> 32]
            if machine == "EM_RISCV" and rtype == _RV_RELAX:
                continue  # a hint that the linker may relax the previous relocation; never relaxing is valid
            recipe = recipes.get(rtype)
            where = (
                f"{_type_name(machine, rtype)} against '{_symbol_name(sym, sections)}' "
                f"at {target.name}+{offset:#x}"
            )
            if recipe is None:
                _refuse(machine, rtype, where)
            if offset + recipe.width > target["sh_size"]:
                raise LinkError(f"{where}: outside its section")
            at = placed[rel["sh_info"]] + offset
            yield _Site(recipe, at, _symbol_address(sym, sections, placed, base) + addend, base + at, where)


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


def _apply(image: bytearray, sites: list[_Site]) -> None:
    # RISC-V psABI: a PCREL_LO12's symbol is the label of the auipc holding the PCREL_HI20, so look up
    # that relocation's S+A and P by the auipc's address. Gather them all first: order is not promised.
    hi20 = {s.p: s for s in sites if s.recipe is _RISCV[_RV_PCREL_HI20]}
    for site in sites:
        sa, p = site.sa, site.p
        if site.recipe in (_RISCV[_RV_PCREL_LO12[0]], _RISCV[_RV_PCREL_LO12[1]]):
            hi = hi20.get(site.sa)
            if hi is None:
                raise LinkError(f"{site.where}: no R_RISCV_PCREL_HI20 at the auipc it names")
            sa, p = hi.sa, hi.p
        width = site.recipe.width
        old = int.from_bytes(image[site.at : site.at + width], "little")
        try:
            new = site.recipe.apply(old, sa, p)
        except _Overflow as err:
            raise LinkError(f"{site.where}: {err}") from None
        image[site.at : site.at + width] = new.to_bytes(width, "little")


def _is_global_function(sym: _Symbol) -> bool:
    return sym.kind == 2 and sym.bind in (1, 2) and sym.shndx != 0  # STT_FUNC, STB_GLOBAL/WEAK, defined


def link_flat(obj: ObjectCode, base: int = 0) -> FlatImage:
    """Lay out `obj` as one flat image for a loader at `base` (4 KiB aligned) and apply its relocations."""
    if base % PAGE:
        raise LinkError(f"image base {base:#x} is not 4 KiB aligned (AArch64 ADRP is page-relative)")
    elf = _open(obj.data)
    _check_header(elf, obj.arch)
    sections = list(elf.iter_sections())
    placed, table, image = _layout(sections)
    _apply(image, list(_sites(elf, sections, placed, base)))
    symbols = _symbols(elf, sections)
    undefined = sorted({s.name for s in symbols if s.name and s.shndx == 0})
    if undefined:  # unreferenced, but a firmware link would still have to resolve them
        raise LinkError(f"undefined symbols: {', '.join(undefined)}")
    entries = []
    for name in obj.entry_points:
        found = [s for s in symbols if s.name == name and _is_global_function(s) and s.shndx in placed]
        if not found:
            raise LinkError(f"entry point '{name}' is not a global function defined in the object")
        entries.append((name, placed[found[0].shndx] + found[0].value))
    return FlatImage(obj.arch, bytes(image), tuple(entries), tuple(table))


def _inspect(elf: ELFFile, sections: list[Any]) -> ObjectInfo:
    symbols = _symbols(elf, sections)
    return ObjectInfo(
        elf_class=elf.elfclass,
        little_endian=elf.little_endian,
        machine=str(elf["e_machine"]),
        functions=tuple((s.name, s.size) for s in symbols if _is_global_function(s)),
        undefined=tuple(sorted({s.name for s in symbols if s.name and s.shndx == 0})),
    )


def inspect_object(data: bytes) -> ObjectInfo:
    """Header facts, global functions with sizes and undefined symbols of a relocatable ELF object."""
    elf = _open(data)
    return _inspect(elf, list(elf.iter_sections()))


def check_object(obj: ObjectCode, target: Target) -> ObjectInfo:
    """Refuse an object a firmware build could not link as is: wrong ELF kind, libcalls, writable data."""
    elf = _open(obj.data)
    sections = list(elf.iter_sections())
    info = _inspect(elf, sections)
    if info.elf_class != 64 or not info.little_endian:
        raise LinkError(f"{target.name}: expected a 64-bit little-endian object, got ELF{info.elf_class}")
    if _MACHINES.get(target.arch) != info.machine:
        raise LinkError(f"{target.name}: object is {info.machine}, expected {_MACHINES.get(target.arch)}")
    if info.undefined:
        raise LinkError(f"{target.name}: undefined symbols: {', '.join(info.undefined)}")
    defined = {name for name, _ in info.functions}
    missing = [name for name in obj.entry_points if name not in defined]
    if missing:
        raise LinkError(f"{target.name}: entry points not defined as global functions: {', '.join(missing)}")
    list(_loaded_sections(sections))  # raises on writable, zero-initialised or thread-local data
    return info
