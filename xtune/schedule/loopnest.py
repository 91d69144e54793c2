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


class BufferKind(Enum):
    INPUT = "input"
    OUTPUT = "output"
    LOCAL = "local"  # scratch on the kernel's stack (packed panels)


@dataclass(frozen=True)
class Buffer:
    name: str
    size: int  # float32 elements
    kind: BufferKind


class BinaryOp(Enum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"


@dataclass(frozen=True)
class Load:
    """`lanes` consecutive floats from buffer[index]; only the first `count` are read, the rest are 0."""

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
class Shuffle:
    """Lanes picked from two vectors of equal width (LLVM shufflevector): `mask[i]` < lanes picks lane
    mask[i] of `a`, else lane mask[i] - lanes of `b`. A deinterleave (stride-2 packing) is one of these."""

    a: Value
    b: Value
    mask: tuple[int, ...]


Value = Load | Const | Broadcast | Reg | Binary | MulAdd | Exp | Shuffle


@dataclass(frozen=True)
class Assign:
    reg: str
    value: Value


@dataclass(frozen=True)
class Store:
    """Store the first `count` (0: all) of `lanes` floats of value at buffer[index]."""

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
    """One entry point: params are the INPUT/OUTPUT buffers in order; registers are (name, lanes).

    `noalias`: the caller promises the parameters never overlap (C's restrict), which lets LLVM reorder
    loads and stores freely. A kernel that may run in place (an elementwise op whose output is one of its
    inputs, xtune/firmware/memory.py) is built without it."""

    name: str
    buffers: tuple[Buffer, ...]
    registers: tuple[tuple[str, int], ...]
    body: tuple[Stmt, ...]
    noalias: bool = True

    @property
    def params(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.kind is not BufferKind.LOCAL)

    @property
    def stack_bytes(self) -> int:
        return sum(4 * b.size for b in self.buffers if b.kind is BufferKind.LOCAL)


class NestBuilder:
    """Builds statement tuples with `with b.loop(...)` blocks, like llvmlite's IRBuilder."""

    def __init__(self) -> None:
        self._stack: list[list[Stmt]] = [[]]
        self._registers: dict[str, int] = {}
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

    def register(self, name: str, lanes: int) -> Reg:
        if self._registers.setdefault(name, lanes) != lanes:
            raise ValueError(f"register {name} redeclared with {lanes} lanes")
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
        return Kernel(name, buffers, tuple(self._registers.items()), tuple(self._stack[0]), noalias)


def walk(stmts: tuple[Stmt, ...], loops: tuple[For, ...] = ()) -> Iterator[tuple[Stmt, tuple[For, ...]]]:
    """Every statement with the loops around it, outermost first."""
    for stmt in stmts:
        yield stmt, loops
        if isinstance(stmt, For):
            yield from walk(stmt.body, (*loops, stmt))
