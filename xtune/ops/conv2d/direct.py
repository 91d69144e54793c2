"""The conv2d template: a conv2d workload + target in, a packed, channel-blocked, register-tiled nest out.

Per image and block of `tile_ic` input channels, the input is copied once into a zero-padded local
buffer (CHW or channel-blocked HWC, a knob), so padding costs no branch anywhere; the border is zeroed
once per call by the vectors around the rows the copies write (`PackEmitter.zero_border`), and an HWC
block holding all of a pixel's channels, no whole vector (a stem's 3), is copied a row at a time. Per
block of `tile_oc` output channels the weights are packed into strips of nr = V vectors of output
channels (zero past k), at every call; or, for prepacked=1, the weights parameter already holds every
block's strips (`Conv2dTemplate.prepack`, the layout `kernel_inputs` gives). The register tile is P
output pixels along a row x V channel vectors, updated by broadcast(input) x weight-vector FMAs over
the (c, kh, kw) reduction in a tunable order, kw optionally unrolled (`unroll_kw`). Accumulators start
from the bias plus the residual (first channel block) or the output (later blocks); ReLU/ReLU6 run on
registers in the last block; tails are constant-size tiles. A strided 1x1 window packs only the pixels
it reads (`subsample`); NCHW tiles are stored, and NCHW input copied, by shuffle transposes
(`transpose_out`, `transpose_in`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from xtune.ops.conv import ConvShape, conv_shape
from xtune.ops.conv2d.direct_nest import ConvEmitter
from xtune.ops.conv2d.direct_schedule import ConvSchedule, padded, subsamples
from xtune.ops.epilogue import ACTIVATION, EPILOGUE
from xtune.ops.matmul import Matmul
from xtune.ops.matmul.schedule import Operands
from xtune.ops.matmul.template import MatmulTemplate
from xtune.ops.tiles import (
    Epilogue,
    Scalars,
    clipped,
    fmas_per_load,
    parse_tile,
    register_budget,
    register_tiles,
    roomy_tiles,
    tile_registers,
    whole_tiles,
)
from xtune.ops.workload import Workload, make_workload
from xtune.schedule.loopnest import (
    Affine,
    Buffer,
    BufferKind,
    Kernel,
)
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind, KnobValue
from xtune.target import Target

IC_OPTIONS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
OC_OPTIONS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
OW_OPTIONS = (4, 8, 12, 16, 24, 32, 48, 64, 112, 224)
OH_OPTIONS = (1, 2, 4, 8, 16)
REDUCTIONS = ("crs", "rsc")  # reduction loops outermost first: c = input channel, r = kh, s = kw
STACK_BUDGET = 2 << 20  # bytes of packed buffers on the kernel's stack (8 MiB default stacks, small boards)


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
    return sh.r == 1 and sh.s == 1 and sh.stride == 1 and sh.padded == (sh.h, sh.w)


def matmul_per_group(workload: Workload) -> bool:
    """Whether a conv2d lowers through the matmul template, one group's product after another (one
    kernel, one task, whose space is one group's matmul), rather than through the direct template: the
    one home of the rule. A pointwise conv2d (`is_pointwise`) does, of any group count, in both layouts,
    on every target: counted under qemu, one group's matmul per group executes fewer instructions than
    the grouped direct kernel on every ShuffleNet-style layer measured, on NEON, AVX2 and RVV, in both
    layouts, whether a group is a whole number of vectors or not (in NHWC both forms vectorize the output
    channels and share the same tails); docs/benchmarks.md, "Issue 28: grouped convolution". A window
    (3x3, a stride, a pad) keeps the direct template's grouped kernel."""
    return is_pointwise(conv_shape(workload).per_group)


