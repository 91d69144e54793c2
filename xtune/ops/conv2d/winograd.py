"""The Winograd template: a conv2d workload with algo=winograd (3x3, stride 1) + target in, an F(m x m, 3x3)
nest out, m = 2 or 4 (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016).

Each m x m output tile of a channel pair is Y = A^T [(G g G^T) * (B^T d B)] A on an (m+2) x (m+2) input
patch d: F(2x2) does 16 multiplies instead of 36, F(4x4) 36 instead of 144 (winograd_transforms.py holds
its matrices, formulas and error analysis). The tile side is the knob `m`, appended last with 2 first so
that every config logged before it keeps its index. Vectors along channels. Per image the input is copied
once into a zero-padded local buffer of channel vectors (when padding or an output size no multiple of m
needs one, and always for NCHW: a transposition). Per block of tiles (tile rows x tiles along a row):
(a) the input transform V = B^T d B of every patch, a channel vector at a time, into V[e][tile][c]
(F(4x4): two passes over the channels, columns then rows in place, so that its 36 values never need
the registers at once);
(b) e = (m+2)^2 GEMMs M[e] (tiles x K) = V[e] (tiles x C) . U[e] (C x K), a register tile of tiles x
output-channel vectors updated by broadcast(V) x U-vector FMAs (the matmul template's micro kernel), C in
blocks of cb;
(c) the output transform Y = A^T M A per tile and channel vector, plus the fused epilogue, stored for the
valid pixels only (the last tile row and column of a size no multiple of m are partial); NCHW stores
them float by float through a small transposing buffer (Ot).
U = G g G^T (e x C x K floats) is the transformed weights: `prepack` computes it on the host (a
network's constant weights, prepacked=1, through `kernel_inputs`), or the kernel computes the U of each
output-channel block from the plain weights into a local buffer. The default m is 4 with prepacked U
where its GEMMs do fewer multiplies (`default_m`). This module holds the space, the default config and
U; ops/conv2d/winograd_nest.py the loop nest.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

from xtune.ops.conv import ConvShape, conv_shape
from xtune.ops.conv2d.winograd_nest import WinogradEmitter, image_copy_floats, round_up, stack_floats, tiles
from xtune.ops.conv2d.winograd_transforms import MS, elements, filter_transform4
from xtune.ops.conv2d.winograd_weights import WinogradSchedule
from xtune.ops.tiles import clipped, fmas_per_load, parse_tile, register_tiles, roomy_tiles
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Kernel
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind, KnobValue
from xtune.target import Target

TY_OPTIONS = (1, 2, 4, 7, 8, 14, 16, 28, 56)  # tile rows per block
TX_OPTIONS = (1, 2, 4, 7, 8, 14, 16, 28, 56)  # tiles along a row per block
CB_OPTIONS = (8, 16, 32, 64, 128, 256, 512)
KB_OPTIONS = (16, 32, 64, 128, 256, 512)
# Bytes of local buffers: the padded image, V, M and (without prepacked=1) one block's U. Twice conv2d's
# budget, half of the 8 MiB default stack that `xtune build` allows (docs/firmware.md, "Stack"): with
# conv2d's 2 MiB a per-call U of 512 channels (16 x 512 x 64 floats, 2 MiB) left room for blocks of one
# tile only, 10x slower.
STACK_BUDGET = 4 << 20
# F(4x4) by default only on images of at least this many of its tiles (`default_m` says why).
MIN_TILES_F4 = 32
WIDEST_LANES = 16  # float32 lanes of the widest target (AVX-512): the largest channel padding of any


def fits_stack(sh: ConvShape) -> bool:
    """Whether the padded image copy, which every config keeps, fits the stack budget on every target:
    a larger image (VGG's 64 x 224 x 224: 13 MB) runs direct, whose panels fit (docs/firmware.md, Stack)."""
    return 4 * image_copy_floats(sh, WIDEST_LANES, 2) <= STACK_BUDGET


def m_options(sh: ConvShape) -> tuple[int, ...]:
    """The output tile sides of the `m` knob: 2 (the knob's first option: what configs logged before the
    knob meant), and 4 where its padded image copy (up to 3 more rows and columns) fits the budget too."""
    return MS if 4 * image_copy_floats(sh, WIDEST_LANES, 4) <= STACK_BUDGET else MS[:1]


# F(2x2, 3x3) (Lavin & Gray, section 4.1): d is a 4x4 input patch, g the 3x3 filter, Y the 2x2 output.
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float32)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float32)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float32)


