"""Lowering of integer lanes: the loop-nest IR's integer values (Dot, Cast, HighMul, RoundShift, integer
Binary ops) in, LLVM IR instructions out, each as the target's instruction where it has one.

`xtune.codegen.lower` calls in here for every value that is not float32; this module owns the element
types of the text (LangRef "Integer Type": integers are signless, so U8 is an i8 whose widening,
comparisons and right shifts are made unsigned here). Every sequence is exact: no lane saturates.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Protocol

from xtune.schedule.loopnest import (
    BinaryOp,
    Bitcast,
    Broadcast,
    Cast,
    Clamp,
    Dot,
    DotDiff,
    DotInsn,
    DType,
    HighMul,
    PairSum,
    RoundEven,
    RoundShift,
    Value,
)

Operand = tuple[str, int, DType]  # (LLVM operand text without its type, lanes, element type)
Env = dict[str, str | int]  # loop variable -> an i64 SSA name (serial loop) or a constant (unrolled)

SCALAR = {
    DType.F32: "float",
    DType.I8: "i8",
    DType.U8: "i8",
    DType.I16: "i16",
    DType.I32: "i32",
    DType.I64: "i64",
}
_BITS = {DType.I8: 8, DType.U8: 8, DType.I16: 16, DType.I32: 32, DType.I64: 64, DType.F32: 32}


@cache
def vtype(lanes: int, dtype: DType = DType.F32) -> str:
    scalar = SCALAR[dtype]
    return scalar if lanes == 1 else f"<{lanes} x {scalar}>"


def splat_int(value: int, lanes: int, dtype: DType) -> str:
    """An integer constant in every lane."""
    return str(value) if lanes == 1 else "<" + ", ".join([f"{SCALAR[dtype]} {value}"] * lanes) + ">"


class Emitter(Protocol):
    """What this module needs of the function being lowered (lower._FunctionLowering)."""

    declarations: set[str]
    pure: dict[tuple[object, ...], str]

    def define(self, instruction: str) -> str: ...
    def value(self, v: Value, env: Env) -> Operand: ...
    def broadcast(self, scalar: str, lanes: int, dtype: DType = DType.F32) -> str: ...
    def lane_splat(self, vector: str, width: int, lanes: int, lane: int, dtype: DType) -> str: ...
    def select(
        self, a: str, pred: str, b: str, then: str, other: str, lanes: int, dtype: DType = DType.F32
    ) -> str: ...


def lower_integer(
    fl: Emitter,
    v: Dot | DotDiff | Cast | Bitcast | PairSum | RoundEven | Clamp | HighMul | RoundShift,
    env: Env,
) -> Operand:
    if isinstance(v, Dot):
        return _dot(fl, v, env)
    if isinstance(v, DotDiff):
        return _dot_diff(fl, v, env)
    if isinstance(v, Cast) and isinstance(v.a, RoundEven) and v.dtype is DType.I32:
        return _round_to_int(fl, v.a, env)
    if isinstance(v, Cast):
        return cast(fl, fl.value(v.a, env), v.dtype), fl.value(v.a, env)[1], v.dtype
    if isinstance(v, Bitcast):
        text, lanes, dtype = fl.value(v.a, env)
        n = lanes * _BITS[dtype] // _BITS[v.dtype]
        return fl.define(f"bitcast {vtype(lanes, dtype)} {text} to {vtype(n, v.dtype)}"), n, v.dtype
    if isinstance(v, RoundEven):
        text, lanes, _ = fl.value(v.a, env)
        ty = vtype(lanes, DType.F32)
        name = f"llvm.roundeven.{'f32' if lanes == 1 else f'v{lanes}f32'}"
        fl.declarations.add(f"declare {ty} @{name}({ty})")
        return fl.define(f"call {ty} @{name}({ty} {text})"), lanes, DType.F32
    if isinstance(v, Clamp):
        return _clamp(fl, v, env)
    if isinstance(v, PairSum):
        text, lanes, dtype = fl.value(v.a, env)
        ty, half = vtype(lanes, dtype), lanes // 2
        even, odd = (shuffle(fl, ty, text, "poison", range(parity, lanes, 2)) for parity in (0, 1))
        return fl.define(f"add {vtype(half, dtype)} {even}, {odd}"), half, dtype
    if isinstance(v, HighMul):
        return _high_mul(fl, fl.value(v.a, env), fl.value(v.b, env)[0])
    return _round_shift(fl, fl.value(v.a, env), fl.value(v.shift, env))


_INT_OPS = {
    BinaryOp.ADD: "add",
    BinaryOp.SUB: "sub",
    BinaryOp.MUL: "mul",
    BinaryOp.AND: "and",
    BinaryOp.XOR: "xor",
    BinaryOp.SHL: "shl",
}
_PMADDWD = {4: "llvm.x86.sse2.pmadd.wd", 8: "llvm.x86.avx2.pmadd.wd", 16: "llvm.x86.avx512.pmaddw.d.512"}


def integer_binary(fl: Emitter, op: BinaryOp, a: str, b: str, lanes: int, dtype: DType) -> str:
    ty = vtype(lanes, dtype)
    if op in (BinaryOp.MAX, BinaryOp.MIN):
        sign = "s" if dtype.signed else "u"
        return fl.select(a, f"{sign}{'gt' if op is BinaryOp.MAX else 'lt'}", b, a, b, lanes, dtype)
    if op is BinaryOp.DIV:
        # C's division, truncated toward zero (LangRef "sdiv"/"udiv"). Kernels divide by constants only
        # (a pooling window's size), which LLVM turns into a multiply-high and shifts (Granlund and
        # Montgomery, "Division by invariant integers using multiplication", PLDI 1994): no divide insn.
        return fl.define(f"{'sdiv' if dtype.signed else 'udiv'} {ty} {a}, {b}")
    name = _INT_OPS.get(op) or ("ashr" if dtype.signed else "lshr")
    return fl.define(f"{name} {ty} {a}, {b}")


def shuffle(fl: Emitter, ty: str, a: str, b: str, lanes: Sequence[int] | range) -> str:
    """LangRef "shufflevector": lanes picked from a ++ b (two values of type `ty`)."""
    mask = ", ".join(f"i32 {i}" for i in lanes)
    return fl.define(f"shufflevector {ty} {a}, {ty} {b}, <{len(lanes)} x i32> <{mask}>")


def cast(fl: Emitter, operand: Operand, to: DType) -> str:
    """LangRef "Conversion Operations": sext/zext by the source's signedness, trunc, sitofp/uitofp, fptosi."""
    text, lanes, src = operand
    if src is to or (not src.is_float and not to.is_float and _BITS[src] == _BITS[to]):
        return text
    if src.is_float:
        op = "fptosi"
    elif to.is_float:
        op = "sitofp" if src.signed else "uitofp"
    elif _BITS[to] > _BITS[src]:
        op = "sext" if src.signed else "zext"
    else:
        op = "trunc"
    return fl.define(f"{op} {vtype(lanes, src)} {text} to {vtype(lanes, to)}")


