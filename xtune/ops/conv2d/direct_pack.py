"""The direct conv2d nest's data movement (xtune/ops/conv2d/direct_nest.py emits the compute around it): a
resolved schedule in; the input copied into the zero-padded local image `Ip` (only its border zeroed, once
per call), the weights packed into strips `Wp` per call or once by the pack kernel a prepacked
workload's firmware runs at start-up, and the indices of both, out. `Block` says where the nest is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from xtune.ops.conv import conv_shape
from xtune.ops.conv2d.direct_schedule import ConvSchedule, padded, transposes_input
from xtune.ops.tiles import (
    Epilogue,
    Rows,
    split_edges,
    transposed_copy,
)
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Buffer,
    BufferKind,
    Const,
    Kernel,
    Load,
    NestBuilder,
    Value,
)


@dataclass(frozen=True)
class Block:
    """Where the nest is: image, input-channel block (and whether it is the first/last), output block."""

    n: Affine
    c0: Affine
    ccur: int
    first: bool
    last: bool
    k0: Affine = field(default_factory=Affine)
    kcur: int = 0
    g: Affine = field(default_factory=Affine)  # the group (groups > 1): its channels' offsets


class PackEmitter:
    """The state a direct nest is emitted with, and the copies that lay its operands out."""

    def __init__(self, workload: Workload, s: ConvSchedule):
        # The blocking works on one group's channels (c/groups in, k/groups out); the tensors' strides are
        # the whole shape's: `full`. A grouped conv2d runs its groups one after another, each a
        # convolution of its own (group g reads input channels g*c/groups.., writes outputs g*k/groups..).
        self.full = conv_shape(workload)
        self.sh = self.full.per_group
        self.s = s
        self.prepacked = bool(workload["prepacked"])
        self.b = NestBuilder()
        self.epi = Epilogue.of(workload, s.integer_clamp)
        # The packed image: the padded input, or the output's own grid when it is subsampled.
        self.hp, self.wp = (self.sh.oh, self.sh.ow) if s.subsample else padded(self.sh)
        self.step = 1 if s.subsample else self.sh.stride  # the tile's stride through the packed image

    def zero_border(self, ip_size: int) -> None:
        """Zero what of Ip no copy writes: per plane (hwc: one, of cb floats a pixel; chw: cb), the floats
        before its first copied row, between its rows and after its last, by whole vectors that may run
        into a copied row (written after this; the last gap's aligned to the plane's end), then the slack
        of whole vectors after the last plane. All of Ip by vectors where that is not fewer stores or a
        vector would leave Ip: the stem's 226x226x3 buffer took 38,307 vector stores for 1,357 floats of
        border (docs/benchmarks.md)."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes
        per, planes = (s.cb, 1) if s.hwc else (1, s.cb)
        size, row = self.hp * self.wp * per, self.wp * per
        first = (sh.top * self.wp + sh.left) * per  # where the first copied row starts in a plane
        gap, last = (self.wp - sh.w) * per, first + (sh.h - 1) * row + sh.w * per
        n_first, n_gap, n_last = (-(-extent // lanes) for extent in (first, gap, size - last))
        slack = ip_size > planes * size
        stores = planes * (n_first + (sh.h - 1) * n_gap + n_last) + slack
        top_plane = (planes - 1) * size
        inside = (
            top_plane + first + n_first * lanes <= ip_size
            and top_plane + last - row + n_gap * lanes <= ip_size
            and n_last * lanes <= size
        )
        if stores >= ip_size // lanes or not inside:
            self.zeros(Affine(), ip_size // lanes, "z")
            return
        with b.loop(planes, "zp") as plane:
            base = plane * size
            self.zeros(base, n_first, "zf")
            if sh.h > 1 and n_gap:
                with b.loop(sh.h - 1, "zy") as y:
                    self.zeros(base + y * row + (first + sh.w * per), n_gap, "zg")
            self.zeros(base + (size - n_last * lanes), n_last, "zl")
        if slack:
            self.zeros(Affine.of(ip_size - lanes), 1, "zs")

    def zeros(self, at: Affine, count: int, prefix: str) -> None:
        """Ip[at + i] = 0 for i < count vectors."""
        lanes = self.s.lanes
        if count:
            with self.b.loop(count, prefix) as z:
                self.b.store("Ip", at + z * lanes, Const(0.0, lanes), lanes)

    def each_group(self, body: Callable[[Affine], None]) -> None:
        """`body(g)` for every group: a loop over the groups, or the constant 0 of an ungrouped conv2d
        (no loop: its nest is what it was before groups existed)."""
        if self.full.groups == 1:
            body(Affine())
            return
        with self.b.loop(self.full.groups, "g") as g:
            body(g)

    @property
    def packed_size(self) -> int:
        """Floats of the prepacked weights: one `cb*r*s*kb` block per (input, output) channel block."""
        sh, s = self.sh, self.s
        kb, cb = min(s.kb, sh.k), min(s.cb, sh.c)
        return -(-sh.c // cb) * -(-sh.k // kb) * s.cb * sh.r * sh.s * s.kb

    def block_base(self, c0: Affine | int, k0: Affine | int, g: Affine | int = 0) -> Affine:
        """Where the prepacked block of channels c0.. and output channels k0.. of group g starts: the
        groups one after another, `packed_size` floats each; in a group, blocks are laid out input-channel
        block first, each c0/cb * (k blocks) + k0/kb blocks of `cb*r*s*kb` floats."""
        sh, s = self.sh, self.s
        kb, cb = min(s.kb, sh.k), min(s.cb, sh.c)
        block = s.cb * sh.r * sh.s * s.kb
        # c0 and k0 are multiples of cb and kb, so the division is exact in the coefficients.
        within = Affine.of(c0) * (-(-sh.k // kb) * block // cb) + Affine.of(k0) * (block // kb)
        return within + Affine.of(g) * self.packed_size

    def ip_index(self, cc: Affine | int, row: Affine | int, col: Affine | int) -> Affine:
        if self.s.hwc:
            return (Affine.of(row) * self.wp + col) * self.s.cb + cc
        return Affine.of(cc) * (self.hp * self.wp) + Affine.of(row) * self.wp + col

    def pack_input(self, ctx: Block) -> None:
        """Ip <- the block's input channels at offset (top, left); vectors along the contiguous axis."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes

        channels, c0 = self.full.c, ctx.g * sh.c + ctx.c0

        def src(c: Affine, y: Affine, x: Affine) -> Affine:
            if sh.nhwc:
                return ((ctx.n * sh.h + y) * sh.w + x) * channels + c0 + c
            return ((ctx.n * channels + c0 + c) * sh.h + y) * sh.w + x

        # Subsampled, Ip's pixel (y, x) is the input's (y*stride, x*stride), and Ip has no border.
        scale = sh.stride if s.subsample else 1
        rows, cols = (sh.oh, sh.ow) if s.subsample else (sh.h, sh.w)

        def copy(c: Affine, y: Affine, x: Affine, n: int) -> None:  # n: floats of a vector, 0: a scalar
            width = lanes if n else 1
            value = Load("input", src(c, y * scale, x * scale), width, n % width)
            b.store("Ip", self.ip_index(c, y + sh.top, x + sh.left), value, width, n)

        if sh.nhwc == s.hwc and sh.nhwc and scale == 1 and ctx.ccur == channels == s.cb and channels % lanes:
            with b.loop(rows, "pi") as y:
                self.copy_row(
                    src(Affine(), y, Affine()), self.ip_index(0, y + sh.top, sh.left), cols * channels
                )
        elif sh.nhwc == s.hwc and sh.nhwc:  # same minor axis: vector copies
            with b.loop(rows, "pi") as y, b.loop(cols, "pj") as x:
                b.split(ctx.ccur, lanes, lambda c, n: copy(c, y, x, n), "pc")
        elif sh.nhwc == s.hwc and not s.subsample:
            with b.loop(ctx.ccur, "pc") as c, b.loop(rows, "pi") as y:
                b.split(cols, lanes, lambda x, n: copy(c, y, x, n), "pj")
        elif sh.nhwc == s.hwc:  # planes, every stride-th column: scalar copies along the row
            with b.loop(ctx.ccur, "pc") as c, b.loop(rows, "pi") as y, b.loop(cols, "pj") as x:
                copy(c, y, x, 0)
        elif transposes_input(s.transpose_in, s.hwc, s.subsample, s.cb, lanes, sh.stride):
            # Each input row of the block's channels is cb rows of floats (subsampled: their even
            # floats): their transpose is the row's pixels in Ip, cb channels each (zeros past ccur in a
            # tail block, never read).
            with b.loop(rows, "pi") as y:
                plane = Rows(
                    buffer="input",
                    start=lambda u: src(Affine.of(u), y * scale, Affine()),
                    count=ctx.ccur,
                    length=cols,
                    step=scale,
                    span=sh.w,
                )
                transposed_copy(b, lanes, plane, "Ip", self.ip_index(0, y + sh.top, sh.left), s.cb)
        else:  # a transposition: scalar copies
            with b.loop(rows, "pi") as y, b.loop(cols, "pj") as x, b.loop(ctx.ccur, "pc") as c:
                copy(c, y, x, 0)

    def copy_row(self, at: Affine, to: Affine, floats: int) -> None:
        """Ip[to + i] = input[at + i] for i < floats, by whole vectors (the last one partial): an HWC row
        whose pixels' channels are every channel yet no whole vector (a stem's 3) is one contiguous run in
        the input and in Ip; a pixel at a time it took three loads and two stores for 3 floats
        (MobileNetV2's 224x224x3 stem, docs/benchmarks.md), this way 0.75 vector copies."""
        lanes = self.s.lanes

        def run(t: Affine, n: int) -> None:
            self.b.store("Ip", to + t, Load("input", at + t, lanes, n % lanes), lanes, n)

        self.b.split(floats, lanes, run, "pr")

    def wp_index(self, strip: Affine | int, cc: Affine | int, i: Affine | int, j: Affine | int) -> Affine:
        sh, s = self.sh, self.s
        if s.red == "crs":
            inner = (Affine.of(cc) * sh.r + i) * sh.s + j
        else:
            inner = (Affine.of(i) * sh.s + j) * s.cb + cc
        return Affine.of(strip) * (s.cb * sh.r * sh.s * s.nr) + inner * s.nr

    def pack_kernel(self, name: str) -> Kernel:
        """`name(weights, packed)`: the plain weights (the workload's layout) laid out as the prepacked
        kernel reads them, each block's strips at its `block_base` by the per-call packer's own loops;
        the padding of tail blocks zero."""
        sh, s, b, groups = self.sh, self.s, self.b, self.full.groups
        size = self.packed_size * groups  # the groups' blocks one after another (`block_base`)
        with b.loop(size // s.lanes, "z") as z:  # blocks are whole strips of whole vectors
            b.store("packed", z * s.lanes, Const(0.0, s.lanes), s.lanes)

        def group(g: Affine) -> None:
            def cblock(c0: Affine, ccur: int, first: bool, last: bool) -> None:
                def kblock(k0: Affine, kcur: int) -> None:
                    block = Block(Affine(), c0, ccur, first, last, k0, kcur, g=g)
                    self.pack_weights(block, "packed", self.block_base(c0, k0, g))

                b.split(sh.k, s.kb, kblock, "kb")

            split_edges(b, sh.c, s.cb, cblock, "cb")

        self.each_group(group)
        buffers = (
            Buffer("weights", groups * sh.k * sh.c * sh.r * sh.s, BufferKind.INPUT),
            Buffer("packed", size, BufferKind.OUTPUT),
        )
        return b.kernel(name, buffers)

    def pack_weights(self, ctx: Block, dst: str = "Wp", base: Affine | None = None) -> None:
        """dst[base + strip][reduction order][nr] <- weights of the block, zero past the last output channel
        (the per-call Wp, or a block of the prepacked weights)."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes
        c0, k0, ccur = ctx.c0, ctx.g * sh.k + ctx.k0, ctx.ccur  # k0: of all the output channels
        at = base or Affine()

        def strip(js: Affine, ncols: int) -> None:
            st = Affine(tuple((v, c // s.nr) for v, c in js.terms), js.const // s.nr)
            if sh.nhwc:  # HWIO: output channels are contiguous
                with b.loop(sh.r, "wi") as i, b.loop(sh.s, "wj") as j, b.loop(ccur, "wc") as c:
                    for v in range(s.nv):
                        cols = min(max(ncols - v * lanes, 0), lanes)
                        src = ((i * sh.s + j) * sh.c + c0 + c) * self.full.k + k0 + js + v * lanes
                        val: Value = Load("weights", src, lanes, cols % lanes) if cols else Const(0.0, lanes)
                        b.store(dst, at + self.wp_index(st, c, i, j) + v * lanes, val, lanes)
                return
            if s.red == "crs" and lanes > 1:
                self.transposed_strip(dst, at + self.wp_index(st, 0, 0, 0), k0 + js, ncols, c0, ccur)
                return
            # OIHW: write the strip's rows contiguously (nr floats), read nr lines at a stride of c*r*s that
            # stay in L1 across the (c, kh, kw) loops. Reading contiguously instead wrote a line per float
            # across a block of up to megabytes, which missed L1 on every store: at 256 channels and 14x14
            # the per-call packing then took about as long as the convolution.
            with (
                b.loop(ccur, "wc") as c,
                b.loop(sh.r, "wi") as i,
                b.loop(sh.s, "wj") as j,
                b.loop(ncols, "wk") as kk,
            ):
                src = ((k0 + js + kk) * sh.c + c0 + c) * (sh.r * sh.s) + i * sh.s + j
                b.store(dst, at + self.wp_index(st, c, i, j) + kk, Load("weights", src))
            if ncols < s.nr:
                with b.loop(ccur, "wc") as c, b.loop(sh.r, "wi") as i, b.loop(sh.s, "wj") as j:
                    for lane in range(ncols, s.nr):
                        b.store(dst, at + self.wp_index(st, c, i, j) + lane, Const(0.0))

        b.split(ctx.kcur, s.nr, strip, "ws")

    def transposed_strip(self, dst: str, at: Affine, k: Affine, ncols: int, c0: Affine, ccur: int) -> None:
        """dst[at + l*nr + kk] <- weights[k + kk][c0*r*s + l] for the block's l < ccur*r*s, zero for kk past
        ncols: in reduction order crs, l*nr is `wp_index` of l's (c, kh, kw), and in OIHW each output
        channel's (c, kh, kw) are contiguous, so a strip is the transpose of nr rows (`transposed_copy`).
        The per-call packing of a deep layer is as many floats as its FMAs are vectors (256 channels at
        14x14: 590 K), so a scalar copy's 2 instructions per float were a third of the kernel's."""
        sh, s = self.sh, self.s
        rs = sh.r * sh.s
        rows = Rows(
            buffer="weights", start=lambda u: (k + u) * (sh.c * rs) + c0 * rs, count=ncols, length=ccur * rs
        )
        transposed_copy(self.b, s.lanes, rows, dst, at, s.nr)
