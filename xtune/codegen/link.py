"""Flat linking: a relocatable ELF `ObjectCode` in, a position-independent `FlatImage` (code, entries) out.

The object is read and checked by `xtune.codegen.elfobject`; each relocation type's patch comes from
`xtune.codegen.relocs`. Here the loaded sections are laid out and every relocation site is patched.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from elftools.elf.relocation import RelocationSection

from xtune.codegen.compile import ObjectCode
from xtune.codegen.elfobject import (
    ObjectInfo,
    _check_header,
    _is_global_function,
    _loaded_sections,
    _open,
    _Symbol,
    _symbol_name,
    _symbols,
    _undefined,
    check_object,
    inspect_object,
)
from xtune.codegen.relocs import (
    _RECIPES,
    _RISCV,
    _RV_PCREL_HI20,
    _RV_PCREL_LO12,
    _RV_RELAX,
    _Overflow,
    _Recipe,
    _refuse,
    _type_name,
)
from xtune.errors import LinkError

# The object checks of a firmware build stay importable from here, where their callers have always found them.
__all__ = ["PAGE", "FlatImage", "ObjectInfo", "check_object", "inspect_object", "link_flat"]

PAGE = 4096  # the image base must be page aligned: AArch64 ADRP computes page differences


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


def _sites(
    machine: str, sections: list[Any], symbols: list[_Symbol], placed: dict[int, int], base: int
) -> Iterator[_Site]:
    recipes = _RECIPES[machine]
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


def link_flat(obj: ObjectCode, base: int = 0) -> FlatImage:
    """Lay out `obj` as one flat image for a loader at `base` (4 KiB aligned) and apply its relocations."""
    if base % PAGE:
        raise LinkError(f"image base {base:#x} is not 4 KiB aligned (AArch64 ADRP is page-relative)")
    elf = _open(obj.data)
    _check_header(elf, obj.arch)
    sections = list(elf.iter_sections())
    placed, table, image = _layout(sections)
    symbols = _symbols(elf, sections)
    _apply(image, list(_sites(str(elf["e_machine"]), sections, symbols, placed, base)))
    undefined = _undefined(symbols)
    if undefined:  # unreferenced, but a firmware link would still have to resolve them
        raise LinkError(f"undefined symbols: {', '.join(undefined)}")
    entries = []
    for name in obj.entry_points:
        found = [s for s in symbols if s.name == name and _is_global_function(s) and s.shndx in placed]
        if not found:
            raise LinkError(f"entry point '{name}' is not a global function defined in the object")
        entries.append((name, placed[found[0].shndx] + found[0].value))
    return FlatImage(obj.arch, bytes(image), tuple(entries), tuple(table))
