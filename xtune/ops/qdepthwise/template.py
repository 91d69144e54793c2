"""The int8 depthwise template: a qdepthwise workload + target in, a nest of widening multiply-adds with
qmatmul's requantizing epilogue out. Each output channel reduces over its own r*s taps only, so there is
no 4-byte dot: channels are the vector lanes (NHWC), bytes of the image and the weights widened and
multiplied into i32 accumulators. Written as an i32 multiply of extended bytes, LLVM knows each product
fits i16 (|u8 * s8| <= 255 * 128 = 32640, |s8 * s8| <= 2^14) and selects the widening forms: on x86
pmovzx/sxbd + vpmaddwd (vpdpwssd with AVX512-VNNI), on AArch64 smull + saddw (s8) or smlal (u8), on RVV
vwmacc.vv / vwmaccsu.vv; exact on every one (an i16 product multiply written as such kept an extra
widening step on x86 and RVV).

`route=dot` (filter rows of at most 4 taps) groups the taps per channel for the 4-way dot instead
(xtune/ops/qdepthwise/grouped.py: vpdpbusd, sdot, smull + sadalp, as `DotPlan` picks).

The input is read from its padded image (xtune/ops/qconv.py, `PaddedImage`: za around it, never
flipped), and the bias slot carries bias - za * (each channel's weight sum), so the kernel adds plain
x * w and the sum equals sum (x - za) * w exactly. Knobs: the register tile (mr output pixels x nv
vectors of channels), `order` (channel vectors outside the pixel tiles of a row, or inside), `taps`
(the s loop kept or unrolled), `product` (the i32 multiply above, or one in i16 extended after) and
`route` (the widening multiplies, or the grouped dots: `taps` and `product` are then unused).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from xtune.errors import InputError
from xtune.ops.qconv import PaddedImage, each_tap, qconv_shape
from xtune.ops.qdepthwise.grouped import GroupedTaps, group_weights
from xtune.ops.qmatmul.epilogue import Requantizer
from xtune.ops.qmatmul.micro import ACT_DTYPE, DotPlan, kernel_params
from xtune.ops.qmatmul.reference import wrap32
from xtune.ops.tiles import parse_tile
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Cast,
    Const,
    DotInsn,
    DType,
    Kernel,
    Load,
    NestBuilder,
)
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind, KnobValue
from xtune.target import Target


@dataclass(frozen=True)
class QDepthwiseSchedule:
    mr: int  # output pixels of a row per tile
    width: int  # channels per tile: nv vectors of the target's i32 lanes
    order: str  # "cp": channel vectors outside the pixel tiles of a row; "pc": inside
    taps: str  # "loop" or "unroll": the s loop of each filter row
    product: str  # "i32": bytes extended to i32 and multiplied; "i16": multiplied in i16, then extended
    route: str = "widen"  # "widen": the multiplies above; "dot": the taps grouped per channel (`groups`)


class QDepthwiseTemplate:
    def __init__(self, workload: Workload, target: Target):
        self.workload, self.target = workload, target
        self.sh = qconv_shape(workload)
        self.act = ACT_DTYPE[str(workload.value("a"))]
        self.lanes = target.fp32_lanes
        self.plan = DotPlan.of(target, self.act)
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, self.tiles()),
                Knob("order", KnobKind.CHOICE, ("cp", "pc")),
                Knob("taps", KnobKind.CHOICE, ("loop", "unroll")),
                Knob("product", KnobKind.CHOICE, ("i32", "i16")),
                # Last, its first option the widening route: older logs keep their configs.
                Knob("route", KnobKind.CHOICE, ("widen", "dot") if self.sh.s <= 4 else ("widen",)),
            )
        )

    def tiles(self) -> tuple[str, ...]:
        """mr x nv tiles whose accumulators (mr*nv registers) and a row's widened operands (the weights'
        and one pixel's i16 halves and products: about 4 per vector) fit the register file."""
        regs = self.target.vector_registers
        return tuple(
            f"{mr}x{nv}"
            for mr in range(1, 9)
            for nv in range(1, 5)
            if mr * nv + 4 * nv <= regs and nv * self.lanes <= 64
        )

    def schedule(self, config: Config) -> QDepthwiseSchedule:
        mr, nv = parse_tile(str(config["tile"]))
        return QDepthwiseSchedule(
            mr,
            nv * self.lanes,
            str(config["order"]),
            str(config["taps"]),
            str(config["product"]),
            str(config["route"]),
        )

    def default_config(self) -> Config:
        tiles = [parse_tile(t) for t in self.tiles()]
        vectors = -(-self.sh.c // self.lanes)
        # The widest channel tile that covers the channels in equal tiles, then the most pixels; a power of
        # two of vectors: the widening route's tile is one vector of nv * lanes, and LLVM scalarizes one of
        # 3 x 8 or 3 x 16 i32 lanes on x86 (vpinsrd/vpextrd: 1.9 MACs/cycle in llvm-mca, docs/benchmarks.md).
        nv = max(v for _, v in tiles if (vectors % v == 0 or v == vectors) and v & (v - 1) == 0)
        mr = max(m for m, v in tiles if v == nv)
        values: dict[str, KnobValue] = {
            "tile": f"{mr}x{nv}",
            "order": "cp",
            "taps": "unroll" if self.sh.s <= 3 else "loop",
            # x86 makes vpmaddwd of u8 * s8 extended to i32, but vpmulld of s8 * s8: vpmullw is cheaper.
            "product": "i16" if self.target.arch == "x86_64" and self.act is DType.I8 else "i32",
            "route": "dot" if self.grouped_by_default() else "widen",
        }
        return self.space.config(self.space.index_of(values))

    def grouped_by_default(self) -> bool:
        """Whether the default takes the grouped taps: where one instruction takes a whole group (VNNI's
        vpdpbusd; the A76's sdot at stride 1, where each group built serves r output rows: at stride 2 the
        build per output doubles and the qemu cycle model puts the two routes within 3 %, the widening one
        ahead), the filter rows fitting a group (docs/benchmarks.md, the int8 depthwise routes)."""
        insn, sh = self.plan.insn, self.sh
        return sh.s <= 4 and (insn is DotInsn.VPDPBUSD or (insn is DotInsn.SDOT and sh.stride == 1))

    def image(self, route: str = "widen") -> PaddedImage:
        """The padded image, of the dot's activation type on the dot route (flipped where it differs)."""
        dtype = self.plan.act if route == "dot" else self.act
        return PaddedImage(sh=self.sh, act=self.act, dtype=dtype, depth=self.sh.c, vector=4 * self.lanes)

    def kernel(self, config: Config, name: str) -> Kernel:
        s, sh, b = self.schedule(config), self.sh, NestBuilder()
        image = self.image(s.route)
        image.emit(b)
        if s.route == "dot":
            grouped = self.grouped()
            with b.loop(sh.n, "n") as n:

                def block(y0: Affine, count: int) -> None:
                    grouped.block(b, image, n, y0, count)
                    with b.loop(count, "y") as y:
                        self.each_tile(
                            b,
                            s,
                            lambda x, mr, ch, w: grouped.micro(
                                b, (n * sh.oh + y0 + y, y * sh.stride, x, mr), (ch, w)
                            ),
                        )

                b.split(sh.oh, grouped.rows, block, "yb")
            params = kernel_params(self.workload, "weights", sh.r * sh.c * 4)
            return b.kernel(name, (*params, *image.buffers, grouped.buffer()))
        with b.loop(sh.n, "n") as n, b.loop(sh.oh, "y") as y:
            self.each_tile(b, s, lambda x, mr, ch, w: self.micro(b, s, image, (n, y, x, mr), (ch, w)))
        return b.kernel(name, (*kernel_params(self.workload, "", 0), *image.buffers))

    def grouped(self) -> GroupedTaps:
        return GroupedTaps(
            workload=self.workload, sh=self.sh, target=self.target, plan=self.plan, lanes=self.lanes
        )

    def each_tile(
        self, b: NestBuilder, s: QDepthwiseSchedule, tile: Callable[[Affine, int, Affine, int], None]
    ) -> None:
        """tile(x, mr, ch, width) over an output row's pixel and channel tiles, in the config's order."""
        sh = self.sh
        if s.order == "cp":
            b.split(sh.c, s.width, lambda ch, w: b.split(sh.ow, s.mr, lambda x, m: tile(x, m, ch, w), "px"))
        else:
            b.split(sh.ow, s.mr, lambda x, m: b.split(sh.c, s.width, lambda ch, w: tile(x, m, ch, w)), "px")

    def micro(
        self,
        b: NestBuilder,
        s: QDepthwiseSchedule,
        image: PaddedImage,
        pixels: tuple[Affine, Affine, Affine, int],
        channels: tuple[Affine, int],
    ) -> None:
        """Pixels x0.. of output row y, channels ch0..ch0+count: every tap's widening multiply-adds."""
        sh = self.sh
        n, y, x0, rows = pixels
        ch0, count = channels
        # A tail tile of whole vectors is a narrower tile, not a masked one (masked lanes go one by one).
        width = -(-count // self.lanes) * self.lanes
        valid = count % width
        acc = [b.register(f"acc_{r}_{width}", width, DType.I32) for r in range(rows)]
        for reg in acc:
            b.assign(reg, Const(0, width, DType.I32))

        def tap(i: Affine, j: Affine | int) -> None:
            w = Cast(Load("weights", (i * sh.s + j) * sh.c + ch0, width, valid), DType.I16)
            for r in range(rows):
                col = (x0 + r) * sh.stride + Affine.of(j) * sh.dilation
                at = image.at(n, y * sh.stride + i * sh.dilation, col) + ch0
                x = Cast(Load(image.name, at, width, valid), DType.I16)
                product = (
                    Binary(BinaryOp.MUL, Cast(x, DType.I32), Cast(w, DType.I32))
                    if s.product == "i32"
                    else Cast(Binary(BinaryOp.MUL, x, w), DType.I32)
                )
                b.assign(acc[r], Binary(BinaryOp.ADD, acc[r], product))

        each_tap(b, (sh.r, sh.s), s.taps == "unroll", tap)
        requant = Requantizer.of(self.workload, width)
        for r in range(rows):
            total = Binary(BinaryOp.ADD, acc[r], Load("bias", ch0, width, valid))
            out = ((n * sh.oh + y) * sh.ow + x0 + r) * sh.c + ch0
            b.store("output", out, requant.apply(total, ch0, valid), width, valid)

    def kernel_inputs(self, config: Config, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The bias slot bias - za * each channel's weight sum (za the image's: flipped on the dot route);
        the weights as they are, or on the dot route each filter row's taps side by side per channel
        (r, c, 4), 0 past s."""
        out, sh = list(inputs), self.sh
        za = int(out[-1][0])  # qparams = [za, zy, lo, hi], the last input
        weights = np.asarray(out[1], np.int8).reshape(sh.r, sh.s, sh.c)
        sums = weights.astype(np.int64).sum(axis=(0, 1))
        if self.schedule(config).route == "dot":
            za = self.plan.zero_point(self.act, za)
            out[1] = group_weights(weights, sh)
        out[2] = wrap32(out[2].astype(np.int64) - za * sums)
        return out

    def packed_layout(self, config: Config) -> Hashable:
        """The corrected bias, and on the dot route the grouped weights (one layout per target)."""
        return ("bias", self.schedule(config).route)

    def pack_kernel(self, config: Config, name: str) -> Kernel:
        raise InputError(f"{self.workload.key}: depthwise weights are read as they are, never packed")
