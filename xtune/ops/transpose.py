"""The transpose of a network's generated operators: a 4-D activation converted between layouts, which
the layout pass (xtune/firmware/relayout.py) inserts, and a model's own 4-D NHWC <-> NCHW Transpose node
(a TFLite model's boundary, xtune/frontend/tflite.py), which that pass relabels in NHWC networks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops import permute
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout, physical
from xtune.ops.opkit import Consts, GeneratedOp, Mapped, NodeFamily, Shape, params, positive
from xtune.schedule.loopnest import (
    Affine,
    Kernel,
    Load,
    NestBuilder,
    Shuffle,
)


@dataclass(frozen=True, kw_only=True)
class Transpose(GeneratedOp):
    """A 4-D activation converted between layouts: (n, c, h, w) to (n, h, w, c) (`to` NHWC), or back. The
    layout pass (xtune/firmware/relayout.py) inserts it."""

    n: int
    c: int
    h: int
    w: int
    to: Layout

    def __post_init__(self) -> None:
        positive("transpose", n=self.n, c=self.c, h=self.h, w=self.w)

    @property
    def label(self) -> str:
        """How a profile names its steps."""
        return f"transpose->{self.to.value}"

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (physical((self.n, self.c, self.h, self.w), _other(self.to)),)

    @property
    def output_shape(self) -> Shape:
        return physical((self.n, self.c, self.h, self.w), self.to)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose((0, 2, 3, 1) if self.to is Layout.NHWC else (0, 3, 1, 2)))

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        """Per image, the input is a rows x cols matrix (channels x pixels, or back) written transposed:
        blocks of lanes x lanes through log2(lanes) rounds of interleaving shuffles (each round pairs
        row i with row i + lanes/2; after the last, row j holds column j), the edges element by element.
        Fewer rows than lanes (an image's 3 channels to NHWC, the network's input): `lanes` columns of
        every row loaded as one vector each and interleaved into `rows` output vectors (`_interleave`)."""
        b, plane = NestBuilder(), self.h * self.w
        rows, cols = (self.c, plane) if self.to is Layout.NHWC else (plane, self.c)
        vectors = lanes > 1 and lanes & (lanes - 1) == 0
        width = lanes if vectors and min(rows, cols) >= lanes else 1
        few = vectors and 1 < rows < lanes <= cols  # the interleave path: every row, whole vectors of cols
        full_rows, full_cols = (rows - rows % width, cols - cols % width) if width > 1 else (0, 0)
        if few:
            full_rows, full_cols = rows, cols - cols % lanes
        with b.loop(self.n, "n") as img:
            base = img * (rows * cols)
            if width > 1:
                with b.loop(rows // width, "r") as r, b.loop(cols // width, "q") as q:
                    self._block(b, base, r * width, q * width, rows, cols, width)
            if few:
                with b.loop(cols // lanes, "q") as q:
                    self._interleave(b, base, q * lanes, rows, cols, lanes)
            for r0, r1, c0 in ((0, full_rows, full_cols), (full_rows, rows, 0)):  # the right edge, the bottom
                with b.loop(cols - c0, "j") as j, b.loop(r1 - r0, "i") as i:
                    b.store(
                        "out", base + (j + c0) * rows + i + r0, Load("x", base + (i + r0) * cols + j + c0)
                    )
        size = self.n * self.c * plane
        return b.kernel(name, params([("x", size)], size))

    @staticmethod
    def _interleave(b: NestBuilder, base: Affine, q: Affine, rows: int, cols: int, width: int) -> None:
        """Columns q..q+width of all `rows` (< width) rows, written as rows*width contiguous outputs:
        output lane e of the block is row e % rows, column e // rows. Each output vector gathers its lanes
        from the rows it touches by two-vector shuffles, one per row after the first."""
        loaded = [b.register(f"v{i}", width) for i in range(rows)]
        for i, reg in enumerate(loaded):
            b.assign(reg, Load("x", base + i * cols + q, width))
        acc = b.register("acc", width)
        for k in range(rows):
            sources = [(e % rows, e // rows) for e in range(k * width, (k + 1) * width)]
            order = sorted({i for i, _ in sources})
            first = tuple(j if i == order[0] else (width + j if i == order[1] else 0) for i, j in sources)
            b.assign(acc, Shuffle(loaded[order[0]], loaded[order[1]], first))
            for row in order[2:]:
                mask = tuple(width + j if i == row else lane for lane, (i, j) in enumerate(sources))
                b.assign(acc, Shuffle(acc, loaded[row], mask))
            b.store("out", base + q * rows + k * width, acc, width)

    @staticmethod
    def _block(b: NestBuilder, base: Affine, r: Affine, q: Affine, rows: int, cols: int, width: int) -> None:
        half = width // 2
        lo = tuple(k // 2 + (k % 2) * width for k in range(width))  # a0 b0 a1 b1 ... of the first halves
        hi = tuple(half + k for k in lo)
        banks = [[b.register(f"{bank}{i}", width) for i in range(width)] for bank in "tu"]
        for i, reg in enumerate(banks[0]):
            b.assign(reg, Load("x", base + (r + i) * cols + q, width))
        for round_ in range(width.bit_length() - 1):
            old, new = banks[round_ % 2], banks[1 - round_ % 2]
            for i in range(half):
                b.assign(new[2 * i], Shuffle(old[i], old[i + half], lo))
                b.assign(new[2 * i + 1], Shuffle(old[i], old[i + half], hi))
        done = banks[(width.bit_length() - 1) % 2]
        for j, reg in enumerate(done):
            b.store("out", base + (q + j) * rows + r, reg, width)


def _other(layout: Layout) -> Layout:
    return Layout.NCHW if layout is Layout.NHWC else Layout.NHWC


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    """A model's own 4-D NHWC <-> NCHW Transpose as the layout change (which the layout pass relabels in
    NHWC networks: then of an int8 tensor too, a TFLite model's int8 input); any other permutation as the
    permute family's general copy (float32)."""
    x = node.inputs[0]
    shape, perm = graph.shape(x), node.ints("perm", ())
    if graph.dtype(x) != "float32" and perm not in ((0, 3, 1, 2), (0, 2, 3, 1)):
        raise refuse(graph, node, f"tensor '{x}' is {graph.dtype(x)}; xtune permutes float32 tensors only")
    if len(shape) == 4 and perm == (0, 3, 1, 2):
        n, h, w, c = shape
        return Mapped(kernel=Transpose(n=n, c=c, h=h, w=w, to=Layout.NCHW), inputs=(x,))
    if len(shape) == 4 and perm == (0, 2, 3, 1):
        n, c, h, w = shape
        return Mapped(kernel=Transpose(n=n, c=c, h=h, w=w, to=Layout.NHWC), inputs=(x,))
    return permute.from_node(graph, node, consts, nxt)  # any other permutation: a general copy


FAMILY = NodeFamily(
    kind="transpose", onnx_ops=("Transpose",), layouts=frozenset((Layout.NCHW,)), from_node=from_node
)
