"""The conv2d template's loop nest (ops/conv2d/direct.py has its space, default config and packed weights):
per image and block of input channels the input is copied into a zero-padded local buffer, per block
of output channels the weights are packed into strips (unless prepacked; both copies are
ops/conv2d/direct_pack.py's), and a register tile of P output pixels x V channel vectors accumulates
broadcast(input) x weight-vector FMAs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from xtune.ops.conv2d.direct_pack import Block, PackEmitter
from xtune.ops.conv2d.direct_schedule import transposes_output
from xtune.ops.tiles import (
    fma_columns_outer,
    lane_group,
    split_edges,
    transpose,
    unrolled,
)
from xtune.schedule.loopnest import (
    Affine,
    Broadcast,
    Buffer,
    BufferKind,
    Const,
    Kernel,
    Load,
    LoopKind,
    MulAdd,
    Reg,
    Value,
)


class ConvEmitter(PackEmitter):
    """The direct kernel: its blocks, tiles and epilogue around the packing copies."""

    def kernel(self, name: str) -> Kernel:
        sh, s, b = self.sh, self.s, self.b
        ip_size = -(-s.cb * self.hp * self.wp // s.lanes) * s.lanes
        full, groups = self.full, self.full.groups
        weights = (self.packed_size if self.prepacked else sh.k * sh.c * sh.r * sh.s) * groups
        buffers = [
            Buffer("input", full.n * full.c * sh.h * sh.w, BufferKind.INPUT),
            Buffer("weights", weights, BufferKind.INPUT),
            *self.epi.buffers(full.k, sh.n * full.k * sh.oh * sh.ow),
            Buffer("output", sh.n * full.k * sh.oh * sh.ow, BufferKind.OUTPUT),
            Buffer("Ip", ip_size, BufferKind.LOCAL),
        ]
        if not self.prepacked:
            buffers.append(Buffer("Wp", s.cb * sh.r * sh.s * s.kb, BufferKind.LOCAL))
        if not sh.nhwc:
            buffers.append(Buffer("Ot", s.p * s.nr, BufferKind.LOCAL))  # transposes a tile for NCHW
        if sh.padded != (sh.h, sh.w):  # the border of the packed input is never written again: zero it once
            self.zero_border(ip_size)
        with b.loop(sh.n, "n") as ni:

            def group(g: Affine) -> None:
                def cblock(c0: Affine, ccur: int, first: bool, last: bool) -> None:
                    self.cblock(Block(ni, c0, ccur, first, last, g=g))

                split_edges(b, sh.c, s.cb, cblock, "cb")

            self.each_group(group)
        return b.kernel(name, tuple(buffers))

    def cblock(self, ctx: Block) -> None:
        self.pack_input(ctx)

        def kblock(k0: Affine, kcur: int) -> None:
            inner = replace(ctx, k0=k0, kcur=kcur)
            if not self.prepacked:
                self.pack_weights(inner)
            self.spatial(inner)

        self.b.split(self.sh.k, self.s.kb, kblock, "kb")

    def spatial(self, ctx: Block) -> None:
        """Blocks of output rows x columns; inside, pixel tiles and channel strips in the config's order."""
        sh, s, b = self.sh, self.s, self.b
        kcur = ctx.kcur

        def rows(y0: Affine, nrows: int, x0: Affine, ncols: int, js: Affine | None, nc: int) -> None:
            with b.loop(nrows, "y") as y:
                b.split(ncols, s.p, lambda x, np_: tiles(y0 + y, x0 + x, np_, js, nc), "px")

        def tiles(y: Affine, x: Affine, np_: int, js: Affine | None, nc: int) -> None:
            if js is None:  # pk: the pixels' input stays in L1 across the strips
                b.split(kcur, s.nr, lambda j, n: self.micro(ctx, y, x, np_, j, n), "ks")
            else:
                self.micro(ctx, y, x, np_, js, nc)

        def block(y0: Affine, nrows: int, x0: Affine, ncols: int) -> None:
            if s.order == "pk":
                rows(y0, nrows, x0, ncols, None, 0)
            else:  # kp: one strip's packed weights stay in L1 across the block
                b.split(kcur, s.nr, lambda js, nc: rows(y0, nrows, x0, ncols, js, nc), "ks")

        b.split(
            sh.oh,
            s.ohb,
            lambda y0, nrows: b.split(sh.ow, s.owb, lambda x0, ncols: block(y0, nrows, x0, ncols), "bx"),
            "by",
        )

    def out_index(self, ctx: Block, y: Affine, x: Affine | int, ch: Affine | int) -> Affine:
        sh, k = self.sh, self.full.k
        ni, k0 = ctx.n, ctx.g * sh.k + ctx.k0
        if sh.nhwc:
            return ((ni * sh.oh + y) * sh.ow + x) * k + k0 + ch
        return ((ni * k + k0 + ch) * sh.oh + y) * sh.ow + x

    def micro(self, ctx: Block, y: Affine, x: Affine, np_: int, js: Affine, nc: int) -> None:
        """acc[p][v] (+)= sum over (c, kh, kw) of broadcast(Ip) * Wp-vector; then the epilogue and store."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes
        nvec = -(-nc // lanes)
        counts = [min(nc - v * lanes, lanes) % lanes for v in range(nvec)]
        acc = [[b.register(f"acc{p}_{v}", lanes) for v in range(nvec)] for p in range(np_)]
        wreg = [b.register(f"w{v}", lanes) for v in range(nvec)]
        bcast = b.register("bcast", lanes)
        strip = Affine(tuple((var, c // s.nr) for var, c in js.terms), js.const // s.nr)
        self.init(ctx, acc, y, x, js, nc, counts)

        packed, base = (
            ("weights", self.block_base(ctx.c0, ctx.k0, ctx.g)) if self.prepacked else ("Wp", Affine())
        )

        def step(env: dict[str, Affine]) -> None:
            cc, i, j = env["c"], env["r"], env["s"]
            weights = [
                Load(packed, base + self.wp_index(strip, cc, i, j) + v * lanes, lanes) for v in range(nvec)
            ]
            row = y * self.step + i * sh.dilation
            inputs = self.input_lanes(
                ctx, row, [(x + p) * self.step + j * sh.dilation for p in range(np_)], cc
            )
            if inputs is not None:
                # Weight vectors outermost: one is live beside the accumulators and the pixels' inputs.
                fma_columns_outer(b, acc, inputs, wreg, weights)
                return
            for v in range(nvec):
                b.assign(wreg[v], weights[v])
            for p in range(np_):
                a = Load("Ip", self.ip_index(cc, row, (x + p) * self.step + j * sh.dilation))
                b.assign(bcast, Broadcast(a, lanes))  # once into a register, not once per FMA
                for v in range(nvec):
                    b.assign(acc[p][v], MulAdd(bcast, wreg[v], acc[p][v]))

        extents = {"c": ctx.ccur, "r": sh.r, "s": sh.s}
        axes = [(a, extents[a]) for a in s.red]
        # Tail tiles run rarely: their reduction stays rolled, which keeps tails x unrolling from
        # doubling the code (and the compile time) of a kernel.
        full = np_ == s.p and nc == s.nr
        serial = [a for a, _ in axes if not (a == "s" and s.unroll_kw and full)]
        # Except the channel groups of a lane-FMA tile: rolled, a tail would broadcast a channel at a time.
        unroll = full or (s.lane_fma and s.hwc)
        self.reduce(axes, serial[-1] if serial and unroll else "", s.unroll_kw and full, {}, step)
        epi = self.epi
        if sh.nhwc:
            for p in range(np_):
                for v in range(nvec):
                    idx = self.out_index(ctx, y, x + p, js + v * lanes)
                    b.store("output", idx, epi.apply(acc[p][v], lanes, ctx.last), lanes, counts[v])
            return
        if transposes_output(s.transpose_out, np_, lanes):
            self.transposed_tile(
                ctx, y, x, js, [[epi.apply(r, lanes, ctx.last) for r in row] for row in acc], nc
            )
            return
        for p in range(np_):  # NCHW: channels are far apart in the output, so go through Ot
            for v in range(nvec):
                b.store("Ot", Affine.of(p * s.nr + v * lanes), epi.apply(acc[p][v], lanes, ctx.last), lanes)
        with b.loop(nc, "oc") as ch:
            for p in range(np_):
                b.store("output", self.out_index(ctx, y, x + p, js + ch), Load("Ot", ch + p * s.nr))

    def transposed_tile(
        self, ctx: Block, y: Affine, x: Affine, js: Affine, tile: list[list[Value]], nc: int
    ) -> None:
        """NCHW output of a tile (tile[p][v]: pixel p's channels v*lanes..): per channel vector, the
        pixels' vectors (zeros past the tile's) transposed by shuffles, so that register u holds channel
        u's pixels x..x+p in its first lanes, stored as one partial vector. Per vector of channels that is
        lanes stores and at most lanes*log2(lanes) shuffles (fewer: LLVM folds those of zero rows), where
        the scalar path stores and reloads every output through Ot (2 * lanes * p accesses)."""
        lanes, np_ = self.s.lanes, len(tile)
        for v in range(len(tile[0])):
            rows = [tile[p][v] if p < np_ else Const(0.0, lanes) for p in range(lanes)]
            for u, column in enumerate(transpose(self.b, rows, "ot")[: min(nc - v * lanes, lanes)]):
                self.b.store("output", self.out_index(ctx, y, x, js + v * lanes + u), column, lanes, np_)

    def input_lanes(self, ctx: Block, row: Affine, cols: list[Affine], cc: Affine) -> list[Broadcast] | None:
        """The input of channel cc at (row, col) for each col of a tile, as a lane of a vector of `lanes`
        consecutive channels (contiguous in the hwc copy) on a lane-FMA tile, when cc's whole group of
        channels is in the block (`lane_group`); None otherwise: broadcast a channel at a time."""
        s = self.s
        group = lane_group(cc, ctx.ccur, s.lanes) if s.lane_fma and s.hwc else None
        if group is None:
            return None
        start, lane = group
        return [Broadcast(Load("Ip", self.ip_index(start, row, col), s.lanes), s.lanes, lane) for col in cols]

    def init(
        self, ctx: Block, acc: list[list[Reg]], y: Affine, x: Affine, js: Affine, nc: int, counts: list[int]
    ) -> None:
        """Accumulators start at the bias plus the residual (or 0) in the first channel block, else at the
        partial output. In NCHW both the output and the residual are gathered through Ot."""
        s, b, lanes, nhwc = self.s, self.b, self.s.lanes, self.sh.nhwc
        k0 = ctx.g * self.sh.k + ctx.k0
        first = ctx.first
        gather = "output" if not first else "residual" if self.epi.residual else ""
        if gather and not nhwc:
            with b.loop(nc, "ic") as ch:
                for p in range(len(acc)):
                    b.store("Ot", ch + p * s.nr, Load(gather, self.out_index(ctx, y, x + p, js + ch)))
        for p, row in enumerate(acc):
            for v, reg in enumerate(row):
                at = self.out_index(ctx, y, x + p, js + v * lanes)
                tile: Value = Load("Ot", Affine.of(p * s.nr + v * lanes), lanes)
                if not first:
                    init = Load("output", at, lanes, counts[v]) if nhwc else tile
                else:
                    residual = Load("residual", at, lanes, counts[v]) if nhwc else tile
                    bias = Load("bias", k0 + js + v * lanes, lanes, counts[v])
                    init = self.epi.initial(lanes, bias, residual)
                b.assign(reg, init)

    def reduce(
        self,
        axes: list[tuple[str, int]],
        innermost: str,
        unroll_kw: bool,
        env: dict[str, Affine],
        step: Callable[[dict[str, Affine]], None],
    ) -> None:
        """The reduction loops in order; kw fully unrolled if asked, the innermost serial one by `unroll`."""
        if not axes:
            step(env)
            return
        (name, extent), rest = axes[0], axes[1:]
        b, u = self.b, min(self.s.unroll, extent)
        if name == "s" and unroll_kw:
            with b.loop(extent, "rs", LoopKind.UNROLLED) as v:
                self.reduce(rest, innermost, unroll_kw, {**env, name: v}, step)
        elif name == innermost and u > 1:
            unrolled(
                b, extent, u, lambda v: self.reduce(rest, innermost, unroll_kw, {**env, name: v}, step), name
            )
        else:
            with b.loop(extent, f"r{name}") as v:
                self.reduce(rest, innermost, unroll_kw, {**env, name: v}, step)
