"""Reading and checking a relocatable ELF object: header, loadable sections, symbol table.

`check_object` is what a firmware build asks of an object before linking it; `xtune.codegen.link` reads the
same facts to lay the object out as a flat image.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from xtune.codegen.compile import ObjectCode
from xtune.errors import LinkError
from xtune.target import Target

_MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "riscv64": "EM_RISCV"}
# Allocated but never needed to run a kernel: unwind tables (we compile nounwind), notes, and
# bookkeeping. Their relocations are skipped with them.
_SKIPPED_PREFIXES = (".eh_frame", ".note", ".comment", ".llvm_addrsig", ".gcc_except_table", ".group")


@dataclass(frozen=True)
class ObjectInfo:
    """What a firmware build needs to know about a relocatable object before linking it."""

    elf_class: int
    little_endian: bool
    machine: str  # pyelftools' e_machine name, e.g. EM_AARCH64
    functions: tuple[tuple[str, int], ...]  # global function symbols and their sizes in bytes
    undefined: tuple[str, ...]


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


def _is_global_function(sym: _Symbol) -> bool:
    return sym.kind == 2 and sym.bind in (1, 2) and sym.shndx != 0  # STT_FUNC, STB_GLOBAL/WEAK, defined


def _undefined(symbols: list[_Symbol]) -> tuple[str, ...]:
    """Names the object uses but does not define: a firmware link would have to resolve each one."""
    return tuple(sorted({s.name for s in symbols if s.name and s.shndx == 0}))


def _inspect(elf: ELFFile, sections: list[Any]) -> ObjectInfo:
    symbols = _symbols(elf, sections)
    return ObjectInfo(
        elf_class=elf.elfclass,
        little_endian=elf.little_endian,
        machine=str(elf["e_machine"]),
        functions=tuple((s.name, s.size) for s in symbols if _is_global_function(s)),
        undefined=_undefined(symbols),
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
