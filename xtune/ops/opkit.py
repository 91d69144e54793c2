"""The pieces every generated operator (xtune/ops/generated.py, xtune/ops/pooling.py) is built from:
size checks, the kernel's pointer parameters, vector loops over contiguous memory, horizontal reductions."""

from __future__ import annotations

from collections.abc import Callable

from xtune.errors import InputError
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Load,
    LoopKind,
    NestBuilder,
    Reg,
    Value,
)

Shape = tuple[int, ...]
UNROLL = 4  # vectors per iteration of an elementwise loop: enough independent work to hide latency


def positive(op: str, **sizes: int) -> None:
    for name, value in sizes.items():
        if value < 1:
            raise InputError(f"{op}: '{name}' must be a positive integer, got {value}")


def params(inputs: list[tuple[str, int]], output: int) -> tuple[Buffer, ...]:
    return (*(Buffer(n, s, BufferKind.INPUT) for n, s in inputs), Buffer("out", output, BufferKind.OUTPUT))


def vector_map(b: NestBuilder, size: int, lanes: int, emit: Callable[[Affine, int, int], None]) -> None:
    """Calls emit(index, lanes, count) over range(size): UNROLL vectors per loop iteration, then the rest,
    the last vector partial (count < lanes) where size is not a multiple of lanes."""

    def block(base: Affine, n: int) -> None:
        if n == UNROLL * lanes:
            with b.loop(UNROLL, "u", LoopKind.UNROLLED) as u:
                emit(base + u * lanes, lanes, lanes)
            return
        for start in range(0, n, lanes):
            emit(base + start, lanes, min(lanes, n - start))

    b.split(size, UNROLL * lanes, block, "v")


def hsum_or_max(b: NestBuilder, acc: Reg, lanes: int, op: BinaryOp) -> Value:
    """The lanes of vector register `acc` reduced to one scalar, through a stack slot."""
    if lanes == 1:
        return acc
    b.store("red", Affine(), acc, lanes)
    total: Value = Load("red", Affine())
    for lane in range(1, lanes):
        total = Binary(op, total, Load("red", Affine.of(lane)))
    return total
