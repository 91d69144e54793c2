"""The conv2d template: a conv2d workload + target in, a packed, channel-blocked, register-tiled nest out.

Per image and block of `tile_ic` input channels, the input is copied once into a zero-padded local
buffer (CHW or channel-blocked HWC, a knob), so padding costs no branch anywhere. Per block of `tile_oc`
output channels the weights are packed into strips of nr = V vectors of output channels (zero past k),
at every call; or, for prepacked=1, the weights parameter already holds every block's strips
(`Conv2dTemplate.prepack`, the layout `kernel_inputs` gives). The register tile is P output pixels along
a row x V channel vectors, updated by broadcast(input) x weight-vector FMAs over the (c, kh, kw)
reduction in a tunable order, kw optionally unrolled (`unroll_kw`). Accumulators start from the bias
plus the residual (first channel block) or the output (later blocks); ReLU/ReLU6 run on registers in the
last block; tails are constant-size tiles.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

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
    Reg,
    Value,
)
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind, KnobValue
from xtune.target import Target
from xtune.templates.matmul import MatmulTemplate, Operands
from xtune.templates.tiles import (
    Epilogue,
    Scalars,
    clipped,
    fmas_per_load,
    parse_tile,
    register_tiles,
    split_edges,
    tile_registers,
    whole_tiles,
)
from xtune.workload import EPILOGUE, ConvShape, Workload, conv_shape, parse_workload

IC_OPTIONS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
OC_OPTIONS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
OW_OPTIONS = (4, 8, 12, 16, 24, 32, 48, 64, 112, 224)
OH_OPTIONS = (1, 2, 4, 8, 16)
REDUCTIONS = ("crs", "rsc")  # reduction loops outermost first: c = input channel, r = kh, s = kw
STACK_BUDGET = 2 << 20  # bytes of packed buffers on the kernel's stack (8 MiB default stacks, small boards)


@dataclass(frozen=True)
class ConvSchedule:
    """A config resolved against the shape: effective block sizes and switches."""

    p: int  # output pixels per register tile
    nv: int  # output-channel vectors per register tile
    lanes: int
    cb: int  # input channels per block
    kb: int  # output channels per block, a multiple of nr
    ohb: int
    owb: int  # a multiple of p unless it covers the whole row
    order: str  # "pk": pixel tiles outside channel strips, "kp": strips outside
    red: str
    hwc: bool  # packed input layout: channel-minor (HWC) or planes (CHW)
    unroll_kw: bool
    unroll: int

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


def padded(sh: ConvShape) -> tuple[int, int]:
    return sh.h + 2 * sh.pad, sh.w + 2 * sh.pad


def ic_options(sh: ConvShape) -> tuple[int, ...]:
    """Channel blocks whose padded input copy fits the stack budget (at least one channel)."""
    hp, wp = padded(sh)
    fits = tuple(o for o in clipped(IC_OPTIONS, sh.c) if 4 * o * hp * wp <= STACK_BUDGET // 2)
    return fits or (1,)


def channel_blocks(
    sh: ConvShape, nr: Scalars, tile_ic: Scalars, tile_oc: Scalars, tile_oh: Scalars
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (cb, kb, ohb) a config's block knobs resolve to for strips of nr output channels: no block
    larger than its axis, and output-channel blocks of whole strips (at least one). `kb` is as the config
    asks: Conv2dTemplate.schedule then shrinks it to the stack budget (`stack_clamped`), which features.py
    leaves out (its conv2d features, and the models trained on them, predate the clamp)."""
    cb = np.minimum(tile_ic, sh.c)
    kb = np.maximum(nr, -(-np.minimum(tile_oc, sh.k) // nr) * nr)
    return cb, kb, np.minimum(tile_oh, sh.oh)


def stack_clamped(sh: ConvShape, nr: int, cb: int, kb: int) -> int:
    """`kb` less whole strips until the packed input and weights fit STACK_BUDGET (never below one strip)."""
    hp, wp = padded(sh)
    while kb > nr and 4 * (cb * hp * wp + cb * sh.r * sh.s * kb) > STACK_BUDGET:
        kb -= nr
    return kb


def is_pointwise(sh: ConvShape) -> bool:
    """A 1x1 window at stride 1 without padding: every output pixel is a dot product of its own input pixel
    with each output channel's weights, i.e. the convolution is a matmul."""
    return sh.r == 1 and sh.s == 1 and sh.stride == 1 and sh.pad == 0


def pointwise_matmul(workload: Workload) -> tuple[Workload, Operands]:
    """The matmul a pointwise conv2d is, and where its operands live. NCHW, per image: out[k, p] =
    W[k, c] . X[c, p] (A = OIHW weights, B = the image's planes, C = its output planes, bias per row),
    the images one after another. NHWC, the whole batch: out[p, k] = X[p, c] . W[c, k] (A = the pixels,
    B = HWIO weights, bias per column, as matmul's own). prepacked=1: the weights operand (A, or B for
    nhwc) is passed in the matmul's panels."""
    sh = conv_shape(workload)
    params = (
        Buffer("input", sh.n * sh.c * sh.h * sh.w, BufferKind.INPUT),
        Buffer("weights", sh.k * sh.c, BufferKind.INPUT),
        *Epilogue.of(workload).buffers(sh.k, sh.n * sh.k * sh.h * sh.w),
        Buffer("output", sh.n * sh.k * sh.h * sh.w, BufferKind.OUTPUT),
    )
    packed = bool(workload["prepacked"])
    if sh.nhwc:
        m, n, k = sh.n * sh.h * sh.w, sh.k, sh.c
        operands = Operands(a="input", b="weights", c="output", params=params,
                            prepacked="B" if packed else "")  # fmt: skip
    else:
        m, n, k = sh.k, sh.h * sh.w, sh.c
        operands = Operands(a="weights", b="input", c="output", params=params, bias_rows=True, batch=sh.n,
                            prepacked="A" if packed else "")  # fmt: skip
    epilogue = ",".join(f"{key}={workload[key]}" for key in EPILOGUE)  # the same fused epilogue
    return parse_workload(f"matmul:m={m},n={n},k={k},{epilogue}"), operands


class Conv2dTemplate:
    def __init__(self, workload: Workload, target: Target):
        self.workload = workload
        self.target = target
        self.shape = sh = conv_shape(workload)
        # A pointwise conv2d lowers through the matmul template: its space, default, features and cost
        # models are the matmul's (the register tiles and blocking that make a matmul fast).
        self.as_matmul: MatmulTemplate | None = None
        if is_pointwise(sh):
            gemm, operands = pointwise_matmul(workload)
            self.as_matmul = MatmulTemplate(gemm, target, operands)
            self.space = self.as_matmul.space
            return
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, register_tiles(target)),
                Knob("tile_ic", KnobKind.TILE, ic_options(sh)),
                Knob("tile_oc", KnobKind.TILE, clipped(OC_OPTIONS, sh.k)),
                Knob("tile_oh", KnobKind.TILE, clipped(OH_OPTIONS, sh.oh)),
                Knob("tile_ow", KnobKind.TILE, clipped(OW_OPTIONS, sh.ow)),
                Knob("order", KnobKind.CHOICE, ("pk", "kp")),
                Knob("reduction", KnobKind.CHOICE, REDUCTIONS),
                Knob("pack_layout", KnobKind.CHOICE, ("hwc", "chw")),
                Knob("unroll_kw", KnobKind.CHOICE, (1, 0)),
                Knob("unroll", KnobKind.UNROLL, (1, 2, 4)),
            )
        )

    def schedule(self, config: Config) -> ConvSchedule:
        sh, lanes = self.shape, self.target.fp32_lanes
        p, nv = parse_tile(str(config["tile"]))
        nr = nv * lanes
        knobs = (config.int("tile_ic"), config.int("tile_oc"), config.int("tile_oh"))
        cb, kb, ohb = (int(b) for b in channel_blocks(sh, nr, *knobs))
        # The packed weights of an output-channel block share the stack budget with the packed input.
        kb = stack_clamped(sh, nr, cb, kb)
        owb = int(whole_tiles(config.int("tile_ow"), sh.ow, p))
        return ConvSchedule(
            p, nv, lanes, cb, kb, ohb, owb, str(config["order"]),
            str(config["reduction"]), config["pack_layout"] == "hwc", bool(config["unroll_kw"]),
            config.int("unroll"),
        )  # fmt: skip

    def default_config(self) -> Config:
        if self.as_matmul is not None:
            return self.as_matmul.default_config()
        sh, t = self.shape, self.target
        knobs = {k.name: k.options for k in self.space.knobs}
        ints = {name: [int(o) for o in opts] for name, opts in knobs.items() if name.startswith("tile_")}

        def score(tile: str) -> float:
            # FMAs per loaded value, discounted by the work wasted on partial pixel and channel tiles.
            p, nv = parse_tile(tile)
            nr = nv * t.fp32_lanes
            waste = (sh.ow / (-(-sh.ow // p) * p)) * (sh.k / (-(-sh.k // nr) * nr))
            return fmas_per_load(p, nv) * waste + 1e-3 * p * nv

        # A spare register: a tile that fills the register file exactly spills (docs/benchmarks.md, History).
        roomy = [str(o) for o in knobs["tile"] if _fits(str(o), t.vector_registers - 1)]
        tile = max(roomy or [str(o) for o in knobs["tile"]], key=score)
        # unroll_kw: a 7-wide window unrolled doubles code and compile time for no gain
        # (docs/benchmarks.md, History).
        values: dict[str, KnobValue] = {
            "tile": tile, "tile_ic": max(ints["tile_ic"]), "tile_oc": max(ints["tile_oc"]),
            "tile_oh": min(ints["tile_oh"]), "tile_ow": max(ints["tile_ow"]), "order": "pk",
            "reduction": "rsc", "pack_layout": "hwc", "unroll_kw": int(sh.s <= 3), "unroll": 1,
        }  # fmt: skip
        return self.space.config(self.space.index_of(values))

    def kernel(self, config: Config, name: str) -> Kernel:
        """The nest of `config`. For prepacked=1 its `weights` parameter holds every block's packed strips
        as `prepack` lays them out (weights known at build time, as in a network): no packing per call.
        A pointwise conv2d is its matmul (prepacked=1: its weights operand in the matmul's panels)."""
        if self.as_matmul is not None:
            return self.as_matmul.kernel(config, name)
        return _ConvEmitter(self.workload, self.schedule(config)).kernel(name)

    def kernel_inputs(self, config: Config, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The reference inputs (the workload's layouts) as `config`'s kernel reads them: for prepacked=1
        the weights (slot 1) packed for the config, the rest as they are."""
        if self.as_matmul is not None:
            return self.as_matmul.kernel_inputs(config, inputs)
        out = list(inputs)
        if self.workload["prepacked"]:
            out[1] = self.prepack(config, out[1])
        return out

    def packed_layout(self, config: Config) -> Hashable:
        """What fixes the layout `kernel_inputs` gives `config`'s weights (None: passed as they are): the
        blocking, the strip width and the reduction order. Configs with equal keys read equal bytes."""
        if self.as_matmul is not None:
            return self.as_matmul.packed_layout(config)
        if not self.workload["prepacked"]:
            return None
        s = self.schedule(config)
        return (s.cb, s.kb, s.nr, s.red)

    def prepack(self, config: Config, weights: np.ndarray) -> np.ndarray:
        """The workload's weights (OIHW, or HWIO for nhwc) as the prepacked kernel of `config` reads them:
        per input-channel block (outer) and output-channel block, the strips `pack_weights` would write,
        zero past the last output channel; every block `cb*r*s*kb` floats (tail blocks padded). Not for a
        pointwise conv2d (its matmul's `kernel_inputs` packs its weights)."""
        assert self.as_matmul is None
        sh, s = self.shape, self.schedule(config)
        layout = (sh.r, sh.s, sh.c, sh.k) if sh.nhwc else (sh.k, sh.c, sh.r, sh.s)
        w = np.asarray(weights, np.float32).reshape(layout)
        emitter = _ConvEmitter(self.workload, s)
        kb, cb = min(s.kb, sh.k), min(s.cb, sh.c)
        # wp_index is affine in (strip, channel, kh, kw) and block_base in (c0, k0): their coefficients
        # place every element of every block with one index computation over the whole (k, c, r, s).
        strip = emitter.wp_index(Affine.of("st"), Affine.of("c"), Affine.of("i"), Affine.of("j"))
        idx, base = dict(strip.terms), dict(emitter.block_base(Affine.of("c0"), Affine.of("k0")).terms)
        out = np.zeros(emitter.packed_size, np.float32)
        # int32 indices (half the bytes to compute and scatter by) whenever they fit: any real layer.
        ints: np.dtype[np.signedinteger[Any]] = np.dtype(np.int32 if out.size < 2**31 else np.int64)
        k, c = np.arange(sh.k, dtype=ints)[:, None], np.arange(sh.c, dtype=ints)[None, :]
        i, j = np.arange(sh.r, dtype=ints)[:, None], np.arange(sh.s, dtype=ints)[None, :]
        kk, cc = k % kb, c % cb
        per_kc = (base.get("k0", 0) * (k - kk) + kk % s.nr + idx.get("st", 0) * (kk // s.nr)
                  + base.get("c0", 0) * (c - cc) + idx.get("c", 0) * cc + strip.const)  # fmt: skip
        per_ij = idx.get("i", 0) * i + idx.get("j", 0) * j
        # Scatter in the source's own order: the weights are read contiguously, only the writes jump.
        if sh.nhwc:
            out[per_ij[:, :, None, None] + per_kc.T] = w
        else:
            out[per_kc[:, :, None, None] + per_ij] = w
        return out


def _fits(tile: str, registers: int) -> bool:
    p, nv = parse_tile(tile)
    return tile_registers(p, nv) <= registers


@dataclass(frozen=True)
class _Block:
    """Where the nest is: image, input-channel block (and whether it is the first/last), output block."""

    n: Affine
    c0: Affine
    ccur: int
    first: bool
    last: bool
    k0: Affine = field(default_factory=Affine)
    kcur: int = 0


class _ConvEmitter:
    def __init__(self, workload: Workload, s: ConvSchedule):
        self.sh = conv_shape(workload)
        self.s = s
        self.prepacked = bool(workload["prepacked"])
        self.b = NestBuilder()
        self.epi = Epilogue.of(workload)
        self.hp, self.wp = padded(self.sh)

    def kernel(self, name: str) -> Kernel:
        sh, s, b = self.sh, self.s, self.b
        ip_size = -(-s.cb * self.hp * self.wp // s.lanes) * s.lanes
        weights = self.packed_size if self.prepacked else sh.k * sh.c * sh.r * sh.s
        buffers = [
            Buffer("input", sh.n * sh.c * sh.h * sh.w, BufferKind.INPUT),
            Buffer("weights", weights, BufferKind.INPUT),
            *self.epi.buffers(sh.k, sh.n * sh.k * sh.oh * sh.ow),
            Buffer("output", sh.n * sh.k * sh.oh * sh.ow, BufferKind.OUTPUT),
            Buffer("Ip", ip_size, BufferKind.LOCAL),
        ]
        if not self.prepacked:
            buffers.append(Buffer("Wp", s.cb * sh.r * sh.s * s.kb, BufferKind.LOCAL))
        if not sh.nhwc:
            buffers.append(Buffer("Ot", s.p * s.nr, BufferKind.LOCAL))  # transposes a tile for NCHW
        if sh.pad:  # the border of the packed input is never written again: zero it once
            with b.loop(ip_size // s.lanes, "z") as z:
                b.store("Ip", z * s.lanes, Const(0.0, s.lanes), s.lanes)
        with b.loop(sh.n, "n") as ni:

            def cblock(c0: Affine, ccur: int, first: bool, last: bool) -> None:
                self.cblock(_Block(ni, c0, ccur, first, last))

            split_edges(b, sh.c, s.cb, cblock, "cb")
        return b.kernel(name, tuple(buffers))

    @property
    def packed_size(self) -> int:
        """Floats of the prepacked weights: one `cb*r*s*kb` block per (input, output) channel block."""
        sh, s = self.sh, self.s
        kb, cb = min(s.kb, sh.k), min(s.cb, sh.c)
        return -(-sh.c // cb) * -(-sh.k // kb) * s.cb * sh.r * sh.s * s.kb

    def block_base(self, c0: Affine | int, k0: Affine | int) -> Affine:
        """Where the prepacked block of channels c0.. and output channels k0.. starts: blocks are laid out
        input-channel block first, each c0/cb * (k blocks) + k0/kb blocks of `cb*r*s*kb` floats."""
        sh, s = self.sh, self.s
        kb, cb = min(s.kb, sh.k), min(s.cb, sh.c)
        block = s.cb * sh.r * sh.s * s.kb
        # c0 and k0 are multiples of cb and kb, so the division is exact in the coefficients.
        return Affine.of(c0) * (-(-sh.k // kb) * block // cb) + Affine.of(k0) * (block // kb)

    def ip_index(self, cc: Affine | int, row: Affine | int, col: Affine | int) -> Affine:
        if self.s.hwc:
            return (Affine.of(row) * self.wp + col) * self.s.cb + cc
        return Affine.of(cc) * (self.hp * self.wp) + Affine.of(row) * self.wp + col

    def cblock(self, ctx: _Block) -> None:
        self.pack_input(ctx)

        def kblock(k0: Affine, kcur: int) -> None:
            inner = replace(ctx, k0=k0, kcur=kcur)
            if not self.prepacked:
                self.pack_weights(inner)
            self.spatial(inner)

        self.b.split(self.sh.k, self.s.kb, kblock, "kb")

    def pack_input(self, ctx: _Block) -> None:
        """Ip <- the block's input channels at offset (pad, pad); vectors along the contiguous axis."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes

        def src(c: Affine, y: Affine, x: Affine) -> Affine:
            if sh.nhwc:
                return ((ctx.n * sh.h + y) * sh.w + x) * sh.c + ctx.c0 + c
            return ((ctx.n * sh.c + ctx.c0 + c) * sh.h + y) * sh.w + x

        def copy(c: Affine, y: Affine, x: Affine, n: int) -> None:  # n: floats of a vector, 0: a scalar
            width = lanes if n else 1
            value = Load("input", src(c, y, x), width, n % width)
            b.store("Ip", self.ip_index(c, y + sh.pad, x + sh.pad), value, width, n)

        if sh.nhwc == s.hwc and sh.nhwc:  # same minor axis: vector copies
            with b.loop(sh.h, "pi") as y, b.loop(sh.w, "pj") as x:
                b.split(ctx.ccur, lanes, lambda c, n: copy(c, y, x, n), "pc")
        elif sh.nhwc == s.hwc:
            with b.loop(ctx.ccur, "pc") as c, b.loop(sh.h, "pi") as y:
                b.split(sh.w, lanes, lambda x, n: copy(c, y, x, n), "pj")
        else:  # a transposition: scalar copies
            with b.loop(sh.h, "pi") as y, b.loop(sh.w, "pj") as x, b.loop(ctx.ccur, "pc") as c:
                copy(c, y, x, 0)

    def wp_index(self, strip: Affine | int, cc: Affine | int, i: Affine | int, j: Affine | int) -> Affine:
        sh, s = self.sh, self.s
        if s.red == "crs":
            inner = (Affine.of(cc) * sh.r + i) * sh.s + j
        else:
            inner = (Affine.of(i) * sh.s + j) * s.cb + cc
        return Affine.of(strip) * (s.cb * sh.r * sh.s * s.nr) + inner * s.nr

    def pack_weights(self, ctx: _Block) -> None:
        """Wp[strip][reduction order][nr] <- weights of the block, zero past the last output channel."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes
        c0, k0, ccur = ctx.c0, ctx.k0, ctx.ccur

        def strip(js: Affine, ncols: int) -> None:
            st = Affine(tuple((v, c // s.nr) for v, c in js.terms), js.const // s.nr)
            if sh.nhwc:  # HWIO: output channels are contiguous
                with b.loop(sh.r, "wi") as i, b.loop(sh.s, "wj") as j, b.loop(ccur, "wc") as c:
                    for v in range(s.nv):
                        cols = min(max(ncols - v * lanes, 0), lanes)
                        src = ((i * sh.s + j) * sh.c + c0 + c) * sh.k + k0 + js + v * lanes
                        val: Value = Load("weights", src, lanes, cols % lanes) if cols else Const(0.0, lanes)
                        b.store("Wp", self.wp_index(st, c, i, j) + v * lanes, val, lanes)
                return
            # OIHW: read contiguously, write strided.
            with (
                b.loop(ncols, "wk") as kk,
                b.loop(ccur, "wc") as c,
                b.loop(sh.r, "wi") as i,
                b.loop(sh.s, "wj") as j,
            ):
                src = ((k0 + js + kk) * sh.c + c0 + c) * (sh.r * sh.s) + i * sh.s + j
                b.store("Wp", self.wp_index(st, c, i, j) + kk, Load("weights", src))
            if ncols < s.nr:
                with b.loop(ccur, "wc") as c, b.loop(sh.r, "wi") as i, b.loop(sh.s, "wj") as j:
                    for lane in range(ncols, s.nr):
                        b.store("Wp", self.wp_index(st, c, i, j) + lane, Const(0.0))

        b.split(ctx.kcur, s.nr, strip, "ws")

    def spatial(self, ctx: _Block) -> None:
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

    def out_index(self, ctx: _Block, y: Affine, x: Affine | int, ch: Affine | int) -> Affine:
        sh = self.sh
        ni, k0 = ctx.n, ctx.k0
        if sh.nhwc:
            return ((ni * sh.oh + y) * sh.ow + x) * sh.k + k0 + ch
        return ((ni * sh.k + k0 + ch) * sh.oh + y) * sh.ow + x

    def micro(self, ctx: _Block, y: Affine, x: Affine, np_: int, js: Affine, nc: int) -> None:
        """acc[p][v] (+)= sum over (c, kh, kw) of broadcast(Ip) * Wp-vector; then the epilogue and store."""
        sh, s, b, lanes = self.sh, self.s, self.b, self.s.lanes
        nvec = -(-nc // lanes)
        counts = [min(nc - v * lanes, lanes) % lanes for v in range(nvec)]
        acc = [[b.register(f"acc{p}_{v}", lanes) for v in range(nvec)] for p in range(np_)]
        wreg = [b.register(f"w{v}", lanes) for v in range(nvec)]
        bcast = b.register("bcast", lanes)
        strip = Affine(tuple((var, c // s.nr) for var, c in js.terms), js.const // s.nr)
        self.init(ctx, acc, y, x, js, nc, counts)

        packed, base = ("weights", self.block_base(ctx.c0, ctx.k0)) if self.prepacked else ("Wp", Affine())

        def step(env: dict[str, Affine]) -> None:
            cc, i, j = env["c"], env["r"], env["s"]
            for v in range(nvec):
                b.assign(wreg[v], Load(packed, base + self.wp_index(strip, cc, i, j) + v * lanes, lanes))
            for p in range(np_):
                col = (x + p) * sh.stride + j * sh.dilation
                a = Load("Ip", self.ip_index(cc, y * sh.stride + i * sh.dilation, col))
                b.assign(bcast, Broadcast(a, lanes))  # once into a register, not once per FMA
                for v in range(nvec):
                    b.assign(acc[p][v], MulAdd(bcast, wreg[v], acc[p][v]))

        extents = {"c": ctx.ccur, "r": sh.r, "s": sh.s}
        axes = [(a, extents[a]) for a in s.red]
        # Tail tiles run rarely: their reduction stays rolled, which keeps tails x unrolling from
        # doubling the code (and the compile time) of a kernel.
        full = np_ == s.p and nc == s.nr
        serial = [a for a, _ in axes if not (a == "s" and s.unroll_kw and full)]
        self.reduce(axes, serial[-1] if serial and full else "", s.unroll_kw and full, {}, step)
        epi = self.epi
        if sh.nhwc:
            for p in range(np_):
                for v in range(nvec):
                    idx = self.out_index(ctx, y, x + p, js + v * lanes)
                    b.store("output", idx, epi.apply(acc[p][v], lanes, ctx.last), lanes, counts[v])
            return
        for p in range(np_):  # NCHW: channels are far apart in the output, so go through Ot
            for v in range(nvec):
                b.store("Ot", Affine.of(p * s.nr + v * lanes), epi.apply(acc[p][v], lanes, ctx.last), lanes)
        with b.loop(nc, "oc") as ch:
            for p in range(np_):
                b.store("output", self.out_index(ctx, y, x + p, js + ch), Load("Ot", ch + p * s.nr))

    def init(
        self, ctx: _Block, acc: list[list[Reg]], y: Affine, x: Affine, js: Affine, nc: int, counts: list[int]
    ) -> None:
        """Accumulators start at the bias plus the residual (or 0) in the first channel block, else at the
        partial output. In NCHW both the output and the residual are gathered through Ot."""
        s, b, lanes, nhwc = self.s, self.b, self.s.lanes, self.sh.nhwc
        k0 = ctx.k0
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
            full, tail = divmod(extent, u)
            with b.loop(full, f"r{name}") as vo, b.loop(u, f"u{name}", LoopKind.UNROLLED) as vi:
                self.reduce(rest, innermost, unroll_kw, {**env, name: vo * u + vi}, step)
            if tail:
                with b.loop(tail, f"t{name}", LoopKind.UNROLLED) as vt:
                    self.reduce(rest, innermost, unroll_kw, {**env, name: vt + full * u}, step)
        else:
            with b.loop(extent, f"r{name}") as v:
                self.reduce(rest, innermost, unroll_kw, {**env, name: v}, step)