def _round_to_int(fl: Emitter, v: RoundEven, env: Env) -> Operand:
    """int32 of float lanes rounded half to even, in one conversion instead of a round and a truncation.

    llvm.lrint rounds in the current rounding mode, which LLVM takes to be the default one outside
    strictfp functions (LangRef "Floating-Point Environment"): round to nearest, ties to even, as every
    ABI here starts a process with (x86-64 psABI 3.2.1: MXCSR RC = 00; the RISC-V ISA manual's frm RNE
    = 000, which Linux sets at exec) and xtune never changes. It is cvtps2dq on x86 and vfcvt.x.f.v on
    RVV without the fsrmi/fsrm pair llvm.roundeven needs there; AArch64 lowers it to frintx + fcvtzs, so
    there `fcvtns` takes FCVTNS itself (Arm ARM: round to nearest with ties to even, whatever FPCR
    says). Callers clamp first: no lane is NaN or outside the int32 range, where the instructions differ."""
    text, lanes, _ = fl.value(v.a, env)
    if v.fcvtns and lanes > 4:  # NEON registers hold 4 lanes: convert quarter by quarter, then rejoin
        assert lanes % 4 == 0, f"{lanes} lanes are no whole NEON registers"
        parts = [shuffle(fl, vtype(lanes), text, "poison", range(i, i + 4)) for i in range(0, lanes, 4)]
        words = [_convert(fl, part, 4, "llvm.aarch64.neon.fcvtns.v4i32.v4f32") for part in parts]
        return _concat(fl, words, 4), lanes, DType.I32
    if v.fcvtns:
        name = "llvm.aarch64.neon.fcvtns." + ("i32.f32" if lanes == 1 else f"v{lanes}i32.v{lanes}f32")
    else:
        name = "llvm.lrint." + ("i32.f32" if lanes == 1 else f"v{lanes}i32.v{lanes}f32")
    return _convert(fl, text, lanes, name), lanes, DType.I32


