"""ONNX Runtime's own arithmetic for two 8-bit element-wise nodes of an ONNX model: the QLinearAdd and
QLinearGlobalAveragePool nodes (ONNX Runtime's com.microsoft operators, or the DequantizeLinear -> Add /
GlobalAveragePool -> QuantizeLinear of a QDQ model, which ONNX Runtime fuses into them and
xtune/frontend/quantized.py turns into them) in, one kernel reading the 8-bit inputs and writing the
8-bit output with MLAS's x86 formulas (and on AArch64 its NEON QLinearAdd) out (`QAdd`,
`QGlobalAveragePool`), and their numpy references.

Which MLAS kernel ONNX Runtime's CPU provider runs on x86-64 (onnxruntime/core/mlas/lib/platform.cpp): the
AVX2 QLinearAdd (onnxruntime/core/mlas/lib/intrinsics/avx2/qladd_avx2.cpp) wherever AVX2 and FMA3 are,
an AVX-512 host included (there is no AVX-512 one); the SSE2 QLinearGlobalAveragePool
(onnxruntime/core/mlas/lib/qlgavgpool.cpp). Their arithmetic, float32 throughout:

- QLinearAdd: the ratios rA = sA / sC and rB = sB / sC, and the fixed part zC - (rA * zA + rB * zB) with
  its product and sum contracted into one FMA as GCC compiles it (the published x86-64 wheels: measured,
  the uncontracted form differs at rare ties); then per element, on the raw integers,
  fma(a, rA, fma(b, rB, fixed)), rounded half to even (cvtps2dq) and saturated to the type (packs).
- QLinearGlobalAveragePool: the int32 sum of a channel's pixels plus -zA * N, converted to float32, times
  the float32 sA / (sC * N), clamped to [lo - zC, hi - zC], rounded half to even, plus zC.

Both differ from dequantizing, computing in float and quantizing (xtune/ops/qpointwise.py's `Quantized`)
where the two roundings fall on either side of a half. The FMAs are `MulAdd`s: one fused instruction on
every target with an FPU that fuses (`Target.has_fma`), which ONNX Runtime's AVX2 kernel requires; `fma32`
is the reference's.

ONNX Runtime's aarch64 build runs MLAS's NEON QLinearAdd instead (onnxruntime/core/mlas/lib/qladd.cpp,
MLAS_NEON_INTRINSICS), in fixed point (`AddKernel`, `add_kernel`: which one a target's build takes; a
QAdd is built for a target by `for_target`). MlasCalcQLinearAddParameters: with E the float32 exponent
of the greater ratio, shift = 21 - E and each multiplier lrintf(r * 2^shift), below 2^22, the greater at
least 2^21; per element acc = (a - zA) * MA + (b - zB) * MB in int32, minus 1 where negative (vsra by 31),
rounding-shifted right by `shift` (vrshl): a / 2^shift rounded half away from zero; saturated to int16,
plus zC (saturating), saturated to the type. Where a ratio is outside [2^-14, 256), the shift outside
[13, 31] or a multiplier rounds up to 2^22, the float fallback (MlasQLinearAddKernelRawHelper): sA * (a -
zA) + sB * (b - zB), GCC contracting the first product into an FMA (measured: the uncontracted sum and the
other product's FMA each differ on a tie), divided by sC, clamped to [lo - zC, hi - zC], plus zC in
float32, rounded half to even (nearbyintf). ONNX Runtime's ARM builds also fuse int8 QDQ groups
(`fuses_int8_qdq`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

import numpy as np
import numpy.typing as npt

from xtune.ops.layout import Layout
from xtune.ops.opkit import ChannelsOp, PointwiseOp, Shape, params, positive, positive_dims
from xtune.ops.quantize import RANGES, QParams, dequantized
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Cast,
    Clamp,
    Const,
    DType,
    Kernel,
    Load,
    MulAdd,
    NestBuilder,
    RoundEven,
    RoundShift,
    Value,
)
from xtune.target import Target


class AddKernel(Enum):
    """MLAS's QLinearAdd kernel of an ONNX Runtime build (`add_kernel`)."""

    AVX2 = "avx2"  # onnxruntime/core/mlas/lib/intrinsics/avx2/qladd_avx2.cpp: float32 FMAs
    NEON = "neon"  # onnxruntime/core/mlas/lib/qladd.cpp, MLAS_NEON_INTRINSICS: fixed point


