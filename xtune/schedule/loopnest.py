"""Loop-nest IR: what templates build (constant-trip loops, affine indices, explicit vectors), and what
lowering and features read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Affine:
    """sum(coeff * loop_var) + const, an element index into a buffer."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(x: Affine | int | str) -> Affine:
        if isinstance(x, Affine):
            return x
        if isinstance(x, str):
            return Affine(((x, 1),))
        return Affine((), x)

    def __add__(self, other: Affine | int | str) -> Affine:
        o = Affine.of(other)
        coeffs = dict(self.terms)
        for var, c in o.terms:
            coeffs[var] = coeffs.get(var, 0) + c
        return Affine(tuple((v, c) for v, c in coeffs.items() if c), self.const + o.const)

    __radd__ = __add__

    def __mul__(self, k: int) -> Affine:
        return Affine(tuple((v, c * k) for v, c in self.terms if c * k), self.const * k)

    __rmul__ = __mul__

    def coeff(self, var: str) -> int:
        return dict(self.terms).get(var, 0)

    def substitute(self, var: str, value: int) -> Affine:
        c = self.coeff(var)
        return Affine(tuple(t for t in self.terms if t[0] != var), self.const + c * value)


class DType(Enum):
    """Element types: float32 (every float kernel), and the integers of quantized kernels (int8/uint8
    tensors, int16 intermediates, int32 accumulators, int64 for exact fixed-point products)."""

    F32 = "f32"
    I8 = "i8"
    U8 = "u8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"

    @property
    def bytes(self) -> int:
        return {"f32": 4, "i8": 1, "u8": 1, "i16": 2, "i32": 4, "i64": 8}[self.value]

    @property
    def is_float(self) -> bool:
        return self is DType.F32

    @property
    def signed(self) -> bool:
        return self is not DType.U8


class BufferKind(Enum):
    INPUT = "input"
    OUTPUT = "output"
    LOCAL = "local"  # scratch on the kernel's stack (packed panels)


@dataclass(frozen=True)
class Buffer:
    name: str
    size: int  # elements of `dtype`
    kind: BufferKind
    dtype: DType = DType.F32


