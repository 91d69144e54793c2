"""The depthwise template: a depthwise workload + target in, a nest vectorized along output width out.

Depthwise convolution has r*s FMAs per output and no reuse across channels, so it is vectorized over
the output width. Per image and input channel the plane is copied into a zero-padded local buffer
split by column phase (col % stride), which makes the columns of consecutive outputs contiguous for
any stride and removes every padding branch: stride-2 rows by vector deinterleaving, and in order
"yx" row tile by row tile, just before the rows are read. The register tile is P output rows x
V width vectors; the weights are broadcast, kw is always unrolled (its phase must be a constant),
kh optionally. Bias plus residual initialise the accumulators and ReLU/ReLU6 run on them before the
store.
"""

from __future__ import annotations

from dataclasses import dataclass

from xtune.ops.conv import conv_shape
from xtune.ops.depthwise import nchw_tiles as rules
from xtune.ops.template import ReadsWeightsAsGiven
from xtune.ops.tiles import Epilogue, clipped, div, parse_tile, roomy_tiles
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Broadcast,
    Buffer,
    BufferKind,
    Const,
    Kernel,
    Load,
    LoopKind,
    MulAdd,
    NestBuilder,
    Reg,
    Shuffle,
)
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind
from xtune.target import Target


@dataclass(frozen=True)
class DepthwiseSchedule:
    p: int  # output rows per register tile
    nv: int  # width vectors per register tile
    lanes: int
    owb: int  # output columns per block, a multiple of nv * lanes unless it covers the row
    order: str  # "yx": rows outside column blocks, "xy": column blocks outside rows
    unroll_kh: bool
    taps: str = (
        "load"  # "load": a load per (row, kw) tap; "ext": aligned loads shifted by shuffles (`ext_micro`)
    )
    integer_clamp: bool = False  # the target's: ReLU/ReLU6 on the accumulators' bits (`Epilogue.bits`)