def _concat(fl: Emitter, parts: list[str], width: int) -> str:
    """One <len(parts) * width x i32> of the parts (each <width x i32>) in order: pairs joined by
    shufflevector, whose operands share one type, so an odd last part is first padded with poison."""
    widths = [width] * len(parts)
    while len(parts) > 1:
        joined, sizes = [], []
        for i in range(0, len(parts), 2):
            if i + 1 == len(parts):
                joined.append(parts[i])
                sizes.append(widths[i])
                continue
            a, b, wa, wb = parts[i], parts[i + 1], widths[i], widths[i + 1]
            if wb < wa:  # lanes wb.. of the padded b are the poison operand's
                b = shuffle(fl, vtype(wb, DType.I32), b, "poison", [*range(wb), *[wb] * (wa - wb)])
            joined.append(shuffle(fl, vtype(wa, DType.I32), a, b, [*range(wa), *range(wa, wa + wb)]))
            sizes.append(wa + wb)
        parts, widths = joined, sizes
    return parts[0]


def _convert(fl: Emitter, text: str, lanes: int, name: str) -> str:
    ty, ity = vtype(lanes, DType.F32), vtype(lanes, DType.I32)
    fl.declarations.add(f"declare {ity} @{name}({ty})")
    return fl.define(f"call {ity} @{name}({ty} {text})")


def _clamp(fl: Emitter, v: Clamp, env: Env) -> Operand:
    """max(lo) then min(hi): nnan lets LLVM select the bare vmaxps/vminps (whose NaN rule would otherwise
    need a fix-up) and their NEON and RVV counterparts; float compares, which QEMU 7.2 aborts on in some
    RVV code (qemu-project issue 1441), are not needed."""
    x, lanes, dtype = fl.value(v.a, env)
    ty = vtype(lanes, dtype)
    suffix = "f32" if lanes == 1 else f"v{lanes}f32"
    for name, bound in (("maxnum", v.lo), ("minnum", v.hi)):
        fl.declarations.add(f"declare {ty} @llvm.{name}.{suffix}({ty}, {ty})")
        x = fl.define(f"call nnan {ty} @llvm.{name}.{suffix}({ty} {x}, {ty} {fl.value(bound, env)[0]})")
    return x, lanes, dtype


def _words(fl: Emitter, operand: Operand, lanes: int) -> str:
    """An operand of 4 * lanes bytes as <lanes x i32>; one of 4 bytes is that group in every lane."""
    text, n, dtype = operand
    if n == 4 * lanes:
        return fl.define(f"bitcast {vtype(n, dtype)} {text} to {vtype(lanes, DType.I32)}")
    assert n == 4, f"a dot operand holds 4 or {4 * lanes} bytes, not {n}"
    word = fl.define(f"bitcast <4 x i8> {text} to i32")
    return fl.broadcast(word, lanes, DType.I32)


