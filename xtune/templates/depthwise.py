"""The depthwise template: a depthwise workload + target in, a nest vectorized along output width out.

Depthwise convolution has r*s FMAs per output and no reuse across channels, so it is vectorized over
the output width. Per image and input channel the plane is copied once into a zero-padded local
buffer split by column phase (col % stride), which makes the columns of consecutive outputs
contiguous for any stride and removes every padding branch. The register tile is P output rows x
V width vectors; the weights are broadcast, kw is always unrolled (its phase must be a constant),
kh optionally. Bias plus residual initialise the accumulators and ReLU/ReLU6 run on them before the
store.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    NestBuilder,
)
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind
from xtune.target import Target
from xtune.templates.matmul import Epilogue, Real, Scalars, clipped, parse_tile, whole_tiles
from xtune.workload import ConvShape, Workload, conv_shape

OW_OPTIONS = (8, 16, 32, 64, 128, 256)


def register_tiles(target: Target) -> tuple[str, ...]:
    """Tiles "PxV" whose accumulators, one input vector and one weight broadcast fit in registers."""
    return tuple(
        f"{p}x{v}"
        for p in range(1, 9)
        for v in range(1, 7)
        if p * v + 2 <= target.vector_registers and v * target.fp32_lanes <= 64
    )


@dataclass(frozen=True)
class DepthwiseSchedule:
    p: int  # output rows per register tile
    nv: int  # width vectors per register tile
    lanes: int
    owb: int  # output columns per block, a multiple of nv * lanes unless it covers the row
    order: str  # "yx": rows outside column blocks, "xy": column blocks outside rows
    unroll_kh: bool


def phase_width(sh: ConvShape, lanes: int) -> int:
    """Columns per phase of a packed row: whole vectors of outputs plus the kernel's reach."""
    return -(-sh.ow // lanes) * lanes + (sh.s - 1) * sh.dilation // sh.stride + 1


def fmas_per_load(sh: ConvShape, p: Real, nv: Real) -> Real:
    """FMAs per loaded vector of a P rows x V vectors tile: the tile's rows share the (P-1)*stride + r
    input rows they read (s kw positions, V vectors each), plus the r*s weight broadcasts."""
    loads = ((p - 1) * sh.stride + sh.r) * sh.s * nv + sh.r * sh.s
    return p * nv * sh.r * sh.s / loads


def column_block(sh: ConvShape, width: Scalars, tile_ow: Scalars) -> np.ndarray:
    """The output columns per block a `tile_ow` knob resolves to for tiles `width` columns wide: whole
    tile widths, except a block that covers the row."""
    return whole_tiles(tile_ow, sh.ow, width)


class DepthwiseTemplate:
    def __init__(self, workload: Workload, target: Target):
        self.workload = workload
        self.target = target
        self.shape = sh = conv_shape(workload)
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, register_tiles(target)),
                Knob("tile_ow", KnobKind.TILE, clipped(OW_OPTIONS, sh.ow)),
                Knob("order", KnobKind.CHOICE, ("yx", "xy")),
                Knob("unroll_kh", KnobKind.CHOICE, (1, 0)),
            )
        )

    def schedule(self, config: Config) -> DepthwiseSchedule:
        p, nv = parse_tile(str(config["tile"]))
        w = nv * self.target.fp32_lanes
        owb = int(column_block(self.shape, w, config.int("tile_ow")))
        return DepthwiseSchedule(
            p, nv, self.target.fp32_lanes, owb, str(config["order"]), bool(config["unroll_kh"])
        )

    def default_config(self) -> Config:
        sh, lanes = self.shape, self.target.fp32_lanes
        knobs = {k.name: k.options for k in self.space.knobs}

        def score(tile: str) -> float:
            # FMAs per loaded vector, discounted by lanes wasted on partial tiles.
            p, nv = parse_tile(tile)
            cols = nv * lanes
            waste = (sh.ow / (-(-sh.ow // cols) * cols)) * (sh.oh / (-(-sh.oh // p) * p))
            return fmas_per_load(sh, p, nv) * waste + 1e-3 * p * nv

        values = {
            "tile": max((str(o) for o in knobs["tile"]), key=score), "tile_ow": max(knobs["tile_ow"]),
            "order": "yx", "unroll_kh": 1,
        }  # fmt: skip
        return self.space.config(self.space.index_of(values))

    def kernel(self, config: Config, name: str) -> Kernel:
        return _DepthwiseEmitter(self.workload, self.schedule(config)).kernel(name)


class _DepthwiseEmitter:
    def __init__(self, workload: Workload, s: DepthwiseSchedule):
        self.sh = sh = conv_shape(workload)
        self.s = s
        self.b = NestBuilder()
        self.epi = Epilogue.of(workload)
        self.wq = phase_width(sh, s.lanes)
        self.row = sh.stride * self.wq  # packed floats per padded input row

    def kernel(self, name: str) -> Kernel:
        sh, s, b = self.sh, self.s, self.b
        ip_size = (sh.h + 2 * sh.pad) * self.row
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
            self.pack(ni * sh.c + ci)
            with b.loop(sh.multiplier, "m") as m:  # the packed plane serves all its output channels
                self.plane(ni, ci * sh.multiplier + m)
        return b.kernel(name, buffers)

    def pack(self, plane: Affine) -> None:
        """Ip[pad + y][phase][q] <- input[plane][y][x] for the padded column x + pad = q*stride + phase."""
        sh, b, lanes = self.sh, self.b, self.s.lanes
        with b.loop(sh.h, "py") as y:
            src = (plane * sh.h + y) * sh.w
            dst = (y + sh.pad) * self.row
            if sh.stride == 1:
                b.split(
                    sh.w,
                    lanes,
                    lambda x, n: b.store(
                        "Ip", dst + sh.pad + x, Load("input", src + x, lanes, n % lanes), lanes, n
                    ),
                    "px",
                )
                return
            for phase in range(sh.stride):
                q0 = -(-(sh.pad - phase) // sh.stride) if sh.pad > phase else 0  # first q with x >= 0
                q1 = (sh.w - 1 + sh.pad - phase) // sh.stride  # last q with x < w
                if q1 < q0:
                    continue
                with b.loop(q1 - q0 + 1, "pq") as q:
                    x = (q + q0) * sh.stride + (phase - sh.pad)
                    b.store("Ip", dst + phase * self.wq + q + q0, Load("input", src + x))

    def plane(self, ni: Affine, oc: Affine) -> None:
        """All outputs of output channel `oc` of image `ni`, from the packed plane Ip."""
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

        if s.order == "yx":
            b.split(
                sh.oh,
                s.p,
                lambda y, nrows: b.split(
                    sh.ow,
                    s.owb,
                    lambda x0, nb: b.split(
                        nb, cols, lambda x, nc: self.micro(ni, oc, y, nrows, x0 + x, nc), "x"
                    ),
                    "bx",
                ),
                "y",
            )
        else:
            b.split(sh.ow, s.owb, block, "bx")

    def micro(self, ni: Affine, oc: Affine, y: Affine, nrows: int, x: Affine, ncols: int) -> None:
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
