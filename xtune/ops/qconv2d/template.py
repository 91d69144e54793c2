"""The int8 direct convolution template: a qconv2d workload + target in, an implicit-GEMM nest out: the
output pixels of a row as the rows of qmatmul's register tile (xtune/ops/qmatmul/micro.py, `DotTile`),
the reduction over (r, s, channel group) in 4-byte dot groups, the requantizing epilogue of qmatmul.

The input is read from its padded image (xtune/ops/qconv.py, `PaddedImage`): channels rounded up to a
multiple of 4 (za' in the extra bytes, zero weights against them), so every dot group is 4 bytes of
one tap; with few channels (c*s bytes in fewer groups than s rounded taps) each image pixel holds its
filter row's s pixels (`folded`), and the window is r taps of s*c channels. The weights (r, s, c, k)
are passed prepacked as qmatmul's B of one row per image byte of a window (zero rows for the extra
channels), and the bias slot carries bias - za' * (the sum of each filter's weights): the padding's za'
and the flipped activations then add exactly sum (x - za) * w.
Knobs: the register tile (mr pixels x nv vectors of output channels), `nc` (a block of output
channels), `order` (channel blocks outside the output rows, or inside), `inner` (a weight strip against
every pixel tile of a row, or the other way), `unroll` and `ksplit` of the channel-group loop, `taps`
(the s loop kept or unrolled), and on RVV `lmul`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from xtune.errors import InputError
from xtune.ops.qconv import PaddedImage, each_tap, qconv_shape
from xtune.ops.qmatmul.epilogue import Requantizer
from xtune.ops.qmatmul.micro import (
    ACT_DTYPE,
    DotPlan,
    DotTile,
    GroupAt,
    RowSpan,
    TileShape,
    fit_registers,
    kernel_params,
    pack_weights,
    register_tiles,
    tap_classes,
    tile_default,
)
from xtune.ops.qmatmul.reference import wrap32
from xtune.ops.qmatmul.template import KSPLIT_OPTIONS, NC_OPTIONS, UNROLL_OPTIONS
from xtune.ops.tiles import clipped, lmul_knobs, lmul_of, parse_tile, whole_tiles
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Affine, Buffer, DotInsn, Kernel, NestBuilder
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind, KnobValue
from xtune.target import Target

# Bytes per step of the padded image's fill and row copy on AArch64 (`PaddedImage.block`): up to 16
# LDP/STP of q registers a step (ResNet-8's rows are 512 bytes: one step each).
COPY_BLOCK = 512


@dataclass(frozen=True)
class QConvSchedule:
    mr: int
    nv: int
    lanes: int
    nc: int
    order: str  # "kp": output-channel blocks outside the output rows; "pk": inside
    inner: str  # within a row and a channel block: "nm" strips outside pixel tiles, "mn" inside
    unroll: int
    ksplit: int
    taps: str  # "loop" or "unroll": the s loop of each filter row

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


class QConv2dTemplate:
    def __init__(self, workload: Workload, target: Target):
        self.workload, self.target = workload, target
        self.sh = qconv_shape(workload)
        self.act = ACT_DTYPE[str(workload.value("a"))]
        self.plan = DotPlan.of(target, self.act)
        self.lanes = target.fp32_lanes
        sh = self.sh
        # The s taps folded into a pixel's channels where that takes fewer dot groups (`PaddedImage`).
        self.folded = sh.s > 1 and -(-sh.s * sh.c // 4) < sh.s * -(-sh.c // 4)
        self.columns = 1 if self.folded else sh.s  # tap columns the kernel loops over
        # Bytes per pixel of the image: its channels (s*c when folded) in whole dot groups.
        self.depth = -(-(sh.c * (sh.s if self.folded else 1)) // 4) * 4
        # The A72 route takes its channel groups two at a time (`DotDiff`) where pixels hold whole pairs.
        self.pairs = self.plan.insn is DotInsn.SADALP and not self.folded and sh.c % 8 == 0
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, register_tiles(self.plan, target)),
                Knob("nc", KnobKind.TILE, clipped(NC_OPTIONS, self.sh.k)),
                Knob("order", KnobKind.CHOICE, ("pk", "kp")),
                Knob("inner", KnobKind.CHOICE, ("nm", "mn")),
                Knob("unroll", KnobKind.UNROLL, UNROLL_OPTIONS),
                Knob("ksplit", KnobKind.CHOICE, KSPLIT_OPTIONS),
                Knob("taps", KnobKind.CHOICE, ("loop", "unroll")),
                *lmul_knobs(target),
            )
        )

    @property
    def groups(self) -> int:
        """4-byte groups per filter: r * columns * depth / 4."""
        return self.sh.r * self.columns * self.depth // 4

    def image(self, lanes: int) -> PaddedImage:
        return PaddedImage(
            sh=self.sh,
            act=self.act,
            dtype=self.plan.act,
            depth=self.depth,
            vector=4 * lanes,
            folded=self.folded,
            complement=self.pairs,
            block=COPY_BLOCK if self.target.arch == "aarch64" else 0,
        )

    def schedule(self, config: Config) -> QConvSchedule:
        mr, nv = parse_tile(str(config["tile"]))
        lmul = lmul_of(config)
        ksplit, lanes = fit_registers(self.plan, self.target, (mr, nv), config.int("ksplit"), lmul)
        nc = int(whole_tiles(config.int("nc"), self.sh.k, nv * lanes))
        return QConvSchedule(
            mr,
            nv,
            lanes,
            nc,
            str(config["order"]),
            str(config["inner"]),
            config.int("unroll"),
            ksplit,
            str(config["taps"]),
        )

    def default_config(self) -> Config:
        knobs = {knob.name: knob.options for knob in self.space.knobs}
        sh = self.sh
        # A block of weight strips within half of L2 (every output row reads it again). When the whole
        # filter does not fit there, the blocks go outside the rows (`kp`): each block comes from memory
        # once and serves every row from L2, where inside the rows the whole filter would stream from
        # memory once per row (ResNet-18's 512-channel 7x7 layers: 2.4 MB of int8 filter, 7 rows).
        panel = self.groups * 4
        fits = [int(v) for v in knobs["nc"] if int(v) * panel <= self.target.l2_bytes // 2]
        outside = panel * sh.k > self.target.l2_bytes // 2 and sh.oh > 1
        # Pairs take 2 a step (one vector of 4 groups: 4 spilled at 64 channels, LLVM hoisting their
        # products), and keep their taps in a loop at stride 2 where a tap is more than one step: the even
        # and the odd taps are two loops over its groups there (`tap_classes`; ResNet-8's 32-channel
        # stride-2 layer counted 0.2445 instructions per MAC on qemu-aarch64 against 0.2387 looped).
        taps = sh.s <= 3 and (not self.pairs or sh.stride == 1 or self.depth <= 16)
        span = RowSpan(
            taps=self.columns if taps and self.plan.lane_groups else 1,
            stride=sh.stride,
            dilation=sh.dilation,
            width=sh.ow,
        )
        unroll = 4 if self.depth >= 16 else 1
        if self.pairs and taps and self.columns > 1:
            unroll = 2
        elif self.plan.insn is DotInsn.SDOT and taps and self.depth >= 32:
            unroll = 8  # 8 groups a step (a tap's all at 32 channels); 16 in one step spilled
        values: dict[str, KnobValue] = {
            "tile": tile_default(
                self.plan, register_tiles(self.plan, self.target), self.target, self.pairs, span
            ),
            "nc": max(fits or [int(knobs["nc"][0])]),
            "order": "kp" if outside else "pk",
            "inner": "nm",
            "unroll": unroll,
            "ksplit": 1,
            "taps": "unroll" if taps else "loop",
            **({"lmul": 1} if "lmul" in knobs else {}),
        }
        return self.space.config(self.space.index_of(values))

    def params(self, s: QConvSchedule) -> tuple[Buffer, ...]:
        """The kernel's parameters in the workload's tensor order; the weights sized as packed strips."""
        return kernel_params(self.workload, "weights", -(-self.sh.k // s.nr) * s.nr * self.groups * 4)

    def kernel(self, config: Config, name: str) -> Kernel:
        s = self.schedule(config)
        return _Emitter(self, s).kernel(name, self.params(s))

    def kernel_inputs(self, config: Config, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The weights as qmatmul's packed B (r*s*depth rows, zero for the channels past c); the bias slot
        bias - za' * each filter's sum (za' the zero point as the dot sees it, `DotPlan.zero_point`)."""
        s, out, sh = self.schedule(config), list(inputs), self.sh
        w = np.asarray(out[1], np.int8)
        za = self.plan.zero_point(self.act, int(out[-1][0]))  # qparams = [za, zy, lo, hi], the last input
        rows = np.zeros((sh.r, self.columns, self.depth, sh.k), np.int8)
        if self.folded:  # (r, s, c, k) -> (r, 1, s*c, k): the image's tap-major channels
            rows[:, 0, : sh.s * sh.c] = w.reshape(sh.r, sh.s * sh.c, sh.k)
        else:
            rows[:, :, : sh.c] = w
        out[1] = pack_weights(rows.reshape(-1, sh.k), s.nr)
        terms = za * w.astype(np.int64).reshape(-1, sh.k).sum(axis=0)
        if self.pairs:  # the complemented groups add their weights once (`DotDiff`)
            terms += (
                rows.reshape(sh.r, self.columns, -1, 2, 4, sh.k)[:, :, :, 1]
                .astype(np.int64)
                .sum((0, 1, 2, 3))
            )
        out[2] = wrap32(out[2].astype(np.int64) - terms)
        return out

    def packed_layout(self, config: Config) -> Hashable:
        return ("weights", self.schedule(config).nr)

    def pack_kernel(self, config: Config, name: str) -> Kernel:
        raise InputError(
            f"{self.workload.key}: a qconv2d kernel reads its weights packed (their sums in its bias); it "
            "is built into a network, not alone"
        )