def pointwise_matmul(workload: Workload) -> tuple[Workload, Operands]:
    """The matmul a pointwise conv2d is, and where its operands live. NCHW, per image: out[k, p] =
    W[k, c] . X[c, p] (A = OIHW weights, B = the image's planes, C = its output planes, bias per row),
    the images one after another. NHWC, the whole batch: out[p, k] = X[p, c] . W[c, k] (A = the pixels,
    B = HWIO weights, bias per column, as matmul's own). prepacked=1: the weights operand (A, or B for
    nhwc) is passed in the matmul's panels. Grouped, the matmul is one group's (c/G input and k/G output
    channels), run for every group (`Operands.groups`): in NCHW each group's weights, input and output
    planes are contiguous, in NHWC its channels are a run of every pixel (`Operands.interleaved`)."""
    full = conv_shape(workload)
    sh = full.per_group
    params = (
        Buffer("input", full.n * full.c * full.h * full.w, BufferKind.INPUT),
        Buffer("weights", full.k * sh.c, BufferKind.INPUT),
        *Epilogue.of(workload).buffers(full.k, full.n * full.k * full.h * full.w),
        Buffer("output", full.n * full.k * full.h * full.w, BufferKind.OUTPUT),
    )
    packed = bool(workload["prepacked"])
    if sh.nhwc:
        m, n, k = sh.n * sh.h * sh.w, sh.k, sh.c
        operands = Operands(
            a="input",
            b="weights",
            c="output",
            params=params,
            prepacked="B" if packed else "",
            groups=full.groups,
            interleaved=True,
        )
    else:
        m, n, k = sh.k, sh.h * sh.w, sh.c
        operands = Operands(
            a="weights",
            b="input",
            c="output",
            params=params,
            bias_rows=True,
            batch=sh.n,
            prepacked="A" if packed else "",
            groups=full.groups,
        )
    # the same fused epilogue
    epilogue = ",".join(f"{key}={workload.value(key)}" for key in (*EPILOGUE, *ACTIVATION))
    rest = f"m={m},n={n},k={k},{epilogue}"
    return make_workload(Matmul(), rest, f"matmul:{rest}"), operands