def add_kernel(target: Target) -> AddKernel:
    """The QLinearAdd of ONNX Runtime's build for `target`'s architecture: aarch64 compiles qladd.cpp's
    NEON kernel, x86-64 dispatches to the AVX2 one (platform.cpp). RISC-V keeps the x86 formulas: no
    ONNX Runtime build for it is checked here (MLAS would run qladd.cpp's portable float loop)."""
    return AddKernel.NEON if target.arch == "aarch64" else AddKernel.AVX2


def fuses_int8_qdq(target: Target) -> bool:
    """Whether ONNX Runtime's build for `target` fuses an int8 DequantizeLinear -> Add -> QuantizeLinear
    into QLinearAdd: QDQIsInt8Allowed (onnxruntime/core/optimizer/qdq_transformer/selectors_actions/
    qdq_selector_action_transformer.h) is true only where MLAS_TARGET_ARM_ANY; the x86-64 build keeps
    the three float nodes (measured; xtune/frontend/quantized.py marks them `requant="float"`)."""
    return target.arch == "aarch64"


@dataclass(frozen=True, kw_only=True)
class FixedPoint:
    """MLAS's NEON QLinearAdd constants: the two ratios as integers over 2^shift."""

    shift: int
    multipliers: tuple[int, int]


def fixed_point(ra: np.float32, rb: np.float32) -> FixedPoint | None:
    """MlasCalcQLinearAddParameters (qladd.cpp) for the float32 ratios sA / sC and sB / sC; None where
    MLAS falls back to its float loop."""
    if not all(np.float32(2.0**-14) <= r < np.float32(256.0) for r in (ra, rb)):
        return None
    exponent = int(np.float32(max(ra, rb)).view(np.uint32) >> 23) - 127
    shift = 21 - exponent
    if not 13 <= shift <= 31:
        return None
    ma, mb = (int(np.rint(np.float32(r * np.float32(2.0**shift)))) for r in (ra, rb))  # lrintf: to even
    if max(ma, mb) >= 1 << 22 or max(ma, mb) < 1 << 21:
        return None
    return FixedPoint(shift=shift, multipliers=(ma, mb))


