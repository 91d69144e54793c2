"""Firmware artifacts: a target, workloads and tuning logs in; one checked relocatable object, its C header
and a build table out (`build`), written as .o, .h and optionally a .a archive (`Artifact.write`)."""

from __future__ import annotations

import dataclasses
import os
import re
import struct
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xtune.boards.cost import CostUnit, gflops
from xtune.codegen.compile import compile_object
from xtune.codegen.link import check_object
from xtune.codegen.lower import lower
from xtune.errors import CompileError, InputError
from xtune.files import check_paths, write_all_atomic
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import MAX_STACK_BYTES, ScheduleTemplate
from xtune.ops.workload import TensorSpec, Workload
from xtune.schedule.loopnest import Kernel
from xtune.schedule.space import Config, KnobValue
from xtune.target import Target, get_target
from xtune.tuning.database import Record, config_of, log_target, read_logs
from xtune.tuning.ranking import build_choice
from xtune.version import __version__

PathLike = str | os.PathLike[str]

# The C calling convention each architecture's entry points follow: LLVM emits the platform ABI of
# the triple (and abiname lp64d on RISC-V), and every kernel is a leaf function taking only pointers.
ABIS = {
    "x86_64": "System V AMD64 psABI (x86-64 SysV calling convention)",
    "aarch64": "AAPCS64 (Procedure Call Standard for the Arm 64-bit Architecture)",
    "riscv64": "RISC-V ELF psABI, LP64D (hard-float double calling convention)",
}
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class KernelEntry:
    """One row of the build table: which config an entry point was compiled from, and what it costs."""

    symbol: str  # the C entry point, e.g. xt_matmul_m8_n16_k4
    workload: str  # Workload.key
    config_index: int
    knobs: tuple[tuple[str, KnobValue], ...]
    source: str  # "log" (best OK record of the logs) or "default" (the template's heuristic)
    reason: str  # why the default was used; "" when source == "log"
    code_bytes: int  # st_size of the function symbol in the object
    stack_bytes: int  # packed panels the kernel keeps on the caller's stack (its frame adds a little)
    gflops: float | None = None  # best measured in the log (wall-time boards only)
    pack: PackEntry | None = None  # prepacked=1: the function that lays the weights out for it

    def as_dict(self) -> dict[str, object]:
        return {
            "symbol": self.symbol,
            "workload": self.workload,
            "config": self.config_index,
            "knobs": dict(self.knobs),
            "source": self.source,
            "reason": self.reason,
            "code_bytes": self.code_bytes,
            "stack_bytes": self.stack_bytes,
            "gflops": self.gflops,
            **({"pack": self.pack.as_dict()} if self.pack else {}),
        }

    @property
    def symbols(self) -> tuple[str, ...]:
        """The entry points of this kernel: itself, then its pack function if it has one."""
        return (self.symbol, self.pack.symbol) if self.pack else (self.symbol,)


@dataclass(frozen=True)
class PackEntry:
    """The pack function of a prepacked=1 kernel: `symbol(const float *tensor, float *packed)` writes the
    `packed_floats` floats the kernel reads in place of `tensor` (its weights, in the workload's layout)."""

    symbol: str
    tensor: str
    packed_floats: int
    code_bytes: int
    stack_bytes: int  # scratch on the caller's stack (NCHW Winograd stages weights there), plus the frame

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Artifact:
    """What a firmware build takes: the object (bytes), the header (text) and the table of kernels."""

    target: Target
    object: bytes
    header: str
    kernels: tuple[KernelEntry, ...]
    warnings: tuple[str, ...] = ()

    def archive(self, member: str = "kernels.o") -> bytes:
        """A static library holding the object, with the symbol index GNU ld needs (`ar rcs`)."""
        return ar_archive(member, self.object, [s for k in self.kernels for s in k.symbols])

    def write(
        self, object_path: PathLike, header_path: PathLike, archive_path: PathLike | None = None
    ) -> None:
        """Write the files, each atomically, after checking every path (`check_outputs`) first."""
        check_outputs(object_path, header_path, archive_path)
        files: list[tuple[PathLike, bytes | str, str]] = [
            (object_path, self.object, "object"),
            (header_path, self.header, "header"),
        ]
        if archive_path is not None:
            name = Path(object_path).name
            # The SysV/GNU member name ends with '/' in a 16-byte field: longer names would need a
            # "//" long-name table, which one fixed member never needs.
            files.append((archive_path, self.archive(name if len(name) <= 15 else "kernels.o"), "archive"))
        write_all_atomic(files)  # all three written before any replaces its old file