class WinogradTemplate:
    def __init__(self, workload: Workload, target: Target):
        self.workload = workload
        self.target = target
        self.shape = sh = conv_shape(workload)
        th, tw = tiles(sh, 2)  # the block knobs' options: F(2x2)'s tiles (F(4x4)'s clip to theirs)
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, register_tiles(target)),
                Knob("tile_ty", KnobKind.TILE, clipped(TY_OPTIONS, th)),
                Knob("tile_tx", KnobKind.TILE, clipped(TX_OPTIONS, tw)),
                Knob("tile_ic", KnobKind.TILE, clipped(CB_OPTIONS, sh.c)),
                Knob("tile_oc", KnobKind.TILE, clipped(KB_OPTIONS, sh.k)),
                Knob("order", KnobKind.CHOICE, ("kt", "tk")),
                Knob("unroll", KnobKind.UNROLL, (1, 2, 4)),
                Knob("m", KnobKind.CHOICE, m_options(sh)),  # last: older logs' indices keep m = 2
            )
        )

    def schedule(self, config: Config) -> WinogradSchedule:
        sh, lanes = self.shape, self.target.fp32_lanes
        mr, nv = parse_tile(str(config["tile"]))
        nr, m = nv * lanes, config.int("m")
        th, tw = tiles(sh, m)
        ty, tx = min(config.int("tile_ty"), th), min(config.int("tile_tx"), tw)
        kb = round_up(min(config.int("tile_oc"), sh.k), nr)

        def floats() -> int:
            return stack_floats(sh, lanes, ty * tx, kb, self.prepacked, m)

        # The local buffers share the stack budget: fewer output channels per block, then fewer tiles.
        while kb > nr and 4 * floats() > STACK_BUDGET:
            kb -= nr
        while ty * tx > 1 and 4 * floats() > STACK_BUDGET:
            ty, tx = (ty // 2, tx) if ty > 1 else (ty, tx // 2)
        return WinogradSchedule(
            mr,
            nv,
            lanes,
            ty,
            tx,
            min(config.int("tile_ic"), sh.c),
            kb,
            str(config["order"]),
            config.int("unroll"),
            m,
            self.target.integer_clamp,
        )

    def default_config(self, m: int | None = None) -> Config:
        """The default config, or the one of tile side `m` (a benchmark's comparison)."""
        sh, t = self.shape, self.target
        knobs = {k.name: [int(o) for o in k.options] for k in self.space.knobs if k.name.startswith("tile_")}
        m = m or self.default_m()
        ty, tx = self.default_blocks(knobs["tile_ty"], knobs["tile_tx"], m)
        nt = ty * tx

        def score(tile: str) -> float:
            # FMAs per loaded value, discounted by the rows and lanes wasted on partial groups and strips.
            mr, nv = parse_tile(tile)
            nr = nv * t.fp32_lanes
            waste = nt / round_up(nt, mr) * sh.k / round_up(sh.k, nr)
            return fmas_per_load(mr, nv) * waste + 1e-3 * mr * nv

        tile = max(roomy_tiles(self.space.knobs[0].options, t), key=score)
        nr = parse_tile(tile)[1] * t.fp32_lanes
        # The input channels whose U strip (cb x nr) fills half of L1; all the output channels.
        fits = [o for o in knobs["tile_ic"] if 4 * o * nr <= t.l1d_bytes // 2]
        cb = max(fits, default=min(knobs["tile_ic"]))
        values: dict[str, KnobValue] = {
            "tile": tile,
            "tile_ty": ty,
            "tile_tx": tx,
            "tile_ic": cb,
            "tile_oc": max(knobs["tile_oc"]),
            "order": "tk",
            "unroll": 2,
            "m": m,
        }
        return self.space.config(self.space.index_of(values))

    def default_m(self) -> int:
        """F(4x4, 3x3) where its GEMMs do fewer multiplies than F(2x2, 3x3)'s, partial tiles counted
        ((m + 2)^2 per m x m tile: all but outputs of 1, 2, 5 or 6 pixels a side; a tie keeps 2), and the
        image has at least MIN_TILES_F4 of its tiles. Each value of U feeds one multiply-add per tile, and
        F(4x4)'s U is 2.25x F(2x2)'s: on a small image its traffic costs more than the multiplies saved
        (x86-avx512, native, ResNet's 3x3 layers: F(4x4) 1.58x F(2x2)'s speed at 56x56 (196 tiles),
        1.09x at 28x28 (49), 0.73x at 14x14 (16), 0.79x at 7x7 (4); docs/benchmarks.md, "Winograd
        F(4x4, 3x3)"). llvm-mca's cycles, which see no caches, follow the multiply ratio alone. With
        prepacked U only (a network's constant weights): a per-call U is 2.25x F(2x2)'s work and stack,
        and the F(4x4) defaults of tests/test_spills.py's per-call layers spilled in hot loops on AVX2,
        the A53 and RVV, so without prepacking the default stays F(2x2) (the tuner may pick 4)."""
        if not self.prepacked:
            return 2
        sh = self.shape
        count = {m: math.prod(tiles(sh, m)) for m in m_options(sh)}  # tiles of the image
        options = [m for m in count if m == 2 or count[m] >= MIN_TILES_F4]
        return min(options, key=lambda m: (elements(m) * count[m], m))

    def default_blocks(self, ty_options: list[int], tx_options: list[int], m: int) -> tuple[int, int]:
        """Tiles per block (rows x along a row). A U that fits half of L2 is read from there by every
        block: blocks of about C/8 tiles (at least 8), an empirical rule that matches the best measured
        on x86-avx512 (64 channels: 8 tiles 1.08x faster than 16 and 1.1x than 28; 128 channels: 14-16
        tiles 1.12-1.2x faster than 4). A larger U streams from memory once per block: blocks as large
        as half of L2 holds (V and M, 16 x tiles x (C + K) floats), so that it streams rarely."""
        sh, t = self.shape, self.target
        e, (th, tw) = elements(m), tiles(sh, m)
        per_tile = 4 * e * (round_up(sh.c, t.fp32_lanes) + sh.k)  # bytes of V and M per tile
        small_u = 4 * e * sh.c * sh.k <= t.l2_bytes // 2
        fits = [
            (y, x)
            for y in ty_options
            for x in tx_options
            if y <= th and x <= tw and y * x * per_tile <= t.l2_bytes // 2
        ]
        pairs = [(y, x) for y, x in fits if y * x <= max(8, sh.c // 8)] if small_u else fits
        if not pairs:
            return 1, 1
        # Most tiles, then whole rows (fewer block edges), then fewer rows.
        return max(pairs, key=lambda p: (p[0] * p[1], p[1], -p[0]))

    @property
    def prepacked(self) -> bool:
        return bool(self.workload["prepacked"])

    def kernel(self, config: Config, name: str) -> Kernel:
        """The nest of `config`. For prepacked=1 its `weights` parameter holds U as `prepack` lays it out
        (weights known at build time, as in a network): no weight transform per call."""
        return WinogradEmitter(self.workload, self.schedule(config), self.prepacked).kernel(name)

    def kernel_inputs(self, config: Config, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The reference inputs as `config`'s kernel reads them: for prepacked=1 the weights (slot 1) as U."""
        out = list(inputs)
        if self.prepacked:
            out[1] = self.prepack(config, out[1])
        return out

    def packed_layout(self, config: Config) -> Hashable:
        """U's layout depends on the strip width and the tile side alone (`prepack`)."""
        s = self.schedule(config)
        if not self.prepacked:
            return None
        return ("nr", s.nr) if s.m == 2 else ("nr", s.nr, "m", s.m)

    def pack_kernel(self, config: Config, name: str) -> Kernel:
        """The nest `name(weights, packed)` that writes U as `kernel_inputs` gives it to `config`'s
        prepacked kernel: the per-call weight transform over all of k, into U's whole-k layout."""
        assert self.prepacked, "only a prepacked=1 kernel reads U"
        return WinogradEmitter(self.workload, self.schedule(config), True, u_buffer="packed").pack_kernel(
            name
        )

    def prepack(self, config: Config, weights: np.ndarray) -> np.ndarray:
        """The workload's weights (HWIO, or OIHW for nchw) as the prepacked kernel of `config` reads them:
        U = G g G^T laid out U[e][strip][c][nr] (e = (m + 2)i + j of the transformed tile, strips of nr
        output channels, zero past k)."""
        sh, s = self.shape, self.schedule(config)
        nr = s.nr
        w = np.asarray(weights, np.float32)
        w = w.reshape(3, 3, sh.c, sh.k) if sh.nhwc else w.reshape(sh.k, sh.c, 3, 3).transpose(2, 3, 1, 0)
        u = (filter_transform4 if s.m == 4 else filter_transform)(w).reshape(s.e, sh.c, sh.k)  # U[e][c][k]
        strips = -(-sh.k // nr)
        out = np.zeros((s.e, sh.c, strips * nr), np.float32)
        out[:, :, : sh.k] = u
        return np.ascontiguousarray(out.reshape(s.e, sh.c, strips, nr).transpose(0, 2, 1, 3)).ravel()


def filter_transform(w: np.ndarray) -> np.ndarray:
    """U = G g G^T (4, 4, ...) of filters g = w (3, 3, ...), float32, in the operations and order of the
    nest's `WinogradEmitter._filter_transform` (G's halves are exact, so a fused or unfused multiply-add
    rounds alike), so that U packed here and by the emitted pack function are the same bits."""
    half = np.float32(0.5)

    def g_rows(g0: np.ndarray, g1: np.ndarray, g2: np.ndarray) -> list[np.ndarray]:  # G @ [g0; g1; g2]
        even = (g0 + g2) * half
        return [g0, g1 * half + even, g1 * -half + even, g2]

    gg = g_rows(*np.asarray(w, np.float32))  # (G g)[a], each (3, ...) over the filter's columns
    return np.stack([np.stack(g_rows(*row)) for row in gg])
