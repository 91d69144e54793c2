"""The matmul template: matmul workload + target in, a BLIS-style blocked, packed, register-tiled nest out.

C[m,n] = A[m,k] @ B[k,n]. Three block loops (mc, nc, kc) in a tunable order; B packed into kc x nr
strips and A into mr x kc panels (each optional), per call, or not at all for the operand that holds
prepacked weights (B of a prepacked=1 matmul; a pointwise conv2d's weights, `Operands.prepacked`), which
the caller passes already in panels (`prepack`); an mr x (nv vectors) register tile of accumulators
updated by broadcast(A) * B-vector FMAs, the k loop unrolled by `unroll_k`. Tails of every axis
become constant-size tiles, so any shape is exact. bias=1 and residual=1 start C (or the accumulators)
at the bias row plus the residual; relu=1 / relu6=1 clamp the accumulators of the last k block before
their store. The space, default config and packed weights are here; the nest is ops/matmul/nest.py
(the panels ops/matmul/panels.py, the resolved config ops/matmul/schedule.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace

import numpy as np

from xtune.ops.matmul.nest import MatmulEmitter
from xtune.ops.matmul.panels import PanelEmitter
from xtune.ops.matmul.schedule import MatmulSchedule, Operands
from xtune.ops.tiles import (
    Epilogue,
    Scalars,
    clipped,
    fmas_per_load,
    group_lanes,
    lmul_knobs,
    lmul_of,
    parse_tile,
    register_budget,
    register_tiles,
    roomy_tiles,
    tile_registers,
    whole_tiles,
)
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Buffer, BufferKind, Kernel
from xtune.schedule.space import Config, ConfigSpace, Knob, KnobKind, KnobValue
from xtune.target import Target

ORDERS = ("nkm", "nmk", "knm", "kmn", "mnk", "mkn")  # block loops, outermost first
KC_OPTIONS = (8, 16, 32, 64, 96, 128, 192, 256, 384, 512)
MC_OPTIONS = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
NC_OPTIONS = (16, 32, 64, 128, 256, 512, 1024)
UNROLL_OPTIONS = (1, 2, 4, 8)


def effective_blocks(
    workload: Workload,
    lanes: Scalars,
    tile: tuple[Scalars, Scalars],
    blocks: tuple[Scalars, Scalars, Scalars],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (mc, nc, kc) a config's block knobs resolve to for an (mr, nv) register tile: mc holds whole
    rows of tiles and nc whole vector strips of nr = nv * lanes (unless one covers its axis); kc is used
    as given (its options never exceed k)."""
    mr, nv = tile
    mc, nc, kc = blocks
    m, n = int(workload["m"]), int(workload["n"])
    return whole_tiles(mc, m, mr), whole_tiles(nc, n, nv * lanes), np.asarray(kc)


