"""Compilation: LLVM IR text and a `Target` in, a relocatable ELF `ObjectCode` out (llvmlite, O3)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm

from xtune.errors import CompileError
from xtune.target import Target


@dataclass(frozen=True)
class ObjectCode:
    """A relocatable ELF object as bytes, with the names of its external entry points."""

    target: str
    arch: str
    data: bytes
    entry_points: tuple[str, ...]


_init_lock = threading.Lock()
_initialized = False


def _initialize() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


@cache
def _target_machine(triple: str, cpu: str, features: str, abi: str) -> llvm.TargetMachine:
    # Measured facts (docs/notes.md §1): llvmlite's default code model is the large one on 64-bit and
    # yields GOT/absolute relocations; 'medium' aborts the process on AArch64. reloc='pic' keeps
    # everything PC-relative, which the flat linker and any firmware link can place anywhere.
    _initialize()
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="pic", codemodel="small", abiname=abi
    )


def target_machine(target: Target) -> llvm.TargetMachine:
    return _target_machine(target.triple, target.cpu, target.features, target.abi)


def optimize(module: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    pto = llvm.PipelineTuningOptions(speed_level=3)
    # Our loop nests are already unrolled and vectorized where the config says. LLVM's own
    # unroller and vectorizers would second-guess the schedule being measured, and its full
    # unrolling of constant-trip loops doubled both compile time and code size (docs/benchmarks.md,
    # "Compile + link of one candidate").
    pto.loop_unrolling = False
    pto.loop_vectorization = False
    pto.slp_vectorization = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(module, pb)


def parse_verified(llvm_ir: str, target: Target) -> llvm.ModuleRef:
    """Parse and verify: llvmlite.ir builds text without checking it, LLVM's verifier does."""
    _initialize()
    try:
        module = llvm.parse_assembly(llvm_ir)
        module.verify()
    except RuntimeError as err:
        raise CompileError(f"invalid LLVM IR for {target.name}: {str(err).strip()}") from None
    module.triple = target.triple
    module.data_layout = str(target_machine(target).target_data)
    return module


def compile_object(llvm_ir: str, target: Target, entry_points: tuple[str, ...]) -> ObjectCode:
    tm = target_machine(target)
    module = parse_verified(llvm_ir, target)
    optimize(module, tm)
    try:
        data = tm.emit_object(module)
    except RuntimeError as err:
        raise CompileError(f"LLVM could not emit an object for {target.name}: {err}") from None
    return ObjectCode(target.name, target.arch, bytes(data), entry_points)
