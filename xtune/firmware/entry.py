"""A network's `Program` and kernels in; its entry points as LLVM IR, its C header and `NetArtifact` out.

The object's external symbols are `{prefix}_run`, in a profile build `{prefix}_profile`, and the size
queries; the header declares them; `NetArtifact` is what `build_model` (firmware/build.py) returns."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from xtune.codegen.lower import quoted
from xtune.codegen.rodata import WeightsLayout, weights_base
from xtune.errors import InputError
from xtune.files import PathLike, write_all_atomic
from xtune.firmware.header import c_comment
from xtune.firmware.kernels import C_TYPES, check_outputs, header_close, header_open
from xtune.firmware.program import Call, Program, Space
from xtune.ops.opkit import GeneratedOp
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Kernel
from xtune.target import Target

# Added to the largest kernel's packed panels: the entry's frame and one kernel's (callee-saved registers,
# spills, the 64-byte realignment of the panels; ~0.9 KiB measured for a kernel on x86-64,
# docs/firmware.md "Stack"), with room to spare.
STACK_MARGIN = 4096


@dataclass(frozen=True, kw_only=True)
class NetKernel:
    """One row of the build table: an internal function of the object and what it runs."""

    symbol: str
    what: str  # the workload key, or the generated operator
    calls: int  # how many calls of the entry use it
    source: str  # "log", "default" (a task's config) or "generated" (an operator of ops.py)
    config_index: int | None
    reason: str  # why the default was used; "" otherwise
    stack_bytes: int

    def as_dict(self) -> dict[str, object]:
        return {
            "symbol": self.symbol,
            "what": self.what,
            "calls": self.calls,
            "source": self.source,
            "config": self.config_index,
            "reason": self.reason,
            "stack_bytes": self.stack_bytes,
        }


@dataclass(frozen=True, kw_only=True)
class NetArtifact:
    """What `build_model` returns: the object (bytes), its header (text), and what they hold."""

    target: Target
    model: str
    prefix: str
    object: bytes
    header: str
    kernels: tuple[NetKernel, ...]
    program: Program
    weights_bytes: int
    stack_bytes: int
    build_id: int
    warnings: tuple[str, ...] = ()
    profiled: bool = False  # the object also has `{prefix}_profile` (build_model's `profile`)

    @property
    def entry(self) -> str:
        return entry_name(self.prefix)

    @property
    def profile_entry(self) -> str:
        return entry_name(self.prefix, profile=True)

    @property
    def entry_points(self) -> tuple[str, ...]:
        return entry_points(self.prefix, self.profiled)

    @property
    def workspace_bytes(self) -> int:
        return self.program.memory.workspace_bytes

    def write(self, object_path: PathLike, header_path: PathLike) -> None:
        """Both files, each atomically, after checking both paths first."""
        check_outputs(object_path, header_path)
        write_all_atomic([(object_path, self.object, "object"), (header_path, self.header, "header")])

    def as_dict(self) -> dict[str, Any]:
        plan = self.program.memory
        return {
            "target": self.target.name,
            "model": self.model,
            "entry": self.entry,
            "layout": self.program.layout.value,
            "input_shape": list(self.program.input_shape),
            "output_shape": list(self.program.output_shape),
            "input_type": self.program.input_type,
            "output_type": self.program.output_type,
            "input_quantization": self.program.input_quant,  # (scale, zero point) or None
            "output_quantization": self.program.output_quant,
            "calls": len(self.program.calls),
            "kernels": [k.as_dict() for k in self.kernels],
            "workspace_bytes": plan.workspace_bytes,
            "workspace_lower_bound": plan.lower_bound,
            "intermediate_bytes": plan.intermediate_bytes,
            "weights_bytes": self.weights_bytes,
            "stack_bytes": self.stack_bytes,
            "build_id": f"{self.build_id:#010x}",
            "warnings": list(self.warnings),
        }


# The small queries beside the entry: name -> (C return type, LLVM type, what the value is).
_QUERIES = {
    "workspace_bytes": ("uint64_t", "i64", "bytes of workspace the entry needs"),
    "input_size": ("uint64_t", "i64", "elements of the input"),
    "output_size": ("uint64_t", "i64", "elements of the output"),
    "build_id": ("uint32_t", "i32", "the build's id: equal to the header's"),
}


def entry_name(prefix: str, profile: bool = False) -> str:
    """`{prefix}_run`, the network's entry, or `{prefix}_profile`, a profile build's second entry."""
    return f"{prefix}_{'profile' if profile else 'run'}"


def entry_points(prefix: str, profile: bool) -> tuple[str, ...]:
    """The object's external functions: the queries, the entry and, in a profile build, the profile entry."""
    runs = (entry_name(prefix), entry_name(prefix, profile=True)) if profile else (entry_name(prefix),)
    return (*(f"{prefix}_{name}" for name in _QUERIES), *runs)