def prepack(operand: str, matrix: np.ndarray, rows: int, cols: int, width: int) -> np.ndarray:
    """A (rows, cols) operand in the panels the kernel reads when it is passed prepacked: B as strips of
    `width` = nr columns, each k x nr row-major (B[kk, j*nr + c] at j*k*nr + kk*nr + c); A as panels of
    `width` = mr rows, each k x mr (A[i*mr + r, kk] at i*k*mr + kk*mr + r); zero past the last column
    (row). Whole k per strip, so that every k block of a strip is contiguous, as the per-call copy is."""
    m = np.asarray(matrix, np.float32).reshape(rows, cols)
    m = m if operand == "B" else m.T  # now (k, panel axis)
    k, extent = m.shape
    padded = np.zeros((k, -(-extent // width) * width), np.float32)
    padded[:, :extent] = m
    return np.ascontiguousarray(padded.reshape(k, -1, width).transpose(1, 0, 2)).ravel()


class MatmulTemplate:
    def __init__(self, workload: Workload, target: Target, operands: Operands | None = None):
        """`operands`: where another template's product lives (a pointwise conv2d); by default the
        workload's own A, B, C, with B prepacked when the workload says prepacked=1."""
        self.workload = workload
        self.target = target
        self.operands = operands or Operands(prepacked="B" if workload["prepacked"] else "")
        assert not (self.operands.prepacked == "B" and self.operands.batch > 1), "B is per product"
        m, n, k = workload["m"], workload["n"], workload["k"]
        self.space = ConfigSpace(
            (
                Knob("tile", KnobKind.CHOICE, register_tiles(target)),
                Knob("mc", KnobKind.TILE, clipped(MC_OPTIONS, m)),
                Knob("nc", KnobKind.TILE, clipped(NC_OPTIONS, n)),
                Knob("kc", KnobKind.TILE, clipped(KC_OPTIONS, k)),
                Knob("order", KnobKind.CHOICE, ORDERS),
                Knob("inner", KnobKind.CHOICE, ("nm", "mn")),
                Knob("pack_a", KnobKind.CHOICE, (0, 1)),
                Knob("pack_b", KnobKind.CHOICE, (0, 1)),
                Knob("unroll_k", KnobKind.UNROLL, UNROLL_OPTIONS),
                *lmul_knobs(target),
            )
        )

    def schedule(self, config: Config) -> MatmulSchedule:
        mr, nv = parse_tile(str(config["tile"]))
        lanes = int(group_lanes(self.target, mr, nv, lmul_of(config)))
        mc, nc, kc = effective_blocks(
            self.workload, lanes, (mr, nv), (config.int("mc"), config.int("nc"), config.int("kc"))
        )
        return MatmulSchedule(
            mr,
            nv,
            lanes,
            int(mc),
            int(nc),
            int(kc),
            str(config["order"]),
            str(config["inner"]),
            bool(config["pack_a"]),
            bool(config["pack_b"]),
            config.int("unroll_k"),
            self.operands.prepacked,
            self.target.weight_prefetch_bytes,
            # A tile whose A vectors would not fit beside its accumulators broadcasts A one step at a time.
            self.target.lane_fma and tile_registers(mr, nv, True) <= register_budget(self.target),
            self.target.integer_clamp,
            self.target.peel_reduction,
            self.target.load_initial,
        )

    def default_config(self) -> Config:
        t = self.target
        knobs = {k.name: k.options for k in self.space.knobs}
        # RVV: the widest register groups, so that a row of B is one load and each row of the tile one
        # FMA per group (the tile's registers counted in groups).
        lmul = max(int(o) for o in knobs.get("lmul", (1,)))
        # The default reads A in place, 4 k steps unrolled: on a lane-FMA target a vector of A per row.
        tiles = [
            parse_tile(s)
            for s in roomy_tiles(register_tiles(t), t, lambda r, v: tile_registers(r, v, t.lane_fma) * lmul)
        ]
        # Most FMAs per loaded value, then the larger tile.
        mr, nv = max(tiles, key=lambda p: (fmas_per_load(p[0], p[1]), p[0] * p[1]))
        nr = nv * int(group_lanes(t, mr, nv, lmul))
        # kc: the whole reduction where its B strip (kc x nr) takes at most an eighth of L2, else the
        # largest block that does. One k block loads, finishes (epilogue) and stores each C tile once, and
        # a B strip streams from L2 fast enough for the tile's FMAs; BLIS' rule (B strip and A panel in
        # half of L1) gave kc = 64 on AVX-512 and lost 1.1-1.5x wherever k > 64 (docs/benchmarks.md,
        # "Issue 28: the pointwise default"). mc: the A block half of L2; nc: the packed B panel fits in
        # L2 (BLIS' analytical model, Low et al., TOMS 2016).
        kc = _largest(knobs["kc"], lambda v: 4 * v * nr <= t.l2_bytes // 8)
        mc = _largest(knobs["mc"], lambda v: 4 * v * kc <= t.l2_bytes // 2)
        nc = _largest(knobs["nc"], lambda v: 4 * v * kc <= t.l2_bytes)
        values: dict[str, KnobValue] = {
            "tile": f"{mr}x{nv}",
            "mc": mc,
            "nc": nc,
            "kc": kc,
            "order": "nkm",
            "inner": "nm",
            "pack_a": 0,
            "pack_b": 1,
            "unroll_k": 4,
            **({"lmul": lmul} if "lmul" in knobs else {}),
        }
        return self.space.config(self.space.index_of(values))

    def kernel(self, config: Config, name: str) -> Kernel:
        """The nest of one config, over the template's operands."""
        emitter = MatmulEmitter(self.workload, self.schedule(config), self.operands)
        return emitter.kernel(name, self.params())

    def kernel_inputs(self, config: Config, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The reference inputs (the workload's layouts) as `config`'s kernel reads them: the prepacked
        operand in its panels (`prepack`) when the config reads it in panels, the rest as they are."""
        s, out = self.schedule(config), list(inputs)
        which = s.passed_packed
        if not which:
            return out
        slot = [p.name for p in self.params()].index(self.operands.a if which == "A" else self.operands.b)
        out[slot] = self.prepack_operand(s, out[slot])
        return out

    def packed_layout(self, config: Config) -> Hashable:
        """What fixes the layout `kernel_inputs` gives `config`'s prepacked operand (None: none passed
        packed): the panel width `prepack_operand` cuts. Configs with equal keys read equal bytes."""
        s = self.schedule(config)
        if not s.passed_packed:
            return None
        return (s.passed_packed, s.mr if self.operands.prepacked == "A" else s.nr)

    def pack_kernel(self, config: Config, name: str) -> Kernel:
        """The nest `name(plain, packed)` that writes the prepacked operand as `kernel_inputs` gives it to
        `config`'s kernel from the operand in the workload's layout: panels through the index the kernel
        reads them by, or a copy when the config reads the operand as it is."""
        s, o = self.schedule(config), self.operands
        assert o.prepacked, "only a prepacked operand has a packed form"
        emitter = PanelEmitter(self.workload, s, o)
        plain = next(p for p in self.params() if p.name == (o.a if o.prepacked == "A" else o.b))
        packed = replace(emitter.packed_param(plain), name="packed", kind=BufferKind.OUTPUT)
        return emitter.pack_kernel(name, plain, packed)

    def prepack_operand(self, s: MatmulSchedule, matrix: np.ndarray) -> np.ndarray:
        """The prepacked operand in its panels, each group's (`Operands.groups`) after the one before."""
        m, n, k, o = self.workload["m"], self.workload["n"], self.workload["k"], self.operands
        rows, cols, width = (m, k, s.mr) if o.prepacked == "A" else (k, n, s.nr)
        plain = np.asarray(matrix, np.float32)
        if o.interleaved:  # each row holds every group's columns
            groups = plain.reshape(rows, o.groups, cols).transpose(1, 0, 2)
        else:
            groups = plain.reshape(o.groups, rows, cols)
        return np.concatenate([prepack(o.prepacked, g, rows, cols, width) for g in groups])

    def params(self) -> tuple[Buffer, ...]:
        """The kernel's parameters in order, each as the workload's layout sizes it."""
        m, n, k, o = self.workload["m"], self.workload["n"], self.workload["k"], self.operands
        return o.params or (
            Buffer("A", m * k, BufferKind.INPUT),
            Buffer("B", k * n, BufferKind.INPUT),
            *Epilogue.of(self.workload).buffers(n, m * n),
            Buffer("C", m * n, BufferKind.OUTPUT),
        )


def _largest(options: tuple[int | str, ...], fits: object) -> int:
    ints = [int(o) for o in options]
    good = [o for o in ints if fits(o)]  # type: ignore[operator]
    return max(good) if good else min(ints)
