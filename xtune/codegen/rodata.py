"""Weights as read-only data in the object: named float arrays in, one blob laid out at 64-byte alignment,
the LLVM IR that declares and addresses it, and the compiled object with the blob patched in, out.

Writing 11.7 M floats as an LLVM IR constant (text, then parsing and emitting it) would take far longer than
a whole-network build may. Instead the module declares an all-zero constant of the blob's size in its own
section; LLVM emits it as SHT_PROGBITS holding that many zero bytes in the file (a read-only constant is never
.bss: verified for x86-64, AArch64 and RISC-V by tests/test_rodata.py), and `patch_weights` overwrites those
bytes in the emitted ELF. A 50 MB section compiles in about 0.1 s and patches in 0.02 s
(docs/firmware.md, "Weights").

Because the constant is visibly zero, LLVM would fold every load from it to 0.0. `weights_base` therefore
passes its address through an empty inline asm whose output is tied to its input (`asm "", "=r,0"`): the
optimizer must treat the result as an unknown pointer, while the code generator emits no instruction for it.

Addressing the section costs one PC-relative pair per function: x86-64 `R_X86_64_PC32` (a signed 32-bit
displacement, System V AMD64 psABI §3.5.1 small PIC model: ±2 GiB), AArch64 `ADR_PREL_PG_HI21` +
`ADD_ABS_LO12_NC` (ADRP, ±4 GiB: ELF for the Arm 64-bit Architecture §5.7.3.2) and RISC-V `PCREL_HI20` +
`PCREL_LO12_I` (auipc + addi, ±2 GiB: RISC-V ELF psABI, "Code Models", medany). Weights of tens or hundreds
of MB are far inside every range; `xtune.codegen.link` checks each one and refuses an overflow.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from xtune.codegen.compile import ObjectCode
from xtune.errors import InputError, LinkError

WEIGHTS_SECTION = ".rodata.xtune.weights"  # ".rodata." prefix: LLVM gives it read-only (SHF_ALLOC) flags
WEIGHTS_SYMBOL = "xtune.weights"
WEIGHTS_ALIGN = 64  # the section and every array in it: a cache line, enough for any vector load


@dataclass(frozen=True, kw_only=True)
class WeightsLayout:
    """Where each named array sits in the blob (byte offsets, multiples of WEIGHTS_ALIGN)."""

    arrays: tuple[tuple[str, int, int], ...]  # name, byte offset, byte size
    nbytes: int  # the blob's size: the last array's end rounded up to WEIGHTS_ALIGN

    def offset(self, name: str) -> int:
        for array, offset, _ in self.arrays:
            if array == name:
                return offset
        raise KeyError(name)


def _aligned(n: int) -> int:
    return -(-n // WEIGHTS_ALIGN) * WEIGHTS_ALIGN


def pack_weights(arrays: Sequence[tuple[str, np.ndarray]]) -> tuple[WeightsLayout, bytes]:
    """One little-endian blob holding every array (C order) at an aligned offset, and its layout: float
    arrays as float32, the integer arrays of int8 kernels (int8 weights, int32 bias and qparams) in
    their own type."""
    rows: list[tuple[str, int, int]] = []
    arrays = [(name, _stored(array)) for name, array in arrays]
    end = 0
    names: set[str] = set()
    for name, array in arrays:
        if name in names:
            raise InputError(f"weights: array '{name}' appears twice")
        names.add(name)
        offset = _aligned(end)
        rows.append((name, offset, array.nbytes))
        end = offset + array.nbytes
    layout = WeightsLayout(arrays=tuple(rows), nbytes=_aligned(end))
    blob = bytearray(layout.nbytes)
    for (_, array), (_, offset, size) in zip(arrays, rows, strict=True):
        blob[offset : offset + size] = array.tobytes()
    return layout, bytes(blob)


def _stored(array: np.ndarray) -> np.ndarray:
    """The array as the object stores it: little-endian, integers in their type, anything else float32."""
    kind = array.dtype.newbyteorder("<") if np.issubdtype(array.dtype, np.integer) else np.dtype("<f4")
    return np.ascontiguousarray(array, dtype=kind)


def weights_global(nbytes: int) -> str:
    """The module-level definition of the weights: an internal all-zero constant in WEIGHTS_SECTION."""
    if nbytes <= 0:
        raise InputError(f"weights: the section needs at least one byte, got {nbytes}")
    return (
        f'@"{WEIGHTS_SYMBOL}" = internal constant [{nbytes} x i8] zeroinitializer, '
        f'section "{WEIGHTS_SECTION}", align {WEIGHTS_ALIGN}'
    )


def weights_base(result: str) -> str:
    """An instruction defining `result` (e.g. "%w") as the weights' address, opaque to the optimizer."""
    return f'{result} = call ptr asm "", "=r,0"(ptr @"{WEIGHTS_SYMBOL}")'


def patch_weights(obj: ObjectCode, blob: bytes) -> ObjectCode:
    """`obj` with WEIGHTS_SECTION's bytes replaced by `blob`; LinkError if the section is not the one
    `weights_global(len(blob))` makes (missing, NOBITS, another size, under-aligned, or relocated)."""
    try:
        elf = ELFFile(io.BytesIO(obj.data))
        sections = list(elf.iter_sections())
    except ELFError as err:
        raise LinkError(f"not an ELF object: {err}") from None
    found = [(i, s) for i, s in enumerate(sections) if s.name == WEIGHTS_SECTION]
    if len(found) != 1:
        raise LinkError(f"{obj.target}: expected one {WEIGHTS_SECTION} section, found {len(found)}")
    index, sec = found[0]
    if sec["sh_type"] != "SHT_PROGBITS" or sec["sh_flags"] & 0x1:  # SHF_WRITE
        raise LinkError(f"{obj.target}: {WEIGHTS_SECTION} is {sec['sh_type']}, not read-only PROGBITS")
    if sec["sh_size"] != len(blob):
        raise LinkError(f"{obj.target}: {WEIGHTS_SECTION} has {sec['sh_size']} bytes, the blob {len(blob)}")
    if sec["sh_addralign"] < WEIGHTS_ALIGN:
        raise LinkError(f"{obj.target}: {WEIGHTS_SECTION} is aligned to {sec['sh_addralign']} bytes")
    if any(s["sh_type"] in ("SHT_RELA", "SHT_REL") and s["sh_info"] == index for s in sections):
        raise LinkError(f"{obj.target}: {WEIGHTS_SECTION} has relocations; it must hold plain data")
    start = int(sec["sh_offset"])
    data = b"".join((obj.data[:start], blob, obj.data[start + len(blob) :]))
    return ObjectCode(obj.target, obj.arch, data, obj.entry_points)
