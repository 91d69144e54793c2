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

With `rows=2` a tile is two output rows (`pair`): they share r - stride of their input rows, so each input
vector loaded feeds up to 2*r*s FMAs; the channel strip runs outside the row's pixel tiles, its r*s weight
vectors loaded once per strip and held in registers; without bias or residual an accumulator starts as its
first product. The border rows are constant pairs and the border pixels two-row tiles of the same strip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import product

from xtune.ops.conv import ConvShape, conv_shape
from xtune.ops.depthwise import nhwc_tiles as rules
from xtune.ops.template import ReadsWeightsAsGiven
from xtune.ops.tiles import (
    Epilogue,
    clipped,
    div,
    parse_tile,
    register_budget,
    roomy_tiles,
)
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Const,
    Kernel,
    Load,
    LoopKind,
    MulAdd,
    NestBuilder,
    Reg,
)
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
    rows: int = 1  # output rows per register tile: 2 shares their input rows (`pair_tiles`)
    integer_clamp: bool = False  # the target's: ReLU/ReLU6 on the accumulators' bits (`Epilogue.bits`)

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


class DepthwiseNhwcTemplate(ReadsWeightsAsGiven):
    def __init__(self, workload: Workload, target: Target):
        self.workload = workload
        self.target = target
        self.shape = sh = conv_shape(workload)
        (lo, hi), _ = rules.interiors(sh)
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, rules.register_tiles(sh, target)),
                Knob("tile_k", KnobKind.TILE, clipped(K_OPTIONS, sh.k)),
                Knob("tile_oh", KnobKind.TILE, clipped(OH_OPTIONS, max(1, hi - lo))),
                Knob("unroll_kh", KnobKind.CHOICE, (1, 0)),
                # Last, its first option today's one-row tile: older logs keep their configs.
                Knob("rows", KnobKind.CHOICE, (1, 2)),
            )
        )

    def schedule(self, config: Config) -> NhwcSchedule:
        sh, lanes = self.shape, self.target.fp32_lanes
        p, nv = parse_tile(str(config["tile"]))
        kb = int(rules.channel_block(sh, nv * lanes, config.int("tile_k")))
        ohb = int(rules.row_block(sh, config.int("tile_oh")))
        rows = config.int("rows") if sh.multiplier == 1 else 1  # the expanded buffer holds r rows
        return NhwcSchedule(p, nv, lanes, kb, ohb, bool(config["unroll_kh"]), rows, self.target.integer_clamp)

    def default_config(self) -> Config:
        sh, t = self.shape, self.target
        knobs = {k.name: k.options for k in self.space.knobs}
        _, (xlo, xhi) = rules.interiors(sh)
        inner = max(1, xhi - xlo)

        def score(tile: str, per_load: Callable[[ConvShape, float, float], float]) -> float:
            # FMAs per loaded vector (which V does not change: no weight serves two channels), discounted
            # by interior pixels left to a narrower tail tile; then the most accumulators, whose FMA
            # chains hide each other's latency.
            p, nv = parse_tile(tile)
            return float(per_load(sh, float(p), float(nv))) * inner / (-(-inner // p) * p) + 1e-3 * p * nv

        # The largest channel block whose input rows stay in half of L1 for the next output row to reuse.
        ks = [int(o) for o in knobs["tile_k"]]
        fits = [k for k in ks if rules.reuses_rows(sh, k, t)]
        # A block is whole strips of the tile's channels (`channel_block`): a strip wider than the block that
        # fits would round the block up past it, so such tiles go only if no other tile is left.
        # AArch64 takes two-row tiles: each input vector feeds up to 2*r FMAs and the weights stay in
        # registers, which the A72 executes in fewer instructions per FMA (docs/benchmarks.md); the x86
        # defaults keep their one-row tile and objects.
        pairs_fit = any(
            rules.pair_registers(sh, *parse_tile(str(o))) <= register_budget(t) for o in knobs["tile"]
        )
        rows = 2 if t.arch == "aarch64" and sh.multiplier == 1 and self.row_pairs() and pairs_fit else 1
        live, per_load = (
            (rules.pair_registers, rules.pair_fmas_per_load)
            if rows == 2
            else (rules.tile_registers, rules.fmas_per_load)
        )
        roomy = roomy_tiles(knobs["tile"], t, lambda p, v: int(live(sh, p, v)))
        narrow = [o for o in roomy if fits and parse_tile(o)[1] * t.fp32_lanes <= max(fits)]
        tile = max(narrow or roomy, key=lambda o: score(o, per_load))
        values: dict[str, KnobValue] = {
            "tile": tile,
            "tile_k": max(fits) if fits else min(ks),
            "tile_oh": max(int(o) for o in knobs["tile_oh"]),
            "unroll_kh": 1,
            "rows": rows,
        }
        return self.space.config(self.space.index_of(values))

    def row_pairs(self) -> bool:
        """Whether the interior has two output rows for a two-row tile."""
        (lo, hi), _ = rules.interiors(self.shape)
        return hi - lo >= 2

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
        self.epi = Epilogue.of(workload, s.integer_clamp)
        (self.ylo, self.yhi), (self.xlo, self.xhi) = rules.interiors(self.sh)

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
        # Two-row tiles take the border rows in pairs too (a pair's constant rows may reach the padding):
        # the rows before `top` and from `bottom` on, an even number of each unless the image runs out.
        top = min(sh.oh, self.ylo + self.ylo % 2) if s.rows == 2 else self.ylo
        bottom = max(top, sh.oh - (sh.oh - self.yhi + (sh.oh - self.yhi) % 2)) if s.rows == 2 else self.yhi
        with b.loop(sh.n, "n") as ni:
            self.const_rows(ni, range(top))
            b.split(bottom - top, s.ohb, lambda y0, nrows: self.row_block(ni, y0 + top, nrows, False))
            self.const_rows(ni, range(bottom, sh.oh))
        return b.kernel(name, tuple(buffers))

    def const_rows(self, ni: Affine, ys: range) -> None:
        """The border rows `ys` (constant y), in pairs with two-row tiles, channel block by channel block."""
        step = self.s.rows
        for y in ys[::step]:
            self.row_block(ni, Affine.of(y), min(step, ys.stop - y), True)

    def row_block(self, ni: Affine, y0: Affine, nrows: int, border: bool) -> None:
        """Rows y0.. of the block, channel block by channel block (the block's input rows stay in cache
        from one output row to the next)."""
        b = self.b

        def cblock(k0: Affine, kcur: int) -> None:
            pairs = nrows // 2 if self.s.rows == 2 else 0
            if border and pairs:  # constant rows: one pair
                self.pair([_Row(n=ni, y=y0 + t, border=True, k0=k0, kcur=kcur) for t in range(2)])
            elif pairs:
                with b.loop(pairs, "yp") as y:
                    self.pair(
                        [_Row(n=ni, y=y0 + y * 2 + t, border=False, k0=k0, kcur=kcur) for t in range(2)]
                    )
            if nrows > 2 * pairs:
                with b.loop(nrows - 2 * pairs, "y") as y:
                    self.row(_Row(n=ni, y=y0 + 2 * pairs + y, border=border, k0=k0, kcur=kcur))

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
            columns = self.columns(xs)
            for kw in sorted({kw for users in columns.values() for _, kw in users}):
                for v in range(nvec):
                    at = (kh * sh.s + kw) * sh.k + ch + v * lanes
                    b.assign(wreg[kw][v], Load("weights", at, lanes, counts[v]))
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

    def pair(self, rows: list[_Row]) -> None:
        """Two output rows of one channel block, channel strip by channel strip: the strip's r*s*V weight
        vectors loaded once, then left border pixels, interior tiles and right border pixels, each a
        two-row tile."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes
        k0 = rows[0].k0

        def strip(js: Affine, nc: int) -> None:
            nvec = -(-nc // lanes)
            counts = [min(nc - v * lanes, lanes) % lanes for v in range(nvec)]
            w = [
                [[b.register(f"w{i}_{j}_{v}", lanes) for v in range(nvec)] for j in range(sh.s)]
                for i in range(sh.r)
            ]
            for i, j, v in product(range(sh.r), range(sh.s), range(nvec)):
                at = (i * sh.s + j) * sh.k + k0 + js + v * lanes
                b.assign(w[i][j][v], Load("weights", at, lanes, counts[v]))

            def tile(xs: list[tuple[Affine, bool]]) -> None:
                self.pair_micro(rows, xs, js, counts, w)

            for x0 in range(0, self.xlo, s.p):
                tile([(Affine.of(x), True) for x in range(x0, min(x0 + s.p, self.xlo))])
            b.split(
                self.xhi - self.xlo,
                s.p,
                lambda x, n: tile([(x + self.xlo + p, False) for p in range(n)]),
                "px",
            )
            for x0 in range(self.xhi, sh.ow, s.p):
                tile([(Affine.of(x), True) for x in range(x0, min(x0 + s.p, sh.ow))])

        b.split(rows[0].kcur, s.nr, strip, "ks")

    def pair_micro(
        self,
        rows: list[_Row],
        xs: list[tuple[Affine, bool]],
        js: Affine,
        counts: list[int],
        w: list[list[list[Reg]]],
    ) -> None:
        """acc[t][p][v] of output rows rows[t]: every input vector loaded once and multiplied into each
        (row, pixel, kh, kw) that reads it, leaving out taps on the padding; an accumulator starts as its
        first product (FMUL), or as bias plus residual; then stored. Each output's taps keep the (kh, kw)
        order of `micro`."""
        sh, b, lanes = self.sh, self.b, self.s.lanes
        ch, nvec = rows[0].k0 + js, len(counts)
        tiles = list(product(range(len(rows)), range(len(xs)), range(nvec)))
        acc = {(t, p, v): b.register(f"acc{t}_{p}_{v}", lanes) for t, p, v in tiles}
        inp = [b.register(f"in{v}", lanes) for v in range(nvec)]

        def out_index(t: int, p: int, v: int) -> Affine:
            return ((rows[t].n * sh.oh + rows[t].y) * sh.ow + xs[p][0]) * sh.k + ch + v * lanes

        started = set(tiles) if self.epi.bias or self.epi.residual else set()
        for t, p, v in started:
            bias = Load("bias", ch + v * lanes, lanes, counts[v])
            residual = Load("residual", out_index(t, p, v), lanes, counts[v])
            b.assign(acc[t, p, v], self.epi.initial(lanes, bias, residual))
        readers: dict[int, list[tuple[int, int]]] = {}
        for t, kh in product(range(len(rows)), range(sh.r)):
            if self.kh_valid(rows[t], kh):
                readers.setdefault(t * sh.stride + kh * sh.dilation, []).append((t, kh))
        columns = self.columns(xs)
        for i in sorted(readers):
            t0, kh0 = readers[i][0]
            for users in columns.values():
                p0, kw0 = users[0]
                for v in range(nvec):
                    b.assign(
                        inp[v], self.tap(rows[t0], Affine.of(kh0), xs[p0][0], kw0, js + v * lanes, counts[v])
                    )
                    for (t, kh), (p, kw) in product(readers[i], users):
                        a = acc[t, p, v]
                        if (t, p, v) in started:
                            b.assign(a, MulAdd(w[kh][kw][v], inp[v], a))
                        else:
                            b.assign(a, Binary(BinaryOp.MUL, w[kh][kw][v], inp[v]))
                            started.add((t, p, v))
        for t, p, v in tiles:
            value = self.epi.apply(acc[t, p, v] if (t, p, v) in started else Const(0.0, lanes), lanes, True)
            b.store("output", out_index(t, p, v), value, lanes, counts[v])

    def columns(self, xs: list[tuple[Affine, bool]]) -> dict[int, list[tuple[int, int]]]:
        """The (pixel, kw) taps of pixels `xs` by the input column they read (relative to the first
        pixel's), in column order; a border pixel's taps on the padding left out."""
        sh = self.sh
        columns: dict[int, list[tuple[int, int]]] = {}
        for p, kw in sorted(
            product(range(len(xs)), range(sh.s)), key=lambda pk: pk[0] * sh.stride + pk[1] * sh.dilation
        ):
            if not xs[p][1] or self.kw_valid(xs[p][0].const, kw):
                columns.setdefault(p * sh.stride + kw * sh.dilation, []).append((p, kw))
        return columns

    def kw_valid(self, x: int, kw: int) -> bool:
        sh = self.sh
        return 0 <= x * sh.stride + kw * sh.dilation - sh.left < sh.w
