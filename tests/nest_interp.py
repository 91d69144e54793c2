"""A slow reference interpreter of the loop-nest IR, so templates can be checked without LLVM: float32
lanes, and the integer lanes of int8 kernels in numpy's integer types (which wrap as LLVM's do)."""

from __future__ import annotations

import math

import numpy as np

from xtune.ops.opkit import GeneratedOp
from xtune.ops.qmatmul import reference as qref
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
    DotInsn,
    DType,
    Erf,
    Exp,
    For,
    HighMul,
    Kernel,
    Lanes,
    Load,
    Log,
    MulAdd,
    PairSum,
    Reg,
    RoundEven,
    RoundShift,
    Shuffle,
    Stmt,
    Store,
    Value,
)

NUMPY = {
    DType.F32: np.float32,
    DType.I8: np.int8,
    DType.U8: np.uint8,
    DType.I16: np.int16,
    DType.I32: np.int32,
    DType.I64: np.int64,
}
INT_OPS = {
    BinaryOp.AND: np.bitwise_and,
    BinaryOp.XOR: np.bitwise_xor,
    BinaryOp.SHL: np.left_shift,
    BinaryOp.SHR: np.right_shift,
}


def dot(v: Dot, acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`Dot`'s contract: 4 products per group into each lane, or (SADALP) 2 per lane of a 2x accumulator."""
    a = np.tile(a, b.size // a.size).astype(np.int64)
    products = a * b.astype(np.int64)
    per = 2 if v.insn is DotInsn.SADALP else 4
    return (acc.astype(np.int64) + products.reshape(-1, per).sum(axis=1)).astype(np.int32)


def dot_diff(acc: np.ndarray, a0: np.ndarray, b0: np.ndarray, a1: np.ndarray, b1: np.ndarray) -> np.ndarray:
    """`DotDiff`'s contract: the i16 lanes a0 b0 - a1 b1 (checked to fit, as smlsl leaves them), pair-added
    into the i32 lanes."""
    lanes = [
        np.tile(a, b.size // a.size).astype(np.int64) * b.astype(np.int64) for a, b in ((a0, b0), (a1, b1))
    ]
    diff = lanes[0] - lanes[1]
    assert np.abs(diff).max() <= 32767, "an i16 lane of smlsl overflowed"
    return (acc.astype(np.int64) + diff.reshape(-1, 2).sum(axis=1)).astype(np.int32)


def integer(v: Value, args: list[np.ndarray]) -> np.ndarray:
    """The values of int8 kernels, on their operands' arrays."""
    if isinstance(v, Dot):
        return dot(v, *args)
    if isinstance(v, DotDiff):
        return dot_diff(*args)
    if isinstance(v, Cast):
        x = np.trunc(args[0]) if args[0].dtype.kind == "f" and v.dtype is not DType.F32 else args[0]
        return x.astype(NUMPY[v.dtype])
    if isinstance(v, Bitcast):  # numpy views bytes little-endian on every host this runs on
        return np.ascontiguousarray(args[0]).view(NUMPY[v.dtype])
    if isinstance(v, PairSum):
        return (args[0][0::2] + args[0][1::2]).astype(args[0].dtype)
    if isinstance(v, RoundEven):
        return np.rint(args[0])
    if isinstance(v, Clamp):
        return np.minimum(np.maximum(args[0], args[1]), args[2])
    if isinstance(v, HighMul):
        return qref.saturating_rounding_doubling_high_mul(*args)
    assert isinstance(v, RoundShift)
    return qref.rounding_divide_by_pot(args[0], args[1])


def operands(v: Value) -> list[Value]:
    if isinstance(v, Dot):
        return [v.acc, v.a, v.b]
    if isinstance(v, DotDiff):
        return [v.acc, v.a0, v.b0, v.a1, v.b1]
    if isinstance(v, Clamp):
        return [v.a, v.lo, v.hi]
    if isinstance(v, HighMul):
        return [v.a, v.b]
    if isinstance(v, RoundShift):
        return [v.a, v.shift]
    assert isinstance(v, Cast | Bitcast | PairSum | RoundEven)
    return [v.a]


def run_kernel(kernel: Kernel, params: list[np.ndarray]) -> None:
    """Executes `kernel` on flat arrays of its buffers' types (outputs updated in place); poisons scratch
    (NaN, or 0x5A bytes for integers)."""
    buffers = {b.name: p.reshape(-1) for b, p in zip(kernel.params, params, strict=True)}
    for b in kernel.buffers:
        if b.kind is BufferKind.LOCAL:
            poison = np.nan if b.dtype is DType.F32 else 0x5A
            buffers[b.name] = np.full(b.size, poison, dtype=NUMPY[b.dtype])
    regs: dict[str, np.ndarray] = {}

    def index(a: Affine, env: dict[str, int]) -> int:
        return a.const + sum(c * env[v] for v, c in a.terms)

    def group(v: Value, env: dict[str, int]) -> np.ndarray:
        if isinstance(v, Broadcast):
            return value(v.value, env)[4 * v.lane : 4 * v.lane + 4]
        return value(v, env)

    def value(v: Value, env: dict[str, int]) -> np.ndarray:
        if isinstance(v, Load):
            i = index(v.index, env)
            out = np.zeros(v.lanes, dtype=buffers[v.buffer].dtype)
            assert i >= 0 and i + v.valid <= buffers[v.buffer].size, f"out of bounds read of {v.buffer}"
            out[: v.valid] = buffers[v.buffer][i : i + v.valid]
            return out
        if isinstance(v, Const):
            return np.full(v.lanes, v.value, dtype=NUMPY[v.dtype])
        if isinstance(v, Reg):
            return regs[v.name].copy()
        if isinstance(v, Broadcast):
            source = value(v.value, env)
            return np.full(v.lanes, source[v.lane], dtype=source.dtype)
        if isinstance(v, MulAdd):
            return value(v.a, env) * value(v.b, env) + value(v.c, env)
        if isinstance(v, Exp):
            return np.exp(value(v.a, env))
        if isinstance(v, Log):
            return np.log(value(v.a, env))
        if isinstance(v, Lanes):
            return np.array(v.values, np.float32)
        if isinstance(v, Erf):  # the lowering's own erf is checked on boards (tests/test_ops_activations.py)
            return np.array([math.erf(a) for a in value(v.a, env).tolist()], np.float32)
        if isinstance(v, Shuffle):
            return np.concatenate([value(v.a, env), value(v.b, env)])[list(v.mask)]
        if isinstance(v, Dot | DotDiff):  # a Broadcast operand is a group (4 bytes) of its vector
            return integer(v, [group(x, env) for x in operands(v)])
        if not isinstance(v, Binary):
            return integer(v, [value(x, env) for x in operands(v)])
        a, b = value(v.a, env), value(v.b, env)
        if v.op in INT_OPS:
            return INT_OPS[v.op](a, b.astype(a.dtype))
        ops = {
            BinaryOp.ADD: np.add,
            BinaryOp.SUB: np.subtract,
            BinaryOp.MUL: np.multiply,
            BinaryOp.DIV: np.divide,
            BinaryOp.MAX: np.maximum,
            BinaryOp.MIN: np.minimum,
        }
        return ops[v.op](a, b).astype(a.dtype)

    def run(stmts: tuple[Stmt, ...], env: dict[str, int]) -> None:
        for s in stmts:
            if isinstance(s, For):
                for i in range(s.extent):
                    run(s.body, {**env, s.var: i})
            elif isinstance(s, Assign):
                regs[s.reg] = value(s.value, env)
            elif isinstance(s, Store):
                i = index(s.index, env)
                assert i >= 0 and i + s.valid <= buffers[s.buffer].size, f"out of bounds write to {s.buffer}"
                buffers[s.buffer][i : i + s.valid] = value(s.value, env)[: s.valid]

    run(kernel.body, {})


def check_one_input_op(op: GeneratedOp, x: np.ndarray, want: np.ndarray, lanes: tuple[int, ...]) -> None:
    """A one-input operator's numpy reference, and its nest interpreted at each lane count, give `want`."""
    np.testing.assert_array_equal(op.reference(x), want)
    for width in lanes:
        out = np.zeros_like(want)
        run_kernel(op.kernel_nest("op", width), [x, out])
        np.testing.assert_array_equal(out, want, err_msg=f"{width} lanes")
