"""Winograd's weight transform: a `WinogradSchedule` and conv shape in, U = G g G^T as nest code out.

F(2x2, 3x3) written out here, F(4x4, 3x3) by winograd_transforms.py's formulas: the schedule is a config
the template (winograd.py) resolves; `WeightTransform` writes U and says where U[e][strip][c] lives;
ops/conv2d/winograd_nest.py emits the rest of the kernel around it."""

from __future__ import annotations

from dataclasses import dataclass

from xtune.ops.conv import ConvShape
from xtune.ops.conv2d.winograd_transforms import NestArith, elements, filter_rows4
from xtune.ops.tiles import Rows, transposed_copy
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Const,
    Load,
    MulAdd,
    NestBuilder,
    Reg,
    Value,
)

E = 16  # elements of a transformed F(2x2, 3x3) tile (4x4)


@dataclass(frozen=True)
class WinogradSchedule:
    """A config resolved against the shape."""

    mr: int  # tiles per register tile
    nv: int  # output-channel vectors per register tile
    lanes: int
    ty: int  # tile rows per block
    tx: int  # tiles along a row per block
    cb: int  # input channels per GEMM block
    kb: int  # output channels per block, a multiple of nr
    order: str  # "kt": channel strips outside tile groups, "tk": inside
    unroll: int
    m: int  # output tile side: F(m x m, 3x3)
    integer_clamp: bool = False  # the target's: ReLU/ReLU6 on the outputs' bits (`Epilogue.bits`)

    @property
    def nr(self) -> int:
        return self.nv * self.lanes

    @property
    def e(self) -> int:
        """Floats of a transformed tile: the GEMMs per block."""
        return elements(self.m)


def add(a: Value, b: Value) -> Value:
    return Binary(BinaryOp.ADD, a, b)


def sub(a: Value, b: Value) -> Value:
    return Binary(BinaryOp.SUB, a, b)