class Conv2dTemplate:
    def __init__(self, workload: Workload, target: Target, matmul: bool | None = None):
        """`matmul`: whether a pointwise conv2d lowers through the matmul template; None (what every
        build and tuning run takes) is `matmul_per_group`'s choice, a benchmark or test may force either
        form of a grouped one."""
        self.workload = workload
        self.target = target
        full = conv_shape(workload)
        # A grouped conv2d's space is one group's convolution: its groups run one after another, each
        # blocked and tiled alike (direct_nest.py).
        self.shape = sh = full.per_group
        self.groups = full.groups
        # A pointwise conv2d lowers through the matmul template (grouped: one group's matmul for each,
        # where `matmul_per_group` says): its space, default, features and cost models are the matmul's
        # (the register tiles and blocking that make a matmul fast).
        self.as_matmul: MatmulTemplate | None = None
        if matmul_per_group(workload) if matmul is None else matmul and is_pointwise(sh):
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
                # Appended last, its first option the old nest (ConfigSpace.matches): a strided 1x1
                # window packs the subsampled image (ConvSchedule.subsample); one option elsewhere.
                Knob("subsample", KnobKind.CHOICE, (0, 1) if subsamples(sh) else (0,)),
                # NCHW: the output tile stored through Ot (0, the old nest) or transposed (1).
                Knob("transpose_out", KnobKind.CHOICE, (0,) if sh.nhwc else (0, 1)),
                # NCHW: the input copied into the hwc layout a float at a time (0) or by transposes (1).
                Knob("transpose_in", KnobKind.CHOICE, (0,) if sh.nhwc else (0, 1)),
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
            p,
            nv,
            lanes,
            cb,
            kb,
            ohb,
            owb,
            str(config["order"]),
            str(config["reduction"]),
            config["pack_layout"] == "hwc",
            bool(config["unroll_kw"]),
            config.int("unroll"),
            # A tile whose input vectors would not fit beside its accumulators broadcasts a channel at a time.
            self.target.lane_fma and tile_registers(p, nv, True) <= register_budget(self.target),
            bool(config["subsample"]),
            bool(config["transpose_out"]),
            bool(config["transpose_in"]),
            self.target.integer_clamp,
        )

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

        tile = max(roomy_tiles(knobs["tile"], t, lambda r, v: tile_registers(r, v, t.lane_fma)), key=score)
        # unroll_kw: a 7-wide window unrolled doubles code and compile time for no gain
        # (docs/benchmarks.md, History).
        values: dict[str, KnobValue] = {
            "tile": tile,
            "tile_ic": max(ints["tile_ic"]),
            "tile_oc": max(ints["tile_oc"]),
            "tile_oh": min(ints["tile_oh"]),
            "tile_ow": max(ints["tile_ow"]),
            "order": "pk",
            "reduction": self.default_reduction(),
            "pack_layout": "hwc",
            "unroll_kw": int(sh.s <= 3),
            # On a lane-FMA target the channel loop runs a vector of channels per unrolled group (`lane_fma`).
            "unroll": t.fp32_lanes if t.lane_fma else 1,
            # The full copy of a stride-2 1x1 layer moves 4 floats per one read: ResNet-18's 64->128
            # downsample at 56x56 copies as many floats as its FMAs are vectors (docs/benchmarks.md).
            "subsample": max(knobs["subsample"], key=int),
            # Fewer instructions wherever a tile's pixels fit a vector (llvm-mca on x86, qemu-aarch64's
            # counts: docs/benchmarks.md); wider tiles keep the Ot path whatever the knob says.
            "transpose_out": max(knobs["transpose_out"], key=int),
            # (2 + log2 lanes) / lanes instructions a float where the scalar copy takes 2 (`transposed_copy`).
            "transpose_in": max(knobs["transpose_in"], key=int),
        }
        return self.space.config(self.space.index_of(values))

    def default_reduction(self) -> str:
        """crs where the kernel packs OIHW weights at every call (NCHW without prepacked=1): that order packs
        by shuffle transposes (`PackEmitter.transposed_strip`), the other a float at a time. On
        qemu-aarch64 at the default blocking, 512->512 at 7x7 executes 41.6 M instructions per call in crs
        against 63.5 M in rsc (46.8 M when prepacked), 256->256 at 14x14 46.4 M against 47.7 M. rsc
        otherwise, as before: HWIO weights are packed by vectors, prepacked ones not at all."""
        packs_oihw = not self.shape.nhwc and not self.workload["prepacked"]
        return "crs" if packs_oihw else "rsc"

    def kernel(self, config: Config, name: str) -> Kernel:
        """The nest of `config`. For prepacked=1 its `weights` parameter holds every block's packed strips
        as `prepack` lays them out (weights known at build time, as in a network): no packing per call.
        A pointwise conv2d is its matmul (prepacked=1: its weights operand in the matmul's panels)."""
        if self.as_matmul is not None:
            return self.as_matmul.kernel(config, name)
        return ConvEmitter(self.workload, self.schedule(config)).kernel(name)

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

    def pack_kernel(self, config: Config, name: str) -> Kernel:
        """The nest `name(weights, packed)` that writes what `kernel_inputs` gives `config`'s prepacked
        kernel from the plain weights: the per-call packer's loops, into every block at its base."""
        assert self.workload["prepacked"], "only a prepacked=1 kernel reads packed weights"
        if self.as_matmul is not None:
            return self.as_matmul.pack_kernel(config, name)
        return ConvEmitter(self.workload, self.schedule(config)).pack_kernel(name)

    def prepack(self, config: Config, weights: np.ndarray) -> np.ndarray:
        """The workload's weights (OIHW, or HWIO for nhwc) as the prepacked kernel of `config` reads them:
        per input-channel block (outer) and output-channel block, the strips `pack_weights` would write,
        zero past the last output channel; every block `cb*r*s*kb` floats (tail blocks padded). Not for a
        pointwise conv2d (its matmul's `kernel_inputs` packs its weights)."""
        assert self.as_matmul is None
        sh, s, groups = self.shape, self.schedule(config), self.groups
        emitter = ConvEmitter(self.workload, s)
        if groups > 1:  # each group's weights packed alone, the groups one after another (block_base)
            split = (sh.r, sh.s, sh.c, groups, sh.k) if sh.nhwc else (groups, sh.k, sh.c, sh.r, sh.s)
            w = np.asarray(weights, np.float32).reshape(split)
            return np.concatenate(
                [self._pack(emitter, w[..., g, :] if sh.nhwc else w[g]) for g in range(groups)]
            )
        layout = (sh.r, sh.s, sh.c, sh.k) if sh.nhwc else (sh.k, sh.c, sh.r, sh.s)
        return self._pack(emitter, np.asarray(weights, np.float32).reshape(layout))

    def _pack(self, emitter: ConvEmitter, w: np.ndarray) -> np.ndarray:
        """One group's weights (HWIO or OIHW of its channels) in the prepacked blocks of `emitter`."""
        sh, s = self.shape, emitter.s
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
        per_kc = (
            base.get("k0", 0) * (k - kk)
            + kk % s.nr
            + idx.get("st", 0) * (kk // s.nr)
            + base.get("c0", 0) * (c - cc)
            + idx.get("c", 0) * cc
            + strip.const
        )
        per_ij = idx.get("i", 0) * i + idx.get("j", 0) * j
        # Scatter in the source's own order: the weights are read contiguously, only the writes jump.
        if sh.nhwc:
            out[per_ij[:, :, None, None] + per_kc.T] = w
        else:
            out[per_kc[:, :, None, None] + per_ij] = w
        return out
