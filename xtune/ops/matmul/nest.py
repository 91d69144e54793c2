"""A resolved `MatmulSchedule` and its `Operands` in, the blocked, packed, register-tiled product out:
the block loops in the config's order, the register tile of broadcast(A) * B-vector FMAs and its fused
epilogue, with the target's tile rules (lane-indexed FMAs, the peeled last k group, per-row bias copies).
Where the operands and their panels lie, and the panel copies, are panels.py's; the space, default
config and packed weights are template.py's."""

from __future__ import annotations

from xtune.ops.matmul.panels import PanelEmitter
from xtune.ops.matmul.schedule import MatmulSchedule, Operands, packed_at
from xtune.ops.tiles import (
    Epilogue,
    div,
    fma_columns_outer,
    lane_group,
    replicate,
    split_edges,
    unrolled,
    whole_vectors,
)
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Affine, Broadcast, Buffer, BufferKind, Kernel, Load, MulAdd, Value


class MatmulEmitter(PanelEmitter):
    """The product's nest, over the operands and panels its `PanelEmitter` part places."""

    def __init__(self, workload: Workload, s: MatmulSchedule, operands: Operands):
        super().__init__(workload, s, operands)
        self.multi_k = self.k > s.kc
        self.epi = Epilogue.of(workload, s.integer_clamp)
        # The bias of each tile row from its own copy (`Target.load_initial`), one n block's columns each:
        # distinct addresses, so that every accumulator starts from a load (the load pipe) and not from a
        # register copy of one shared bias load (an FP pipe); a stack copy per n block, not per tile.
        self.bias_width = whole_vectors(min(s.nc, self.n), s.lanes)
        # Bias plus residual is an add (no register copy): the copies pay for a bias alone.
        alone = self.epi.bias and not self.epi.residual
        self.bias_copy = s.bias_copy and alone and not operands.bias_rows and not self.multi_k and s.mr > 1

    def kernel(self, name: str, params: tuple[Buffer, ...]) -> Kernel:
        s, b = self.s, self.b
        buffers = [self.packed_param(p) for p in params]
        if s.copy_b:
            buffers.append(
                Buffer("Bp", min(s.kc, self.k) * -(-min(s.nc, self.n) // s.nr) * s.nr, BufferKind.LOCAL)
            )
        if s.copy_a:
            buffers.append(
                Buffer("Ap", min(s.kc, self.k) * -(-min(s.mc, self.m) // s.mr) * s.mr, BufferKind.LOCAL)
            )
        if self.bias_copy:
            buffers.append(Buffer("Biasr", s.mr * self.bias_width, BufferKind.LOCAL))
        with b.loop(self.o.batch, "bn") as product, b.loop(self.o.groups, "gr") as group:
            self.locate(product, group)
            if self.multi_k:
                self.zero_c()  # every k block then accumulates into C
            self.blocks(s.order, {})
        return b.kernel(name, tuple(buffers))

    def bias_vector(self, row: Affine, col: Affine, cols: int) -> Value:
        """The bias of C[row, col : col + lanes] (its first `cols`): one per column, or a row's broadcast."""
        v = self.s.lanes
        if self.o.bias_rows:
            return Broadcast(Load("bias", self.bias_at + row), v)
        return Load("bias", self.bias_at + col, v, cols % v)

    def zero_c(self) -> None:
        """C = 0 (or the bias row plus the residual) before the k blocks accumulate into it."""
        v = self.s.lanes

        def row(i: Affine, j: Affine, cols: int) -> None:
            bias = self.bias_vector(i, j, cols)
            residual = Load("residual", self.c_at + i * self.ldc + j, v, cols % v)
            value = self.epi.initial(v, bias, residual)
            self.b.store(self.o.c, self.c_at + i * self.ldc + j, value, v, cols)

        with self.b.loop(self.m, "zi") as i:
            self.b.split(self.n, v, lambda j, cols: row(i, j, cols), "zj")

    def blocks(self, order: str, ctx: dict[str, tuple[Affine, int]]) -> None:
        if not order:
            self.macro(ctx)
            return
        axis, rest = order[0], order[1:]
        extent, tile = {"m": (self.m, self.s.mc), "n": (self.n, self.s.nc), "k": (self.k, self.s.kc)}[axis]

        def body(offset: Affine, size: int, last: bool = True) -> None:
            inner = {**ctx, axis: (offset, size)}
            if axis == "k" and not last:
                inner["not_last_k"] = (offset, 0)  # the clamp waits for the last k block
            # Pack a panel as soon as the loops that fix it are open (BLIS: B per (jc,pc), A per (ic,pc)).
            if self.s.copy_b and axis == packed_at(self.s.order, "B"):
                self.pack_b(inner)
            if self.s.copy_a and axis == packed_at(self.s.order, "A"):
                self.pack_a(inner)
            if self.bias_copy and axis == "n":  # the n block's bias once per tile row
                copies = (self.s.mr, self.bias_width)
                replicate(self.b, "bias", self.bias_at + offset, size, self.s.lanes, copies, "Biasr")
            self.blocks(rest, inner)

        if axis == "k" and self.epi.clamps and self.multi_k:
            split_edges(self.b, extent, tile, lambda o, size, _first, last: body(o, size, last), "kc")
        else:
            self.b.split(extent, tile, body, f"{axis}c")

    def macro(self, ctx: dict[str, tuple[Affine, int]]) -> None:
        s, b = self.s, self.b
        (_, mcur), (_, ncur) = ctx["m"], ctx["n"]

        def rows(io: Affine, nrows: int, jo: Affine, ncols: int) -> None:
            self.micro(ctx, io, nrows, jo, ncols)

        if s.inner == "nm":
            b.split(
                ncur,
                s.nr,
                lambda jo, nc: b.split(mcur, s.mr, lambda io, mr: rows(io, mr, jo, nc), "ir"),
                "jr",
            )
        else:
            b.split(
                mcur,
                s.mr,
                lambda io, mr: b.split(ncur, s.nr, lambda jo, nc: rows(io, mr, jo, nc), "jr"),
                "ir",
            )

    def prefetch_strip(self, col: Affine, row: Affine) -> None:
        """Prefetch the prepacked B strip of column `col`, `prefetch_bytes` past its row `row`: a line per
        64 bytes of the row, interleaved with the FMAs of the k step that reads `row` (BLIS and MLAS
        prefetch their packed micro-panels the same way). In a network the weights arrive cold: read
        once per run, evicted by the other layers in between (docs/networks.md, "Where the time goes
        inside the network"); touching them serially before the kernel costs what it saves, the loads
        must overlap the FMAs. A one-row tile (a classifier, m = 1) is left alone: it does one FMA per
        loaded vector, and a prefetch per line made it slower. The addresses may run past the strip
        (the next strip, or past the end of B): a prefetch never faults (LangRef "llvm.prefetch")."""
        s = self.s
        ahead = self.panel_index(col, row) + s.prefetch_bytes // 4
        for line in range(0, s.nr, 16):  # 16 floats per 64-byte cache line
            self.b.prefetch(self.o.b, ahead + line)

    def b_vector(
        self, ctx: dict[str, tuple[Affine, int]], jo: Affine, kk: Affine, c: int, count: int
    ) -> Value:
        """Vector c of B's row k0 + kk in the register tile at column jo: from the packed strip, the
        prepacked whole-k strips, or B itself."""
        s = self.s
        (n0, _), (k0, kcur), lanes = ctx["n"], ctx["k"], s.lanes
        if s.copy_b:
            return Load("Bp", div(jo, s.nr) * (kcur * s.nr) + kk * s.nr + c * lanes, lanes)
        if s.passed_packed == "B":  # whole-k strips of the whole B (`prepack`)
            return Load(self.o.b, self.panel_index(n0 + jo, k0 + kk) + c * lanes, lanes)
        return Load(self.o.b, self.b_at + (k0 + kk) * self.ldb + n0 + jo + c * lanes, lanes, count)

    def a_value(
        self, ctx: dict[str, tuple[Affine, int]], io: Affine, rows: int, r: int, kk: Affine
    ) -> Broadcast:
        """A[i + r, k0 + kk] broadcast: from the packed panel, the prepacked whole-k panels, or A itself;
        read in place on a lane-FMA target, as lane kk % lanes of a vector of `lanes` consecutive steps."""
        s = self.s
        (m0, _), (k0, kcur), lanes = ctx["m"], ctx["k"], s.lanes
        if s.copy_a:
            return Broadcast(Load("Ap", div(io, s.mr) * (kcur * s.mr) + kk * rows + r), lanes)
        if s.passed_packed == "A":  # whole-k panels of the whole A, mr rows each (`prepack`)
            return Broadcast(Load(self.o.a, self.panel_index(m0 + io, k0 + kk) + r), lanes)
        row = self.a_at + (m0 + io + r) * self.lda + k0
        group = lane_group(kk, kcur, lanes) if s.lane_fma else None
        if group is None:
            return Broadcast(Load(self.o.a, row + kk), lanes)
        start, lane = group
        return Broadcast(Load(self.o.a, row + start, lanes), lanes, lane)

    def micro(
        self, ctx: dict[str, tuple[Affine, int]], io: Affine, rows: int, jo: Affine, ncols: int
    ) -> None:
        """The register tile: acc[r][c] += broadcast(A[i+r, kk]) * B[kk, j + c*lanes : +lanes]."""
        s, b = self.s, self.b
        (m0, _), (n0, _), (k0, kcur) = ctx["m"], ctx["n"], ctx["k"]
        lanes, nvec = s.lanes, -(-ncols // s.lanes)
        counts = [min(ncols - c * lanes, lanes) % lanes for c in range(nvec)]  # 0 = full vector
        acc = [[b.register(f"acc{r}_{c}", lanes) for c in range(nvec)] for r in range(rows)]
        breg = [b.register(f"b{c}", lanes) for c in range(nvec)]

        def c_index(r: int, c: int) -> Affine:
            return self.c_at + (m0 + io + r) * self.ldc + n0 + jo + c * lanes

        for r in range(rows):
            for c in range(nvec):
                if self.multi_k:
                    init: Value = Load(self.o.c, c_index(r, c), lanes, counts[c])
                else:
                    bias = (
                        Load("Biasr", jo + c * lanes + r * self.bias_width, lanes)
                        if self.bias_copy
                        else self.bias_vector(m0 + io + r, n0 + jo + c * lanes, counts[c])
                    )
                    init = self.epi.initial(
                        lanes,
                        bias,
                        Load("residual", c_index(r, c), lanes, counts[c]),
                    )
                b.assign(acc[r][c], init)

        def step(kk: Affine) -> None:
            if s.passed_packed == "B" and s.prefetch_bytes and rows > 1:
                self.prefetch_strip(n0 + jo, k0 + kk)
            bvec = [self.b_vector(ctx, jo, kk, c, counts[c]) for c in range(nvec)]
            a = [self.a_value(ctx, io, rows, r, kk) for r in range(rows)]
            if any(isinstance(x.value, Load) and x.value.lanes > 1 for x in a):
                # Each A vector holds `lanes` steps of its row: with B outermost only one B vector is live
                # beside the accumulators and the rows' A vectors (`tile_registers` with lane_fma).
                fma_columns_outer(b, acc, a, breg, bvec)
                return
            for c in range(nvec):
                b.assign(breg[c], bvec[c])
            for r in range(rows):
                for c in range(nvec):
                    b.assign(acc[r][c], MulAdd(a[r], breg[c], acc[r][c]))

        unrolled(b, kcur, s.unroll_k, step, "k", s.peel_k)
        last = "not_last_k" not in ctx
        for r in range(rows):
            for c in range(nvec):
                b.store(self.o.c, c_index(r, c), self.epi.apply(acc[r][c], lanes, last), lanes, counts[c])