class WeightTransform:
    """U[e][strip][c][nr] <- (G g G^T)[e] into the nest `b`: per call into the block's Ub, or (prepacked)
    read from, or written by the pack function into, `u_buffer`, the whole U (strips of all of k)."""

    def __init__(self, b: NestBuilder, sh: ConvShape, s: WinogradSchedule, prepacked: bool, u_buffer: str):
        self.b, self.sh, self.s, self.prepacked, self.u_buffer = b, sh, s, prepacked, u_buffer
        self.strips = -(-sh.k // s.nr)  # strips of the whole U (prepacked)
        # Whether this nest transforms OIHW weights (NCHW: per call, or in the pack function) by vectors,
        # staging `lanes` input channels of a strip at a time in a local Wt (`transform_staged`).
        self.staged = not sh.nhwc and s.lanes > 1 and (not prepacked or u_buffer == "packed")

    def u_index(self, e: Affine | int, strip: Affine, c: Affine | int) -> tuple[str, Affine]:
        """Where U[e][strip][c][0:nr] is: the prepacked weights (strips of all of k) or this block's Ub."""
        s = self.s
        if self.prepacked:
            return self.u_buffer, ((Affine.of(e) * self.strips + strip) * self.sh.c + c) * s.nr
        return "Ub", ((Affine.of(e) * (s.kb // s.nr) + strip) * self.sh.c + c) * s.nr

    def staging(self) -> list[Buffer]:
        """Wt, where `transform_staged` transposes `lanes` channels of a strip (9 x lanes x nr
        floats, 36 KiB at most). Left out of `stack_floats`, so that the blocks a config resolves to (and
        what old logs' configs mean) stay as they were."""
        s = self.s
        return [Buffer("Wt", 9 * s.lanes * s.nr, BufferKind.LOCAL)] if self.staged else []

    def transform(self, k0: Affine, kcur: int) -> None:
        """U[e][strip][c][nr] <- (G g G^T)[e] for the block's output channels, zero past k: into this
        block's Ub, or (prepacked, by `pack_kernel`) into the whole U."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes

        def strip(js: Affine, ncols: int) -> None:
            st = Affine(tuple((v, c // s.nr) for v, c in js.terms), js.const // s.nr)
            if self.staged:
                self.transform_staged(k0 + js, st, ncols)
                return
            if not sh.nhwc:
                self.transform_oihw(k0 + js, st, ncols)
                return
            # A vector of output channels at a time: its 9 taps, 12 partial and 16 transformed values fit
            # the registers, where all nv vectors of a strip at once spilled on every target.
            for v in range(s.nv):
                cols = min(max(ncols - v * lanes, 0), lanes)
                with b.loop(sh.c, "wc") as c:
                    g = [
                        [self._weight(i, j, c, k0 + js + v * lanes, cols) for j in range(3)] for i in range(3)
                    ]
                    u = self._filter_transform(g)
                    for e in range(s.e):
                        buf, at = self.u_index(e, st, c)
                        b.store(buf, at + v * lanes, u[e], lanes)

        b.split(kcur, s.nr, strip, "ws")

    def transform_staged(self, k: Affine, st: Affine, ncols: int) -> None:
        """NCHW's OIHW weights of a strip, `lanes` input channels at a time: transposed into Wt (each
        channel's 9 taps a vector of the strip's output channels, zero past k; `transposed_copy`), then
        transformed by vectors as NHWC's are: about 16x fewer instructions on 16 lanes than the transform
        of one output channel at a time, which at 256 channels and 14x14 outweighed the 16 GEMMs."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes

        def chunk(c0: Affine, ccur: int) -> None:
            rows = Rows(
                buffer="weights", start=lambda u: (k + u) * (sh.c * 9) + c0 * 9, count=ncols, length=ccur * 9
            )
            transposed_copy(b, lanes, rows, "Wt", Affine(), s.nr)
            for v in range(s.nv):  # a vector at a time, as `transform`
                with b.loop(ccur, "wc") as c:
                    g: list[list[Value]] = [
                        [Load("Wt", (c * 9 + i * 3 + j) * s.nr + v * lanes, lanes) for j in range(3)]
                        for i in range(3)
                    ]
                    u = self._filter_transform(g)
                    for e in range(s.e):
                        buf, at = self.u_index(e, st, c0 + c)
                        b.store(buf, at + v * lanes, u[e], lanes)

        b.split(sh.c, lanes, chunk, "wb")

    def transform_oihw(self, k: Affine, st: Affine, ncols: int) -> None:
        """NCHW's OIHW weights, one output channel's 3x3 at a time (contiguous), into lane kk of the
        strip's U; the lanes past k zero."""
        sh, s, b = self.sh, self.s, self.b
        with b.loop(ncols, "wk") as kk, b.loop(sh.c, "wc") as c:
            base = ((k + kk) * sh.c + c) * 9
            g: list[list[Value]] = [[Load("weights", base + i * 3 + j) for j in range(3)] for i in range(3)]
            u = self._filter_transform(g, 1)
            for e in range(s.e):
                buf, at = self.u_index(e, st, c)
                b.store(buf, at + kk, u[e])
        if ncols < s.nr:
            with b.loop(sh.c, "wc") as c:
                for e in range(s.e):
                    buf, at = self.u_index(e, st, c)
                    for lane in range(ncols, s.nr):
                        b.store(buf, at + lane, Const(0.0))

    def _weight(self, i: int, j: int, c: Affine, k: Affine, cols: int) -> Value:
        sh, lanes = self.sh, self.s.lanes
        if not cols:
            return Const(0.0, lanes)
        return Load("weights", ((i * 3 + j) * sh.c + c) * sh.k + k, lanes, cols % lanes)

    def _filter_transform(self, g: list[list[Value]], lanes: int = 0) -> list[Value]:
        """G g G^T, G = [[1,0,0],[1/2,1/2,1/2],[1/2,-1/2,1/2],[0,0,1]]: the 16 values, row-major (vectors,
        or single floats for lanes=1)."""
        b, lanes = self.b, lanes or self.s.lanes
        tag = "s" if lanes == 1 else ""
        if self.s.m == 4:
            return self._filter_transform4(g, lanes, tag)
        half = Const(0.5, lanes)
        rows: list[list[Reg]] = []
        for i, (g0, g1, g2) in enumerate(zip(*g, strict=True)):  # column i of g: G g
            regs = [b.register(f"gt{tag}{a}_{i}", lanes) for a in range(4)]
            b.assign(regs[0], g0)
            b.assign(regs[3], g2)
            even = b.register(f"ge{tag}{i}", lanes)
            b.assign(even, Binary(BinaryOp.MUL, add(g0, g2), half))
            b.assign(regs[1], MulAdd(g1, half, even))
            b.assign(regs[2], MulAdd(g1, Const(-0.5, lanes), even))
            rows.append(regs)
        out: list[Value] = []
        for a in range(4):  # (G g) G^T: the same on each row of G g
            t0, t1, t2 = rows[0][a], rows[1][a], rows[2][a]
            mid = Binary(BinaryOp.MUL, add(t0, t2), half)
            out += [t0, MulAdd(t1, half, mid), MulAdd(t1, Const(-0.5, lanes), mid), t2]
        return out

    def _filter_transform4(self, g: list[list[Value]], lanes: int, tag: str) -> list[Value]:
        """F(4x4)'s G g G^T (winograd_transforms.filter_rows4), in `filter_transform4`'s order: each
        column of g, then each row of G g; the 36 values, row-major."""
        b = self.b
        rows: list[list[Value]] = []
        for i, col in enumerate(zip(*g, strict=True)):  # column i of g: G g
            regs = [b.register(f"gt{tag}{a}_{i}", lanes) for a in range(6)]
            for reg, value in zip(regs, filter_rows4(NestArith(b, lanes, f"g{tag}{i}"), col), strict=True):
                b.assign(reg, value)
            rows.append(list(regs))
        out: list[Value] = []
        for a in range(6):  # (G g) G^T: the same on each row of G g
            out += filter_rows4(NestArith(b, lanes, f"h{tag}{a}"), [rows[i][a] for i in range(3)])
        return out