def check_outputs(
    object_path: PathLike,
    header_path: PathLike,
    archive_path: PathLike | None = None,
    inputs: Sequence[tuple[PathLike | None, str]] = (),
) -> None:
    """InputError unless each output can be written, no two name the same file, and none is one of the
    `inputs` (the logs, the model) a build reads (call it before a build: `xtune.files.check_paths`)."""
    outputs = [(object_path, "object"), (header_path, "header"), (archive_path, "archive")]
    check_paths(outputs, inputs)


@dataclass(frozen=True)
class Choice:
    """Which config a workload is built with, where it came from, and why when it is the default."""

    config: Config
    source: str
    reason: str
    gflops: float | None


def build(
    target: str | Target,
    workloads: Sequence[str | Workload],
    logs: Sequence[PathLike] = (),
    prefix: str = "xt",
) -> Artifact:
    """Compile each workload's best logged config for `target` (else its default) into one checked object.

    Entry points are `{prefix}_{workload.symbol}`; duplicate workloads are built once. Raises InputError
    for an unknown target or workload, a missing log or a bad prefix; LinkError if the object is unfit."""
    tgt = target if isinstance(target, Target) else get_target(target)
    valid_prefix(prefix)
    wls = _unique([w if isinstance(w, Workload) else parse_workload(w) for w in workloads])
    if not wls:
        raise InputError("no workloads to build")
    for w in wls:
        if w.op in ("qmatmul", "qconv2d", "qdepthwise"):  # zero-point terms folded into the bias
            raise InputError(
                f"{w.key}: a {w.op} kernel reads its bias with the zero point's terms folded in (and "
                "qmatmul's and qconv2d's weights packed per config); it is built into a network, not alone"
            )
    records, notes = read_noted(logs)
    templates = [template_for(w, tgt) for w in wls]
    choices = [choose(w, tgt, t, records) for w, t in zip(wls, templates, strict=True)]
    names = tuple(f"{prefix}_{w.symbol}" for w in wls)
    kernels = [
        kernel_for(w, t, c, name) for w, t, c, name in zip(wls, templates, choices, names, strict=True)
    ]
    # A prepacked=1 kernel reads its weights in its config's layout: its pack function lays them out, from
    # the same nest code as the kernel's own reads (the template's `pack_kernel`).
    packs = {
        name: t.pack_kernel(c.config, f"{name}_pack")
        for w, t, c, name in zip(wls, templates, choices, names, strict=True)
        if "prepacked" in w.operator.keys and w["prepacked"]
    }
    entry_points = tuple(n for name in names for n in (name, *([f"{name}_pack"] if name in packs else [])))
    # One LLVM module, so one object; lower() makes only the kernels external.
    obj = compile_object(
        lower([*kernels, *packs.values()], module_name=f"{prefix}_kernels"), tgt, entry_points
    )
    sizes = dict(check_object(obj, tgt).functions)
    entries = tuple(
        KernelEntry(
            name,
            w.key,
            c.config.index,
            c.config.values,
            c.source,
            c.reason,
            sizes[name],
            k.stack_bytes,
            c.gflops,
            pack_entry(packs.get(name), sizes),
        )
        for name, w, c, k in zip(names, wls, choices, kernels, strict=True)
    )
    notes += fallback_notes([(e.workload, e.source, e.reason) for e in entries])
    return Artifact(tgt, obj.data, render_header(tgt, wls, entries, prefix), entries, tuple(notes))


def pack_entry(pack: Kernel | None, sizes: dict[str, int]) -> PackEntry | None:
    """The build table's row of a pack function (params: the plain tensor, then the packed output)."""
    if pack is None:
        return None
    plain, packed = pack.params
    return PackEntry(pack.name, plain.name, packed.size, sizes[pack.name], pack.stack_bytes)


def valid_prefix(prefix: str) -> None:
    """InputError unless `prefix` can start a C identifier's name."""
    if not _C_IDENTIFIER.match(prefix):
        raise InputError(f"prefix '{prefix}' is not a C identifier")


def kernel_for(wl: Workload, template: ScheduleTemplate, choice: Choice, name: str) -> Kernel:
    """The kernel of `choice`, named `name`, checked by `check_kernel`."""
    return check_kernel(wl, choice, template.kernel(choice.config, name))


def check_kernel(wl: Workload, choice: Choice, kernel: Kernel) -> Kernel:
    """`kernel`, unless it does not take the workload's tensors in order (CompileError) or its packed
    panels need more stack than MAX_STACK_BYTES (InputError)."""
    _check_signature(wl, kernel)
    if kernel.stack_bytes > MAX_STACK_BYTES:
        raise InputError(
            f"{wl.key}: config {choice.config.index} ({choice.source}) needs {kernel.stack_bytes} bytes "
            f"of stack, more than the {MAX_STACK_BYTES} a built kernel may use (docs/firmware.md, Stack)"
        )
    return kernel


