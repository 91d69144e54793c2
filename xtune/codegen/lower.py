"""Lowering: loop-nest `Kernel`s in, LLVM IR text out (written directly), one external function per kernel.

The text follows the LLVM Language Reference (https://llvm.org/docs/LangRef.html) of LLVM 15+: opaque
`ptr`, `poison`. `compile.parse_verified` runs LLVM's verifier on every module, since nothing here
checks the text. Building it through llvmlite.ir's object model cost about half of the Python time
per candidate (docs/benchmarks.md, "Compile + link of one candidate").

The control flow is straight-line code and rotated (do-while) loops, so every instruction dominates
everything emitted after it: a pure value (address arithmetic, a broadcast, a constant) computed once
is reused from a table by later statements. Loads are reused only up to the next store or loop edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from xtune.codegen import transcend
from xtune.codegen.intlower import SCALAR, Env, Operand, integer_binary, lower_integer, vtype
from xtune.codegen.transcend import float_literal
from xtune.schedule.loopnest import (
    Affine,
    Assign,
    Binary,
    BinaryOp,
    Bitcast,
    Broadcast,
    BufferKind,
    Cast,
    Clamp,
    Const,
    Dot,
    DotDiff,
    DType,
    Erf,
    Exp,
    For,
    HighMul,
    Kernel,
    Lanes,
    Load,
    Log,
    LoopKind,
    MulAdd,
    PairSum,
    Prefetch,
    Reg,
    RoundEven,
    RoundShift,
    Shuffle,
    Stmt,
    Store,
    Value,
    walk,
)

# Frame alignment of the packed panels: a cache line, and enough for any vector load we emit.
LOCAL_ALIGN = 64
# nounwind: no .eh_frame and no unwinder dependency. "no-builtins": LLVM's LoopIdiomRecognize would
# otherwise turn our copy/zero loops into memcpy/memset calls, i.e. undefined symbols (measured on all
# three architectures, docs/notes.md §1).
FUNCTION_ATTRIBUTES = 'attributes #0 = { nounwind "no-builtins" }'
# Internal kernels of a whole-network module (xtune/firmware/build.py) are never inlined into its entry: each
# keeps its own frame, so the entry's stack is the largest kernel's, not the sum of all of them.
INTERNAL_ATTRIBUTES = 'attributes #1 = { nounwind "no-builtins" noinline }'


def ftype(lanes: int) -> str:
    return vtype(lanes, DType.F32)


@cache
def constant(value: float, lanes: int, dtype: DType = DType.F32) -> str:
    if value == 0.0 and not str(value).startswith("-"):
        return ("0.0" if dtype.is_float else "0") if lanes == 1 else "zeroinitializer"
    scalar = float_literal(value) if dtype.is_float else str(int(value))
    return scalar if lanes == 1 else "<" + ", ".join([f"{SCALAR[dtype]} {scalar}"] * lanes) + ">"


def quoted(name: str) -> str:
    """A quoted LLVM identifier (LangRef "Identifiers"): any name without a quote or backslash."""
    if '"' in name or "\\" in name:
        raise ValueError(f"name {name!r} cannot be an LLVM identifier")
    return f'"{name}"'


class _FunctionLowering:
    """Lowers one kernel's statements into the lines of one function definition."""

    def __init__(self, kernel: Kernel, declarations: set[str], internal: bool = False):
        self.kernel = kernel
        self.internal = internal
        self.declarations = declarations  # of the intrinsics the module calls (shared by its functions)
        self.lines: list[str] = ["entry:"]
        self.block = "entry"  # the label of the block being filled, as referenced after '%'
        self.counter = 0
        self.lanes = dict(kernel.registers)
        self.types = dict(kernel.register_types)  # registers that do not hold float32
        self.dtypes = {buf.name: buf.dtype for buf in kernel.buffers}
        self.registers: dict[str, str] = {}  # register -> its current SSA value
        self.buffers: dict[str, str] = {}
        self.pure: dict[tuple[object, ...], str] = {}  # address arithmetic, broadcasts (never invalid)
        self.loads: dict[tuple[str, int, int], str] = {}  # (pointer, lanes, count) -> value, until a store
        self.carried: dict[int, list[str]] = {}  # id(loop) -> the registers its body assigns
        for buf in kernel.buffers:
            self.buffers[buf.name] = "%" + quoted(buf.name)
            if buf.kind is BufferKind.LOCAL:
                elem = SCALAR[buf.dtype]
                self.emit(f"{self.buffers[buf.name]} = alloca {elem}, i64 {buf.size}, align {LOCAL_ALIGN}")

    def fresh(self) -> str:
        self.counter += 1
        return f"%.{self.counter}"  # a leading '.' keeps temporaries apart from every quoted name

    def emit(self, instruction: str) -> None:
        self.lines.append("  " + instruction)

    def define(self, instruction: str) -> str:
        name = self.fresh()
        self.lines.append(f"  {name} = {instruction}")
        return name

    def text(self) -> str:
        self.statements(self.kernel.body, {})
        self.emit("ret void")
        # noalias: the caller promises A, B and C do not overlap (documented in every header we emit);
        # without it LLVM must reload B after every store to C.
        # A kernel that may run in place says so (Kernel.noalias), and gets plain pointers.
        attribute = "ptr noalias" if self.kernel.noalias else "ptr"
        params = ", ".join(f"{attribute} {self.buffers[b.name]}" for b in self.kernel.params)
        linkage, group = ("internal ", 1) if self.internal else ("", 0)
        head = f"define {linkage}void @{quoted(self.kernel.name)}({params}) #{group} {{"
        return "\n".join([head, *self.lines, "}"])

    # --- statements -------------------------------------------------------------------------
    def statements(self, stmts: Sequence[Stmt], env: Env) -> None:
        for stmt in stmts:
            if isinstance(stmt, Assign):
                self.registers[stmt.reg] = self.value(stmt.value, env)[0]
            elif isinstance(stmt, Store):
                self.store(stmt, env)
            elif isinstance(stmt, Prefetch):
                self.prefetch(stmt, env)
            elif stmt.kind is LoopKind.UNROLLED:
                for i in range(stmt.extent):
                    self.statements(stmt.body, {**env, stmt.var: i})
            else:
                self.loop(stmt, env)

    def loop(self, loop: For, env: Env) -> None:
        """Rotated (do-while) form: every extent here is a constant >= 2, so the body runs at least once.
        The phis are written once the latch block and the values leaving the body are known."""
        self.counter += 1
        name = f"{loop.var}.{self.counter}"
        iv, body, exit_ = "%" + quoted(name), quoted(name + ".body"), quoted(name + ".exit")
        pre = self.block
        self.emit(f"br label %{body}")
        self.start_block(body)
        phi_line = len(self.lines)
        carried = self.carried_registers(loop)
        entering = {reg: self.registers.get(reg, "poison") for reg in carried}  # LangRef: poison, not undef
        self.lines.extend([""] * (1 + len(carried)))
        for reg in carried:
            self.registers[reg] = "%" + quoted(f"{reg}.{name}")
        self.statements(loop.body, {**env, loop.var: iv})
        nxt = "%" + quoted(name + ".next")
        self.emit(f"{nxt} = add nuw nsw i64 {iv}, 1")
        latch = self.block
        self.lines[phi_line] = f"  {iv} = phi i64 [0, %{pre}], [{nxt}, %{latch}]"
        for row, reg in enumerate(carried, phi_line + 1):
            ty = vtype(self.lanes[reg], self.types.get(reg, DType.F32))
            incoming = f"[{entering[reg]}, %{pre}], [{self.registers[reg]}, %{latch}]"
            self.lines[row] = f"  %{quoted(f'{reg}.{name}')} = phi {ty} {incoming}"
        done = self.define(f"icmp eq i64 {nxt}, {loop.extent}")
        self.emit(f"br i1 {done}, label %{exit_}, label %{body}")
        self.start_block(exit_)

    def start_block(self, label: str) -> None:
        self.lines.append(f"{label}:")
        self.block = label
        self.loads.clear()  # another iteration's (or the loop's) stores may have run in between

    def carried_registers(self, loop: For) -> list[str]:
        """The registers the body assigns, each a phi. Cached: an unrolled loop repeats the same For."""
        regs = self.carried.get(id(loop))
        if regs is None:
            regs = sorted({st.reg for st, _ in walk(loop.body) if isinstance(st, Assign)})
            self.carried[id(loop)] = regs
        return regs

    def store(self, stmt: Store, env: Env) -> None:
        value, lanes, dtype = self.value(stmt.value, env)
        ptr = self.address(stmt.buffer, stmt.index, env)
        align = dtype.bytes
        self.loads.clear()
        if stmt.valid == lanes:
            self.emit(f"store {vtype(lanes, dtype)} {value}, ptr {ptr}, align {align}")
            return
        vty = vtype(lanes, dtype)
        # A partial vector (the tail of a row) as power-of-two pieces, widest first: 7 lanes are one
        # 4-lane, one 2-lane and one scalar store rather than 7 scalar ones (never past the valid lanes).
        lane = 0
        while lane < stmt.valid:
            width = 1 << ((stmt.valid - lane).bit_length() - 1)
            if width == 1:
                piece = self.define(f"extractelement {vty} {value}, i64 {lane}")
            else:
                mask = ", ".join(f"i32 {i}" for i in range(lane, lane + width))
                piece = self.define(f"shufflevector {vty} {value}, {vty} poison, <{width} x i32> <{mask}>")
            addr = self.lane_address(ptr, lane, dtype)
            self.emit(f"store {vtype(width, dtype)} {piece}, ptr {addr}, align {align}")
            lane += width

    # --- values -----------------------------------------------------------------------------
    def prefetch(self, stmt: Prefetch, env: Env) -> None:
        """llvm.prefetch(addr, read, locality 3 = keep in all levels, data cache) (LangRef
        "llvm.prefetch"). The address is not inbounds: it may point past the buffer."""
        ptr = self.address(stmt.buffer, stmt.index, env, inbounds=False)
        self.declarations.add("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
        self.emit(f"call void @llvm.prefetch.p0(ptr {ptr}, i32 0, i32 3, i32 1)")

    def value(self, v: Value, env: Env) -> Operand:
        if isinstance(v, Reg):
            return self.registers[v.name], self.lanes[v.name], self.types.get(v.name, DType.F32)
        if isinstance(v, Load):
            return self.load(v, env), v.lanes, self.dtypes[v.buffer]
        if isinstance(v, Const):
            return constant(v.value, v.lanes, v.dtype), v.lanes, v.dtype
        if isinstance(v, Lanes):
            vector = ", ".join(f"float {float_literal(x)}" for x in v.values)
            return f"<{vector}>", len(v.values), DType.F32
        if isinstance(v, Broadcast):
            value, width, dtype = self.value(v.value, env)
            if width > 1:
                return self.lane_splat(value, width, v.lanes, v.lane, dtype), v.lanes, dtype
            return self.broadcast(value, v.lanes, dtype), v.lanes, dtype
        if isinstance(v, MulAdd):
            return self.muladd(v, env)
        if isinstance(v, Exp):
            return self.exp(self.value(v.a, env))
        if isinstance(v, Log):
            return self.log(self.value(v.a, env))
        if isinstance(v, Erf):
            x, lanes, _ = self.value(v.a, env)
            return (*transcend.erf(self, (x, lanes)), DType.F32)
        if isinstance(v, Shuffle):
            return self.shuffle(v, env)
        if isinstance(v, Binary):
            return self.binary(v, env)
        return self.integer(v, env)

    def integer(
        self, v: Dot | DotDiff | Cast | Bitcast | PairSum | RoundEven | Clamp | HighMul | RoundShift, env: Env
    ) -> Operand:
        """The integer operations of quantized kernels (xtune/codegen/intlower.py)."""
        return lower_integer(self, v, env)

    def shuffle(self, v: Shuffle, env: Env) -> Operand:
        """LangRef "shufflevector": the mask is a constant vector of i32 lane numbers over a ++ b."""
        (a, lanes, dtype), (b, _, _) = self.value(v.a, env), self.value(v.b, env)
        ty = vtype(lanes, dtype)
        mask = ", ".join(f"i32 {i}" for i in v.mask)
        shuffled = self.define(f"shufflevector {ty} {a}, {ty} {b}, <{len(v.mask)} x i32> <{mask}>")
        return shuffled, len(v.mask), dtype

    def muladd(self, v: MulAdd, env: Env) -> Operand:
        """llvm.fmuladd: one FMA where the target has it, mul + add elsewhere (never a libcall)."""
        (a, lanes, _), (b, _, _), (c, _, _) = (self.value(part, env) for part in (v.a, v.b, v.c))
        return self.fmuladd(a, b, c, lanes), lanes, DType.F32

    def fmuladd(self, a: str, b: str, c: str, lanes: int) -> str:
        ty = ftype(lanes)
        self.declarations.add(f"declare {ty} @llvm.fmuladd.{_suffix(lanes)}({ty}, {ty}, {ty})")
        return self.define(f"call {ty} @llvm.fmuladd.{_suffix(lanes)}({ty} {a}, {ty} {b}, {ty} {c})")

    def binary(self, v: Binary, env: Env) -> Operand:
        (lhs, lanes, dtype), (rhs, _, _) = self.value(v.a, env), self.value(v.b, env)
        if not dtype.is_float:
            return integer_binary(self, v.op, lhs, rhs, lanes, dtype), lanes, dtype
        ty = ftype(lanes)
        arithmetic = {BinaryOp.ADD: "fadd", BinaryOp.SUB: "fsub", BinaryOp.MUL: "fmul", BinaryOp.DIV: "fdiv"}
        if v.op in arithmetic:
            return self.define(f"{arithmetic[v.op]} {ty} {lhs}, {rhs}"), lanes, dtype
        if v.op not in (BinaryOp.MAX, BinaryOp.MIN):
            raise ValueError(f"{v.op.value} takes integer lanes, not float")
        # max/min via compare + select: llvm.maxnum/minnum would be libcalls (fmaxf) on some targets.
        return self.select(lhs, "ogt" if v.op is BinaryOp.MAX else "olt", rhs, lhs, rhs, lanes), lanes, dtype

    def select(
        self, a: str, pred: str, b: str, then: str, other: str, lanes: int, dtype: DType = DType.F32
    ) -> str:
        """`a PRED b ? then : other`, lane by lane (fcmp predicates for float lanes, icmp for integers)."""
        ty = vtype(lanes, dtype)
        compare = "fcmp" if dtype.is_float else "icmp"
        cond = self.define(f"{compare} {pred} {ty} {a}, {b}")
        cty = "i1" if lanes == 1 else f"<{lanes} x i1>"
        return self.define(f"select {cty} {cond}, {ty} {then}, {ty} {other}")

    def exp(self, operand: Operand) -> Operand:
        """e**x of a float operand, with native instructions only (xtune/codegen/transcend.py)."""
        x, lanes, _ = operand
        return (*transcend.exp(self, (x, lanes)), DType.F32)

    def log(self, operand: Operand) -> Operand:
        """ln x of a positive normal float operand (xtune/codegen/transcend.py)."""
        x, lanes, _ = operand
        return (*transcend.log(self, (x, lanes)), DType.F32)

    def broadcast(self, scalar: str, lanes: int, dtype: DType = DType.F32) -> str:
        """The splat idiom instcombine produces itself (insertelement into poison, zero shuffle mask)."""
        if lanes == 1:
            return scalar
        key = ("splat", scalar, lanes, SCALAR[dtype])
        splat = self.pure.get(key)
        if splat is None:
            ty = vtype(lanes, dtype)
            one = self.define(f"insertelement {ty} poison, {SCALAR[dtype]} {scalar}, i64 0")
            splat = self.define(f"shufflevector {ty} {one}, {ty} poison, <{lanes} x i32> zeroinitializer")
            self.pure[key] = splat
        return splat

    def lane_splat(self, vector: str, width: int, lanes: int, lane: int, dtype: DType) -> str:
        """Lane `lane` of a `width`-lane vector in all `lanes` lanes: a shuffle whose mask is that lane
        everywhere, the operand AArch64's instruction selection folds into FMLA (by element)."""
        ty = vtype(width, dtype)
        if lanes == 1:
            return self.define(f"extractelement {ty} {vector}, i64 {lane}")
        key = ("lane splat", vector, lanes, lane)
        splat = self.pure.get(key)
        if splat is None:
            mask = "<" + ", ".join([f"i32 {lane}"] * lanes) + ">"
            splat = self.pure[key] = self.define(
                f"shufflevector {ty} {vector}, {ty} poison, <{lanes} x i32> {mask}"
            )
        return splat

    def load(self, v: Load, env: Env) -> str:
        ptr = self.address(v.buffer, v.index, env)
        key = (ptr, v.lanes, v.valid)
        value = self.loads.get(key)
        if value is not None:
            return value
        dtype = self.dtypes[v.buffer]
        scalar, align = SCALAR[dtype], dtype.bytes
        if v.valid == v.lanes:
            value = self.define(f"load {vtype(v.lanes, dtype)}, ptr {ptr}, align {align}")
        else:
            vty, value = vtype(v.lanes, dtype), "zeroinitializer"
            for lane in range(v.valid):  # never read past the end of a row
                elem = self.define(f"load {scalar}, ptr {self.lane_address(ptr, lane, dtype)}, align {align}")
                value = self.define(f"insertelement {vty} {value}, {scalar} {elem}, i64 {lane}")
        self.loads[key] = value
        return value

    # --- addresses --------------------------------------------------------------------------
    def address(self, buffer: str, index: Affine, env: Env, inbounds: bool = True) -> str:
        """&buffer[index] as one GEP over its element type (inbounds unless a prefetch's, which may point
        past the buffer); the loop-variable part is computed once."""
        const, dynamic = index.const, []
        for var, coeff in index.terms:
            bound = env[var]
            if isinstance(bound, int):  # an unrolled loop's variable: folded into the constant
                const += coeff * bound
            else:
                dynamic.append((bound, coeff))
        if not dynamic and not const:
            return self.buffers[buffer]
        key = ("gep", buffer, tuple(dynamic), const, inbounds)
        ptr = self.pure.get(key)
        if ptr is None:
            offset = str(const)
            if dynamic:
                offset = self.offset(tuple(dynamic))
                if const:
                    # nuw only when adding a non-negative constant to a non-negative sum (LangRef "add":
                    # else the result is poison)
                    flags = "nuw nsw" if const > 0 and all(c > 0 for _, c in dynamic) else "nsw"
                    offset = self.define(f"add {flags} i64 {offset}, {const}")
            gep = "getelementptr inbounds" if inbounds else "getelementptr"
            elem = SCALAR[self.dtypes[buffer]]
            ptr = self.define(f"{gep} {elem}, ptr {self.buffers[buffer]}, i64 {offset}")
            self.pure[key] = ptr
        return ptr

    def offset(self, terms: tuple[tuple[str, int], ...]) -> str:
        """sum(coeff * iv) in i64, each prefix of the sum shared with other indices."""
        total = self.pure.get(("sum", terms))
        if total is not None:
            return total
        iv, coeff = terms[-1]
        # nuw only while every coefficient is positive (LangRef "mul", "add": an unsigned wrap is poison);
        # a backwards copy (a negative Slice step, a reflected Pad) has a negative one.
        flags = "nuw nsw" if all(c > 0 for _, c in terms) else "nsw"
        term = iv if coeff == 1 else self.pure.get(("mul", iv, coeff))
        if term is None:
            scale = "nuw nsw" if coeff > 0 else "nsw"
            term = self.pure[("mul", iv, coeff)] = self.define(f"mul {scale} i64 {iv}, {coeff}")
        total = term if len(terms) == 1 else self.define(f"add {flags} i64 {self.offset(terms[:-1])}, {term}")
        self.pure[("sum", terms)] = total
        return total

    def lane_address(self, ptr: str, lane: int, dtype: DType = DType.F32) -> str:
        if lane == 0:
            return ptr
        key = ("lane", ptr, lane, SCALAR[dtype])
        addr = self.pure.get(key)
        if addr is None:
            elem = SCALAR[dtype]
            addr = self.pure[key] = self.define(f"getelementptr inbounds {elem}, ptr {ptr}, i64 {lane}")
        return addr


def _suffix(lanes: int) -> str:
    """The overloaded intrinsic's name mangling (LangRef "Intrinsic Functions"): .f32 or .v8f32."""
    return "f32" if lanes == 1 else f"v{lanes}f32"


def lower(
    kernels: Sequence[Kernel],
    module_name: str = "xtune",
    *,
    internal: bool = False,
    extra: Sequence[str] = (),
) -> str:
    """LLVM IR text of a module holding every kernel as an external function (the only externals).

    With `internal`, the kernels are internal, never-inlined functions instead, and `extra` holds the rest
    of the module (globals, the external functions that call the kernels), written by the caller."""
    declarations: set[str] = set()
    functions = [_FunctionLowering(kernel, declarations, internal).text() for kernel in kernels]
    header = f"; ModuleID = {quoted(module_name)}"
    attributes = [FUNCTION_ATTRIBUTES, *([INTERNAL_ATTRIBUTES] if internal else [])]
    return "\n\n".join([header, *extra, *functions, *sorted(declarations), *attributes]) + "\n"
