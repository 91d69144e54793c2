"""The pieces every generated operator of a network (the families elementwise.py, pool2d.py, softmax.py,
concat.py, reshape.py, transpose.py ... in xtune/ops/) is built from: the kernel class they all are
(`GeneratedOp`, with `ChannelsOp` for those over the channels of one (n, c, h, w) tensor and `PointwiseOp`
for those that map every element of one shape), what an ONNX node maps to (`Mapped`, `NodeFamily`), size
checks, the kernel's pointer parameters, vector loops over contiguous memory, horizontal reductions.

A generated operator takes shapes in and gives the output shape, a numpy reference and a loop-nest
`Kernel` (lowered by xtune.codegen.lower like any template's) out. Float32; 4-D tensors in NCHW, or NHWC
where the layout pass (xtune/firmware/relayout.py) asks it (`in_layout`), inserting `Transpose`s. Every
kernel takes its inputs then its output as pointer parameters, in that order, and writes every element
of the output. The parameters must not overlap, except that an elementwise kernel's output may be exactly
one of its inputs (it runs in place, `Kernel.noalias` is off). Semantics follow the ONNX operator
definitions (https://onnx.ai/onnx/operators/); each family's docstring says which. Elementwise ops,
Concat and Softmax run along contiguous memory in vectors of the target's fp32 lanes (a partial vector at
the end, never a read past it); pooling as xtune/ops/pool2d.py says; a Transpose runs in blocks of
lanes x lanes shuffles."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import Field, dataclass, replace
from typing import Any, ClassVar, Self

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout, physical
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Kernel,
    Load,
    LoopKind,
    NestBuilder,
    Reg,
    Value,
)
from xtune.target import Target

Shape = tuple[int, ...]
UNROLL = 4  # vectors per iteration of an elementwise loop: enough independent work to hide latency
# Why a node has no generated operator, in the words of every family's refusal.
# The operators a build runs are the registry's families (xtune/ops/registry.py), listed for users in
# docs/networks.md; the message points there rather than keeping a second list that goes stale.
UNSUPPORTED = "xtune cannot run this operator in a whole-network build (docs/networks.md lists those it runs)"
Consts = dict[str, np.ndarray]  # the network's constant operands a mapping reads, by tensor name


class GeneratedOp(ABC):
    """A generated operator's kernel (a frozen dataclass of its sizes): the shapes it reads and writes
    (in its layout's order), its numpy `reference`, its loop nest, and how a profile names it (`label`:
    the class name in lower case unless the operator says more). `in_layout` is the same computation in
    another layout; here the kernel itself, right for an operator whose work does not depend on the
    order (elementwise), runs in NCHW only (its family's layouts) or is the conversion itself."""

    # What dataclasses.fields and replace read: every generated operator is a frozen dataclass.
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    reference: Callable[..., np.ndarray]  # the inputs (as many as `input_shapes`) in, the output out

    @property
    @abstractmethod
    def input_shapes(self) -> tuple[Shape, ...]: ...

    @property
    @abstractmethod
    def output_shape(self) -> Shape: ...

    @abstractmethod
    def kernel_nest(self, name: str, lanes: int) -> Kernel: ...

    @property
    def label(self) -> str:
        """How a profile names its steps."""
        return type(self).__name__.lower()

    def in_layout(self, layout: Layout, out_shape: Shape) -> GeneratedOp:
        return self

    def for_target(self, target: Target) -> GeneratedOp:
        """The operator as a build for `target` computes it: here the operator itself; an operator whose
        reference runtime computes it otherwise on another architecture (xtune/ops/qmlas.py) says how."""
        return self


class ChannelsOp(GeneratedOp):
    """An operator over one (n, c, h, w) tensor, or (n, h, w, c) in NHWC (its `layout` field): in another
    layout the same window over that layout's axes."""

    n: int
    c: int
    h: int
    w: int
    layout: Layout

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (physical((self.n, self.c, self.h, self.w), self.layout),)

    def in_layout(self, layout: Layout, out_shape: Shape) -> Self:
        return replace(self, layout=layout)


class PointwiseOp(GeneratedOp):
    """An operator computing each element of `shape` from the same element of its inputs (each of
    `shape`): the same whatever the layout; `map_nest` builds its kernel where it runs in place."""

    shape: Shape

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.shape,)

    @property
    def output_shape(self) -> Shape:
        return self.shape

    def map_nest(
        self, name: str, lanes: int, names: str, value: Callable[[list[Value], int], Value]
    ) -> Kernel:
        """The kernel storing value(the inputs' vectors, width) at every element, inputs `names`. Every
        element is loaded before the same element is stored, so the output may be any one input (in
        place, the memory plan's in_place_of) as long as LLVM is not told the pointers differ."""
        b = NestBuilder()

        def emit(i: Affine, width: int, count: int) -> None:
            b.store("out", i, value([Load(n, i, width, count) for n in names], width), width, count)

        vector_map(b, self.size, lanes, emit)
        return b.kernel(name, params([(n, self.size) for n in names], self.size), noalias=False)