# The counter a profile build reads between steps, by architecture: `llvm.readcyclecounter` lowers to
# RDTSC on x86-64 (the time-stamp counter: constant rate on CPUs with invariant TSC, Intel SDM vol. 3B
# 18.17) and to MRS CNTVCT_EL0 on AArch64 (the generic timer's virtual count, readable at EL0 when the OS
# sets CNTKCTL_EL1.EL0VCTEN, as Linux does: Arm ARM D11.2). On RISC-V it lowers to RDCYCLE, which Linux
# traps in user mode since 6.6 (perf_user_access), so a profile build is refused there.
PROFILE_COUNTERS = {"x86_64": "RDTSC", "aarch64": "CNTVCT_EL0"}


def check_profile(target: Target) -> None:
    """InputError in one line unless a profile build can read a counter on `target`."""
    if target.arch not in PROFILE_COUNTERS:
        known = ", ".join(PROFILE_COUNTERS)
        raise InputError(
            f"{target.name}: a profile build needs a user-mode cycle or time counter, which "
            f"xtune reads on {known} only ({target.arch}: RDCYCLE traps in user mode)"
        )


def kernel_key(kernel: Workload | GeneratedOp) -> str:
    """What a kernel computes, as the build table shows it: the workload key, or e.g.
    "pool2d:kind=max,n=1,c=64,h=112,w=112,kernel=3x3,stride=2x2,pads=1x1x1x1" for an operator."""
    if isinstance(kernel, Workload):
        return kernel.key

    def text(value: object) -> str:
        if isinstance(value, tuple):
            return "x".join(map(str, value))
        return str(value.value) if isinstance(value, Enum) else str(value)

    fields = ",".join(f"{f.name}={text(getattr(kernel, f.name))}" for f in dataclasses.fields(kernel))
    return f"{type(kernel).__name__.lower()}:{fields}"


def entry_ir(
    prog: Program, kernels: dict[str, Kernel], layout: WeightsLayout, prefix: str, profile: bool = False
) -> str:
    """The external entry: one call per step, each argument a byte offset from one of four bases; with
    `profile`, `{prefix}_profile`, which also stores the counter before the first call and after each."""
    bases = {
        Space.INPUT: "%input",
        Space.OUTPUT: "%output",
        Space.WORKSPACE: "%workspace",
        Space.WEIGHTS: "%w",
    }
    name, stamps = entry_name(prefix, profile), (", ptr noalias %stamps" if profile else "")
    lines = [
        f"define i32 @{quoted(name)}(ptr noalias %input, ptr noalias %output, ptr noalias %workspace"
        f"{stamps}) #0 {{",
        "entry:",
    ]
    if layout.nbytes:
        lines.append("  " + weights_base("%w"))
    pointers: dict[str, str] = {}
    for i, call in enumerate(prog.calls):
        args = []
        for tensor in call.args:
            if tensor not in pointers:
                space, offset = prog.places[tensor]
                if space is Space.WEIGHTS:
                    offset = layout.offset(tensor)
                pointer = f"%p{len(pointers)}"
                lines.append(f"  {pointer} = getelementptr inbounds i8, ptr {bases[space]}, i64 {offset}")
                pointers[tensor] = pointer
            args.append(f"ptr {pointers[tensor]}")
        if profile and i == 0:
            lines += _stamp(0)
        kernel = kernels[kernel_key(call.kernel)]
        lines.append(f"  call void @{quoted(kernel.name)}({', '.join(args)})")
        if profile:
            lines += _stamp(i + 1)
    lines += ["  ret i32 0", "}"]
    if profile:
        lines.append("declare i64 @llvm.readcyclecounter()")
    return "\n".join(lines)


def _stamp(i: int) -> list[str]:
    """IR storing the counter into stamps[i] (llvm.readcyclecounter has side effects: LLVM keeps it
    between the calls around it)."""
    return [
        f"  %t{i} = call i64 @llvm.readcyclecounter()",
        f"  %s{i} = getelementptr inbounds i64, ptr %stamps, i64 {i}",
        f"  store i64 %t{i}, ptr %s{i}",
    ]


def queries_ir(prog: Program, prefix: str, build_id: int) -> str:
    values = {
        "workspace_bytes": prog.memory.workspace_bytes,
        "input_size": math.prod(prog.input_shape),
        "output_size": math.prod(prog.output_shape),
        "build_id": build_id,
    }
    return "\n".join(
        f"define {ty} @{quoted(f'{prefix}_{name}')}() #0 {{\n  ret {ty} {values[name]}\n}}"
        for name, (_, ty, _) in _QUERIES.items()
    )