def fma32(a: npt.ArrayLike, b: npt.ArrayLike, c: npt.ArrayLike) -> np.ndarray:
    """a * b + c for float32 operands, rounded once to float32 (IEEE 754 fusedMultiplyAdd): the product
    is exact in float64, the sum's rounding error is recovered (TwoSum) and breaks the one case where
    rounding float64 to float32 rounds twice, a float64 sum exactly halfway between two float32s."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c64 = np.asarray(c, np.float64)
    s = p + c64
    back = s - p
    err = (p - (s - back)) + (c64 - back)
    r = s.astype(np.float32)
    halfway = np.zeros(s.shape, bool)
    for toward in (-np.inf, np.inf):
        neighbour = np.nextafter(r, np.float32(toward)).astype(np.float64)
        halfway |= s == (r.astype(np.float64) + neighbour) / 2
    nudged = np.where(halfway & (err != 0), np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return np.asarray(nudged.astype(np.float32))


def _saturated(v: Value, width: int, q: QParams, dequantizes: bool) -> Value:
    """The store of float32 `v` (the output's integer units, its zero point added): rounded half to even
    and saturated to `q`'s type (clamped first: the bounds are integers, so the same); dequantized
    again where a DequantizeLinear was folded into the kernel."""
    lo, hi = RANGES[q.qtype]
    rounded = Cast(
        Cast(RoundEven(Clamp(v, Const(float(lo), width), Const(float(hi), width))), DType.I32), q.dtype
    )
    return dequantized(rounded, width, q) if dequantizes else rounded


def _finished(q: np.ndarray, writes: QParams, dequantizes: bool) -> np.ndarray:
    lo, hi = RANGES[writes.qtype]
    out = np.clip(np.rint(q), lo, hi).astype(writes.qtype)
    return writes.dequantize(out) if dequantizes else out


def _typed(kernel: Kernel, types: dict[str, QParams]) -> Kernel:
    buffers = tuple(replace(b, dtype=types[b.name].dtype) if b.name in types else b for b in kernel.buffers)
    return replace(kernel, buffers=buffers)


def _raw(x: Value) -> Value:
    """An 8-bit load's integer as float32 (exact)."""
    return Cast(Cast(x, DType.I32), DType.F32)


@dataclass(frozen=True, kw_only=True)
class QAdd(PointwiseOp):
    """QLinearAdd of two 8-bit tensors of `shape` (quantized as `reads`) into `writes`, as MLAS's kernel
    `mlas` computes it; `dequantizes`: the 8-bit sum dequantized again (a DequantizeLinear after it,
    folded)."""

    shape: Shape
    reads: tuple[QParams, QParams]
    writes: QParams
    dequantizes: bool = False
    mlas: AddKernel = AddKernel.AVX2

    def __post_init__(self) -> None:
        positive_dims("qadd", self.shape)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.shape, self.shape)

    def for_target(self, target: Target) -> QAdd:
        return replace(self, mlas=add_kernel(target))

    def ratios(self) -> tuple[np.float32, np.float32]:
        """sA / sC and sB / sC in float32, as both MLAS kernels divide them."""
        sa, sb, sc = (np.float32(q.scale) for q in (*self.reads, self.writes))
        return np.float32(sa / sc), np.float32(sb / sc)

    def _constants(self) -> tuple[np.float32, np.float32, np.float32]:
        """rA, rB and the fixed part, as qladd_avx2.cpp computes them once."""
        qa, qb, qc = (*self.reads, self.writes)
        ra, rb = self.ratios()
        zero_terms = fma32(np.asarray(ra), np.float32(qa.zero), np.float32(rb * np.float32(qb.zero)))
        return ra, rb, np.float32(np.float32(qc.zero) - zero_terms)

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if self.mlas is AddKernel.NEON:
            return _finished(self._neon_reference(a, b), self.writes, self.dequantizes)
        ra, rb, fixed = self._constants()
        inner = fma32(b.astype(np.float32), rb, fixed)
        return _finished(fma32(a.astype(np.float32), ra, inner), self.writes, self.dequantizes)

    def _neon_reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The output's integers, zero point added, before saturating (module docstring)."""
        (qa, qb), qc = self.reads, self.writes
        da, db = (x.astype(np.int64) - q.zero for x, q in ((a, qa), (b, qb)))
        fixed = fixed_point(*self.ratios())
        if fixed is None:
            sa, sb, sc = (np.float32(q.scale) for q in (qa, qb, qc))
            total = fma32(sa, da.astype(np.float32), (sb * db.astype(np.float32)).astype(np.float32))
            lo, hi = RANGES[qc.qtype]
            scaled = np.clip(
                (total / sc).astype(np.float32), np.float32(lo - qc.zero), np.float32(hi - qc.zero)
            )
            return np.rint((scaled + np.float32(qc.zero)).astype(np.float32))
        ma, mb = fixed.multipliers
        acc = da * ma + db * mb
        acc -= acc < 0
        return ((acc + (1 << (fixed.shift - 1))) >> fixed.shift) + qc.zero

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        value = self._neon_value if self.mlas is AddKernel.NEON else self._avx2_value
        kernel = self.map_nest(name, lanes, "ab", value)
        out = {} if self.dequantizes else {"out": self.writes}
        return _typed(kernel, {"a": self.reads[0], "b": self.reads[1], **out})

    def _avx2_value(self, xs: list[Value], width: int) -> Value:
        ra, rb, fixed = (float(v) for v in self._constants())
        inner = MulAdd(_raw(xs[1]), Const(rb, width), Const(fixed, width))
        return _saturated(MulAdd(_raw(xs[0]), Const(ra, width), inner), width, self.writes, self.dequantizes)

    def _neon_value(self, xs: list[Value], width: int) -> Value:
        (qa, qb), qc = self.reads, self.writes
        i32 = DType.I32
        da, db = (
            Binary(BinaryOp.SUB, Cast(x, i32), Const(q.zero, width, i32))
            for x, q in zip(xs, self.reads, strict=True)
        )
        fixed = fixed_point(*self.ratios())
        if fixed is None:
            lo, hi = RANGES[qc.qtype]
            vb = Binary(BinaryOp.MUL, Const(float(np.float32(qb.scale)), width), Cast(db, DType.F32))
            total = MulAdd(Cast(da, DType.F32), Const(float(np.float32(qa.scale)), width), vb)
            scaled = Binary(BinaryOp.DIV, total, Const(float(np.float32(qc.scale)), width))
            bounds = (Const(float(v - qc.zero), width) for v in (lo, hi))
            shifted = Binary(BinaryOp.ADD, Clamp(scaled, *bounds), Const(float(qc.zero), width))
            return _saturated(shifted, width, qc, self.dequantizes)
        ma, mb = (Const(m, width, i32) for m in fixed.multipliers)
        acc = Binary(BinaryOp.ADD, Binary(BinaryOp.MUL, da, ma), Binary(BinaryOp.MUL, db, mb))
        # vsra by 31 then vrshl: half away from zero, which RoundShift is (gemmlowp's RoundingDivideByPOT)
        q = Binary(BinaryOp.ADD, RoundShift(acc, Const(fixed.shift, width, i32)), Const(qc.zero, width, i32))
        lo, hi = RANGES[qc.qtype]
        bounded = Binary(BinaryOp.MIN, Binary(BinaryOp.MAX, q, Const(lo, width, i32)), Const(hi, width, i32))
        value = Cast(bounded, qc.dtype)
        return dequantized(value, width, qc) if self.dequantizes else value