def fallback_notes(built: Sequence[tuple[str, str, str]]) -> list[str]:
    """The one warning naming every (workload, source, reason) built from its template's default."""
    fallbacks = [f"{workload} ({reason})" for workload, source, reason in built if source == "default"]
    if not fallbacks:
        return []
    return [f"default config used for {len(fallbacks)} workload(s): " + "; ".join(fallbacks)]


def _check_signature(wl: Workload, kernel: Kernel) -> None:
    """The header declares the workload's tensors in order; the code must take exactly those pointers."""
    declared = [t.name for t in wl.tensors()]
    taken = [p.name for p in kernel.params]
    if declared != taken:
        raise CompileError(
            f"{kernel.name}: the kernel takes ({', '.join(taken)}) but the workload's tensors "
            f"are ({', '.join(declared)})"
        )


def _unique(workloads: list[Workload]) -> list[Workload]:
    seen: dict[str, Workload] = {}
    for w in workloads:
        seen.setdefault(w.key, w)
    return list(seen.values())


def read_noted(logs: Sequence[PathLike]) -> tuple[list[Record] | None, list[str]]:
    """The records of every log (None if no log was given) and the reader's warnings, as text."""
    if not logs:
        return None, []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_logs(logs)
    return records, [str(w.message) for w in caught]


def choose(wl: Workload, target: Target, template: ScheduleTemplate, records: list[Record] | None) -> Choice:
    """The best OK record of the whole history on this target, else the default config and why."""
    default = template.default_config()
    if records is None:
        return Choice(default, "default", "no log given", None)
    logged_as, key = log_target(wl, target), wl.key  # the key once: a log holds thousands of records
    mine = [r for r in records if r.workload == key and r.target == logged_as]
    if not mine:
        others = sorted({r.target for r in records if r.workload == key})
        elsewhere = f"; logged only for {', '.join(others)}" if others else ""
        return Choice(default, "default", f"never tuned on {logged_as}{elsewhere}", None)
    record = build_choice(mine, key, logged_as)  # what `xtune best` shows, by construction
    config = config_of(template, record) if record else None  # read_logs left out stale records
    if record and config:
        return Choice(config, "log", "", gflops(wl.flops(), record.cost, record.result.cost_unit))
    checked = [r.result.cost_unit for r in mine if r.result.ok]
    if checked and all(unit is CostUnit.NONE for unit in checked):
        why = f"only correctness-only boards measured it on {target.name} (no figure to rank by)"
        return Choice(default, "default", why, None)
    failures = Counter(r.result.status.value for r in mine)
    shown = ", ".join(f"{n} {status}" for status, n in sorted(failures.items()))
    return Choice(default, "default", f"only failed records on {target.name} ({shown})", None)


# ---- the header ---------------------------------------------------------------------------------------


def render_header(
    target: Target, workloads: Sequence[Workload], entries: Sequence[KernelEntry], prefix: str
) -> str:
    """A C99/C++ header: guard, extern "C", and per kernel its layouts, config, stack and prototype."""
    guard = f"{prefix.upper()}_KERNELS_H"
    integers = any(t.dtype != "float32" for wl in workloads for t in wl.tensors())
    lines = header_open(target, guard, includes=("stdint.h",) if integers else ())
    for wl, entry in zip(workloads, entries, strict=True):
        lines += _kernel_block(wl, entry)
    return "\n".join(lines + header_close(guard))


def header_open(target: Target, guard: str, includes: Sequence[str] = ()) -> list[str]:
    """The lines every generated header starts with: what made it, the ABI and the object's promises,
    the include guard, `includes` and the opening of extern "C"."""
    return [
        f"/* Generated by xtune {__version__} for target {target.name} "
        f"({target.triple}, cpu {target.cpu}). Do not edit.",
        f" * ABI: {ABIS.get(target.arch, target.arch)}.",
        " * The object is position-independent, has no undefined symbols and needs no GOT; it uses no",
        " * libc, no heap and no writable data: every buffer is the caller's, scratch lives on the stack.",
        f" * Code uses the ISA features '{target.features}': run it only on such a CPU. */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        *(f"#include <{name}>" for name in includes),
        *([""] if includes else []),
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
    ]


def header_close(guard: str) -> list[str]:
    return ["#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard} */", ""]


