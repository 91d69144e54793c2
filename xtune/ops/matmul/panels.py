"""A resolved `MatmulSchedule` and its `Operands` in; out, where each operand of the current product and
its panels lie, and the nests that copy operands into panels: A's mr-row panels and B's nr-column strips
at every call, and the nest that writes the operand passed prepacked (`pack_kernel`). The product's nest
(nest.py) builds on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from xtune.ops.matmul.schedule import MatmulSchedule, Operands
from xtune.ops.tiles import div
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Affine, Buffer, Const, Kernel, Load, NestBuilder, Value


class PanelEmitter:
    """The operands' addresses and panel copies in one `NestBuilder`, shared with the product's nest."""

    def __init__(self, workload: Workload, s: MatmulSchedule, operands: Operands):
        self.m, self.n, self.k = workload["m"], workload["n"], workload["k"]
        self.s, self.o = s, operands
        # Row strides: a group's rows are its slice of rows holding every group (`Operands.interleaved`).
        width = operands.groups if operands.interleaved else 1
        self.lda, self.ldb, self.ldc = self.k * width, self.n * width, self.n * width
        # Where the current product's operands start (`locate`): plain A, B, C, its bias, and its panels
        # of the operand passed prepacked.
        self.a_at, self.b_at, self.c_at, self.bias_at, self.packed_at = (Affine(),) * 5
        self.b = NestBuilder()

    def locate(self, product: Affine, group: Affine) -> None:
        """Point the operands at batch product `product`'s group `group` (`Operands.groups`)."""
        m, n, k, o = self.m, self.n, self.k, self.o
        if o.interleaved:  # the group's columns of every row
            self.a_at, self.b_at, self.c_at, self.bias_at = group * k, group * n, group * n, group * n
        else:  # whole matrices: A and the bias per group, B and C per (product, group)
            at = product * o.groups + group
            self.a_at, self.b_at, self.c_at = group * (m * k), at * (k * n), at * (m * n)
            self.bias_at = group * (m if o.bias_rows else n)
        self.packed_at = group * self.panels_size()

    def panels_size(self) -> int:
        """Floats of one group's panels of the operand passed prepacked (0 for none): whole k per panel,
        rows (A) or columns (B) up to whole panels."""
        s = self.s
        if s.passed_packed == "A":
            return -(-self.m // s.mr) * s.mr * self.k
        if s.passed_packed == "B":
            return -(-self.n // s.nr) * s.nr * self.k
        return 0

    def packed_param(self, param: Buffer) -> Buffer:
        """`param`, sized as its panels when it is the operand passed prepacked and read in panels."""
        packed = self.s.passed_packed
        if param.name == {"A": self.o.a, "B": self.o.b}.get(packed):
            return replace(param, size=self.panels_size() * self.o.groups)
        return param

    def pack_b(self, ctx: dict[str, tuple[Affine, int]]) -> None:
        """Bp[strip][kk][nr] = B[k0+kk, n0+strip*nr : +nr], zero-padded past the last column."""
        s = self.s
        (n0, ncur), (k0, kcur) = ctx["n"], ctx["k"]
        self.copy_strips(n0, ncur, k0, kcur, "Bp", lambda js, kk: div(js, s.nr) * (kcur * s.nr) + kk * s.nr)

    def copy_strips(
        self, n0: Affine, ncur: int, k0: Affine, kcur: int, dst: str, at: Callable[[Affine, Affine], Affine]
    ) -> None:
        """dst[at(js, kk) + 0:nr] = B[k0+kk, n0+js : +nr] for each strip js of the block, zero past n."""
        s, b = self.s, self.b

        def strip(js: Affine, ncols: int) -> None:
            with b.loop(kcur, "pbk") as kk:
                for c in range(s.nv):
                    cols = min(max(ncols - c * s.lanes, 0), s.lanes)
                    src = self.b_at + (k0 + kk) * self.ldb + n0 + js + c * s.lanes
                    value: Value = (
                        Load(self.o.b, src, s.lanes, cols % s.lanes) if cols else Const(0.0, s.lanes)
                    )
                    b.store(dst, at(js, kk) + c * s.lanes, value, s.lanes)

        b.split(ncur, s.nr, strip, "pbj")

    def pack_a(self, ctx: dict[str, tuple[Affine, int]]) -> None:
        """Ap[panel][kk][rows] = A[m0+panel*mr+r, k0+kk]: the broadcasts then stream contiguously."""
        s = self.s
        (m0, mcur), (k0, kcur) = ctx["m"], ctx["k"]
        self.copy_panels(
            m0, mcur, k0, kcur, "Ap", lambda io, kk, rows: div(io, s.mr) * (kcur * s.mr) + kk * rows
        )

    def copy_panels(
        self,
        m0: Affine,
        mcur: int,
        k0: Affine,
        kcur: int,
        dst: str,
        at: Callable[[Affine, Affine, int], Affine],
        pad: bool = False,
    ) -> None:
        """dst[at(io, kk, rows) + r] = A[m0+io+r, k0+kk] for each panel io of `rows` rows of the block; with
        `pad`, zeros in rows past m up to mr (the prepacked layout's whole panels)."""
        s, b = self.s, self.b

        def panel(io: Affine, rows: int) -> None:
            with b.loop(kcur, "pak") as kk:
                for r in range(s.mr if pad else rows):
                    index = self.a_at + (m0 + io + r) * self.lda + k0 + kk
                    src: Value = Load(self.o.a, index) if r < rows else Const(0.0)
                    b.store(dst, at(io, kk, rows) + r, src)

        b.split(mcur, s.mr, panel, "pai")

    def panel_index(self, start: Affine | int, kk: Affine | int) -> Affine:
        """Where row `kk` of the prepacked operand's panel starting at row (A) or column (B) `start` is:
        whole-k panels of `width` = mr rows (A) or nr columns (B), each k x width (`prepack`)."""
        width = self.s.mr if self.s.passed_packed == "A" else self.s.nr
        return self.packed_at + div(Affine.of(start), width) * (self.k * width) + Affine.of(kk) * width

    def pack_kernel(self, name: str, plain: Buffer, packed: Buffer) -> Kernel:
        """The nest that writes `packed` (the prepacked operand as the kernel reads it) from `plain` (the
        operand in the workload's layout): through `panel_index`, the index the kernel reads by."""
        s, b = self.s, self.b
        zero = Affine()
        if s.passed_packed:
            with b.loop(self.o.groups, "gr") as group:  # each group's panels from its own slice
                self.locate(zero, group)
                if s.passed_packed == "B":
                    self.copy_strips(zero, self.n, zero, self.k, packed.name, self.panel_index)
                else:
                    at = self.panel_index
                    self.copy_panels(
                        zero, self.m, zero, self.k, packed.name, lambda io, kk, _: at(io, kk), True
                    )
        else:  # the config reads the operand as it is: the packed form is a copy
            b.split(
                plain.size,
                s.lanes,
                lambda i, n: b.store(packed.name, i, Load(plain.name, i, s.lanes, n % s.lanes), s.lanes, n),
                "cp",
            )
        return b.kernel(name, (plain, packed))