class _Emitter:
    def __init__(self, template: QConv2dTemplate, s: QConvSchedule):
        self.t, self.s, self.sh = template, s, template.sh
        self.b = NestBuilder()
        self.image = template.image(s.lanes)
        self.requant = Requantizer.of(template.workload, s.lanes, template.target.arch)
        self.shape = TileShape(
            lanes=s.lanes,
            nv=s.nv,
            ksplit=s.ksplit,
            unroll=s.unroll,
            groups=template.groups,
            pairs=template.pairs,
        )

    def kernel(self, name: str, params: tuple[Buffer, ...]) -> Kernel:
        b, s, sh = self.b, self.s, self.sh
        self.image.emit(b)

        def rows(block: tuple[Affine, int] | None) -> None:
            with b.loop(sh.n, "n") as image, b.loop(sh.oh, "y") as y:
                if block is None:
                    b.split(sh.k, s.nc, lambda c0, nc: self.row(image, y, c0, nc), "kc")
                else:
                    self.row(image, y, *block)

        if s.order == "kp":
            b.split(sh.k, s.nc, lambda c0, nc: rows((c0, nc)), "kc")
        else:
            rows(None)
        return b.kernel(name, (*params, *self.image.buffers))

    def row(self, image: Affine, y: Affine, col0: Affine, ncur: int) -> None:
        """Output row y of `image`, output channels col0..col0+ncur, in register tiles."""
        b, s, ow = self.b, self.s, self.sh.ow

        def pixels(j: Affine, nc: int) -> None:
            b.split(ow, s.mr, lambda x, mr: self.micro(image, y, x, mr, col0 + j, nc), "px")

        def strips(x: Affine, mr: int) -> None:
            b.split(ncur, s.nr, lambda j, nc: self.micro(image, y, x, mr, col0 + j, nc), "jr")

        if s.inner == "nm":
            b.split(ncur, s.nr, pixels, "jr")
        else:
            b.split(ow, s.mr, strips, "px")

    def micro(self, image: Affine, y: Affine, x0: Affine, rows: int, col0: Affine, ncols: int) -> None:
        """Pixels x0..x0+rows of output row y against one strip: every tap's channel groups, the store."""
        b, sh, s = self.b, self.sh, self.s
        tile = DotTile(b, self.t.plan, self.shape, rows, col0, ncols, "weights", self.requant.narrows_rows)
        per_tap = self.t.depth // 4
        name = self.image.name

        def run(i: Affine, j: Affine | int) -> tuple[Affine, GroupAt]:
            """Tap (i, j)'s first weight group and where each row's groups are."""
            row = y * sh.stride + i * sh.dilation

            def group(r: int, g: Affine | int) -> tuple[str, Affine]:
                col = (x0 + r) * sh.stride + Affine.of(j) * sh.dilation
                return name, self.image.at(image, row, col) + Affine.of(g) * 4

            return (i * self.t.columns + j) * per_tap, group

        if s.taps == "unroll" and self.t.plan.lane_groups:
            # A filter row's taps whose columns meet modulo the stride in one loop over channel groups
            # (`DotTile.reduce_parts`): the vectors they share are loaded once (at stride 1 every tap's
            # are its neighbours'; at stride 2 the even taps' are, and the odd ones' apart keep fewer live).
            with b.loop(sh.r, "ti") as i:
                for columns in tap_classes(self.t.columns, sh.stride, sh.dilation):
                    tile.reduce_parts(per_tap, [run(i, j) for j in columns])
        else:
            each_tap(
                b, (sh.r, self.t.columns), s.taps == "unroll", lambda i, j: tile.reduce(per_tap, *run(i, j))
            )
        tile.store(self.requant, "output", lambda r: ((image * sh.oh + y) * sh.ow + x0 + r) * sh.k)
