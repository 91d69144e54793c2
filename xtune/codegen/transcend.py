"""Transcendental functions for the lowering: an fp32 operand (scalar or vector) in, the LLVM IR text of
e**x, ln x or erf x computed with native instructions out (libm's expf/logf would be undefined symbols in a
freestanding object), and the float constants they and the lowering write."""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import cache
from typing import Protocol

Operand = tuple[str, int]  # (LLVM operand text without its type, fp32 lanes)

# exp: ln(FLT_MAX); ln(2**-150), below which e**x rounds to 0 in float32; log2(e); ln 2 = _LN2_HI +
# _LN2_LO with _LN2_HI exact in 9 bits; Cephes expf's polynomial, highest first.
_EXP_HI, _EXP_LO = 88.72283905206835, -103.97207708399179
_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
# log: Cephes logf's minimax polynomial for ln(1 + x) = x - x^2/2 + x^3 P(x), |x| <= sqrt(2)/2 - 1 ...
# sqrt(2) - 1, highest first; sqrt(1/2), where the mantissa is folded so that |x| stays that small.
_LOG_POLY = (
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)
_SQRT_HALF = 0.707106781186547524
# erf: the float32 minimax fits of Arm's Optimized Routines (github.com/ARM-software/optimized-routines,
# math/erff_data.c, erff_poly_A and erff_poly_B; N. Juffa's faithfully rounded erff), highest first. Below
# _ERF_SPLIT, erf(x) = x + x p(x^2); above it erf(t) = 1 - e^-(t + t q(t)) for t = |x| (the exponent keeps
# the tail's relative error small where 1 - erf is). Evaluated in float32 with FMAs they stay within 8.1e-8
# of a float64 erf in relative error (numpy sweep, docs/design.md "The loop-nest IR"); Erf(_ERF_BIG_END) is
# 1 in float32.
_ERF_SMALL = tuple(
    float.fromhex(h)
    for h in ("-0x1.3a1a82p-11", "0x1.473f48p-08", "-0x1.b68bd2p-06", "0x1.ce1a46p-04", "-0x1.8126e0p-02")
)
_ERF_SMALL_LAST = float.fromhex("0x1.06eba6p-03")  # 2/sqrt(pi) - 1
_ERF_BIG = tuple(
    float.fromhex(h)
    for h in ("0x1.222900p-16", "-0x1.91d2ccp-12", "0x1.fd1336p-09", "-0x1.8d6300p-06", "0x1.b55cb0p-4")
)
_ERF_BIG_TAIL = (float.fromhex("0x1.450aa0p-1"), float.fromhex("0x1.079d0cp-3"))
_ERF_SPLIT = 0.921875
_ERF_BIG_END = 4.0


class Emitter(Protocol):
    """What the functions write through: the lowering of one function (xtune/codegen/lower.py)."""

    def define(self, instruction: str) -> str: ...
    def select(self, a: str, pred: str, b: str, then: str, other: str, lanes: int) -> str: ...
    def fmuladd(self, a: str, b: str, c: str, lanes: int) -> str: ...


@cache
def ftype(lanes: int) -> str:
    return "float" if lanes == 1 else f"<{lanes} x float>"


def float_literal(value: float) -> str:
    """LangRef "Simple Constants": a float constant in hex is the 64-bit pattern of the double holding
    the float's exact value; decimal would have to be exact too. Cached by the float's bits: 0.0 and -0.0
    are equal keys to a cache of values."""
    return _bits_literal(struct.pack("<f", value))


@cache
def _bits_literal(bits: bytes) -> str:
    exact = struct.unpack("<f", bits)[0]
    return f"0x{struct.unpack('<Q', struct.pack('<d', exact))[0]:016X}"


@cache
def constant(value: float, lanes: int) -> str:
    if value == 0.0 and not str(value).startswith("-"):
        return "0.0" if lanes == 1 else "zeroinitializer"
    scalar = float_literal(value)
    return scalar if lanes == 1 else "<" + ", ".join([f"float {scalar}"] * lanes) + ">"


