"""The NHWC depthwise template: a depthwise layout=nhwc workload + target in, a nest vectorized along
channels out.

In NHWC a pixel's channels are contiguous, so channels are the vector axis (XNNPACK's and MLAS's
NHWC depthwise kernels do the same): a narrow late layer (960 channels at 7x7) fills every lane, where
the NCHW template's vectors along a 7-wide row would be half empty. The register tile is P output
pixels along a row x V channel vectors; per (kh, kw) the V weight vectors are loaded once and reused
across the P pixels, and with kw unrolled the input vectors that neighbouring pixels share (stride 1:
pixel p's tap kw+1 is pixel p+1's tap kw) are loaded once. Stride 2 needs no deinterleave: a pixel
is whole channel vectors.

Padding costs no branch and no copy: output pixels whose window lies inside the input (the interior)
run in loops that read the input directly; the few border rows and columns are peeled into constant
code that leaves out the taps falling on padding. Channels past the last whole vector are partial
loads and stores (Load/Store counts). A multiplier above 1 copies, per output row, the input rows it
reads into a local buffer with every channel repeated `multiplier` times (output channel o reads input
channel o // multiplier), then runs the same microkernel on it. Bias plus residual start the
accumulators, ReLU/ReLU6 clamp them before the store (ops/matmul/template.py `Epilogue`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xtune.ops.conv import ConvShape, conv_shape
from xtune.ops.template import ReadsWeightsAsGiven
from xtune.ops.tiles import Epilogue, Real, Scalars, clipped, div, parse_tile, roomy_tiles, whole_tiles
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Affine, Buffer, BufferKind, Kernel, Load, LoopKind, MulAdd, NestBuilder
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind, KnobValue
from xtune.target import Target

K_OPTIONS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768)  # output channels per block
OH_OPTIONS = (1, 2, 4, 8, 16, 32)  # interior output rows per block


@dataclass(frozen=True)
class NhwcSchedule:
    p: int  # output pixels per register tile, along a row
    nv: int  # channel vectors per register tile
    lanes: int
    kb: int  # output channels per block: whole strips of nv * lanes (unless it covers k), whole multipliers
    ohb: int  # interior output rows per block (the channel blocks run inside a row block)
    unroll_kh: bool

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


def interior(extent: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> tuple[int, int]:
    """[lo, hi): the outputs along one axis whose window lies inside the input (no tap on padding)."""
    lo = min(out, -(-pad // stride))
    hi = (extent - 1 + pad - (kernel - 1) * dilation) // stride + 1
    return lo, max(lo, min(out, hi))


def interiors(sh: ConvShape) -> tuple[tuple[int, int], tuple[int, int]]:
    """The interior rows and columns of the output (`interior` along h and w)."""
    rows = interior(sh.h, sh.oh, sh.r, sh.stride, sh.top, sh.dilation)
    return rows, interior(sh.w, sh.ow, sh.s, sh.stride, sh.left, sh.dilation)


def tile_registers(sh: ConvShape, p: Real, nv: Real) -> Real:
    """Vector registers a P x V tile holds live: its accumulators, the s*V weight vectors of a kernel row
    and the V vectors of one input column."""
    return p * nv + sh.s * nv + nv


def register_tiles(sh: ConvShape, target: Target) -> tuple[str, ...]:
    """Tiles "PxV" that fit the register file (at least one: 1x1 even if a wide kernel row does not)."""
    tiles = tuple(
        f"{p}x{v}"
        for p in range(1, 13)
        for v in range(1, 7)
        if tile_registers(sh, p, v) <= target.vector_registers and v * target.fp32_lanes <= 64
    )
    return tiles or ("1x1",)


def input_columns(sh: ConvShape, p: Real) -> Real:
    """Distinct input columns the taps of p neighbouring output pixels read along a row."""
    return np.minimum(p * sh.s, (p - 1) * sh.stride + (sh.s - 1) * sh.dilation + 1)


def fmas_per_load(sh: ConvShape, p: Real, nv: Real) -> Real:
    """FMAs per loaded vector of a P pixels x V vectors tile, per kernel row: P*V*s FMAs against s*V
    weight vectors and V vectors of each input column the P pixels read."""
    return p * nv * sh.s / (sh.s * nv + nv * input_columns(sh, p))


def channel_block(sh: ConvShape, nr: Scalars, tile_k: Scalars) -> np.ndarray:
    """The output channels per block a `tile_k` knob resolves to: whole strips of nr (unless it covers k),
    and whole multipliers, so that a block starts at an input channel."""
    kb = whole_tiles(tile_k, sh.k, nr)
    return np.where(kb >= sh.k, sh.k, np.maximum(sh.multiplier, kb - kb % sh.multiplier))


def row_block(sh: ConvShape, tile_oh: Scalars) -> np.ndarray:
    (lo, hi), _ = interiors(sh)
    return np.maximum(1, np.minimum(tile_oh, hi - lo))


def rows_bytes(sh: ConvShape, kb: Scalars) -> Scalars:
    """Bytes of the input rows one output row reads for a block of kb output channels: what stays in
    cache for the next output row to reuse ((r-1)*dilation + 1 rows, of kb / multiplier channels)."""
    return 4.0 * ((sh.r - 1) * sh.dilation + 1) * sh.w * kb / sh.multiplier


def reuses_rows(sh: ConvShape, kb: Scalars, target: Target) -> np.ndarray:
    """Whether the input rows one output row reads for a block of kb channels stay in L1 for the next
    output row (half of it: the weights and the output lines share it)."""
    return np.asarray(rows_bytes(sh, kb)) <= target.l1d_bytes / 2


class DepthwiseNhwcTemplate(ReadsWeightsAsGiven):
    def __init__(self, workload: Workload, target: Target):
        self.workload = workload
        self.target = target
        self.shape = sh = conv_shape(workload)
        (lo, hi), _ = interiors(sh)
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, register_tiles(sh, target)),
                Knob("tile_k", KnobKind.TILE, clipped(K_OPTIONS, sh.k)),
                Knob("tile_oh", KnobKind.TILE, clipped(OH_OPTIONS, max(1, hi - lo))),
                Knob("unroll_kh", KnobKind.CHOICE, (1, 0)),
            )
        )

    def schedule(self, config: Config) -> NhwcSchedule:
        sh, lanes = self.shape, self.target.fp32_lanes
        p, nv = parse_tile(str(config["tile"]))
        kb = int(channel_block(sh, nv * lanes, config.int("tile_k")))
        ohb = int(row_block(sh, config.int("tile_oh")))
        return NhwcSchedule(p, nv, lanes, kb, ohb, bool(config["unroll_kh"]))

    def default_config(self) -> Config:
        sh, t = self.shape, self.target
        knobs = {k.name: k.options for k in self.space.knobs}
        _, (xlo, xhi) = interiors(sh)
        inner = max(1, xhi - xlo)

        def score(tile: str) -> float:
            # FMAs per loaded vector (which V does not change: no weight serves two channels), discounted
            # by interior pixels left to a narrower tail tile; then the most accumulators, whose FMA
            # chains hide each other's latency.
            p, nv = parse_tile(tile)
            return (
                float(fmas_per_load(sh, float(p), float(nv))) * inner / (-(-inner // p) * p) + 1e-3 * p * nv
            )

        # The largest channel block whose input rows stay in half of L1 for the next output row to reuse.
        ks = [int(o) for o in knobs["tile_k"]]
        fits = [k for k in ks if reuses_rows(sh, k, t)]
        # A block is whole strips of the tile's channels (channel_block): a strip wider than the block that
        # fits would round the block up past it, so such tiles go only if no other tile is left.
        roomy = roomy_tiles(knobs["tile"], t, lambda p, v: int(tile_registers(sh, p, v)))
        narrow = [o for o in roomy if fits and parse_tile(o)[1] * t.fp32_lanes <= max(fits)]
        tile = max(narrow or roomy, key=score)
        values: dict[str, KnobValue] = {
            "tile": tile,
            "tile_k": max(fits) if fits else min(ks),
            "tile_oh": max(int(o) for o in knobs["tile_oh"]),
            "unroll_kh": 1,
        }
        return self.space.config(self.space.index_of(values))

    def kernel(self, config: Config, name: str) -> Kernel:
        return _NhwcEmitter(self.workload, self.schedule(config)).kernel(name)


@dataclass(frozen=True)
class _Row:
    """Where the nest is: image, output row (constant on a border row), channel block."""

    n: Affine
    y: Affine
    border: bool  # y is a constant whose window reaches into the padding
    k0: Affine
    kcur: int


class _NhwcEmitter:
    def __init__(self, workload: Workload, s: NhwcSchedule):
        self.sh = conv_shape(workload)
        self.s = s
        self.b = NestBuilder()
        self.epi = Epilogue.of(workload)
        (self.ylo, self.yhi), (self.xlo, self.xhi) = interiors(self.sh)

    def kernel(self, name: str) -> Kernel:
        sh, s, b = self.sh, self.s, self.b
        out_size = sh.n * sh.oh * sh.ow * sh.k
        buffers = [
            Buffer("input", sh.n * sh.h * sh.w * sh.c, BufferKind.INPUT),
            Buffer("weights", sh.r * sh.s * sh.k, BufferKind.INPUT),
            *self.epi.buffers(sh.k, out_size),
            Buffer("output", out_size, BufferKind.OUTPUT),
        ]
        if sh.multiplier > 1:  # the input rows of one output row, channels repeated per multiplier
            buffers.append(Buffer("E", sh.r * sh.w * min(s.kb, sh.k), BufferKind.LOCAL))
        with b.loop(sh.n, "n") as ni:
            for y in range(self.ylo):
                self.row_block(ni, Affine.of(y), 1, True)
            b.split(
                self.yhi - self.ylo, s.ohb, lambda y0, nrows: self.row_block(ni, y0 + self.ylo, nrows, False)
            )
            for y in range(self.yhi, sh.oh):
                self.row_block(ni, Affine.of(y), 1, True)
        return b.kernel(name, tuple(buffers))

    def row_block(self, ni: Affine, y0: Affine, nrows: int, border: bool) -> None:
        """Rows y0.. of the block, channel block by channel block (the block's input rows stay in cache
        from one output row to the next)."""
        b = self.b

        def cblock(k0: Affine, kcur: int) -> None:
            with b.loop(nrows, "y") as y:
                self.row(_Row(n=ni, y=y0 + y, border=border, k0=k0, kcur=kcur))

        b.split(self.sh.k, self.s.kb, cblock, "kb")

    def kh_valid(self, row: _Row, kh: int) -> bool:
        """Whether kernel row kh of output row `row` reads an input row (always, off the border)."""
        sh = self.sh
        return not row.border or 0 <= row.y.const * sh.stride + kh * sh.dilation - sh.top < sh.h

    def row(self, row: _Row) -> None:
        """One output row of one channel block: left border pixels, interior tiles, right border pixels."""
        sh, s, b = self.sh, self.s, self.b
        if sh.multiplier > 1:
            self.expand(row)

        def tiles(xs: list[tuple[Affine, bool]]) -> None:
            b.split(row.kcur, s.nr, lambda js, nc: self.micro(row, xs, js, nc), "ks")

        for x0 in range(0, self.xlo, s.p):
            tiles([(Affine.of(x), True) for x in range(x0, min(x0 + s.p, self.xlo))])
        b.split(
            self.xhi - self.xlo, s.p, lambda x, n: tiles([(x + self.xlo + p, False) for p in range(n)]), "px"
        )
        for x0 in range(self.xhi, sh.ow, s.p):
            tiles([(Affine.of(x), True) for x in range(x0, min(x0 + s.p, sh.ow))])

    def expand(self, row: _Row) -> None:
        """E[kh][x][o] <- input[row y*stride + kh*dilation - top][x][(k0 + o) // multiplier] for the
        block's output channels o: whole multipliers, so (k0 + o) // m = k0 / m + o's input channel."""
        sh, s, b = self.sh, self.s, self.b
        m, kb = sh.multiplier, min(s.kb, sh.k)
        c0 = div(row.k0, m)
        kind = LoopKind.UNROLLED if s.unroll_kh else LoopKind.SERIAL
        khs = [Affine.of(kh) for kh in range(sh.r) if self.kh_valid(row, kh)] if row.border else None

        def copy(kh: Affine) -> None:
            src_row = row.y * sh.stride + kh * sh.dilation + (-sh.top)
            with b.loop(sh.w, "ex") as x, b.loop(row.kcur // m, "ec") as cc:
                value = Load("input", ((row.n * sh.h + src_row) * sh.w + x) * sh.c + c0 + cc)
                for j in range(m):
                    b.store("E", (kh * sh.w + x) * kb + cc * m + j, value)

        if khs is None:
            with b.loop(sh.r, "ek", kind) as kh:
                copy(kh)
        else:
            for kh in khs:
                copy(kh)

    def tap(self, row: _Row, kh: Affine, x: Affine, kw: int, js: Affine, count: int) -> Load:
        """The input vector of output pixel x's tap (kh, kw) at the block's output channels js.."""
        sh, lanes = self.sh, self.s.lanes
        col = x * sh.stride + (kw * sh.dilation - sh.left)
        if sh.multiplier > 1:
            return Load("E", (kh * sh.w + col) * min(self.s.kb, sh.k) + js, lanes, count)
        src_row = row.y * sh.stride + kh * sh.dilation + (-sh.top)
        return Load("input", ((row.n * sh.h + src_row) * sh.w + col) * sh.c + row.k0 + js, lanes, count)

    def micro(self, row: _Row, xs: list[tuple[Affine, bool]], js: Affine, nc: int) -> None:
        """acc[p][v] = bias + residual + sum over (kh, kw) of weight vector * input vector, then store."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes
        nvec = -(-nc // lanes)
        counts = [min(nc - v * lanes, lanes) % lanes for v in range(nvec)]
        ch = row.k0 + js
        acc = [[b.register(f"acc{p}_{v}", lanes) for v in range(nvec)] for p in range(len(xs))]
        wreg = [[b.register(f"w{kw}_{v}", lanes) for v in range(nvec)] for kw in range(sh.s)]
        inp = [b.register(f"in{v}", lanes) for v in range(nvec)]

        def out_index(x: Affine, v: int) -> Affine:
            return ((row.n * sh.oh + row.y) * sh.ow + x) * sh.k + ch + v * lanes

        for p, (x, _) in enumerate(xs):
            for v in range(nvec):
                bias = Load("bias", ch + v * lanes, lanes, counts[v])
                residual = Load("residual", out_index(x, v), lanes, counts[v])
                b.assign(acc[p][v], self.epi.initial(lanes, bias, residual))

        def taps(kh: Affine) -> None:
            """One kernel row: its s*V weight vectors loaded once, then input column by input column, each
            column's V vectors loaded once and multiplied into every (pixel, kw) that reads it."""
            pairs = [
                (p, kw)
                for p, (x, border) in enumerate(xs)
                for kw in range(sh.s)
                if not border or self.kw_valid(x.const, kw)
            ]
            for kw in sorted({kw for _, kw in pairs}):
                for v in range(nvec):
                    at = (kh * sh.s + kw) * sh.k + ch + v * lanes
                    b.assign(wreg[kw][v], Load("weights", at, lanes, counts[v]))
            columns: dict[int, list[tuple[int, int]]] = {}
            for p, kw in sorted(pairs, key=lambda pk: pk[0] * sh.stride + pk[1] * sh.dilation):
                columns.setdefault(p * sh.stride + kw * sh.dilation, []).append((p, kw))
            for users in columns.values():
                p0, kw0 = users[0]
                for v in range(nvec):
                    b.assign(inp[v], self.tap(row, kh, xs[p0][0], kw0, js + v * lanes, counts[v]))
                    for p, kw in users:
                        b.assign(acc[p][v], MulAdd(wreg[kw][v], inp[v], acc[p][v]))

        if row.border:
            for i in range(sh.r):
                if self.kh_valid(row, i):
                    taps(Affine.of(i))
        else:
            with b.loop(sh.r, "kh", LoopKind.UNROLLED if s.unroll_kh else LoopKind.SERIAL) as kh:
                taps(kh)
        for p, (x, _) in enumerate(xs):
            for v in range(nvec):
                b.store("output", out_index(x, v), self.epi.apply(acc[p][v], lanes, True), lanes, counts[v])

    def kw_valid(self, x: int, kw: int) -> bool:
        sh = self.sh
        return 0 <= x * sh.stride + kw * sh.dilation - sh.left < sh.w
