"""The matmul nest: a resolved `MatmulSchedule` and its `Operands` in, the blocked, packed nest out.

`MatmulSchedule` is a config resolved against the shape, `Operands` where the product's operands live;
the emitter writes the register-tiled product and the nest that writes a prepacked operand's panels
(ops/matmul/template.py has the space, default config and packed weights)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import Literal

from xtune.ops.tiles import (
    Epilogue,
    Num,
    div,
    fma_columns_outer,
    lane_group,
    replicate,
    split_edges,
    unrolled,
    whole_vectors,
)
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
    Value,
)

# The block loops that fix each packed panel: B's strips by (n, k), A's panels by (m, k).
PANEL_AXES = {"B": ("n", "k"), "A": ("m", "k")}


def packed_per_call(pack: Num, prepacked: str, operand: str) -> Num:
    """Whether (1/0) a config copies `operand` into panels at every call: it reads the operand in panels
    (its pack knob) that the caller did not pass already packed (`prepacked` names that operand)."""
    return pack * (prepacked != operand)


@cache
def packed_at(order: str, operand: str) -> str:
    """The block loop whose body packs `operand`'s panel: the inner of the two that fix it, as soon as both
    are open (BLIS: B per (jc, pc), A per (ic, pc))."""
    a, b = PANEL_AXES[operand]
    return a if order.index(a) > order.index(b) else b


@cache
def repacked_per_block(order: str, operand: str) -> bool:
    """Whether `operand`'s panel is packed again for every block of the third loop (outside the packer)."""
    (third,) = set("mnk") - set(PANEL_AXES[operand])
    return order.index(third) < order.index(packed_at(order, operand))


@dataclass(frozen=True)
class MatmulSchedule:
    """A config resolved against the shape: effective block sizes and switches."""

    mr: int
    nv: int
    lanes: int
    mc: int
    nc: int
    kc: int
    order: str
    inner: str  # "nm": column strips outside row panels (B strip stays in L1), or "mn"
    pack_a: bool  # A is read in panels ...
    pack_b: bool  # ... B in strips
    unroll_k: int
    prepacked: str  # the operand passed already in panels (when its pack knob is on), or ""
    prefetch_bytes: int = 0  # the target's weight_prefetch_bytes (`MatmulEmitter.prefetch_strip`)
    lane_fma: bool = False  # the target's: A read in place is loaded a vector of k steps at a time
    integer_clamp: bool = False  # the target's: ReLU/ReLU6 on the accumulators' bits (`Epilogue.bits`)
    peel_k: bool = False  # the target's `peel_reduction`: the last k group runs beside the tile's stores
    bias_copy: bool = False  # the target's `load_initial`: each tile row loads its bias from its own copy

    @property
    def nr(self) -> int:
        return self.nv * self.lanes

    @property
    def copy_a(self) -> bool:
        """A copied into panels at every call."""
        return bool(packed_per_call(self.pack_a, self.prepacked, "A"))

    @property
    def copy_b(self) -> bool:
        return bool(packed_per_call(self.pack_b, self.prepacked, "B"))

    @property
    def passed_packed(self) -> str:
        """The operand the kernel reads from panels the caller passed (`prepack`): the prepacked one, if
        its pack knob is on (else the kernel reads it as it is), or ""."""
        reads_panels = self.pack_a if self.prepacked == "A" else self.pack_b
        return self.prepacked if reads_panels else ""


@dataclass(frozen=True, kw_only=True)
class Operands:
    """Where the product's operands live, for a template that lowers through this one (a pointwise
    conv2d): buffer names, the kernel's parameters in order (None: A, B, bias, C), bias per row of C
    instead of per column, `batch` products one after another that share A (B and C advance by one
    whole matrix per product), and which operand holds weights passed prepacked ("" for none).

    `groups` (a grouped pointwise conv2d): per batch product, that many independent products of the
    workload's shape, each over its own slice of every operand and its own bias. Without `interleaved`
    each group's A, B and C are whole matrices one after another (NCHW: a group's weights rows, input and
    output planes are contiguous); `interleaved` (NHWC) puts the groups side by side in every row: a row
    of A holds every group's k columns, of B and C every group's n. A prepacked operand holds each
    group's panels one after another."""

    a: str = "A"
    b: str = "B"
    c: str = "C"
    params: tuple[Buffer, ...] | None = None
    bias_rows: bool = False
    batch: int = 1
    prepacked: Literal["", "A", "B"] = ""
    groups: int = 1
    interleaved: bool = False