class BinaryOp(Enum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    # integer lanes only: bitwise and, xor, shifts (SHR is arithmetic on signed types, logical on U8)
    AND = "and"
    XOR = "xor"
    SHL = "shl"
    SHR = "shr"


@dataclass(frozen=True)
class Load:
    """`lanes` consecutive elements (of the buffer's dtype) from buffer[index]; only the first `count` are
    read, the rest are 0."""

    buffer: str
    index: Affine
    lanes: int = 1
    count: int = 0  # 0 means all lanes

    @property
    def valid(self) -> int:
        return self.count or self.lanes


@dataclass(frozen=True)
class Const:
    value: float
    lanes: int = 1
    dtype: DType = DType.F32


@dataclass(frozen=True)
class Lanes:
    """A float32 constant vector given lane by lane (per-lane weights: a resize's columns along W)."""

    values: tuple[float, ...]


@dataclass(frozen=True)
class Broadcast:
    """`lanes` copies of lane `lane` of `value` (a scalar's lane 0 is the scalar). A lane of a loaded
    vector is what AArch64's FMLA (by element) multiplies by without a separate broadcast (Arm ARM,
    "FMLA (by element)"): one vector load then serves `lanes` multiply-adds' broadcasts."""

    value: Value
    lanes: int
    lane: int = 0


@dataclass(frozen=True)
class Reg:
    name: str


@dataclass(frozen=True)
class Binary:
    op: BinaryOp
    a: Value
    b: Value


@dataclass(frozen=True)
class MulAdd:
    """a * b + c, fused into one FMA where the target has one (llvm.fmuladd)."""

    a: Value
    b: Value
    c: Value


@dataclass(frozen=True)
class Exp:
    """e**a, lane by lane: expanded by the lowering into native instructions (llvm.exp would be expf)."""

    a: Value


@dataclass(frozen=True)
class Log:
    """The natural logarithm of a, lane by lane, for a positive normal float (what a reduction's
    normalizer, e.g. LRN's, takes): expanded by the lowering like `Exp`."""

    a: Value


@dataclass(frozen=True)
class Erf:
    """The error function of a, lane by lane: expanded by the lowering like `Exp` (whose result it uses)."""

    a: Value


@dataclass(frozen=True)
class Shuffle:
    """Lanes picked from two vectors of equal width (LLVM shufflevector): `mask[i]` < lanes picks lane
    mask[i] of `a`, else lane mask[i] - lanes of `b`. A deinterleave (stride-2 packing) is one of these."""

    a: Value
    b: Value
    mask: tuple[int, ...]


class DotInsn(Enum):
    """How a `Dot` is computed: the instruction the target has (each exact, none saturates)."""

    VPDPBUSD = "vpdpbusd"  # x86 AVX512-VNNI / AVX-VNNI: u8 x s8, 4 products per i32 lane
    SDOT = "sdot"  # AArch64 +dotprod: s8 x s8 (udot: u8 x u8)
    PMADDWD = "pmaddwd"  # x86 without VNNI: the even and odd bytes widened to i16, two vpmaddwd
    MLA = "mla"  # anywhere: each byte of an i32 lane sign/zero-extended by shifts, i32 multiply-adds
    # AArch64 without dotprod: smull of the bytes into i16 products, sadalp of product pairs into i32.
    # Its accumulator holds two lanes per group (the pair sums of bytes 0-1 and 2-3): `acc` has
    # 2 * lanes lanes, and `PairSum` folds it into the group sums after the reduction.
    SADALP = "sadalp"


@dataclass(frozen=True)
class Dot:
    """acc + the 4-way dot products of 8-bit integers: lane i of the i32 result adds a[4i+t] * b[4i+t] for
    t < 4 to acc[i]. `a` and `b` hold 4 * lanes bytes each, except that an `a` of 4 bytes is one group
    broadcast to every lane (a row of A against a strip of B columns), and an `a` that is a `Broadcast` of
    4 * lanes bytes is its group `lane` (4 bytes) broadcast (AArch64's SDOT by element). Signedness is the
    operands' dtypes'; `insn` must support it (VPDPBUSD: a u8, b i8; SDOT: both i8 or both u8)."""

    acc: Value
    a: Value
    b: Value
    insn: DotInsn


@dataclass(frozen=True)
class DotDiff:
    """acc + the pair sums of (a0 * b0 - a1 * b1), two groups at once on AArch64 without dotprod: the s8
    bytes of each group (as `Dot`'s `a` and `b`, `a` broadcast or by element) multiplied into i16 lanes
    (smull), the second group's products subtracted there (smlsl), adjacent i16 lanes added into the
    i32 lanes of `acc` (sadalp; `acc` as `DotInsn.SADALP`'s, 2 * lanes lanes). Exact for every s8 input:
    |a0 b0 - a1 b1| <= 128 * 128 + 128 * 127 = 32640 fits an i16 lane, where a sum of two products
    (-128 * -128 twice) does not; a caller that stores a1 complemented (~a1 = -a1 - 1) gets
    a0 b0 + a1 b1 + b1 instead, b1 a constant of the weights."""

    acc: Value
    a0: Value
    b0: Value
    a1: Value
    b1: Value


@dataclass(frozen=True)
class PairSum:
    """Lanes 2i and 2i+1 added into lane i (an accumulator of `DotInsn.SADALP` into group sums: addp)."""

    a: Value


@dataclass(frozen=True)
class Cast:
    """Each lane converted to `dtype`: integers widened (by their signedness) or truncated (the low bits),
    integers to float rounded to nearest (LLVM sitofp), floats to integers truncated toward zero (fptosi:
    the value must fit the integer type)."""

    a: Value
    dtype: DType


@dataclass(frozen=True)
class Bitcast:
    """The bits of the lanes as lanes of integer type `dtype` (LLVM bitcast): i32 lanes as 4 times as many
    bytes, byte t of lane i at lane 4i + t (every target here is little-endian), or bytes as i32 lanes."""

    a: Value
    dtype: DType


@dataclass(frozen=True)
class RoundEven:
    """Float lanes rounded to the nearest integer, ties to even (llvm.roundeven: roundps/vrndscaleps,
    frintn, RVV vfcvt with the RNE rounding mode), still float."""

    a: Value


@dataclass(frozen=True)
class Clamp:
    """Float lanes clamped to [lo, hi], for inputs that are never NaN (llvm.maxnum/minnum with nnan: one
    vmaxps and one vminps, fmaxnm/fminnm, vfmax/vfmin; no compare and select)."""

    a: Value
    lo: Value
    hi: Value


@dataclass(frozen=True)
class HighMul:
    """gemmlowp's SaturatingRoundingDoublingHighMul of i32 lanes: the high 32 bits of 2ab, rounded to
    nearest with ties away from zero, INT32_MAX for a = b = INT32_MIN (gemmlowp fixedpoint.h)."""

    a: Value
    b: Value


@dataclass(frozen=True)
class RoundShift:
    """gemmlowp's RoundingDivideByPOT of i32 lanes: a / 2**shift rounded to nearest, ties away from zero,
    for shifts 0..31 (a per-lane vector or one for all)."""

    a: Value
    shift: Value


Value = (
    Load
    | Const
    | Lanes
    | Broadcast
    | Reg
    | Binary
    | MulAdd
    | Exp
    | Log
    | Erf
    | Shuffle
    | Dot
    | DotDiff
    | Cast
    | Bitcast
    | PairSum
    | RoundEven
    | Clamp
    | HighMul
    | RoundShift
)


@dataclass(frozen=True)
class Assign:
    reg: str
    value: Value


@dataclass(frozen=True)
class Store:
    """Store the first `count` (0: all) of `lanes` elements of value at buffer[index]."""

    buffer: str
    index: Affine
    value: Value
    lanes: int = 1
    count: int = 0

    @property
    def valid(self) -> int:
        return self.count or self.lanes


@dataclass(frozen=True)
class Prefetch:
    """A hint to bring the cache line holding buffer[index] toward the core (LLVM's llvm.prefetch): no
    value, no fault, no effect on results; an index past the buffer's end is allowed (never read)."""

    buffer: str
    index: Affine


class LoopKind(Enum):
    SERIAL = "serial"
    UNROLLED = "unrolled"  # fully unrolled by the lowering, the var becomes a constant


@dataclass(frozen=True)
class For:
    """for var in range(extent): body."""

    var: str
    extent: int
    body: tuple[Stmt, ...]
    kind: LoopKind = LoopKind.SERIAL


Stmt = Assign | Store | Prefetch | For


@dataclass(frozen=True)
class Kernel:
    """One entry point: params are the INPUT/OUTPUT buffers in order; registers are (name, lanes), and
    `register_types` names those that do not hold float32 (an integer accumulator).

    `noalias`: the caller promises the parameters never overlap (C's restrict), which lets LLVM reorder
    loads and stores freely. A kernel that may run in place (an elementwise op whose output is one of its
    inputs, xtune/firmware/memory.py) is built without it."""

    name: str
    buffers: tuple[Buffer, ...]
    registers: tuple[tuple[str, int], ...]
    body: tuple[Stmt, ...]
    noalias: bool = True
    register_types: tuple[tuple[str, DType], ...] = ()

    @property
    def params(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.kind is not BufferKind.LOCAL)

    @property
    def stack_bytes(self) -> int:
        return sum(b.dtype.bytes * b.size for b in self.buffers if b.kind is BufferKind.LOCAL)


class NestBuilder:
    """Builds statement tuples with `with b.loop(...)` blocks, like llvmlite's IRBuilder."""

    def __init__(self) -> None:
        self._stack: list[list[Stmt]] = [[]]
        self._registers: dict[str, int] = {}
        self._types: dict[str, DType] = {}
        self._counter = 0

    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    @contextmanager
    def loop(self, extent: int, prefix: str = "i", kind: LoopKind = LoopKind.SERIAL) -> Iterator[Affine]:
        """A loop over range(extent); yields its variable. An extent of 1 yields the constant 0."""
        if extent == 1:
            yield Affine()
            return
        var = self.fresh(prefix)
        self._stack.append([])
        yield Affine.of(var)
        body = self._stack.pop()
        if extent > 1 and body:
            self.emit(For(var, extent, tuple(body), kind))

    def register(self, name: str, lanes: int, dtype: DType = DType.F32) -> Reg:
        if self._registers.setdefault(name, lanes) != lanes:
            raise ValueError(f"register {name} redeclared with {lanes} lanes")
        if self._types.setdefault(name, dtype) is not dtype:
            raise ValueError(f"register {name} redeclared as {dtype.value}")
        return Reg(name)

    def emit(self, stmt: Stmt) -> None:
        self._stack[-1].append(stmt)

    def assign(self, reg: Reg, value: Value) -> None:
        self.emit(Assign(reg.name, value))

    def store(self, buffer: str, index: Affine, value: Value, lanes: int = 1, count: int = 0) -> None:
        self.emit(Store(buffer, index, value, lanes, 0 if count == lanes else count))

    def prefetch(self, buffer: str, index: Affine) -> None:
        self.emit(Prefetch(buffer, index))

    def split(self, extent: int, tile: int, body: Callable[[Affine, int], None], prefix: str = "t") -> None:
        """Cover range(extent) with tiles of `tile`: a loop over the full ones, then one constant tail."""
        tile = max(1, min(tile, extent))
        full, tail = divmod(extent, tile)
        if full:
            with self.loop(full, prefix) as t:
                body(t * tile, tile)
        if tail:
            body(Affine.of(full * tile), tail)

    def kernel(self, name: str, buffers: tuple[Buffer, ...], noalias: bool = True) -> Kernel:
        assert len(self._stack) == 1, "unclosed loop"
        types = tuple((n, t) for n, t in self._types.items() if t is not DType.F32)
        return Kernel(name, buffers, tuple(self._registers.items()), tuple(self._stack[0]), noalias, types)


def walk(stmts: tuple[Stmt, ...], loops: tuple[For, ...] = ()) -> Iterator[tuple[Stmt, tuple[For, ...]]]:
    """Every statement with the loops around it, outermost first."""
    for stmt in stmts:
        yield stmt, loops
        if isinstance(stmt, For):
            yield from walk(stmt.body, (*loops, stmt))