def _int(value: int, lanes: int) -> str:
    return str(value) if lanes == 1 else "<" + ", ".join([f"i32 {value}"] * lanes) + ">"


def _helpers(
    e: Emitter, lanes: int
) -> tuple[str, str, Callable[[float], str], Callable[[str, str, str], str]]:
    """The float and i32 types of `lanes` lanes, their float constant, and a fused multiply-add."""

    def c(value: float) -> str:
        return constant(value, lanes)

    def fma(a: str, b: str, addend: str) -> str:
        return e.fmuladd(a, b, addend, lanes)

    return ftype(lanes), "i32" if lanes == 1 else f"<{lanes} x i32>", c, fma


def exp(e: Emitter, operand: Operand, in_range: bool = False) -> Operand:
    """e**x without libm, after Cephes' expf (S. L. Moshier, "Methods and Programs for Mathematical
    Functions", 1989): Cody-Waite reduction x = n ln2 + r with ln2 split in two so that n * _LN2_HI is
    exact (W. J. Cody and W. Waite, "Software Manual for the Elementary Functions", 1980), |r| <= ln2/2,
    e**r by Cephes' degree-7 minimax polynomial, then times 2**n built in the exponent bits. 2**n is
    applied as two factors so that n from -150 to 128 (subnormal results to FLT_MAX) stays in range.
    Beyond the range: +inf above ln(FLT_MAX), 0 below ln of half the smallest subnormal; a caller whose
    operand is always within (`in_range`: finite, from -87 to 88, normal results) skips those checks."""
    x, lanes = operand
    ty, ity, c, fma = _helpers(e, lanes)

    clamped = x
    if not in_range:
        clamped = e.select(x, "olt", c(_EXP_LO), c(_EXP_LO), x, lanes)
        clamped = e.select(clamped, "ogt", c(_EXP_HI), c(_EXP_HI), clamped, lanes)
    t = e.define(f"fmul {ty} {clamped}, {c(_LOG2E)}")
    half = e.select(t, "olt", c(0.0), c(-0.5), c(0.5), lanes)  # round half away from zero
    n = e.define(f"fptosi {ty} {e.define(f'fadd {ty} {t}, {half}')} to {ity}")
    nf = e.define(f"sitofp {ity} {n} to {ty}")
    r = fma(nf, c(-_LN2_HI), clamped)
    r = fma(nf, c(-_LN2_LO), r)
    poly = c(_EXP_POLY[0])
    for coeff in _EXP_POLY[1:]:
        poly = fma(poly, r, c(coeff))
    z = e.define(f"fmul {ty} {r}, {r}")
    y = e.define(f"fadd {ty} {fma(poly, z, r)}, {c(1.0)}")
    n1 = e.define(f"ashr {ity} {n}, {_int(1, lanes)}")
    n2 = e.define(f"sub {ity} {n}, {n1}")
    for part in (n1, n2):
        bits = e.define(f"shl {ity} {e.define(f'add {ity} {part}, {_int(127, lanes)}')}, {_int(23, lanes)}")
        y = e.define(f"fmul {ty} {y}, {e.define(f'bitcast {ity} {bits} to {ty}')}")
    if in_range:
        return y, lanes
    y = e.select(x, "ogt", c(_EXP_HI), c(float("inf")), y, lanes)
    return e.select(x, "olt", c(_EXP_LO), c(0.0), y, lanes), lanes


