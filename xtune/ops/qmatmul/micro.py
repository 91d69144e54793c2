"""The register tile of int8 kernels: a target's `DotPlan` (its 4-way dot instruction), the packed
weight strips and each row's 4-byte groups in, the nest statements of an mr x nv tile of int32
accumulators (zeroed, reduced over k groups, summed, requantized and stored) out. qmatmul's rows are A's
rows; qconv2d's are output pixels, whose groups are (tap, channel group) bytes of a padded image: both
reduce through this one tile, with the weights packed by `pack_weights`.

The weights are strips of nr = nv * lanes columns, each strip k-group after k-group, each group nr
columns of 4 consecutive k bytes (B[4g + t, j] at strip * K4*nr*4 + g*nr*4 + c*4 + t), zero past n and
past k: the operand layout of vpdpbusd and sdot, which multiply 4 bytes per 32-bit lane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from xtune.ops.qmatmul.epilogue import Requantizer, joined_lanes
from xtune.ops.tiles import lane_group, parse_tile, register_budget
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Broadcast,
    Buffer,
    BufferKind,
    Const,
    Dot,
    DotDiff,
    DotInsn,
    DType,
    Load,
    NestBuilder,
    PairSum,
    Shuffle,
    Value,
)
from xtune.target import Target

ACT_DTYPE = {"u8": DType.U8, "s8": DType.I8}  # the loop-nest type of each activation word

# Where a row's 4-byte group of the dot's left operand is: (row within the tile, group) -> (buffer, index
# of its first byte); a row's groups are consecutive bytes.
GroupAt = Callable[[int, Affine | int], tuple[str, Affine]]


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
    def lane_groups(self) -> bool:
        """Whether a row's groups are read 4 at a time, one vector load, each dot taking its group by element
        (Arm ARM, "SDOT (by element)": `sdot v.4s, v.16b, v.4b[i]`), as the float matmul's FMLA by element
        takes its lanes; smull has no by-element form for bytes, so there a DUP (element) broadcasts it.
        AArch64's ld1r has no immediate offset: a broadcast load costs two instructions a group."""
        return self.insn in (DotInsn.SDOT, DotInsn.SADALP)

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
    """B (k, n) int8 in the strips the tile reads (module docstring), zero-padded; a flat int8 array."""
    k, n = b.shape
    groups, strips = -(-k // 4), -(-n // nr)
    padded = np.zeros((groups * 4, strips * nr), np.int8)
    padded[:k, :n] = b
    # (g, t, strip, c) -> (strip, g, c, t)
    return np.ascontiguousarray(padded.reshape(groups, 4, strips, nr).transpose(2, 0, 3, 1)).ravel()


@dataclass(frozen=True, kw_only=True)
class TileShape:
    """What the tile needs of a schedule: vectors of `lanes` int32, nv of them per row, `ksplit` partial
    sets, `unroll` groups per loop step, and the strips' `groups` (k groups per strip)."""

    lanes: int
    nv: int
    ksplit: int
    unroll: int
    groups: int
    pairs: bool = False  # two groups per step (`DotDiff`): the caller stores each odd group complemented

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


class DotTile:
    """One register tile: `rows` rows against the weight columns col0..col0+ncols (col0 a multiple of nr)
    of the packed buffer `weights`. With `bias_first` the first partial set starts from the bias instead
    of zero (AArch64, where `Requantizer.narrows_rows`: a load or move per accumulator either way, and no
    add per vector after the reduction); elsewhere the bias is added before the requantization."""

    def __init__(
        self,
        b: NestBuilder,
        plan: DotPlan,
        shape: TileShape,
        rows: int,
        col0: Affine,
        ncols: int,
        weights: str = "B",
        bias_first: bool = False,
    ) -> None:
        self.b, self.plan, self.shape = b, plan, shape
        self.rows, self.col0, self.ncols, self.weights = rows, col0, ncols, weights
        self.bias_first = bias_first
        self.nvec = -(-ncols // shape.lanes)
        width = shape.lanes * plan.acc_width
        self.acc = [
            [[b.register(f"acc{p}_{r}_{c}", width, DType.I32) for c in range(self.nvec)] for r in range(rows)]
            for p in range(shape.ksplit)
        ]
        zero: Value = Const(0, width, DType.I32)
        for p, sets in enumerate(self.acc):
            for row in sets:
                for c, reg in enumerate(row):
                    b.assign(reg, self._bias(c) if bias_first and p == 0 else zero)
        self.strip = Affine.of(col0) * (shape.groups * 4)

    def _bias(self, c: int) -> Value:
        """Vector c's bias as its accumulator's start; where the accumulator holds a pair per lane
        (`PairSum` after), each bias in the first of its pair and 0 in the second (ZIP1, ZIP2)."""
        lanes = self.shape.lanes
        bias = self.bias_at(c)
        if self.plan.acc_width == 1:
            return bias
        return Shuffle(
            bias, Const(0, lanes, DType.I32), tuple(i // 2 if i % 2 == 0 else lanes for i in range(2 * lanes))
        )

    def bias_at(self, c: int) -> Load:
        lanes = self.shape.lanes
        col = self.col0 + c * lanes
        return Load("bias", col, lanes, min(self.ncols - c * lanes, lanes) % lanes)

    def operand(self, at: tuple[str, Affine], g: Affine | int, count: int, size: int) -> Value:
        """A row's group g (local, of `count`) at `at`: by element from a vector of 4 groups where the plan
        reads them so (`DotPlan.lane_groups`) and the 4 are whole, else the group itself."""
        name, index = at
        group = lane_group(Affine.of(g), count, 4) if self.plan.lane_groups and size == 4 else None
        if group is None:
            return Load(name, index, 4, size % 4)
        return Broadcast(Load(name, index + group[1] * -4, 16), 4, group[1])

    def weights_at(self, g: Affine | int) -> list[Load]:
        """The strip's vectors of weight group g."""
        lanes = self.shape.lanes
        base = self.strip + Affine.of(g) * (self.shape.nr * 4)
        return [Load(self.weights, base + c * lanes * 4, 4 * lanes) for c in range(self.nvec)]

    def step(self, g: Affine, part: int, rows: Callable[[int], Value]) -> None:
        """acc[part][r][c] += dot(row r's group, strip vector c of weight group g)."""
        vectors = self.weights_at(g)
        for r in range(self.rows):
            a = rows(r)
            for c in range(self.nvec):
                acc = self.acc[part][r][c]
                self.b.assign(acc, Dot(acc, a, vectors[c], self.plan.insn))

    def step_pair(self, g: Affine, part: int, rows: Callable[[int, int], Value]) -> None:
        """acc[part][r][c] += the `DotDiff` of groups g and g + 1 (the second stored complemented)."""
        first, second = self.weights_at(g), self.weights_at(g + 1)
        for r in range(self.rows):
            a0, a1 = rows(r, 0), rows(r, 1)
            for c in range(self.nvec):
                acc = self.acc[part][r][c]
                self.b.assign(acc, DotDiff(acc, a0, first[c], a1, second[c]))

    def reduce(self, count: int, first: Affine | int, group: GroupAt, tail: int = 0) -> None:
        """Groups first..first+count-1 (local index g given to `group`), `unroll` steps per loop step spread
        over the `ksplit` partial sets, a step one group or (`pairs`) two, an odd group's step last; then
        one group of `tail` bytes (a k % 4 rest) if any."""
        self.reduce_parts(count, ((first, group),), tail)

    def reduce_parts(self, count: int, parts: Sequence[tuple[Affine | int, GroupAt]], tail: int = 0) -> None:
        """`reduce` of several runs of `count` groups (each its first group and `GroupAt`) in one loop: a
        loop step takes its `unroll` steps of every run in turn (a convolution's tap columns: the rows'
        vectors of 4 groups that neighbouring taps share are loaded once, and the loop's counters are
        paid once for all of them)."""
        s, b = self.shape, self.b
        width = 2 if s.pairs else 1
        per = s.unroll * s.ksplit
        full, rest = divmod(count // width, per)

        def one(
            part: tuple[Affine | int, GroupAt], g: Affine | int, acc: int, size: int = 4, width: int = width
        ) -> None:
            first, group = part
            local = Affine.of(g)
            at = Affine.of(first) + local
            if width == 2:
                self.step_pair(at, acc, lambda r, i: self.operand(group(r, local + i), local + i, count, 4))
            else:
                self.step(at, acc, lambda r: self.operand(group(r, local), local, count, size))

        quad = max(1, 4 // width)  # steps per vector of 4 groups
        if full:
            with b.loop(full, "kg") as o:
                for q in range(0, per, quad):  # each vector of 4 groups through every run, then the next
                    for part in parts:
                        for u in range(q, min(q + quad, per)):
                            one(part, (o * per + u) * width, u % s.ksplit)
        for part in parts:
            for u in range(rest):
                one(part, (full * per + u) * width, u % s.ksplit)
            if count % width:
                one(part, count - 1, rest % s.ksplit, 4, 1)
            if tail:
                one(part, count, (rest + count % width) % s.ksplit, tail, 1)

    def totals(self) -> Iterator[tuple[int, int, Value]]:
        """(row, vector, its int32 sums over every partial set) of the tile."""
        for r in range(self.rows):
            for c in range(self.nvec):
                total: Value = self.acc[0][r][c]
                for part in self.acc[1:]:
                    total = Binary(BinaryOp.ADD, total, part[r][c])
                if self.plan.acc_width == 2:
                    total = PairSum(total)
                yield r, c, total

    def store(self, requant: Requantizer, out: str, row_at: Callable[[int], Affine]) -> None:
        """Each sum plus its column's bias, requantized, stored at out[row_at(row) + column]: a row of whole
        vectors as one store where the requantizer narrows rows together (`Requantizer.apply_row`)."""
        lanes = self.shape.lanes
        rows: dict[int, list[tuple[Value, Affine]]] = {}
        for r, c, total in self.totals():
            col = self.col0 + c * lanes
            count = min(self.ncols - c * lanes, lanes) % lanes
            summed = total if self.bias_first else Binary(BinaryOp.ADD, total, self.bias_at(c))
            if requant.narrows_rows and self.ncols % lanes == 0:
                rows.setdefault(r, []).append((summed, col))
            else:
                self.b.store(out, row_at(r) + col, requant.apply(summed, col, count), lanes, count)
        for r, words in rows.items():
            row, valid = requant.apply_row(words), len(words) * lanes
            self.b.store(out, row_at(r) + self.col0, row, joined_lanes(len(words), lanes), valid)


def kernel_params(wl: Workload, packed: str, size: int) -> tuple[Buffer, ...]:
    """An int8 kernel's parameters in the workload's tensor order, the weights `packed` sized as `size`
    packed bytes."""
    dtypes = {"float32": DType.F32, "int8": DType.I8, "uint8": DType.U8, "int32": DType.I32}
    return tuple(
        Buffer(
            t.name,
            size if t.name == packed else t.size,
            BufferKind.OUTPUT if t.is_output else BufferKind.INPUT,
            dtypes[t.dtype],
        )
        for t in wl.tensors()
    )


def register_tiles(plan: DotPlan, target: Target) -> tuple[str, ...]:
    """Tiles "MRxNV" whose accumulators and operands fit the register file (at lmul 1); a config whose
    tile does not fit with ksplit=2 or its lmul runs with fewer (`fit_registers`)."""
    regs, lanes = target.vector_registers, target.fp32_lanes
    return tuple(
        f"{mr}x{nv}"
        for mr in range(1, 13)
        for nv in range(1, 7)
        if plan.registers(mr, nv) <= regs and nv * lanes <= 64
    )


def fit_registers(
    plan: DotPlan, target: Target, tile: tuple[int, int], ksplit: int, lmul: int
) -> tuple[int, int]:
    """(ksplit, lanes) a tile runs with: 2 partial sets only if they fit the register file, and vectors of
    the largest lmul (RVV's register grouping) whose groups hold the tile within 64 lanes."""
    mr, nv = tile
    regs = target.vector_registers
    if ksplit > 1 and plan.registers(mr, nv, ksplit) > regs:
        ksplit = 1  # two partial sets would spill: the same nest as ksplit=1
    need = plan.registers(mr, nv, ksplit)
    while lmul > 1 and (need > regs // lmul or nv * target.fp32_lanes * lmul > 64):
        lmul //= 2  # the tile's register groups would not fit: the nest of the largest lmul that does
    return ksplit, target.fp32_lanes * lmul


@dataclass(frozen=True, kw_only=True)
class RowSpan:
    """What a convolution's tile rows read (qconv2d, its taps unrolled): `taps` tap columns in one loop
    step (`DotTile.reduce_parts`), whose vectors overlap (tap j of row r reads pixel column
    r * stride + j * dilation); `width` pixels per output row, cut into tiles of mr and
    one narrower tail tile. The default for qmatmul: one column, rows without a tail."""

    taps: int = 1
    stride: int = 1
    dilation: int = 1
    width: int = 0

    def columns(self, mr: int, taps: tuple[int, ...]) -> int:
        """Distinct pixel columns (row vectors of 4 groups) an mr-row tile reads over `taps`."""
        return len({r * self.stride + j * self.dilation for r in range(mr) for j in taps})

    def vectors(self, mr: int) -> int:
        """Row vectors an mr-row tile loads over its taps."""
        return self.columns(mr, tuple(range(self.taps)))

    def live(self, mr: int) -> int:
        """Row vectors an mr-row tile holds at once: those of the largest class of `tap_classes`."""
        return max(self.columns(mr, c) for c in tap_classes(self.taps, self.stride, self.dilation))


def tap_classes(taps: int, stride: int, dilation: int) -> list[tuple[int, ...]]:
    """The tap columns 0..taps-1 in classes whose pixel columns coincide between rows (j * dilation equal
    modulo the stride): one class at stride 1, the even and the odd taps at stride 2 (dilation 1)."""
    classes: dict[int, list[int]] = {}
    for j in range(taps):
        classes.setdefault(j * dilation % stride, []).append(j)
    return [tuple(c) for c in classes.values()]


def lane_cost(plan: DotPlan, mr: int, nv: int, pairs: bool, span: RowSpan = RowSpan()) -> tuple[float, int]:
    """(instructions per multiply-add group, live registers) of an mr x nv tile reading its rows' groups
    by element (`DotPlan.lane_groups`), by what the AArch64 code holds: per group, the dots, B's vectors
    in ldp pairs and a quarter load of each row's vector (SADALP: a dup of each row's group, and a
    smull, smull2 and two sadalps per dot; `DotDiff` pairs: 6 instructions per two groups); live, the
    accumulators, B's vectors of one step (two groups for pairs), each row's vector, and the next step's
    operands in flight (2). Over `span.taps` unrolled sdot taps the rows' vectors are `span.vectors`,
    loaded once for all of them (the SADALP count stays per tap: 3x3 pair tiles, cheaper by the shared
    count, spilled on qemu-aarch64)."""
    rows = span.vectors(mr)
    if plan.insn is DotInsn.SDOT:
        return (mr * nv + nv / 2 + rows / 4 / span.taps) / (mr * nv), mr * nv + nv + span.live(mr) + 2
    per_dot = 3.0 if pairs else 4.0
    steps = 2 if pairs else 1
    cost = (per_dot * mr * nv + nv / 2 + mr * 1.25) / (mr * nv)
    return cost, 2 * mr * nv + steps * nv + mr + 2 + 2


def tile_default(
    plan: DotPlan, tiles: tuple[str, ...], target: Target, pairs: bool = False, span: RowSpan = RowSpan()
) -> str:
    """The tile of the fewest instructions per dot, averaged over a row of `span.width` pixels with its
    tail tile (ResNet-8's 8-pixel rows: 5x4 leaves a 3x4 tail, 8x2 none; ResNet-18's 7-pixel rows: 6x4
    leaves a 1x4 tail that streams a whole weight strip for one pixel, 7x3 none), then the larger tile.
    Per dot: `DotPlan.instructions`; on AArch64's by-element route (`lane_groups`), `lane_cost` among the
    tiles whose live registers fit the `register_budget` (a fuller tile spills: 6x4 sdot and 4x2 smull
    tiles measured more instructions on qemu-aarch64 for it)."""
    shapes = [parse_tile(t) for t in tiles]
    width = span.width

    def per_dot(m: int, v: int) -> float:
        if plan.lane_groups:
            return lane_cost(plan, m, v, pairs, span)[0]
        return plan.instructions(m, v) / (m * v)

    def cost(m: int, v: int) -> float:
        if not width:
            return per_dot(m, v)
        full, rest = divmod(width, min(m, width))
        tail = per_dot(rest, v) * rest if rest else 0.0
        return (per_dot(min(m, width), v) * full * min(m, width) + tail) / width

    fits = shapes
    if plan.lane_groups:
        fits = [p for p in shapes if lane_cost(plan, *p, pairs, span)[1] <= register_budget(target)] or shapes
    mr, nv = min(fits, key=lambda p: (cost(*p), -min(p[0], width or p[0]) * p[1], -p[0] * p[1]))
    return f"{mr}x{nv}"