def with_header(a: NetArtifact) -> NetArtifact:
    """`a` with its C header: the entry, the queries, the sizes the caller provides, the kernels."""
    p, prog, plan, up = a.prefix, a.program, a.program.memory, a.prefix.upper()
    guard = f"{up}_NETWORK_H"
    dims = "".join(f"[{d}]" for d in prog.input_shape)
    out_dims = "".join(f"[{d}]" for d in prog.output_shape)
    tasks = sum(k.calls for k in a.kernels if k.source != "generated")
    lines = header_open(a.target, guard, includes=("stdint.h",))
    model = c_comment(os.path.basename(a.model))
    in_c, out_c = C_TYPES[prog.input_type], C_TYPES[prog.output_type]
    lines += [
        f"/* {a.entry}: the whole network {model}, {len(prog.calls)} kernel calls "
        f"({tasks} tuned tasks, {len(prog.calls) - tasks} generated operators).",
        f" *   input:  {in_c}{dims}, '{c_comment(prog.input)}', row-major (NCHW), read only",
        f" *   output: {out_c}{out_dims}, '{c_comment(prog.output)}', row-major, overwritten",
        *_quant_lines(prog),
        f" *   (the network runs in {prog.layout.value.upper()} inside; input and output are as the model "
        "declares them)",
        f" *   workspace: {plan.workspace_bytes} bytes of the caller's memory, 64-byte aligned for speed",
        " *   (4 is enough), reused between calls; needs no initialisation, means nothing after.",
        f" *   Planned statically: lower bound {plan.lower_bound} bytes, intermediates "
        f"{plan.intermediate_bytes} bytes.",
        f" *   stack: {a.stack_bytes} bytes (the largest kernel's packed panels, "
        f"{a.stack_bytes - STACK_MARGIN}, plus {STACK_MARGIN} for the frames).",
        f" *   weights: {a.weights_bytes} bytes of read-only data in the object (BatchNorm folded, conv2d",
        " *   weights packed into the strips their kernel reads).",
        " *   input, output and workspace must not overlap. Returns 0. Reentrant: no static state.",
        " */",
        f"#define {up}_INPUT_SHAPE {{{', '.join(map(str, prog.input_shape))}}}",
        f"#define {up}_OUTPUT_SHAPE {{{', '.join(map(str, prog.output_shape))}}}",
        f"#define {up}_INPUT_SIZE {math.prod(prog.input_shape)}u",
        f"#define {up}_OUTPUT_SIZE {math.prod(prog.output_shape)}u",
        f"#define {up}_WORKSPACE_BYTES {plan.workspace_bytes}u",
        f"#define {up}_STACK_BYTES {a.stack_bytes}u",
        f"#define {up}_WEIGHTS_BYTES {a.weights_bytes}u",
        f"#define {up}_BUILD_ID {a.build_id:#010x}u",
        *_quant_defines(prog, up),
        f"int {a.entry}(const {in_c} *input, {out_c} *output, void *workspace);",
        "",
    ]
    for name, (cty, _, what) in _QUERIES.items():
        lines.append(f"{cty} {p}_{name}(void); /* {what} */")
    if a.profiled:
        lines += _profile_header(a)
    lines += ["", "/* Kernels (internal functions of the object):"]
    for k in a.kernels:
        config = f"config {k.config_index} ({k.source}{': ' + k.reason if k.reason else ''})"
        how = config if k.source != "generated" else "generated"
        lines.append(
            c_comment(f" *   {k.symbol}: {k.what}, {k.calls} call(s), {how}, {k.stack_bytes} B stack")
        )
    lines += [" */", ""]
    return replace(a, header="\n".join(lines + header_close(guard)))


def _quant_lines(prog: Program) -> list[str]:
    """The header's words on a quantized network's input and output: real = scale * (q - zero_point)."""
    lines = []
    for what, kind, quant in (
        ("input", prog.input_type, prog.input_quant),
        ("output", prog.output_type, prog.output_quant),
    ):
        if quant is None:
            continue
        how = "its values are" if kind != "float32" else "quantized inside to" if what == "input" else "from"
        lines.append(f" *   {what} quantization: {how} 8-bit q, real = {quant[0]!r} * (q - {quant[1]})")
    return lines


def _quant_defines(prog: Program, up: str) -> list[str]:
    lines = []
    for what, quant in (("INPUT", prog.input_quant), ("OUTPUT", prog.output_quant)):
        if quant is not None:
            lines += [
                f"#define {up}_{what}_SCALE {quant[0]!r}f",
                f"#define {up}_{what}_ZERO_POINT {quant[1]}",
            ]
    return lines


def _profile_header(a: NetArtifact) -> list[str]:
    """A profile build's extra entry and the step each stamp follows."""
    up, calls = a.prefix.upper(), a.program.calls
    lines = [
        "",
        f"/* Profile build: {a.profile_entry} runs the network as {a.entry} does and writes "
        f"{len(calls) + 1} counter readings ({PROFILE_COUNTERS[a.target.arch]}) to stamps:",
        " * stamps[0] before the first step, stamps[i + 1] after step i (step i took stamps[i + 1] - "
        "stamps[i] ticks). */",
        f"#define {up}_PROFILE_STAMPS {len(calls) + 1}u",
        f"int {a.profile_entry}(const float *input, float *output, void *workspace, uint64_t *stamps);",
        "/* Steps:",
    ]
    lines += [f" *   {i:3d} {c_comment(step_label(call))}" for i, call in enumerate(calls)]
    return [*lines, " */"]


def step_label(call: Call) -> str:
    """A step as a profile names it: its kind and the ONNX node it runs (a Transpose: the node it feeds)."""
    kernel = call.kernel
    kind = kernel.op if isinstance(kernel, Workload) else kernel.label
    return f"{kind} {call.nodes[0]}"