@dataclass(frozen=True, kw_only=True)
class Mapped:
    """What a node maps to: the generated kernel (None: a view, the same bytes, no code), the tensors it
    reads in its parameter order, whether its output may share an input's bytes (`in_place`) or is that
    input (`alias`), and the next node folded into it (Add then Relu: one Add+ReLU), if any. A node of
    several outputs (Split) is one call per output: `output` names the one this call writes (empty: the
    node's first, or its folded node's), `more` the calls that write the others."""

    kernel: GeneratedOp | None
    inputs: tuple[str, ...]
    in_place: bool = False
    alias: bool = False
    fused: Node | None = None
    layouts: frozenset[Layout] | None = None  # this node's, where it differs from its family's
    follows_input: bool | None = None  # this node's, where it differs from its family's
    output: str = ""
    more: tuple[Mapped, ...] = ()


@dataclass(frozen=True, kw_only=True)
class NodeFamily:
    """A generated operator's ONNX side: `kind` as `xtune tasks` lists its nodes, `onnx_ops` the op
    types it builds, `layouts` the layouts a network may run it in (else NCHW with
    conversions around it), `follows_input` whether it runs in the layout its first input has instead,
    and `from_node`, a node (and the only node reading its output, if it comes later) as a `Mapped`,
    adding the constants it reads to `consts`."""

    kind: str
    onnx_ops: tuple[str, ...]
    layouts: frozenset[Layout]
    from_node: Callable[[Graph, Node, Consts, Node | None], Mapped]
    follows_input: bool = False


def positive(op: str, **sizes: int) -> None:
    for name, value in sizes.items():
        if value < 1:
            raise InputError(f"{op}: '{name}' must be a positive integer, got {value}")


def positive_dims(op: str, shape: Shape) -> None:
    positive(op, **{f"dim{i}": d for i, d in enumerate(shape)})


@contextmanager
def refusing(graph: Graph, node: Node) -> Iterator[None]:
    """A kernel's own size checks (InputError) as the refusal of the node it was built for."""
    try:
        yield
    except InputError as err:
        raise refuse(graph, node, str(err)) from None


def params(inputs: list[tuple[str, int]], output: int) -> tuple[Buffer, ...]:
    return (*(Buffer(n, s, BufferKind.INPUT) for n, s in inputs), Buffer("out", output, BufferKind.OUTPUT))


def vector_map(b: NestBuilder, size: int, lanes: int, emit: Callable[[Affine, int, int], None]) -> None:
    """Calls emit(index, lanes, count) over range(size): UNROLL vectors per loop iteration, then the rest,
    the last vector partial (count < lanes) where size is not a multiple of lanes."""

    def block(base: Affine, n: int) -> None:
        if n == UNROLL * lanes:
            with b.loop(UNROLL, "u", LoopKind.UNROLLED) as u:
                emit(base + u * lanes, lanes, lanes)
            return
        for start in range(0, n, lanes):
            emit(base + start, lanes, min(lanes, n - start))

    b.split(size, UNROLL * lanes, block, "v")


def hsum_or_max(b: NestBuilder, acc: Reg, lanes: int, op: BinaryOp) -> Value:
    """The lanes of vector register `acc` reduced to one scalar, through a stack slot."""
    if lanes == 1:
        return acc
    b.store("red", Affine(), acc, lanes)
    total: Value = Load("red", Affine())
    for lane in range(1, lanes):
        total = Binary(op, total, Load("red", Affine.of(lane)))
    return total


def constant_operand(graph: Graph, node: Node, tensor: str, consts: Consts) -> None:
    value = graph.constant(tensor)
    if value is None:
        return
    if value.dtype != np.float32:
        raise refuse(graph, node, f"constant '{tensor}' is {value.dtype}, xtune runs float32 only")
    consts[tensor] = value


def constant_ints(graph: Graph, node: Node, index: int, what: str) -> tuple[int, ...] | None:
    """Input `index` of `node`, a constant, as integers (Pad's pads, Slice's starts, a Reduce's axes, ...);
    None where it is omitted; a refusal naming `what` where it is not a constant."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    value = graph.constant(node.inputs[index])
    if value is None:
        raise refuse(graph, node, f"the {what} are not a constant")
    return tuple(int(v) for v in value.reshape(-1))
