"""A slow reference interpreter of the loop-nest IR, so templates can be checked without LLVM."""

from __future__ import annotations

import numpy as np

from xtune.schedule.loopnest import (
    Affine,
    Assign,
    BinaryOp,
    Broadcast,
    BufferKind,
    Const,
    Exp,
    For,
    Kernel,
    Load,
    MulAdd,
    Reg,
    Shuffle,
    Stmt,
    Store,
    Value,
)  # fmt: skip


def run_kernel(kernel: Kernel, params: list[np.ndarray]) -> None:
    """Executes `kernel` on flat float32 arrays (outputs updated in place); NaN-poisons scratch."""
    buffers = {b.name: p.reshape(-1) for b, p in zip(kernel.params, params, strict=True)}
    for b in kernel.buffers:
        if b.kind is BufferKind.LOCAL:
            buffers[b.name] = np.full(b.size, np.nan, dtype=np.float32)
    regs: dict[str, np.ndarray] = {}

    def index(a: Affine, env: dict[str, int]) -> int:
        return a.const + sum(c * env[v] for v, c in a.terms)

    def value(v: Value, env: dict[str, int]) -> np.ndarray:
        if isinstance(v, Load):
            i = index(v.index, env)
            out = np.zeros(v.lanes, dtype=np.float32)
            assert i >= 0 and i + v.valid <= buffers[v.buffer].size, f"out of bounds read of {v.buffer}"
            out[: v.valid] = buffers[v.buffer][i : i + v.valid]
            return out
        if isinstance(v, Const):
            return np.full(v.lanes, v.value, dtype=np.float32)
        if isinstance(v, Reg):
            return regs[v.name].copy()
        if isinstance(v, Broadcast):
            return np.full(v.lanes, value(v.value, env)[v.lane], dtype=np.float32)
        if isinstance(v, MulAdd):
            return value(v.a, env) * value(v.b, env) + value(v.c, env)
        if isinstance(v, Exp):
            return np.exp(value(v.a, env))
        if isinstance(v, Shuffle):
            return np.concatenate([value(v.a, env), value(v.b, env)])[list(v.mask)]
        a, b = value(v.a, env), value(v.b, env)
        ops = {BinaryOp.ADD: np.add, BinaryOp.SUB: np.subtract, BinaryOp.MUL: np.multiply,
               BinaryOp.DIV: np.divide, BinaryOp.MAX: np.maximum, BinaryOp.MIN: np.minimum}  # fmt: skip
        return ops[v.op](a, b)

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