@dataclass(frozen=True, kw_only=True)
class QGlobalAveragePool(ChannelsOp):
    """QLinearGlobalAveragePool of an 8-bit (n, c, h, w) tensor, (n, h, w, c) in NHWC, quantized as `reads`,
    into (n, c, 1, 1) quantized as `writes`, MLAS's x86 way; `dequantizes` as `QAdd`'s."""

    n: int
    c: int
    h: int
    w: int
    reads: QParams
    writes: QParams
    dequantizes: bool = False
    layout: Layout = Layout.NHWC

    def __post_init__(self) -> None:
        positive("qglobalaveragepool", n=self.n, c=self.c, h=self.h, w=self.w)

    @property
    def output_shape(self) -> Shape:
        return (self.n, self.c, 1, 1)

    def _scale(self) -> np.float32:
        count = np.float32(self.h * self.w)
        return np.float32(np.float32(self.reads.scale) / (np.float32(self.writes.scale) * count))

    def reference(self, x: np.ndarray) -> np.ndarray:
        axes = (1, 2) if self.layout is Layout.NHWC else (2, 3)
        total = x.astype(np.int32).sum(axis=axes) - np.int32(self.reads.zero * self.h * self.w)
        lo, hi = RANGES[self.writes.qtype]
        zc = self.writes.zero
        scaled = np.clip(total.astype(np.float32) * self._scale(), np.float32(lo - zc), np.float32(hi - zc))
        out = _finished(np.rint(scaled) + zc, self.writes, self.dequantizes)
        return out.reshape(self.output_shape)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        """Vectors of channels summed in int32 over the pixels (NHWC), or one channel at a time (NCHW)."""
        b, plane, c = NestBuilder(), self.h * self.w, self.c
        nhwc = self.layout is Layout.NHWC
        lo, hi = RANGES[self.writes.qtype]
        zc = self.writes.zero

        def channels(img: Affine, ch: Affine, width: int, count: int) -> None:
            acc = b.register(f"acc{width}", width, DType.I32)
            b.assign(acc, Const(-self.reads.zero * plane, width, DType.I32))
            with b.loop(plane, "p") as p:
                at = img * (plane * c) + p * c + ch if nhwc else (img * c + ch) * plane + p
                b.assign(acc, Binary(BinaryOp.ADD, acc, Cast(Load("x", at, width, count), DType.I32)))
            scaled = Binary(BinaryOp.MUL, Cast(acc, DType.F32), Const(float(self._scale()), width))
            bounded = Clamp(scaled, Const(float(lo - zc), width), Const(float(hi - zc), width))
            q = Binary(BinaryOp.ADD, Cast(RoundEven(bounded), DType.I32), Const(zc, width, DType.I32))
            value = Cast(q, self.writes.dtype)
            stored = dequantized(value, width, self.writes) if self.dequantizes else value
            b.store("out", img * c + ch, stored, width, count)

        with b.loop(self.n, "n") as img:
            if nhwc:
                b.split(c, lanes, lambda ch, count: channels(img, ch, lanes, count), "c")
            else:
                with b.loop(c, "c") as ch:
                    channels(img, ch, 1, 1)
        kernel = b.kernel(name, params([("x", self.n * c * plane)], self.n * c))
        out = {} if self.dequantizes else {"out": self.writes}
        return _typed(kernel, {"x": self.reads, **out})