class MatmulEmitter:
    def __init__(self, workload: Workload, s: MatmulSchedule, operands: Operands):
        self.m, self.n, self.k = workload["m"], workload["n"], workload["k"]
        self.s, self.o = s, operands
        # Row strides: a group's rows are its slice of rows holding every group (`Operands.interleaved`).
        width = operands.groups if operands.interleaved else 1
        self.lda, self.ldb, self.ldc = self.k * width, self.n * width, self.n * width
        # Where the current product's operands start (`locate`): plain A, B, C, its bias, and its panels
        # of the operand passed prepacked.
        self.a_at, self.b_at, self.c_at, self.bias_at, self.packed_at = (Affine(),) * 5
        self.b = NestBuilder()
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

    def locate(self, product: Affine, group: Affine) -> None:
        """Point the operands at batch product `product`'s group `group` (`Operands.groups`)."""
        m, n, k, o = self.m, self.n, self.k, self.o
        if o.interleaved:  # the group's columns of every row
            self.a_at, self.b_at, self.c_at, self.bias_at = group * k, group * n, group * n, group * n
        else:  # whole matrices: A and the bias per group, B and C per (product, group)
            at = product * o.groups + group
            self.a_at, self.b_at, self.c_at = group * (m * k), at * (k * n), at * (m * n)
            self.bias_at = group * (m if o.bias_rows else n)
        self.packed_at = group * self.panels_size()

    def panels_size(self) -> int:
        """Floats of one group's panels of the operand passed prepacked (0 for none): whole k per panel,
        rows (A) or columns (B) up to whole panels."""
        s = self.s
        if s.passed_packed == "A":
            return -(-self.m // s.mr) * s.mr * self.k
        if s.passed_packed == "B":
            return -(-self.n // s.nr) * s.nr * self.k
        return 0

    def packed_param(self, param: Buffer) -> Buffer:
        """`param`, sized as its panels when it is the operand passed prepacked and read in panels."""
        packed = self.s.passed_packed
        if param.name == {"A": self.o.a, "B": self.o.b}.get(packed):
            return replace(param, size=self.panels_size() * self.o.groups)
        return param

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

    def pack_b(self, ctx: dict[str, tuple[Affine, int]]) -> None:
        """Bp[strip][kk][nr] = B[k0+kk, n0+strip*nr : +nr], zero-padded past the last column."""
        s = self.s
        (n0, ncur), (k0, kcur) = ctx["n"], ctx["k"]
        self.copy_strips(n0, ncur, k0, kcur, "Bp", lambda js, kk: div(js, s.nr) * (kcur * s.nr) + kk * s.nr)

    def copy_strips(
        self, n0: Affine, ncur: int, k0: Affine, kcur: int, dst: str, at: Callable[[Affine, Affine], Affine]
    ) -> None:
        """dst[at(js, kk) + 0:nr] = B[k0+kk, n0+js : +nr] for each strip js of the block, zero past n."""
        s, b = self.s, self.b

        def strip(js: Affine, ncols: int) -> None:
            with b.loop(kcur, "pbk") as kk:
                for c in range(s.nv):
                    cols = min(max(ncols - c * s.lanes, 0), s.lanes)
                    src = self.b_at + (k0 + kk) * self.ldb + n0 + js + c * s.lanes
                    value: Value = (
                        Load(self.o.b, src, s.lanes, cols % s.lanes) if cols else Const(0.0, s.lanes)
                    )
                    b.store(dst, at(js, kk) + c * s.lanes, value, s.lanes)

        b.split(ncur, s.nr, strip, "pbj")

    def pack_a(self, ctx: dict[str, tuple[Affine, int]]) -> None:
        """Ap[panel][kk][rows] = A[m0+panel*mr+r, k0+kk]: the broadcasts then stream contiguously."""
        s = self.s
        (m0, mcur), (k0, kcur) = ctx["m"], ctx["k"]
        self.copy_panels(
            m0, mcur, k0, kcur, "Ap", lambda io, kk, rows: div(io, s.mr) * (kcur * s.mr) + kk * rows
        )

    def copy_panels(
        self,
        m0: Affine,
        mcur: int,
        k0: Affine,
        kcur: int,
        dst: str,
        at: Callable[[Affine, Affine, int], Affine],
        pad: bool = False,
    ) -> None:
        """dst[at(io, kk, rows) + r] = A[m0+io+r, k0+kk] for each panel io of `rows` rows of the block; with
        `pad`, zeros in rows past m up to mr (the prepacked layout's whole panels)."""
        s, b = self.s, self.b

        def panel(io: Affine, rows: int) -> None:
            with b.loop(kcur, "pak") as kk:
                for r in range(s.mr if pad else rows):
                    index = self.a_at + (m0 + io + r) * self.lda + k0 + kk
                    src: Value = Load(self.o.a, index) if r < rows else Const(0.0)
                    b.store(dst, at(io, kk, rows) + r, src)

        b.split(mcur, s.mr, panel, "pai")

    def panel_index(self, start: Affine | int, kk: Affine | int) -> Affine:
        """Where row `kk` of the prepacked operand's panel starting at row (A) or column (B) `start` is:
        whole-k panels of `width` = mr rows (A) or nr columns (B), each k x width (`prepack`)."""
        width = self.s.mr if self.s.passed_packed == "A" else self.s.nr
        return self.packed_at + div(Affine.of(start), width) * (self.k * width) + Affine.of(kk) * width

    def pack_kernel(self, name: str, plain: Buffer, packed: Buffer) -> Kernel:
        """The nest that writes `packed` (the prepacked operand as the kernel reads it) from `plain` (the
        operand in the workload's layout): through `panel_index`, the index the kernel reads by."""
        s, b = self.s, self.b
        zero = Affine()
        if s.passed_packed:
            with b.loop(self.o.groups, "gr") as group:  # each group's panels from its own slice
                self.locate(zero, group)
                if s.passed_packed == "B":
                    self.copy_strips(zero, self.n, zero, self.k, packed.name, self.panel_index)
                else:
                    at = self.panel_index
                    self.copy_panels(
                        zero, self.m, zero, self.k, packed.name, lambda io, kk, _: at(io, kk), True
                    )
        else:  # the config reads the operand as it is: the packed form is a copy
            b.split(
                plain.size,
                s.lanes,
                lambda i, n: b.store(packed.name, i, Load(plain.name, i, s.lanes, n % s.lanes), s.lanes, n),
                "cp",
            )
        return b.kernel(name, (plain, packed))

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
