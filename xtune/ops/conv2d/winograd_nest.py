"""The loop nest of the Winograd template (ops/conv2d/winograd.py): a resolved schedule in, the
F(m x m, 3x3) kernel out (m = 2, or 4 by winograd_transforms.py's formulas): the padded copy, the weight
transform of a call without prepacked U (winograd_weights.py), and per block of tiles the input
transform, the (m + 2)^2 GEMMs and the output transform with the fused epilogue."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xtune.ops.conv import ConvShape, conv_shape
from xtune.ops.conv2d.winograd_transforms import (
    NestArith,
    alpha,
    elements,
    input_rows4,
    output_rows4,
)
from xtune.ops.conv2d.winograd_weights import WeightTransform, WinogradSchedule, add, sub
from xtune.ops.tiles import Epilogue, split_edges, unrolled
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Broadcast,
    Buffer,
    BufferKind,
    Const,
    Kernel,
    Load,
    MulAdd,
    NestBuilder,
    Reg,
    Value,
)


def tiles(sh: ConvShape, m: int) -> tuple[int, int]:
    """m x m output tiles down and across (the last of a size no multiple of m is partial)."""
    return -(-sh.oh // m), -(-sh.ow // m)


def needs_copy(sh: ConvShape, m: int) -> bool:
    """Whether the tiles read a copy of the image: NCHW (transposed to channel vectors), padding, or the
    partial tile of an output size no multiple of m (reads past the input)."""
    return not sh.nhwc or sh.pad > 0 or sh.oh % m != 0 or sh.ow % m != 0


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def stack_floats(sh: ConvShape, lanes: int, nt: int, kb: int, prepacked: bool, m: int) -> int:
    """Floats of the local buffers: padded input copy, V (e x nt x C), M (e x nt x kb), and U of one
    output-channel block unless the weights come prepacked (e = (m + 2)^2 floats per transformed tile)."""
    cp, e = round_up(sh.c, lanes), elements(m)
    return image_copy_floats(sh, lanes, m) + e * nt * cp + e * nt * kb + (0 if prepacked else e * sh.c * kb)


def image_copy_floats(sh: ConvShape, lanes: int, m: int) -> int:
    """Floats of the padded copy of the whole image the tiles of side m read (`needs_copy`)."""
    th, tw = tiles(sh, m)
    return (m * th + 2) * (m * tw + 2) * round_up(sh.c, lanes) if needs_copy(sh, m) else 0


@dataclass(frozen=True)
class _Block:
    """Where the nest is: image, output-channel block, block of tiles (and whether its last tile row and
    column are the partial tiles of an output size no multiple of m)."""

    n: Affine
    k0: Affine
    kcur: int
    ty0: Affine
    nty: int
    tx0: Affine
    ntx: int
    half_y: bool
    half_x: bool

    @property
    def nt(self) -> int:
        return self.nty * self.ntx


class WinogradEmitter:
    def __init__(self, workload: Workload, s: WinogradSchedule, prepacked: bool, u_buffer: str = "weights"):
        """`u_buffer`: the buffer holding the whole U when prepacked (the kernel's weights parameter, or
        the output of `pack_kernel`)."""
        self.sh = sh = conv_shape(workload)
        self.s, self.prepacked, self.u_buffer = s, prepacked, u_buffer
        self.b = NestBuilder()
        self.epi = Epilogue.of(workload, s.integer_clamp)
        self.th, self.tw = tiles(sh, s.m)
        self.copy = needs_copy(sh, s.m)
        self.cp = round_up(sh.c, s.lanes)
        self.u = WeightTransform(self.b, sh, s, prepacked, u_buffer)
        self.wrow = s.m * self.tw + 2  # columns of the padded copy

    def kernel(self, name: str) -> Kernel:
        sh, s, b = self.sh, self.s, self.b
        nt = s.ty * s.tx
        weights = s.e * self.u.strips * sh.c * s.nr if self.prepacked else 9 * sh.c * sh.k
        ip_size = (s.m * self.th + 2) * self.wrow * self.cp
        buffers = [
            Buffer("input", sh.n * sh.h * sh.w * sh.c, BufferKind.INPUT),
            Buffer("weights", weights, BufferKind.INPUT),
            *self.epi.buffers(sh.k, sh.n * sh.oh * sh.ow * sh.k),
            Buffer("output", sh.n * sh.oh * sh.ow * sh.k, BufferKind.OUTPUT),
            Buffer("V", s.e * nt * self.cp, BufferKind.LOCAL),
            Buffer("M", s.e * nt * s.kb, BufferKind.LOCAL),
        ]
        if self.copy:
            buffers.append(Buffer("Ip", ip_size, BufferKind.LOCAL))
            self.zero_border(ip_size)
        if not self.prepacked:
            buffers.append(Buffer("Ub", s.e * sh.c * s.kb, BufferKind.LOCAL))
        buffers += self.u.staging()
        if not sh.nhwc:
            buffers.append(Buffer("Ot", s.m * s.m * s.lanes, BufferKind.LOCAL))
        with b.loop(sh.n, "n") as ni:
            if self.copy:
                self.copy_input(ni)

            def kblock(k0: Affine, kcur: int) -> None:
                if not self.prepacked:
                    self.u.transform(k0, kcur)
                self.tile_blocks(ni, k0, kcur)

            b.split(sh.k, s.kb, kblock, "kb")
        return b.kernel(name, tuple(buffers))

    # --- the padded input and the transformed weights ---------------------------------------------

    def zero_border(self, ip_size: int) -> None:
        """Zero what the copies never write, once per call: the padding and the rows and columns past the
        input that half tiles read (at 56x56x64 the whole copy is 0.9 MB, its border 7 %). NCHW copies
        only the C channels of each pixel: with a partial last vector, all of it."""
        sh, b, lanes = self.sh, self.b, self.s.lanes

        def zero(start: Affine | int, floats: int, prefix: str) -> None:
            with b.loop(floats // lanes, prefix) as z:  # floats: whole vectors (a multiple of cp)
                b.store("Ip", Affine.of(start) + z * lanes, Const(0.0, lanes), lanes)

        if not sh.nhwc and sh.c % lanes:
            zero(0, ip_size, "z")
            return
        row = self.wrow * self.cp
        zero(0, sh.pad * row, "zt")  # rows above the input
        zero((sh.pad + sh.h) * row, ip_size - (sh.pad + sh.h) * row, "zb")  # and below
        with b.loop(sh.h, "zr") as y:  # columns left and right of each input row
            at = (y + sh.pad) * row
            zero(at, sh.pad * self.cp, "zl")
            zero(at + (sh.pad + sh.w) * self.cp, (self.wrow - sh.pad - sh.w) * self.cp, "zc")

    def copy_input(self, ni: Affine) -> None:
        """Ip[pad + y][pad + x][:C] <- the image's pixel (y, x): NHWC in channel vectors, the tail lanes
        zero-filled; NCHW one float at a time, plane by plane (a transposition, as conv2d's)."""
        sh, b, lanes = self.sh, self.b, self.s.lanes
        if not sh.nhwc:
            with b.loop(sh.c, "pc") as c, b.loop(sh.h, "py") as y, b.loop(sh.w, "px") as x:
                src = ((ni * sh.c + c) * sh.h + y) * sh.w + x
                b.store("Ip", ((y + sh.pad) * self.wrow + x + sh.pad) * self.cp + c, Load("input", src))
            return
        with b.loop(sh.h, "py") as y, b.loop(sh.w, "px") as x:
            src = ((ni * sh.h + y) * sh.w + x) * sh.c
            dst = ((y + sh.pad) * self.wrow + x + sh.pad) * self.cp
            b.split(
                sh.c,
                lanes,
                lambda c, n: b.store("Ip", dst + c, Load("input", src + c, lanes, n % lanes), lanes),
                "pc",
            )

    def pack_kernel(self, name: str) -> Kernel:
        """`name(weights, packed)`: U of every output channel, written by the per-call weight transform
        into the whole-k layout the prepacked kernel reads (`WeightTransform.u_index`; emit with
        u_buffer="packed")."""
        sh, s = self.sh, self.s
        assert self.prepacked and self.u_buffer == "packed"
        self.u.transform(Affine(), sh.k)
        buffers = (
            Buffer("weights", 9 * sh.c * sh.k, BufferKind.INPUT),
            Buffer("packed", s.e * self.u.strips * sh.c * s.nr, BufferKind.OUTPUT),
            *self.u.staging(),
        )
        return self.b.kernel(name, buffers)

    # --- blocks of tiles ----------------------------------------------------------------------------

    def tile_blocks(self, ni: Affine, k0: Affine, kcur: int) -> None:
        """Blocks of tile rows x tiles; the last block along an output axis no multiple of m is peeled
        (partial tiles)."""
        sh, s, b = self.sh, self.s, self.b

        def along(
            extent: int, tile: int, odd: bool, body: Callable[[Affine, int, bool], None], prefix: str
        ) -> None:
            if odd:  # the last block holds the half tiles: peeled, so it is constant code
                split_edges(b, extent, tile, lambda o, n, _f, last: body(o, n, last), prefix)
            else:
                b.split(extent, tile, lambda o, n: body(o, n, False), prefix)

        def rows(ty0: Affine, nty: int, half_y: bool) -> None:
            def cols(tx0: Affine, ntx: int, half_x: bool) -> None:
                self.block(_Block(ni, k0, kcur, ty0, nty, tx0, ntx, half_y, half_x))

            along(self.tw, s.tx, sh.ow % s.m != 0, cols, "bx")

        along(self.th, s.ty, sh.oh % s.m != 0, rows, "by")

    def block(self, blk: _Block) -> None:
        self.transform_input(blk)
        self.gemms(blk)
        self.transform_output(blk)

    def transform_input(self, blk: _Block) -> None:
        """V[e][t][c] <- (B^T d B)[e] of tile t's 4x4 patch, channel vector by channel vector."""
        sh, b, lanes = self.sh, self.b, self.s.lanes
        with b.loop(blk.nty, "iy") as i, b.loop(blk.ntx, "ix") as j:
            b.split(sh.c, lanes, lambda c, n: self.input_tile(blk, i, j, c, n % lanes), "ic")
            if self.s.m == 4:  # the second pass, over the channels again (`input_columns4`)
                with b.loop(self.cp // lanes, "ir") as v:
                    self.input_rows_pass4(Affine.of(i) * blk.ntx + j, blk.nt, v * lanes)

    def input_tile(self, blk: _Block, i: Affine, j: Affine, c: Affine, count: int) -> None:
        """One tile's e V vectors for channels c..c+lanes (`count` of them, 0: all)."""
        sh, b, lanes, a = self.sh, self.b, self.s.lanes, alpha(self.s.m)
        y, x = (blk.ty0 + i) * self.s.m, (blk.tx0 + j) * self.s.m

        def load(p: Affine | int, q: Affine | int) -> Load:
            if self.copy:  # whole vectors: the copy's tail lanes are zero
                return Load("Ip", ((y + p) * self.wrow + x + q) * self.cp + c, lanes)
            return Load("input", ((blk.n * sh.h + y + p) * sh.w + x + q) * sh.c + c, lanes, count)

        if self.s.m == 4:
            self.input_columns4(Affine.of(i) * blk.ntx + j, blk.nt, c, load)
            return
        d = [[b.register(f"d{p}{q}", lanes) for q in range(a)] for p in range(a)]
        for p in range(a):
            for q in range(a):
                b.assign(d[p][q], load(p, q))
        # B^T d, column by column.
        t = [[b.register(f"t{p}{q}", lanes) for q in range(a)] for p in range(a)]
        for q in range(a):
            for p, value in enumerate(self.input_rows([d[p][q] for p in range(a)], f"c{q}")):
                b.assign(t[p][q], value)
        t_index = Affine.of(i) * blk.ntx + j
        for p in range(a):  # (B^T d) B, row by row
            for q, value in enumerate(self.input_rows(t[p], f"r{p}")):
                b.store("V", ((t_index + (p * a + q) * blk.nt) * self.cp) + c, value, lanes)

    def input_columns4(
        self, t_index: Affine, nt: int, c: Affine, load: Callable[[Affine | int, Affine | int], Load]
    ) -> None:
        """F(4x4)'s first pass, B^T d into the tile's V slots. Its 36 values do not fit the registers
        (all spilled, even on AArch64's 32), so the transform takes two passes over the channels, V the
        store between them: a loop apart, LLVM keeps them in memory, 12 values live at a time."""
        b, lanes = self.b, self.s.lanes
        with b.loop(6, "iq") as q:  # a loop: unrolled, LLVM would interleave the columns and spill
            d = [b.register(f"d{p}", lanes) for p in range(6)]
            for p in range(6):
                b.assign(d[p], load(p, q))
            for p, value in enumerate(input_rows4(NestArith(b, lanes, "bc"), d)):
                b.store("V", ((t_index + (p * 6 + q) * nt) * self.cp) + c, value, lanes)

    def input_rows_pass4(self, t_index: Affine, nt: int, c: Affine) -> None:
        """F(4x4)'s second pass: (B^T d) B, row by row of the tile's V slots, in place."""
        b, lanes = self.b, self.s.lanes
        with b.loop(6, "ip") as p:
            t = [b.register(f"t{q}", lanes) for q in range(6)]
            for q in range(6):  # the whole row first: it is overwritten
                b.assign(t[q], Load("V", ((t_index + (p * 6 + q) * nt) * self.cp) + c, lanes))
            for q, value in enumerate(input_rows4(NestArith(b, lanes, "br"), t)):
                b.store("V", ((t_index + (p * 6 + q) * nt) * self.cp) + c, value, lanes)

    def input_rows(self, col: list[Reg], name: str) -> list[Value]:
        """B^T of a column: F(2x2)'s rows d0-d2, d1+d2, d2-d1, d1-d3, or F(4x4)'s (`input_rows4`)."""
        if self.s.m == 4:
            return input_rows4(NestArith(self.b, self.s.lanes, "b" + name), col)
        d0, d1, d2, d3 = col
        return [sub(d0, d2), add(d1, d2), sub(d2, d1), sub(d1, d3)]

    def output_rows(self, col: Sequence[Value], name: str) -> list[Value]:
        """A^T of a column: F(2x2)'s rows m0+m1+m2, m1-m2-m3, or F(4x4)'s (`output_rows4`)."""
        if self.s.m == 4:
            return output_rows4(NestArith(self.b, self.s.lanes, "a" + name), col)
        m0, m1, m2, m3 = col
        return [add(add(m0, m1), m2), sub(sub(m1, m2), m3)]

    def gemms(self, blk: _Block) -> None:
        """M[e] (nt x kcur) = V[e] (nt x C) . U[e] (C x kcur) for each e, C in blocks of cb."""
        sh, s, b = self.sh, self.s, self.b

        def cblock(c0: Affine, ccur: int, first: bool, _last: bool) -> None:
            with b.loop(s.e, "e") as e:

                def tile(js: Affine, ncols: int, group: Affine, rows: int) -> None:
                    self.micro(blk, e, c0, ccur, first, js, ncols, group, rows)

                def strips(group: Affine, rows: int) -> None:
                    b.split(blk.kcur, s.nr, lambda js, n: tile(js, n, group, rows), "ks")

                def groups(js: Affine, ncols: int) -> None:
                    b.split(blk.nt, s.mr, lambda g, r: tile(js, ncols, g, r), "tg")

                if s.order == "kt":  # one strip's U (cb x nr) stays in L1 across the tile groups
                    b.split(blk.kcur, s.nr, groups, "ks")
                else:  # a group's V rows stay in L1 across the strips
                    b.split(blk.nt, s.mr, strips, "tg")

        split_edges(b, sh.c, s.cb, cblock, "cb")

    def micro(
        self,
        blk: _Block,
        e: Affine,
        c0: Affine,
        ccur: int,
        first: bool,
        js: Affine,
        ncols: int,
        t0: Affine,
        rows: int,
    ) -> None:
        """acc[r][v] (+)= sum over the block's channels of broadcast(V[e][t0+r][c]) * U[e][c] vector."""
        s, b, lanes = self.s, self.b, self.s.lanes
        nvec = -(-ncols // lanes)
        acc = [[b.register(f"acc{r}_{v}", lanes) for v in range(nvec)] for r in range(rows)]
        ureg = [b.register(f"u{v}", lanes) for v in range(nvec)]
        bcast = b.register("bcast", lanes)
        strip = Affine(tuple((var, c // s.nr) for var, c in js.terms), js.const // s.nr)
        if self.prepacked:
            strip = strip + Affine(tuple((var, c // s.nr) for var, c in blk.k0.terms), blk.k0.const // s.nr)

        def m_index(r: int, v: int) -> Affine:
            return ((e * blk.nt + t0 + r) * s.kb) + js + v * lanes

        for r in range(rows):
            for v in range(nvec):
                init: Value = Const(0.0, lanes) if first else Load("M", m_index(r, v), lanes)
                b.assign(acc[r][v], init)

        def step(c: Affine) -> None:
            buf, at = self.u.u_index(e, strip, c0 + c)
            for v in range(nvec):
                b.assign(ureg[v], Load(buf, at + v * lanes, lanes))
            for r in range(rows):
                a = Load("V", (e * blk.nt + t0 + r) * self.cp + c0 + c)
                b.assign(bcast, Broadcast(a, lanes))
                for v in range(nvec):
                    b.assign(acc[r][v], MulAdd(bcast, ureg[v], acc[r][v]))

        unrolled(b, ccur, s.unroll, step, "c")
        for r in range(rows):
            for v in range(nvec):
                b.store("M", m_index(r, v), acc[r][v], lanes)

    def transform_output(self, blk: _Block) -> None:
        """output <- A^T M A of every tile (plus the epilogue), the partial tiles' valid pixels only."""
        m = self.s.m

        def rows(i: Affine, vy: int) -> None:
            def cols(j: Affine, vx: int) -> None:
                self.output_tile(blk, i, j, vy, vx)

            self._halves(blk.ntx, self.sh.ow - m * (self.tw - 1) if blk.half_x else 0, cols, "ox")

        self._halves(blk.nty, self.sh.oh - m * (self.th - 1) if blk.half_y else 0, rows, "oy")

    def _halves(self, extent: int, last: int, body: Callable[[Affine, int], None], prefix: str) -> None:
        """Tiles 0..extent-1 with m valid pixels each, except a last partial tile of `last` (0: none)."""
        full = extent - 1 if last else extent
        with self.b.loop(full, prefix) as i:
            body(i, self.s.m)
        if last:
            body(Affine.of(full), last)

    def output_tile(self, blk: _Block, i: Affine, j: Affine, vy: int, vx: int) -> None:
        sh, s, b, lanes, al = self.sh, self.s, self.b, self.s.lanes, alpha(self.s.m)
        t_index = Affine.of(i) * blk.ntx + j

        def m_at(e: Affine | int, kv: Affine) -> Affine:
            return (t_index + e * blk.nt) * s.kb + kv

        def channels(kv: Affine, count: int) -> None:
            k = blk.k0 + kv
            bias = Load("bias", k, lanes, count)
            if s.m == 4:  # the second pass: rows of A^T M from M's slots, then A
                for a in range(vy):
                    row = [Load("M", m_at(a * 6 + q, kv), lanes) for q in range(6)]
                    self.output_row(blk, i, j, a, vx, self.output_rows(row, f"r{a}"), (k, bias, count))
            else:
                m = [Load("M", m_at(e, kv), lanes) for e in range(s.e)]
                # A^T m, column by column.
                srow = [[b.register(f"s{a}{q}", lanes) for q in range(al)] for a in range(s.m)]
                for q in range(al):
                    for a, value in enumerate(self.output_rows([m[p * al + q] for p in range(al)], f"c{q}")):
                        b.assign(srow[a][q], value)
                for a in range(vy):
                    self.output_row(blk, i, j, a, vx, self.output_rows(srow[a], f"r{a}"), (k, bias, count))
            if not sh.nhwc:
                self.scatter_nchw(blk, i, j, vy, vx, k, count or lanes)

        if s.m == 4:  # F(4x4)'s first pass (as `input_columns4`): A^T M into M's first 4 rows, in place
            with b.loop(-(-blk.kcur // lanes), "oq") as kq, b.loop(6, "ow") as q:
                col = [b.register(f"o{p}", lanes) for p in range(6)]
                for p in range(6):
                    b.assign(col[p], Load("M", m_at(q + p * 6, kq * lanes), lanes))
                for a, value in enumerate(self.output_rows(col, "c")):
                    b.store("M", m_at(q + a * 6, kq * lanes), value, lanes)
        b.split(blk.kcur, lanes, lambda kv, n: channels(kv, n % lanes), "ok")

    def output_row(
        self,
        blk: _Block,
        i: Affine,
        j: Affine,
        a: int,
        vx: int,
        values: list[Value],
        at_k: tuple[Affine, Load, int],
    ) -> None:
        """Row a of a tile's A^T M A, its `vx` valid pixels, to the output with the epilogue (NCHW: to Ot)."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes
        k, bias, count = at_k
        for col, value in enumerate(values[:vx]):
            y, x = (blk.ty0 + i) * s.m + a, (blk.tx0 + j) * s.m + col
            if not sh.nhwc:  # channels are planes apart: through Ot, then one float at a time
                b.store("Ot", Affine.of((a * s.m + col) * lanes), value, lanes)
                continue
            at = ((blk.n * sh.oh + y) * sh.ow + x) * sh.k + k
            init = self.epi.initial(lanes, bias, Load("residual", at, lanes, count))
            out = value if init == Const(0.0, lanes) else add(value, init)
            b.store("output", at, self.epi.apply(out, lanes, True), lanes, count)

    def scatter_nchw(self, blk: _Block, i: Affine, j: Affine, vy: int, vx: int, k: Affine, nch: int) -> None:
        """NCHW: the tile's pixels of `nch` channels from Ot to their planes, with the epilogue per float."""
        sh, b, lanes, m = self.sh, self.b, self.s.lanes, self.s.m
        with b.loop(nch, "oc") as ch:
            for a in range(vy):
                for col in range(vx):
                    y, x = (blk.ty0 + i) * m + a, (blk.tx0 + j) * m + col
                    at = ((blk.n * sh.k + k + ch) * sh.oh + y) * sh.ow + x
                    init = self.epi.initial(1, Load("bias", k + ch), Load("residual", at))
                    value: Value = Load("Ot", ch + (a * m + col) * lanes)
                    value = value if init == Const(0.0, 1) else add(value, init)
                    b.store("output", at, self.epi.apply(value, 1, True))
