"""The quantized matmul template: a qmatmul workload + target in, a register-tiled nest of 4-way int8 dot
products with a requantizing epilogue out.

The weights B are always passed prepacked (`kernel_inputs`, the one home of the layout): the strips of
xtune/ops/qmatmul/micro.py, whose register tile (`DotTile`) this template drives. The bias slot carries
the column terms instead of the bias: bias[j] - za' * sum_k B[k, j], with za' the activation zero point
as the kernel sees it (`DotPlan`), as ONNX Runtime folds its column sums into the packed weights. The
register tile is mr x nv vectors of int32 accumulators (times `ksplit` partial sets, which shorten the
dot chains), each step one broadcast 4-byte group of A per row against nv B vectors; the k groups
unrolled by `unroll`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from xtune.ops.qmatmul.epilogue import Requantizer
from xtune.ops.qmatmul.micro import (
    ACT_DTYPE,
    DotPlan,
    DotTile,
    TileShape,
    fit_registers,
    kernel_params,
    pack_weights,
    register_tiles,
    tile_default,
)
from xtune.ops.qmatmul.reference import wrap32
from xtune.ops.tiles import clipped, div, lmul_knobs, lmul_of, parse_tile, whole_tiles
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Cast,
    Const,
    DType,
    Kernel,
    Load,
    NestBuilder,
    Value,
)
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind, KnobValue
from xtune.target import Target

MC_OPTIONS = (4, 8, 16, 32, 64, 128, 256, 512)
NC_OPTIONS = (16, 32, 64, 128, 256, 512, 1024)
UNROLL_OPTIONS = (1, 2, 4, 8)
KSPLIT_OPTIONS = (1, 2)


@dataclass(frozen=True)
class QMatmulSchedule:
    mr: int
    nv: int
    lanes: int
    mc: int
    nc: int
    order: str  # block loops, outer first: "nm" or "mn"
    inner: str  # the register tiles of a block: "nm" (a B strip against every row tile) or "mn"
    unroll: int
    ksplit: int

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


class QMatmulTemplate:
    def __init__(self, workload: Workload, target: Target):
        self.workload, self.target = workload, target
        self.act = ACT_DTYPE[str(workload.value("a"))]
        self.plan = DotPlan.of(target, self.act)
        self.lanes = target.fp32_lanes  # 32-bit lanes of a vector register
        m, n = workload["m"], workload["n"]
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, self.tiles()),
                Knob("mc", KnobKind.TILE, clipped(MC_OPTIONS, m)),
                Knob("nc", KnobKind.TILE, clipped(NC_OPTIONS, n)),
                Knob("order", KnobKind.CHOICE, ("nm", "mn")),
                Knob("inner", KnobKind.CHOICE, ("nm", "mn")),
                Knob("unroll", KnobKind.UNROLL, UNROLL_OPTIONS),
                Knob("ksplit", KnobKind.CHOICE, KSPLIT_OPTIONS),
                *lmul_knobs(target),
            )
        )

    def tiles(self) -> tuple[str, ...]:
        return register_tiles(self.plan, self.target)

    def schedule(self, config: Config) -> QMatmulSchedule:
        mr, nv = parse_tile(str(config["tile"]))
        wl = self.workload
        lmul = lmul_of(config)
        ksplit, lanes = fit_registers(self.plan, self.target, (mr, nv), config.int("ksplit"), lmul)
        mc = int(whole_tiles(config.int("mc"), wl["m"], mr))
        nc = int(whole_tiles(config.int("nc"), wl["n"], nv * lanes))
        return QMatmulSchedule(
            mr,
            nv,
            lanes,
            mc,
            nc,
            str(config["order"]),
            str(config["inner"]),
            config.int("unroll"),
            ksplit,
        )

    def default_config(self) -> Config:
        t, wl = self.target, self.workload
        k = wl["k"]
        knobs = {knob.name: knob.options for knob in self.space.knobs}
        # A row block within half of L2 and the packed B panel of a column block within the other half.
        mc = max([int(v) for v in knobs["mc"] if int(v) * k <= t.l2_bytes // 2] or [int(knobs["mc"][0])])
        nc = max([int(v) for v in knobs["nc"] if int(v) * k <= t.l2_bytes // 2] or [int(knobs["nc"][0])])
        values: dict[str, KnobValue] = {
            "tile": tile_default(self.plan, self.tiles(), self.target),
            "mc": mc,
            "nc": nc,
            "order": "nm",
            "inner": "nm",
            "unroll": 4,
            "ksplit": 1,
            **({"lmul": 1} if "lmul" in knobs else {}),
        }
        return self.space.config(self.space.index_of(values))

    def params(self, s: QMatmulSchedule) -> tuple[Buffer, ...]:
        """The kernel's parameters in the workload's tensor order; B sized as its packed strips."""
        wl = self.workload
        return kernel_params(wl, "B", -(-wl["n"] // s.nr) * s.nr * -(-wl["k"] // 4) * 4)

    def kernel(self, config: Config, name: str) -> Kernel:
        s = self.schedule(config)
        return _Emitter(self, s).kernel(name, self.params(s))

    def kernel_inputs(self, config: Config, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """B packed into the config's strips (`pack_weights`), the bias slot replaced by the column terms
        bias - za' * colsum(B) (za' the zero point the kernel's dot sees, `DotPlan.zero_point`)."""
        s, out = self.schedule(config), list(inputs)
        a_zero = int(out[-1][0])  # qparams = [za, zy, lo, hi], the last input
        b = np.asarray(out[1], np.int8)
        za = self.plan.zero_point(self.act, a_zero)
        out[1] = pack_weights(b, s.nr)
        out[2] = wrap32(out[2].astype(np.int64) - za * b.astype(np.int64).sum(axis=0))
        return out

    def pack_kernel(self, config: Config, name: str) -> Kernel:
        """The nest `name(B, packed)` that writes B as `pack_weights` does for `config` (the strips of its
        nr, zero past n and k), one byte at a time. The column terms of the bias slot are not in it: a
        qmatmul is built into a network, whose build computes them (`kernel_inputs`)."""
        s, wl, b = self.schedule(config), self.workload, NestBuilder()
        k, n, nr = wl["k"], wl["n"], s.nr
        groups = -(-k // 4)
        plain = Buffer("B", k * n, BufferKind.INPUT, DType.I8)
        packed = Buffer("packed", -(-n // nr) * nr * groups * 4, BufferKind.OUTPUT, DType.I8)

        def group(j0: Affine, cols: int, g: Affine | int, rows: int) -> None:
            at = div(j0, nr) * (groups * nr * 4) + Affine.of(g) * (nr * 4)
            for c in range(nr):
                for t in range(4):
                    value: Value = (
                        Load("B", (Affine.of(g) * 4 + t) * n + j0 + c)
                        if c < cols and t < rows
                        else Const(0, 1, DType.I8)
                    )
                    b.store("packed", at + c * 4 + t, value)

        def strip(j0: Affine, cols: int) -> None:
            with b.loop(k // 4, "pg") as g:
                group(j0, cols, g, 4)
            if k % 4:
                group(j0, cols, k // 4, k % 4)

        b.split(n, nr, strip, "ps")
        return b.kernel(name, (plain, packed))

    def packed_layout(self, config: Config) -> Hashable:
        """The B strips' width: configs of one nr read the same bytes (the column terms never vary)."""
        return ("B", self.schedule(config).nr)


class _Emitter:
    def __init__(self, template: QMatmulTemplate, s: QMatmulSchedule):
        wl = template.workload
        self.m, self.n, self.k = wl["m"], wl["n"], wl["k"]
        self.s, self.plan, self.act = s, template.plan, template.act
        self.groups = -(-self.k // 4)
        self.flip = self.plan.act is not self.act
        self.block_m0 = Affine()  # the m block whose rows `flip_rows` copied last
        self.b = NestBuilder()
        self.requant = Requantizer.of(wl, s.lanes, template.target.arch)

    def kernel(self, name: str, params: tuple[Buffer, ...]) -> Kernel:
        s, b = self.s, self.b
        outer, inner = s.order[0], s.order[1]
        extents = {"m": (self.m, s.mc), "n": (self.n, s.nc)}
        flipped = (
            [Buffer("Af", min(s.mc, self.m) * self.k, BufferKind.LOCAL, self.plan.act)] if self.flip else []
        )

        def level2(o1: Affine, size1: int) -> None:
            if outer == "m":
                self.flip_rows(o1, size1)

            def level3(o2: Affine, size2: int) -> None:
                if inner == "m":
                    self.flip_rows(o2, size2)
                blocks = {outer: (o1, size1), inner: (o2, size2)}
                self.block(blocks["m"], blocks["n"])

            b.split(extents[inner][0], extents[inner][1], level3, f"{inner}c")

        b.split(extents[outer][0], extents[outer][1], level2, f"{outer}c")
        return b.kernel(name, (*params, *flipped))

    def flip_rows(self, m0: Affine, rows: int) -> None:
        """Af = the m block's rows of A with the sign bit of every byte flipped (u8 <-> s8, `DotPlan`),
        once per block: m*k/(4*lanes) vector xors, where flipping each broadcast group would cost one
        per row of every register tile (an extra instruction on the dot's ports per mr*nv dots)."""
        if not self.flip:
            return
        b, v, k = self.b, 4 * self.s.lanes, self.k
        self.block_m0 = m0

        def chunk(j: Affine, size: int) -> None:
            a = Load("A", (m0 + i) * k + j, v, size % v)
            b.store(
                "Af",
                i * k + j,
                Cast(Binary(BinaryOp.XOR, a, Const(-128, v, DType.I8)), self.plan.act),
                v,
                size,
            )

        with b.loop(rows, "fi") as i:
            b.split(k, v, chunk, "fj")

    def block(self, rows: tuple[Affine, int], cols: tuple[Affine, int]) -> None:
        s, b = self.s, self.b
        (m0, mcur), (n0, ncur) = rows, cols

        def columns(i: Affine, mr: int) -> None:
            b.split(ncur, s.nr, lambda j, nc: self.micro(m0 + i, mr, n0 + j, nc), "jr")

        def row_tiles(j: Affine, nc: int) -> None:
            b.split(mcur, s.mr, lambda i, mr: self.micro(m0 + i, mr, n0 + j, nc), "ir")

        if s.inner == "nm":
            b.split(ncur, s.nr, row_tiles, "jr")
        else:
            b.split(mcur, s.mr, columns, "ir")

    def a_group(self, row: Affine, g: Affine | int) -> tuple[str, Affine]:
        """Where A's row's k group g is, as the dot instruction multiplies it (in the block's flipped copy
        where the activation type is not the instruction's)."""
        if self.flip:
            return "Af", (row + self.block_m0 * -1) * self.k + Affine.of(g) * 4
        return "A", row * self.k + Affine.of(g) * 4

    def micro(self, row0: Affine, rows: int, col0: Affine, ncols: int) -> None:
        """acc[set][r][c] += dot(A[row0+r, group], B strip vector c), then the epilogue and the store."""
        s = self.s
        shape = TileShape(lanes=s.lanes, nv=s.nv, ksplit=s.ksplit, unroll=s.unroll, groups=self.groups)
        tile = DotTile(self.b, self.plan, shape, rows, col0, ncols, bias_first=self.requant.narrows_rows)
        tile.reduce(self.k // 4, 0, lambda r, g: self.a_group(row0 + r, g), self.k % 4)
        tile.store(self.requant, "C", lambda r: (row0 + r) * self.n)
