"""The quantized matmul template: a qmatmul workload + target in, a register-tiled nest of 4-way int8 dot
products with a requantizing epilogue out.

The weights B are always passed prepacked (`kernel_inputs`, the one home of the layout): strips of
nr = nv * lanes columns, each strip k-group after k-group, each group nr columns of 4 consecutive k bytes
(B[4g + t, j] at strip * K4*nr*4 + g*nr*4 + c*4 + t), zero past n and past k: the operand layout of
vpdpbusd and sdot, which multiply 4 bytes per 32-bit lane. The bias slot carries the column terms instead
of the bias: bias[j] - za' * sum_k B[k, j], with za' the activation zero point as the kernel sees it
(`DotPlan`), as ONNX Runtime folds its column sums into the packed weights. The register tile is
mr x nv vectors of int32 accumulators (times `ksplit` partial sets, which shorten the dot chains), each
step one broadcast 4-byte group of A per row against nv B vectors; the k groups unrolled by `unroll`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from xtune.ops.qmatmul.epilogue import Requantizer
from xtune.ops.qmatmul.reference import wrap32
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Cast,
    Const,
    Dot,
    DotInsn,
    DType,
    Kernel,
    Load,
    NestBuilder,
    PairSum,
    Reg,
    Value,
)
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind, KnobValue
from xtune.target import Target
from xtune.templates.tiles import clipped, div, parse_tile, whole_tiles

MC_OPTIONS = (4, 8, 16, 32, 64, 128, 256, 512)
NC_OPTIONS = (16, 32, 64, 128, 256, 512, 1024)
UNROLL_OPTIONS = (1, 2, 4, 8)
KSPLIT_OPTIONS = (1, 2)
LMUL_OPTIONS = (1, 2, 4)
_ACT = {"u8": DType.U8, "s8": DType.I8}


@dataclass(frozen=True)
class DotPlan:
    """How a target computes the 4-way dot: its instruction, and the activation type that instruction
    multiplies. An activation of the other signedness is flipped by xor 0x80 (a + 128 or a - 128), whose
    zero point moves with it: sum (a - za) b = sum ((a ^ 0x80) - (za +- 128)) b, exactly."""

    insn: DotInsn
    act: DType  # the activation type the kernel feeds the instruction

    @staticmethod
    def of(target: Target, act: DType) -> DotPlan:
        features = set(target.features.split(","))
        if target.arch == "x86_64":
            vnni = "+avx512vnni" in features or ("+avxvnni" in features and target.fp32_lanes <= 8)
            return DotPlan(DotInsn.VPDPBUSD, DType.U8) if vnni else DotPlan(DotInsn.PMADDWD, act)
        if target.arch == "aarch64":  # both take s8 x s8 (smull: a u8 x s8 product would need uxtl + mul)
            return DotPlan(DotInsn.SDOT if "+dotprod" in features else DotInsn.SADALP, DType.I8)
        return DotPlan(DotInsn.MLA, act)

    def zero_point(self, act: DType, za: int) -> int:
        """The activation zero point after the kernel's flip of `act` into `self.act` (if any)."""
        if act is self.act:
            return za
        return za + 128 if self.act is DType.U8 else za - 128

    @property
    def acc_width(self) -> int:
        """Accumulator registers per vector of results: 2 for SADALP (pair sums, `PairSum` after)."""
        return 2 if self.insn is DotInsn.SADALP else 1

    def registers(self, mr: int, nv: int, ksplit: int = 1) -> int:
        """Vector registers an mr x nv tile holds live: its accumulators (ksplit sets, `acc_width` each),
        the B vectors and A's broadcast, plus what the instruction needs besides (PMADDWD: the 2 widened
        halves of each; MLA: the 4 bytes of each B vector, A's widened group and the products in flight,
        LLVM's temporaries included: a 10x2 tile spilled on RVV; SADALP: the products in flight)."""
        accumulators = ksplit * mr * nv * self.acc_width
        if self.insn is DotInsn.MLA:
            return accumulators + 4 * nv + 6
        if self.insn is DotInsn.SADALP:
            return accumulators + 2 * nv + 3  # each B vector's high half too (LLVM's ext + smull)
        return accumulators + (2 if self.insn is DotInsn.PMADDWD else 1) * (nv + 1)

    def instructions(self, mr: int, nv: int) -> int:
        """Instructions per k group of an mr x nv tile, by what `intlower` emits: the dots, B's loads (and
        widening), A's broadcasts (and widening). The default tile minimizes it per dot."""
        dots, b, a = {
            DotInsn.VPDPBUSD: (1, 1, 1),
            DotInsn.SDOT: (1, 1, 2),
            DotInsn.PMADDWD: (4, 6, 6),
            DotInsn.MLA: (4, 12, 3),
            DotInsn.SADALP: (4, 2, 1),
        }[self.insn]
        return dots * mr * nv + b * nv + a * mr