class DepthwiseTemplate(ReadsWeightsAsGiven):
    def __init__(self, workload: Workload, target: Target):
        self.workload = workload
        self.target = target
        self.shape = sh = conv_shape(workload)
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, rules.register_tiles(target)),
                Knob("tile_ow", KnobKind.TILE, clipped(rules.OW_OPTIONS, sh.ow)),
                Knob("order", KnobKind.CHOICE, ("yx", "xy")),
                Knob("unroll_kh", KnobKind.CHOICE, (1, 0)),
                # Last, its first option today's taps: older logs keep their configs.
                Knob("taps", KnobKind.CHOICE, ("load", "ext")),
            )
        )

    def schedule(self, config: Config) -> DepthwiseSchedule:
        p, nv = parse_tile(str(config["tile"]))
        w = nv * self.target.fp32_lanes
        owb = int(rules.column_block(self.shape, w, config.int("tile_ow")))
        return DepthwiseSchedule(
            p,
            nv,
            self.target.fp32_lanes,
            owb,
            str(config["order"]),
            bool(config["unroll_kh"]),
            str(config["taps"]),
            self.target.integer_clamp,
        )

    def default_config(self) -> Config:
        sh, lanes = self.shape, self.target.fp32_lanes
        knobs = {k.name: k.options for k in self.space.knobs}

        def score(tile: str) -> float:
            # FMAs per loaded vector, discounted by lanes wasted on partial tiles.
            p, nv = parse_tile(tile)
            cols = nv * lanes
            waste = (sh.ow / (-(-sh.ow // cols) * cols)) * (sh.oh / (-(-sh.oh // p) * p))
            return rules.fmas_per_load(sh, p, nv) * waste + 1e-3 * p * nv

        def ext_score(tile: str) -> float:
            # The last rows and columns run as a shorter or narrower tile, not in wasted lanes: a tile
            # counts only the rows and vectors the plane has.
            p, nv = parse_tile(tile)
            p, nv = min(p, sh.oh), min(nv, -(-sh.ow // lanes))
            return rules.ext_fmas_per_instruction(sh, p, nv) + 1e-3 * p * nv

        # AArch64 takes "ext" taps: aligned loads (scaled offsets, no address add per misaligned tap) and
        # rows shared in registers execute fewer instructions per FMA on the A72 (docs/benchmarks.md); the
        # other targets keep their taps and objects.
        if self.target.arch == "aarch64":
            live = lambda p, v: int(rules.ext_registers(sh, p, v, lanes))  # noqa: E731
            roomy = roomy_tiles(knobs["tile"], self.target, live)
            short = [t for t in roomy if rules.ext_spills_not(sh, *parse_tile(t))]
            tile, taps = max(short or roomy, key=ext_score), "ext"
        else:
            tile, taps = max(roomy_tiles(knobs["tile"], self.target, rules.tile_registers), key=score), "load"
        values = {
            "tile": tile,
            "tile_ow": max(knobs["tile_ow"]),
            "order": "yx",
            "unroll_kh": 1,
            "taps": taps,
        }
        return self.space.config(self.space.index_of(values))

    def kernel(self, config: Config, name: str) -> Kernel:
        return _DepthwiseEmitter(self.workload, self.schedule(config)).kernel(name)


class _DepthwiseEmitter:
    def __init__(self, workload: Workload, s: DepthwiseSchedule):
        self.sh = sh = conv_shape(workload)
        self.s = s
        self.b = NestBuilder()
        self.epi = Epilogue.of(workload, s.integer_clamp)
        self.leads = rules.phase_leads(sh, s.lanes) if s.taps == "ext" and sh.stride > 1 else (0,) * sh.stride
        self.wq = rules.phase_width(sh, s.lanes, s.taps == "ext", max(self.leads))
        self.row = sh.stride * self.wq  # packed floats per padded input row

    def kernel(self, name: str) -> Kernel:
        sh, s, b = self.sh, self.s, self.b
        ip_size = sh.padded[0] * self.row
        buffers = (
            Buffer("input", sh.n * sh.c * sh.h * sh.w, BufferKind.INPUT),
            Buffer("weights", sh.k * sh.r * sh.s, BufferKind.INPUT),
            *self.epi.buffers(sh.k, sh.n * sh.k * sh.oh * sh.ow),
            Buffer("output", sh.n * sh.k * sh.oh * sh.ow, BufferKind.OUTPUT),
            Buffer("Ip", -(-ip_size // s.lanes) * s.lanes, BufferKind.LOCAL),
        )
        # Padding and slack columns are never written by the packing: zero them once.
        with b.loop(-(-ip_size // s.lanes), "z") as z:
            b.store("Ip", z * s.lanes, Const(0.0, s.lanes), s.lanes)
        with b.loop(sh.n, "n") as ni, b.loop(sh.c, "c") as ci:
            if s.order == "yx":
                self.row_tiles(ni, ci)
            else:
                with b.loop(sh.h, "py") as y:
                    self.pack_row(ni * sh.c + ci, y)
                with b.loop(sh.multiplier, "m") as m:  # the packed plane serves all its output channels
                    self.plane(ni, ci * sh.multiplier + m)
        return b.kernel(name, buffers)

    def row_tiles(self, ni: Affine, ci: Affine) -> None:
        """Order "yx": each tile of output rows packs the input rows it is the first to need, then computes
        its rows for every output channel of the plane. The rows are packed right before they are read
        (in L1, and the loads of the next rows overlap the FMAs), not a whole plane ahead, which at 112²
        and stride 2 outgrows L1 (docs/design.md, Convolutions)."""
        sh, s, b = self.sh, self.s, self.b
        step = s.p * sh.stride  # padded input rows a full tile adds
        lead = (sh.r - 1) * sh.dilation + 1 - sh.stride  # tile t needs rows [t*step + lead, +step) first
        first, end = sh.top, sh.top + sh.h  # the padded rows that hold input (the rest stay zero)

        def pack(start: int, stop: int) -> None:  # constant padded rows, clipped to the input's
            for row in range(max(start, first), min(stop, end)):
                self.pack_row(ni * sh.c + ci, Affine.of(row - sh.top))

        def compute(y: Affine, nrows: int) -> None:
            with b.loop(sh.multiplier, "m") as m:
                self.columns(ni, ci * sh.multiplier + m, y, nrows)

        pack(0, lead)
        full, tail = divmod(sh.oh, s.p)
        # Tiles whose new rows all hold input run in one loop; the others are peeled, their rows clipped.
        lo = min(full, max(0, -(-(first - lead) // step)))
        hi = max(lo, min(full, (end - lead - step) // step + 1))
        for t in range(lo):
            pack(t * step + lead, (t + 1) * step + lead)
            compute(Affine.of(t * s.p), s.p)
        with b.loop(hi - lo, "ty") as tv:
            with b.loop(step, "pr") as k:
                self.pack_row(ni * sh.c + ci, (tv + lo) * step + (lead - sh.top) + k)
            compute((tv + lo) * s.p, s.p)
        for t in range(hi, full):
            pack(t * step + lead, (t + 1) * step + lead)
            compute(Affine.of(t * s.p), s.p)
        if tail:
            pack(full * step + lead, full * step + lead + tail * sh.stride)
            compute(Affine.of(full * s.p), tail)

    def pack_row(self, plane: Affine, y: Affine) -> None:
        """Ip[top + y][phase][q] <- input[plane][y][x] for the padded column x + left = q*stride + phase."""
        sh, b, lanes = self.sh, self.b, self.s.lanes
        src = (plane * sh.h + y) * sh.w
        dst = (y + sh.top) * self.row
        if sh.stride == 1:
            # "ext" copies two vectors a step: LLVM pairs their halves into one LDP and one STP.
            v = rules.row_lanes(sh.w, lanes * (2 if self.s.taps == "ext" else 1))

            def copy(x: Affine) -> None:
                b.store("Ip", dst + sh.left + x, Load("input", src + x, v), v)

            full, tail = divmod(sh.w, v)
            with b.loop(full, "px", rules.pack_loop_kind(full)) as t:
                copy(t * v)
            if tail:  # a whole vector ending at the row's end (overlapping) beats a partial one
                copy(Affine.of(sh.w - v))
            return
        v = rules.row_lanes(sh.w // 2, lanes)
        done = self.deinterleave(src, dst, v) if sh.stride == 2 and v > 1 else 0
        for phase in range(sh.stride):  # the columns left, one by one
            q0 = max(0, -(-(done + sh.left - phase) // sh.stride))  # first q with x >= done
            q1 = (sh.w - 1 + sh.left - phase) // sh.stride  # last q with x < w
            if q1 < q0:
                continue
            with b.loop(q1 - q0 + 1, "pq") as q:
                x = (q + q0) * sh.stride + (phase - sh.left)
                b.store("Ip", dst + phase * self.wq + self.leads[phase] + q + q0, Load("input", src + x))

    def deinterleave(self, src: Affine, dst: Affine, lanes: int) -> int:
        """Stride 2: each 2V input columns are two vector loads and two shuffles into V even and V odd
        columns, stored whole into their phases (XNNPACK's and MLAS's stride-2 depthwise kernels read
        strided columns instead; packing once per row makes every later load contiguous). Returns how
        many columns it packed: whole chunks, the rest is left to scalar copies."""
        sh, b = self.sh, self.b
        width = 2 * lanes

        def chunk(x0: Affine) -> None:  # x0 even
            # One load of 2V floats and two even/odd shuffles of it: the pattern LLVM's InterleavedAccess
            # pass turns into one AArch64 LD2 or RISC-V VLSEG2 (on x86: two loads and two permutes).
            both = Load("input", src + x0, width)
            for first in (0, 1):  # input columns x0 + first + 2i, padded x0 + first + left + 2i
                phase, q = (first + sh.left) % 2, (first + sh.left) // 2
                picked = Shuffle(both, both, tuple(range(first, width, 2)))
                b.store("Ip", dst + phase * self.wq + self.leads[phase] + div(x0, 2) + q, picked, lanes)

        chunks = sh.w // width
        with b.loop(chunks, "pv", rules.pack_loop_kind(chunks)) as t:
            chunk(t * width)
        if not chunks or sh.w % width < 2:
            return chunks * width
        # The rest: one more chunk ending at the row's last even column, overlapping the previous one
        # (it rewrites the same values), so at most one column is left to a scalar copy.
        last = (sh.w - width) // 2 * 2
        chunk(Affine.of(last))
        return last + width

    def plane(self, ni: Affine, oc: Affine) -> None:
        """Order "xy": all outputs of output channel `oc` of image `ni`, column blocks outside row tiles,
        from the packed plane."""
        sh, s, b = self.sh, self.s, self.b
        cols = s.nv * s.lanes

        def block(x0: Affine, ncols: int) -> None:
            b.split(
                sh.oh,
                s.p,
                lambda y, nrows: b.split(
                    ncols, cols, lambda x, nc: self.micro(ni, oc, y, nrows, x0 + x, nc), "x"
                ),
                "y",
            )

        b.split(sh.ow, s.owb, block, "bx")

    def columns(self, ni: Affine, oc: Affine, y: Affine, nrows: int) -> None:
        """Order "yx": one tile of output rows of channel `oc`, block by block of columns."""
        sh, s, b = self.sh, self.s, self.b
        cols = s.nv * s.lanes
        b.split(
            sh.ow,
            s.owb,
            lambda x0, nb: b.split(nb, cols, lambda x, nc: self.micro(ni, oc, y, nrows, x0 + x, nc), "x"),
            "bx",
        )

    def micro(self, ni: Affine, oc: Affine, y: Affine, nrows: int, x: Affine, ncols: int) -> None:
        if self.s.taps == "ext":
            self.ext_micro(ni, oc, y, nrows, x, ncols)
        else:
            self.load_micro(ni, oc, y, nrows, x, ncols)

    def load_micro(self, ni: Affine, oc: Affine, y: Affine, nrows: int, x: Affine, ncols: int) -> None:
        """acc[p][v] = bias + sum over (kh, kw) of broadcast(weight) * Ip row vector; epilogue; store."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes
        nvec = -(-ncols // lanes)
        counts = [min(ncols - v * lanes, lanes) % lanes for v in range(nvec)]
        acc = [[b.register(f"acc{p}_{v}", lanes) for v in range(nvec)] for p in range(nrows)]

        def out_index(p: int, v: int) -> Affine:
            return ((ni * sh.k + oc) * sh.oh + y + p) * sh.ow + x + v * lanes

        for p in range(nrows):
            for v in range(nvec):
                residual = Load("residual", out_index(p, v), lanes, counts[v])
                b.assign(acc[p][v], self.epi.initial(lanes, Broadcast(Load("bias", oc), lanes), residual))
        wv = b.register("wv", lanes)
        kind = LoopKind.UNROLLED if s.unroll_kh else LoopKind.SERIAL
        with b.loop(sh.r, "ki", kind) as i:
            for j in range(sh.s):
                phase, shift = divmod(j * sh.dilation, sh.stride)[::-1]
                b.assign(wv, Broadcast(Load("weights", oc * (sh.r * sh.s) + i * sh.s + j), lanes))
                for p in range(nrows):
                    row = ((y + p) * sh.stride + i * sh.dilation) * self.row + phase * self.wq + shift
                    for v in range(nvec):
                        a = Load("Ip", row + x + v * lanes, lanes)
                        b.assign(acc[p][v], MulAdd(wv, a, acc[p][v]))
        for p in range(nrows):
            for v in range(nvec):
                b.store("output", out_index(p, v), self.epi.apply(acc[p][v], lanes, True), lanes, counts[v])

    def ext_micro(self, ni: Affine, oc: Affine, y: Affine, nrows: int, x: Affine, ncols: int) -> None:
        """The "ext" taps: input row by input row of the tile, phase by phase, its V + 1 aligned vectors
        loaded once, each kw's tap shifted out of two neighbours by a shuffle (AArch64 EXT; XNNPACK's CHW
        depthwise kernels shift the same way) and multiplied into every (output row, kernel row) that reads
        it, with the r*s weights held in registers; an accumulator starts as its first product (FMUL), or
        as bias plus residual; then the epilogue and the store. kh is always unrolled (rows are constants)."""
        sh, b, lanes = self.sh, self.b, self.s.lanes
        nvec = -(-ncols // lanes)
        counts = [min(ncols - v * lanes, lanes) % lanes for v in range(nvec)]
        acc = [[b.register(f"acc{p}_{v}", lanes) for v in range(nvec)] for p in range(nrows)]

        def out_index(p: int, v: int) -> Affine:
            return ((ni * sh.k + oc) * sh.oh + y + p) * sh.ow + x + v * lanes

        started = set()
        if self.epi.bias or self.epi.residual:
            for p in range(nrows):
                for v in range(nvec):
                    residual = Load("residual", out_index(p, v), lanes, counts[v])
                    bias = Broadcast(Load("bias", oc), lanes)
                    b.assign(acc[p][v], self.epi.initial(lanes, bias, residual))
                    started.add((p, v))
        w = self.lane_weights(oc)
        readers: dict[int, list[tuple[int, int]]] = {}
        for p in range(nrows):
            for i in range(sh.r):
                readers.setdefault(p * sh.stride + i * sh.dilation, []).append((p, i))
        phases: dict[int, list[tuple[int, int]]] = {}  # phase -> its (kw, shift) taps
        for j in range(sh.s):
            shift, phase = divmod(j * sh.dilation, sh.stride)
            phases.setdefault(phase, []).append((j, shift + self.leads[phase]))
        tap = b.register("tap", lanes)
        for q in sorted(readers):
            for phase, taps in phases.items():
                row = (y * sh.stride + q) * self.row + phase * self.wq + x
                extra = -(-max(shift for _, shift in taps) // lanes)
                vecs = [b.register(f"t{u}", lanes) for u in range(nvec + extra)]
                for u, reg in enumerate(vecs):
                    b.assign(reg, Load("Ip", row + u * lanes, lanes))
                for j, shift in taps:
                    for v in range(nvec):
                        b.assign(tap, _shifted(vecs, v, shift, lanes))
                        for p, i in readers[q]:
                            a = acc[p][v]
                            if (p, v) in started:
                                b.assign(a, MulAdd(w[i][j], tap, a))
                            else:
                                b.assign(a, Binary(BinaryOp.MUL, w[i][j], tap))
                                started.add((p, v))
        for p in range(nrows):
            for v in range(nvec):
                value = acc[p][v] if (p, v) in started else Const(0.0, lanes)
                b.store("output", out_index(p, v), self.epi.apply(value, lanes, True), lanes, counts[v])

    def lane_weights(self, oc: Affine) -> list[list[Broadcast]]:
        """The r*s weights of output channel `oc` loaded as ceil(r*s / lanes) vectors, w[i][j] a lane of
        one (FMLA by element, Arm ARM C7.2 "FMLA (by element)"): a taller tile fits than beside r*s
        broadcast registers."""
        sh, b, lanes = self.sh, self.b, self.s.lanes
        n = sh.r * sh.s
        wv = [b.register(f"wv{c}", lanes) for c in range(-(-n // lanes))]
        for c, reg in enumerate(wv):
            b.assign(reg, Load("weights", oc * n + c * lanes, lanes, min(n - c * lanes, lanes) % lanes))
        return [
            [Broadcast(wv[t // lanes], lanes, t % lanes) for t in range(i * sh.s, (i + 1) * sh.s)]
            for i in range(sh.r)
        ]


def _shifted(vecs: list[Reg], v: int, shift: int, lanes: int) -> Reg | Shuffle:
    """The vector `shift` columns past vecs[v]: a register itself, or lanes of two neighbours."""
    whole, part = divmod(shift, lanes)
    if not part:
        return vecs[v + whole]
    return Shuffle(vecs[v + whole], vecs[v + whole + 1], tuple(range(part, part + lanes)))
