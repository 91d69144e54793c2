"""Lowering: loop-nest `Kernel`s in, LLVM IR text (llvmlite.ir) out, one external function per kernel."""

from __future__ import annotations

from collections.abc import Sequence

import llvmlite.ir as ir

from xtune.loopnest import (
    Affine,
    Assign,
    BinaryOp,
    Broadcast,
    BufferKind,
    Const,
    For,
    Kernel,
    Load,
    LoopKind,
    MulAdd,
    Reg,
    Stmt,
    Store,
    Value,
    walk,
)

F32 = ir.FloatType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
# Frame alignment of the packed panels: a cache line, and enough for any vector load we emit.
LOCAL_ALIGN = 64


def ftype(lanes: int) -> ir.Type:
    return F32 if lanes == 1 else ir.VectorType(F32, lanes)


def _lanes_of(ty: ir.Type) -> int:
    return ty.count if isinstance(ty, ir.VectorType) else 1


class _FunctionLowering:
    """Lowers one kernel's statements into one function; loop variables map to i64 values or ints."""

    def __init__(self, module: ir.Module, kernel: Kernel):
        self.module = module
        self.kernel = kernel
        fnty = ir.FunctionType(ir.VoidType(), [PTR] * len(kernel.params))
        self.fn = ir.Function(module, fnty, kernel.name)
        # nounwind: no .eh_frame and no unwinder dependency. "no-builtins": LLVM's LoopIdiomRecognize
        # would otherwise turn our copy/zero loops into memcpy/memset calls, i.e. undefined symbols
        # (measured on all three architectures, see DESIGN.md). llvmlite.ir refuses string
        # attributes, so the attribute is admitted to this one function's known set.
        self.fn.attributes.add("nounwind")
        self.fn.attributes._known = self.fn.attributes._known | {'"no-builtins"'}
        self.fn.attributes.add('"no-builtins"')
        self.buffers: dict[str, ir.Value] = {}
        for arg, buf in zip(self.fn.args, kernel.params, strict=True):
            arg.name = buf.name
            # The caller promises A, B and C do not overlap (documented in every header we emit);
            # without noalias LLVM must reload B after every store to C.
            arg.add_attribute("noalias")
            self.buffers[buf.name] = arg
        self.builder = ir.IRBuilder(self.fn.append_basic_block("entry"))
        # Registers are SSA values; a serial loop gets a phi for each register its body assigns.
        self.lanes = dict(kernel.registers)
        self.registers: dict[str, ir.Value] = {}
        for buf in kernel.buffers:
            if buf.kind is BufferKind.LOCAL:
                slot = self.builder.alloca(F32, size=ir.Constant(I64, buf.size), name=buf.name)
                slot.align = LOCAL_ALIGN
                slot.type = PTR  # an opaque pointer like the params, so vector stores type-check
                self.buffers[buf.name] = slot

    def lower(self) -> None:
        self.statements(self.kernel.body, {})
        self.builder.ret_void()

    # --- statements -------------------------------------------------------------------------
    def statements(self, stmts: Sequence[Stmt], env: dict[str, ir.Value | int]) -> None:
        for stmt in stmts:
            if isinstance(stmt, For):
                self.loop(stmt, env)
            elif isinstance(stmt, Assign):
                self.registers[stmt.reg] = self.value(stmt.value, env)
            else:
                self.store(stmt, env)

    def loop(self, loop: For, env: dict[str, ir.Value | int]) -> None:
        if loop.kind is LoopKind.UNROLLED:
            for i in range(loop.extent):
                self.statements(loop.body, {**env, loop.var: i})
            return
        # Rotated (do-while) form: every extent here is a constant >= 2, so the body runs at least once.
        b = self.builder
        pre = b.block
        body = b.append_basic_block(f"{loop.var}.body")
        exit_ = b.append_basic_block(f"{loop.var}.exit")
        b.branch(body)
        b.position_at_end(body)
        iv = b.phi(I64, name=loop.var)
        iv.add_incoming(ir.Constant(I64, 0), pre)
        carried = {}
        for name in sorted({st.reg for st, _ in walk(loop.body) if isinstance(st, Assign)}):
            ty = ftype(self.lanes[name])
            phi = b.phi(ty, name=f"{name}.{loop.var}")
            phi.add_incoming(self.registers.get(name, ir.Constant(ty, ir.Undefined)), pre)
            carried[name] = self.registers[name] = phi
        self.statements(loop.body, {**env, loop.var: iv})
        nxt = b.add(iv, ir.Constant(I64, 1), name=f"{loop.var}.next", flags=("nuw", "nsw"))
        iv.add_incoming(nxt, b.block)
        for name, phi in carried.items():
            phi.add_incoming(self.registers[name], b.block)
        done = b.icmp_unsigned("==", nxt, ir.Constant(I64, loop.extent))
        b.cbranch(done, exit_, body)
        b.position_at_end(exit_)

    def store(self, stmt: Store, env: dict[str, ir.Value | int]) -> None:
        value = self.value(stmt.value, env)
        ptr = self.address(stmt.buffer, stmt.index, env)
        if stmt.valid == stmt.lanes:
            self.builder.store(value, ptr, align=4)
            return
        for lane in range(stmt.valid):  # a partial vector: the tail of a row, lane by lane
            elem = self.builder.extract_element(value, ir.Constant(I32, lane))
            self.builder.store(elem, self.offset(ptr, lane), align=4)

    # --- values -----------------------------------------------------------------------------
    def value(self, v: Value, env: dict[str, ir.Value | int]) -> ir.Value:
        b = self.builder
        if isinstance(v, Load):
            return self.load(v, env)
        if isinstance(v, Const):
            return ir.Constant(ftype(v.lanes), [v.value] * v.lanes if v.lanes > 1 else v.value)
        if isinstance(v, Reg):
            return self.registers[v.name]
        if isinstance(v, Broadcast):
            scalar = self.value(v.value, env)
            if v.lanes == 1:
                return scalar
            vec = b.insert_element(ir.Constant(ftype(v.lanes), None), scalar, ir.Constant(I32, 0))
            mask = ir.Constant(ir.VectorType(I32, v.lanes), [0] * v.lanes)
            return b.shuffle_vector(vec, vec, mask)
        if isinstance(v, MulAdd):
            a, x, c = (self.value(part, env) for part in (v.a, v.b, v.c))
            return b.call(self.fmuladd(a.type), [a, x, c])
        lhs, rhs = self.value(v.a, env), self.value(v.b, env)
        if v.op is BinaryOp.ADD:
            return b.fadd(lhs, rhs)
        if v.op is BinaryOp.MUL:
            return b.fmul(lhs, rhs)
        # max via compare + select: llvm.maxnum would be a libcall (fmaxf) on some targets.
        return b.select(b.fcmp_ordered(">", lhs, rhs), lhs, rhs)

    def load(self, v: Load, env: dict[str, ir.Value | int]) -> ir.Value:
        b = self.builder
        ptr = self.address(v.buffer, v.index, env)
        if v.valid == v.lanes:
            return b.load(ptr, typ=ftype(v.lanes), align=4)
        vec: ir.Value = ir.Constant(ftype(v.lanes), [0.0] * v.lanes)
        for lane in range(v.valid):  # never read past the end of a row
            elem = b.load(self.offset(ptr, lane), typ=F32, align=4)
            vec = b.insert_element(vec, elem, ir.Constant(I32, lane))
        return vec

    def fmuladd(self, ty: ir.Type) -> ir.Function:
        name = "llvm.fmuladd." + (f"v{_lanes_of(ty)}f32" if isinstance(ty, ir.VectorType) else "f32")
        declared: ir.Function | None = self.module.globals.get(name)  # shared by every kernel of the module
        return declared or ir.Function(self.module, ir.FunctionType(ty, [ty] * 3), name)

    # --- addresses --------------------------------------------------------------------------
    def address(self, buffer: str, index: Affine, env: dict[str, ir.Value | int]) -> ir.Value:
        const = index.const
        dynamic: ir.Value | None = None
        for var, coeff in index.terms:
            bound = env[var]
            if isinstance(bound, int):
                const += coeff * bound
                continue
            term = (
                bound
                if coeff == 1
                else self.builder.mul(bound, ir.Constant(I64, coeff), flags=("nuw", "nsw"))
            )
            dynamic = term if dynamic is None else self.builder.add(dynamic, term, flags=("nuw", "nsw"))
        offset: ir.Value = ir.Constant(I64, const)
        if dynamic is not None:
            offset = self.builder.add(dynamic, offset, flags=("nuw", "nsw")) if const else dynamic
        return self.builder.gep(self.buffers[buffer], [offset], inbounds=True, source_etype=F32)

    def offset(self, ptr: ir.Value, lane: int) -> ir.Value:
        return self.builder.gep(ptr, [ir.Constant(I64, lane)], inbounds=True, source_etype=F32)


def lower(kernels: Sequence[Kernel], module_name: str = "xtune") -> str:
    """LLVM IR text of a module holding every kernel as an external function (the only externals)."""
    module = ir.Module(name=module_name)
    for kernel in kernels:
        _FunctionLowering(module, kernel).lower()
    return str(module)