def _kernel_block(wl: Workload, entry: KernelEntry) -> list[str]:
    tensors = wl.tensors()
    summary = (type(wl.operator).__doc__ or wl.op).strip().splitlines()[0]
    knobs = " ".join(f"{k}={v}" for k, v in entry.knobs)
    where = "best OK record in the log" if entry.source == "log" else f"template default: {entry.reason}"
    speed = f", {entry.gflops:.1f} GFLOP/s measured" if entry.gflops is not None else ""
    pack, packed_floats = entry.pack, f"{entry.symbol.upper()}_PACKED_FLOATS"
    lines = [f"/* {entry.symbol}: {wl.key}", f" *   {summary}"]
    for t in tensors:
        dims = "".join(f"[{d}]" for d in t.shape)
        role = "output, overwritten" if t.is_output else "input, read only"
        if pack and t.name == pack.tensor:
            lines.append(f" *   {t.name}: float[{packed_floats}], as {pack.symbol} packs it, {role}")
        else:
            lines.append(f" *   {t.name}: {C_TYPES[t.dtype]}{dims}, row-major, {role}")
    names = ", ".join(t.name for t in tensors)
    lines += [
        f" *   config {entry.config_index} ({where}{speed}):",
        f" *     {knobs}",
        f" *   stack: {entry.stack_bytes} bytes of packed scratch buffers, plus the frame",
        " *   (saved registers, spills, 64-byte realignment: allow 1 KiB more).",
        f" *   {names} must not overlap (the parameters are noalias); any 4-byte alignment is fine.",
        " */",
        f"#define {entry.symbol.upper()}_STACK_BYTES {entry.stack_bytes}u",
        *([f"#define {packed_floats} {pack.packed_floats}u"] if pack else []),
        f"void {entry.symbol}({_params(tensors)});",
        "",
    ]
    if pack:
        (plain,) = [t for t in tensors if t.name == pack.tensor]
        dims = "".join(f"[{d}]" for d in plain.shape)
        lines += [
            f"/* {pack.symbol}: {plain.name} as {entry.symbol} reads it (the layout of config "
            f"{entry.config_index}); call it once,",
            " *   e.g. at start-up, and pass `packed` to every call. Packed bytes fit this build only.",
            f" *   {plain.name}: float{dims} ({plain.axes}), row-major (the workload's layout), input",
            f" *   packed: float[{packed_floats}], output, overwritten (padding zero)",
            f" *   stack: {pack.stack_bytes} bytes of scratch buffers, plus the frame (allow 1 KiB more).",
            f" *   {plain.name} and packed must not overlap; any 4-byte alignment is fine.",
            " */",
            f"void {pack.symbol}(const float *{plain.name}, float *packed);",
            "",
        ]
    return lines


# The C type of each tensor element type (C99 <stdint.h> for the integers).
C_TYPES = {"float32": "float", "int8": "int8_t", "uint8": "uint8_t", "int32": "int32_t"}


def _params(tensors: Sequence[TensorSpec]) -> str:
    return ", ".join(
        f"{C_TYPES[t.dtype]} *{t.name}" if t.is_output else f"const {C_TYPES[t.dtype]} *{t.name}"
        for t in tensors
    )


# ---- the archive --------------------------------------------------------------------------------------


def ar_archive(member: str, data: bytes, symbols: Sequence[str]) -> bytes:
    """A GNU/SysV `ar` archive of one member with its "/" symbol index, as `ar rcsD` writes it.

    Format: "!<arch>\\n", then per member a 60-byte ASCII header and the data padded to an even length;
    the "/" member lists big-endian u32 count, u32 member offsets and NUL-terminated names (ar(5))."""
    if len(member) > 15 or "/" in member:
        raise InputError(f"archive member name '{member}' must be at most 15 characters, without '/'")
    names = b"".join(s.encode() + b"\0" for s in symbols)
    index_size = 4 + 4 * len(symbols) + len(names)
    member_offset = 8 + 60 + index_size + index_size % 2
    index = struct.pack(f">I{len(symbols)}I", len(symbols), *([member_offset] * len(symbols))) + names
    return b"!<arch>\n" + _ar_member("/", index) + _ar_member(member + "/", data)


def _ar_member(name: str, data: bytes) -> bytes:
    # Deterministic like `ar D`: mtime, uid and gid 0, mode 644, so builds are reproducible.
    header = f"{name:<16}{0:<12}{0:<6}{0:<6}{0o644:<8o}{len(data):<10}`\n".encode()
    assert len(header) == 60
    return header + data + (b"\n" if len(data) % 2 else b"")