def log(e: Emitter, operand: Operand) -> Operand:
    """ln x of a positive normal float without libm, after Cephes' logf (Moshier, as `exp`): x = m 2**k
    with m in [sqrt(1/2), sqrt(2)) read from the IEEE-754 bits, ln m = f - f^2/2 + f^3 P(f) with f = m - 1
    by Cephes' degree-8 minimax polynomial (relative error about 1e-7 in float32), plus k ln 2 with ln 2
    split as in `exp`. Zero, negative, subnormal, infinite and NaN inputs are not handled: a caller
    guarantees its operand is a positive normal float."""
    x, lanes = operand
    ty, ity, c, fma = _helpers(e, lanes)

    bits = e.define(f"bitcast {ty} {x} to {ity}")
    biased = e.define(f"lshr {ity} {bits}, {_int(23, lanes)}")
    k = e.define(f"sitofp {ity} {e.define(f'sub {ity} {biased}, {_int(126, lanes)}')} to {ty}")
    mantissa = e.define(
        f"or {ity} {e.define(f'and {ity} {bits}, {_int(0x007FFFFF, lanes)}')}, {_int(0x3F000000, lanes)}"
    )
    m = e.define(f"bitcast {ity} {mantissa} to {ty}")  # in [1/2, 1)
    small = e.select(m, "olt", c(_SQRT_HALF), c(1.0), c(0.0), lanes)  # fold m below sqrt(1/2) to 2m
    k = e.define(f"fsub {ty} {k}, {small}")
    f = fma(m, e.define(f"fadd {ty} {small}, {c(1.0)}"), c(-1.0))
    z = e.define(f"fmul {ty} {f}, {f}")
    poly = c(_LOG_POLY[0])
    for coeff in _LOG_POLY[1:]:
        poly = fma(poly, f, c(coeff))
    y = e.define(f"fmul {ty} {e.define(f'fmul {ty} {poly}, {f}')}, {z}")
    y = fma(k, c(_LN2_LO), y)
    y = fma(z, c(-0.5), y)
    return fma(k, c(_LN2_HI), e.define(f"fadd {ty} {f}, {y}")), lanes


def erf(e: Emitter, operand: Operand) -> Operand:
    """erf x without libm, by Juffa's two minimax forms (the constants above): both are computed and each
    lane takes the one for its |x|; the tail's form uses `exp` and takes the sign of x back from its bits.
    |x| is clamped to _ERF_BIG_END first, where erf is 1 in float32, so that q(t) cannot overflow."""
    x, lanes = operand
    ty, ity, c, fma = _helpers(e, lanes)

    bits = e.define(f"bitcast {ty} {x} to {ity}")
    t = e.define(f"bitcast {ity} {e.define(f'and {ity} {bits}, {_int(0x7FFFFFFF, lanes)}')} to {ty}")
    t = e.select(t, "olt", c(_ERF_BIG_END), t, c(_ERF_BIG_END), lanes)
    s = e.define(f"fmul {ty} {t}, {t}")
    # |x| <= _ERF_SPLIT: x + x p(x^2) (there t = |x|, not clamped, and s = x^2)
    p = c(_ERF_SMALL[0])
    for coeff in (*_ERF_SMALL[1:], _ERF_SMALL_LAST):
        p = fma(p, s, c(coeff))
    small = fma(p, x, x)
    # |x| > _ERF_SPLIT: q(t) split in two halves as Juffa evaluates it (shorter dependency chain)
    q = fma(fma(c(_ERF_BIG[0]), t, c(_ERF_BIG[1])), s, fma(c(_ERF_BIG[2]), t, c(_ERF_BIG[3])))
    for coeff in (_ERF_BIG[4], *_ERF_BIG_TAIL):
        q = fma(q, t, c(coeff))
    exponent = e.define(f"fneg {ty} {fma(q, t, t)}")
    tail = e.define(f"fsub {ty} {c(1.0)}, {exp(e, (exponent, lanes), in_range=True)[0]}")
    sign = e.define(f"and {ity} {bits}, {_int(-0x80000000, lanes)}")
    signed = e.define(f"or {ity} {e.define(f'bitcast {ty} {tail} to {ity}')}, {sign}")
    big = e.define(f"bitcast {ity} {signed} to {ty}")
    return e.select(t, "ogt", c(_ERF_SPLIT), big, small, lanes), lanes