def _group(fl: Emitter, a: Broadcast, env: Env, lanes: int) -> Operand:
    """A `Broadcast` dot operand: group `a.lane` (4 bytes) of a loaded vector in each of `lanes` i32 lanes,
    as a shuffle whose mask is that group everywhere (AArch64 folds it into SDOT by element, or a DUP
    from the lane where the instruction has no by-element form)."""
    text, n, dtype = fl.value(a.value, env)
    words = fl.define(f"bitcast {vtype(n, dtype)} {text} to {vtype(n // 4, DType.I32)}")
    splat = fl.lane_splat(words, n // 4, lanes, a.lane, DType.I32)
    return (
        fl.define(f"bitcast {vtype(lanes, DType.I32)} {splat} to {vtype(4 * lanes, dtype)}"),
        4 * lanes,
        dtype,
    )


def _operand(fl: Emitter, a: Value, env: Env, lanes: int) -> Operand:
    """A dot's left operand: a group of a vector (`_group`) or the value itself."""
    return _group(fl, a, env, lanes) if isinstance(a, Broadcast) else fl.value(a, env)


def _dot(fl: Emitter, v: Dot, env: Env) -> Operand:
    acc, lanes, _ = fl.value(v.acc, env)
    sadalp = v.insn is DotInsn.SADALP  # its accumulator has 2 lanes per group
    a = _operand(fl, v.a, env, lanes // 2 if sadalp else lanes)
    b = fl.value(v.b, env)
    if sadalp:
        return _sadalp(fl, acc, a, b, lanes), lanes, DType.I32
    assert b[1] == 4 * lanes, "b holds 4 bytes per accumulator lane"
    aw, bw = _words(fl, a, lanes), _words(fl, b, lanes)
    signed = (a[2].signed, b[2].signed)
    if v.insn is DotInsn.VPDPBUSD:
        # Intel SDM, VPDPBUSD: each i32 lane += 4 products of an unsigned byte of src2 and the signed
        # byte of src3 (LLVM's operand order: acc, the u8 words, the s8 words); no saturation.
        assert signed == (False, True), "vpdpbusd multiplies u8 by s8"
        ty = vtype(lanes, DType.I32)
        name = f"llvm.x86.avx512.vpdpbusd.{32 * lanes}"
        fl.declarations.add(f"declare {ty} @{name}({ty}, {ty}, {ty})")
        return fl.define(f"call {ty} @{name}({ty} {acc}, {ty} {aw}, {ty} {bw})"), lanes, DType.I32
    if v.insn is DotInsn.SDOT:
        # Arm ARM, SDOT/UDOT (vector): each i32 lane += 4 products of the bytes of its 32-bit group.
        assert signed[0] == signed[1] and lanes in (2, 4), "sdot/udot take one signedness, 64/128 bits"
        ty, bty = vtype(lanes, DType.I32), vtype(4 * lanes, DType.I8)
        # The broadcast group second: the operand LLVM's AArch64 patterns match as SDOT's by-element one.
        ab = [fl.define(f"bitcast {ty} {w} to {bty}") for w in (bw, aw)]
        name = f"llvm.aarch64.neon.{'s' if signed[0] else 'u'}dot.v{lanes}i32.v{4 * lanes}i8"
        fl.declarations.add(f"declare {ty} @{name}({ty}, {bty}, {bty})")
        return fl.define(f"call {ty} @{name}({ty} {acc}, {bty} {ab[0]}, {bty} {ab[1]})"), lanes, DType.I32
    if v.insn is DotInsn.PMADDWD:
        return _pmaddwd(fl, acc, (aw, bw), signed, lanes), lanes, DType.I32
    a_bytes = _group_bytes(fl, a, lanes) if a[1] == 4 and lanes > 1 else _lane_bytes(fl, aw, signed[0], lanes)
    b_bytes = _lane_bytes(fl, bw, signed[1], lanes)
    ty = vtype(lanes, DType.I32)
    total = acc
    for at, bt in zip(a_bytes, b_bytes, strict=True):
        total = fl.define(f"add {ty} {total}, {fl.define(f'mul nsw {ty} {at}, {bt}')}")
    return total, lanes, DType.I32


def _pmaddwd(fl: Emitter, acc: str, words: tuple[str, str], signed: tuple[bool, bool], lanes: int) -> str:
    """x86 without VNNI. Each operand's bytes as i16 words: the even bytes (low byte of every word,
    sign-extended by shl 8 + sar 8 or masked) and the odd ones (sar/shr 8). vpmaddwd of the even words
    gives a0*b0 + a2*b2 in each i32 lane, of the odd ones a1*b1 + a3*b3: two vpmaddwd and two adds per
    dot. Exact: |u8 * s8| <= 32640, and vpmaddwd sums its two i16 products in i32 (Intel SDM, PMADDWD:
    only -32768 * -32768 twice overflows). vpmaddubsw would be one instruction fewer, but it saturates
    its pair sums to i16 (255 * -128 * 2 does), which ONNX Runtime's reference does not."""
    wty = vtype(2 * lanes, DType.I16)
    parts = []
    for word, is_signed in zip(words, signed, strict=True):
        halves = fl.pure.get(("bytes16", word, is_signed))
        if halves is None:
            w16 = fl.define(f"bitcast {vtype(lanes, DType.I32)} {word} to {wty}")
            eight = splat_int(8, 2 * lanes, DType.I16)
            if is_signed:
                even = fl.define(f"ashr {wty} {fl.define(f'shl {wty} {w16}, {eight}')}, {eight}")
            else:
                even = fl.define(f"and {wty} {w16}, {splat_int(255, 2 * lanes, DType.I16)}")
            odd = fl.define(f"{'ashr' if is_signed else 'lshr'} {wty} {w16}, {eight}")
            halves = fl.pure[("bytes16", word, is_signed)] = f"{even},{odd}"
        parts.append(halves.split(","))
    ty = vtype(lanes, DType.I32)
    name = _PMADDWD[lanes]
    fl.declarations.add(f"declare {ty} @{name}({wty}, {wty})")
    total = acc
    for half in (0, 1):
        product = fl.define(f"call {ty} @{name}({wty} {parts[0][half]}, {wty} {parts[1][half]})")
        total = fl.define(f"add {ty} {total}, {product}")
    return total


def _sadalp(fl: Emitter, acc: str, a: Operand, b: Operand, lanes: int) -> str:
    """AArch64 without dotprod: the bytes widened and multiplied in i16 (smull/smull2: |s8 * s8| <= 2^14
    and |u8 * s8| <= 32640 fit), then each pair of products added into an i32 lane of the accumulator
    (sadalp, Arm ARM SADALP: no saturation), 16 bytes at a time. 4 instructions per 16 multiply-adds,
    exact for every input; the accumulator's 2 lanes per group are summed once after the reduction."""
    n = b[1]
    assert lanes == n // 2 and not (a[2] is DType.U8 and b[2] is DType.U8), "pairs of u8 x s8 or s8 x s8"
    return _pair_add(fl, acc, _products(fl, a, b), n, lanes)


def _products(fl: Emitter, a: Operand, b: Operand) -> str:
    """The i16 products of b's bytes and a's (a group of 4 bytes repeated to b's length): smull, smull2."""
    n = b[1]
    if a[1] != n:
        a = (
            fl.define(f"bitcast {vtype(n // 4, DType.I32)} {_words(fl, a, n // 4)} to {vtype(n, DType.I8)}"),
            n,
            a[2],
        )
    wide = [cast(fl, x, DType.I16) for x in (a, b)]
    return fl.define(f"mul nsw {vtype(n, DType.I16)} {wide[0]}, {wide[1]}")


def _dot_diff(fl: Emitter, v: DotDiff, env: Env) -> Operand:
    """`DotDiff`: the second group's products subtracted from the first's in i16 (smull + smlsl, smull2 +
    smlsl2, exact: at most 32640 in magnitude), then pair-added into the accumulator (sadalp): 6
    instructions per 32 multiply-adds where `_sadalp` takes 8."""
    acc, lanes, _ = fl.value(v.acc, env)
    n = 2 * lanes
    groups = []
    for a_value, b_value in ((v.a0, v.b0), (v.a1, v.b1)):
        b = fl.value(b_value, env)
        a = _operand(fl, a_value, env, n // 4)
        assert DType.U8 not in (a[2], b[2]) and b[1] == n, "s8 x s8 groups of 2 * lanes bytes"
        groups.append(_products(fl, a, b))
    diff = fl.define(f"sub nsw {vtype(n, DType.I16)} {groups[0]}, {groups[1]}")
    return _pair_add(fl, acc, diff, n, lanes), lanes, DType.I32


def _pair_add(fl: Emitter, acc: str, products: str, n: int, lanes: int) -> str:
    """acc + the sums of adjacent i16 lanes of `products` (n lanes) as i32 lanes (sadalp, Arm ARM SADALP:
    no saturation), 8 lanes at a time."""
    chunks = []
    fl.declarations.add("declare <4 x i32> @llvm.aarch64.neon.saddlp.v4i32.v8i16(<8 x i16>)")
    for lo in range(0, n, 8):
        part = shuffle(fl, vtype(n, DType.I16), products, "poison", range(lo, lo + 8))
        chunks.append(fl.define(f"call <4 x i32> @llvm.aarch64.neon.saddlp.v4i32.v8i16(<8 x i16> {part})"))
    width = 4
    while len(chunks) > 1:  # the 4-lane pair sums concatenated back into the accumulator's width
        ty = vtype(width, DType.I32)
        chunks = [
            shuffle(fl, ty, chunks[i], chunks[i + 1], range(2 * width)) for i in range(0, len(chunks), 2)
        ]
        width *= 2
    return fl.define(f"add {vtype(lanes, DType.I32)} {acc}, {chunks[0]}")


def _lane_bytes(fl: Emitter, word: str, is_signed: bool, lanes: int) -> list[str]:
    """The MLA route (NEON without dotprod, RVV, scalar): byte t of each i32 lane sign- or zero-extended
    in place (shl 24 - 8t, then sar/shr 24), for t = 0..3; then four i32 multiply-adds per dot. Extracted
    once per operand and shared by every dot that reads it (a B vector by the rows of a tile)."""
    ty = vtype(lanes, DType.I32)
    out = []
    for t in range(4):
        key = ("byte", word, t, is_signed)
        byte = fl.pure.get(key)
        if byte is None:
            shift = splat_int(24 - 8 * t, lanes, DType.I32)
            up = word if t == 3 else fl.define(f"shl {ty} {word}, {shift}")
            down = "ashr" if is_signed else "lshr"
            byte = fl.pure[key] = fl.define(f"{down} {ty} {up}, {splat_int(24, lanes, DType.I32)}")
        out.append(byte)
    return out


def _group_bytes(fl: Emitter, a: Operand, lanes: int) -> list[str]:
    """A broadcast group's 4 bytes as 4 splats: the group widened once (sxtl/uxtl twice on NEON), each
    byte a splat of one lane, which AArch64 folds into `mla v.4s, v.4s, v.s[t]` (by element) and RVV
    into `vmacc.vx`: 3 instructions per group instead of 8 for shifting each byte out of a splat."""
    text, _, dtype = a
    key = ("group", text)
    cached = fl.pure.get(key)
    if cached is None:
        wide = fl.define(f"{'sext' if dtype.signed else 'zext'} <4 x i8> {text} to <4 x i32>")
        cached = fl.pure[key] = ",".join(
            fl.broadcast(fl.define(f"extractelement <4 x i32> {wide}, i64 {t}"), lanes, DType.I32)
            for t in range(4)
        )
    return cached.split(",")


def _high_mul(fl: Emitter, a: Operand, b: str) -> Operand:
    """SaturatingRoundingDoublingHighMul (gemmlowp fixedpoint.h), in i64 as the reference writes it:
    ab = a * b; nudge = ab >= 0 ? 2^30 : 1 - 2^30; (ab + nudge) / 2^31 truncated toward zero; the one
    overflow (a = b = INT32_MIN) saturates to INT32_MAX. AArch64's sqrdmulh rounds ties upward, not away
    from zero, so it is not used: the result must equal TFLite's reference kernels."""
    x, lanes, _ = a
    ty, lty = vtype(lanes, DType.I32), vtype(lanes, DType.I64)
    wide = [fl.define(f"sext {ty} {v} to {lty}") for v in (x, b)]
    ab = fl.define(f"mul nsw {lty} {wide[0]}, {wide[1]}")
    positive, negative = splat_int(1 << 30, lanes, DType.I64), splat_int(1 - (1 << 30), lanes, DType.I64)
    nudge = fl.select(ab, "sge", splat_int(0, lanes, DType.I64), positive, negative, lanes, DType.I64)
    total = fl.define(f"add nsw {lty} {ab}, {nudge}")
    quotient = fl.define(f"sdiv {lty} {total}, {splat_int(1 << 31, lanes, DType.I64)}")
    high = fl.define(f"trunc {lty} {quotient} to {ty}")
    int_min = splat_int(-(1 << 31), lanes, DType.I32)
    cty = "i1" if lanes == 1 else f"<{lanes} x i1>"
    is_min = [fl.define(f"icmp eq {ty} {v}, {int_min}") for v in (x, b)]
    overflow = fl.define(f"and {cty} {is_min[0]}, {is_min[1]}")
    saturated = splat_int((1 << 31) - 1, lanes, DType.I32)
    result = fl.define(f"select {cty} {overflow}, {ty} {saturated}, {ty} {high}")
    return result, lanes, DType.I32


def _round_shift(fl: Emitter, a: Operand, shift: Operand) -> Operand:
    """RoundingDivideByPOT (gemmlowp fixedpoint.h): mask = 2^e - 1; remainder = x & mask; threshold =
    (mask >> 1) + (x < 0); x >> e (arithmetic) + (remainder > threshold)."""
    x, lanes, _ = a
    e, elanes, _ = shift
    if elanes != lanes:
        e = fl.broadcast(e, lanes, DType.I32)
    ty = vtype(lanes, DType.I32)
    one, zero = splat_int(1, lanes, DType.I32), splat_int(0, lanes, DType.I32)
    mask = fl.define(f"sub {ty} {fl.define(f'shl {ty} {one}, {e}')}, {one}")
    remainder = fl.define(f"and {ty} {x}, {mask}")
    negative = fl.select(x, "slt", zero, one, zero, lanes, DType.I32)
    threshold = fl.define(f"add {ty} {fl.define(f'ashr {ty} {mask}, {one}')}, {negative}")
    up = fl.select(remainder, "sgt", threshold, one, zero, lanes, DType.I32)
    return fl.define(f"add {ty} {fl.define(f'ashr {ty} {x}, {e}')}, {up}"), lanes, DType.I32