def pack_weights(b: np.ndarray, nr: int) -> np.ndarray:
    """B (k, n) int8 in the strips the kernel reads (module docstring), zero-padded; a flat int8 array."""
    k, n = b.shape
    groups, strips = -(-k // 4), -(-n // nr)
    padded = np.zeros((groups * 4, strips * nr), np.int8)
    padded[:k, :n] = b
    # (g, t, strip, c) -> (strip, g, c, t)
    return np.ascontiguousarray(padded.reshape(groups, 4, strips, nr).transpose(2, 0, 3, 1)).ravel()


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
        self.act = _ACT[str(workload.value("a"))]
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
                # RVV: vectors of lmul registers (LMUL, the RVV spec's register grouping), so a tile's
                # vectors are lmul times longer and the register file holds 32 / lmul of them.
                *(
                    [Knob("lmul", KnobKind.CHOICE, LMUL_OPTIONS)]
                    if "+v" in target.features.split(",")
                    else []
                ),
            )
        )

    def tiles(self) -> tuple[str, ...]:
        """Tiles "MRxNV" whose accumulators and operands fit the register file (at lmul 1); a config whose
        tile does not fit with ksplit=2 or its lmul runs with fewer (`schedule`)."""
        regs = self.target.vector_registers
        return tuple(
            f"{mr}x{nv}"
            for mr in range(1, 13)
            for nv in range(1, 7)
            if self.plan.registers(mr, nv) <= regs and nv * self.lanes <= 64
        )

    def schedule(self, config: Config) -> QMatmulSchedule:
        mr, nv = parse_tile(str(config["tile"]))
        wl, regs = self.workload, self.target.vector_registers
        ksplit = config.int("ksplit")
        if ksplit > 1 and self.plan.registers(mr, nv, ksplit) > regs:
            ksplit = 1  # two partial sets would spill: the same nest as ksplit=1
        lmul = config.int("lmul") if "lmul" in dict(config.values) else 1
        need = self.plan.registers(mr, nv, ksplit)
        while lmul > 1 and (need > regs // lmul or nv * self.lanes * lmul > 64):
            lmul //= 2  # the tile's register groups would not fit: the nest of the largest lmul that does
        lanes = self.lanes * lmul
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
        tiles = [parse_tile(s) for s in self.tiles()]
        # The fewest instructions per dot (`DotPlan.instructions`), then the larger tile.
        mr, nv = min(tiles, key=lambda p: (self.plan.instructions(*p) / (p[0] * p[1]), -p[0] * p[1]))
        k = wl["k"]
        knobs = {knob.name: knob.options for knob in self.space.knobs}
        # A row block within half of L2 and the packed B panel of a column block within the other half.
        mc = max([int(v) for v in knobs["mc"] if int(v) * k <= t.l2_bytes // 2] or [int(knobs["mc"][0])])
        nc = max([int(v) for v in knobs["nc"] if int(v) * k <= t.l2_bytes // 2] or [int(knobs["nc"][0])])
        values: dict[str, KnobValue] = {
            "tile": f"{mr}x{nv}",
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
        m, n, k = wl["m"], wl["n"], wl["k"]
        packed_b = -(-n // s.nr) * s.nr * -(-k // 4) * 4
        dtypes = {"float32": DType.F32, "int8": DType.I8, "uint8": DType.U8, "int32": DType.I32}
        out = []
        for t in wl.tensors():
            size = packed_b if t.name == "B" else t.size
            kind = BufferKind.OUTPUT if t.is_output else BufferKind.INPUT
            out.append(Buffer(t.name, size, kind, dtypes[t.dtype]))
        assert len(out) and out[0].name == "A" and m * k == out[0].size
        return tuple(out)

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
        self.requant = Requantizer.of(wl, s.lanes)

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

    def a_group(self, row: Affine, g: Affine | int, count: int) -> Value:
        """The 4 bytes of A's row at k group g, as the dot instruction multiplies them (from the block's
        flipped copy where the activation type is not the instruction's)."""
        if self.flip:
            return Load("Af", (row + self.block_m0 * -1) * self.k + Affine.of(g) * 4, 4, count % 4)
        return Load("A", row * self.k + Affine.of(g) * 4, 4, count % 4)

    def micro(self, row0: Affine, rows: int, col0: Affine, ncols: int) -> None:
        """acc[set][r][c] += dot(A[row0+r, group], B strip vector c), then the epilogue and the store."""
        s, b = self.s, self.b
        lanes, nvec, width = s.lanes, -(-ncols // s.lanes), s.lanes * self.plan.acc_width
        acc = [
            [[b.register(f"acc{p}_{r}_{c}", width, DType.I32) for c in range(nvec)] for r in range(rows)]
            for p in range(s.ksplit)
        ]
        for sets in acc:
            for row in sets:
                for reg in row:
                    b.assign(reg, Const(0, width, DType.I32))
        strip = Affine.of(col0) * (self.groups * 4)  # col0 is a multiple of nr: strip index * nr

        def step(g: Affine | int, part: int, count: int = 4) -> None:
            base = strip + Affine.of(g) * (s.nr * 4)
            vectors = [Load("B", base + c * lanes * 4, 4 * lanes) for c in range(nvec)]
            for r in range(rows):
                a = self.a_group(row0 + r, g, count)
                for c in range(nvec):
                    b.assign(acc[part][r][c], Dot(acc[part][r][c], a, vectors[c], self.plan.insn))

        whole = self.k // 4
        per = s.unroll * s.ksplit
        full, rest = divmod(whole, per)
        if full:
            with b.loop(full, "kg") as o:
                for u in range(per):
                    step(o * per + u, u % s.ksplit)
        for u in range(rest):
            step(full * per + u, u % s.ksplit)
        if self.k % 4:
            step(whole, rest % s.ksplit, self.k % 4)
        self.store(acc, row0, col0, ncols)

    def store(self, acc: list[list[list[Reg]]], row0: Affine, col0: Affine, ncols: int) -> None:
        lanes = self.s.lanes
        for r in range(len(acc[0])):
            for c in range(len(acc[0][r])):
                col = col0 + c * lanes
                count = min(ncols - c * lanes, lanes) % lanes
                total: Value = acc[0][r][c]
                for part in acc[1:]:
                    total = Binary(BinaryOp.ADD, total, part[r][c])
                if self.plan.acc_width == 2:
                    total = PairSum(total)
                total = Binary(BinaryOp.ADD, total, Load("bias", col, lanes, count))
                value = self.requant.apply(total, col, count)
                self.b.store("C", (row0 + r) * self.n + col, value, lanes, count)
