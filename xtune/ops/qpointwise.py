"""The quantized element-wise family of a network's generated operators: ONNX Runtime's QOperator nodes
com.microsoft QLinearAdd, QLinearMul, QLinearGlobalAveragePool, QLinearSigmoid and QLinearLeakyRelu (and
the DequantizeLinear -> float op -> QuantizeLinear of the QDQ form, which xtune/frontend/quantized.py
turns into them) in, one kernel that reads the 8-bit inputs and writes the 8-bit output out
(`Quantized`): the float operator's own kernel (xtune/ops/elementwise.py, arith.py, pool2d.py,
activation.py) with every load of an input dequantized and every store of the output quantized
(xtune/ops/quantize.py's values), so no float32 tensor is written between them. A QuantizeLinear after a
float generated operator, and a DequantizeLinear after such a kernel, fold into it the same way
(`fused_boundary`).

The arithmetic is the three nodes' exactly: each element is dequantized, computed and quantized by the
same float32 operations in the same order as DequantizeLinear, the float kernel and QuantizeLinear run
one after another (LLVM is given no fast-math flag, so nothing is contracted across them); only the
float32 tensors between them are gone. How that compares with ONNX Runtime's own QLinear kernels (MLAS
scales the inputs first): docs/int8.md, "Exactness".
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, replace

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops import activation, arith, elementwise, pool2d
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout
from xtune.ops.opkit import Consts, GeneratedOp, Mapped, NodeFamily, Shape
from xtune.ops.qmlas import QAdd, QGlobalAveragePool, fuses_int8_qdq
from xtune.ops.qpool import scaled_mean
from xtune.ops.quantize import RANGES, QParams, dequantized, node_arithmetic, node_qparams, quantized
from xtune.schedule.loopnest import Assign, BufferKind, For, Kernel, Load, Stmt, Store, Value, walk
from xtune.target import Target

# op -> (the float op, how many 8-bit inputs, each followed by its scale and zero point; then the
# output's scale and zero point), as ONNX Runtime's contrib operators define them.
FLOAT_FORMS = {
    "com.microsoft.QLinearAdd": ("Add", 2),
    "com.microsoft.QLinearMul": ("Mul", 2),
    "com.microsoft.QLinearGlobalAveragePool": ("GlobalAveragePool", 1),
    "com.microsoft.QLinearSigmoid": ("Sigmoid", 1),
    "com.microsoft.QLinearLeakyRelu": ("LeakyRelu", 1),
}
QLINEAR_OF = {float_op: op for op, (float_op, _) in FLOAT_FORMS.items()}  # the float op's QOperator node
_MAPPINGS = {
    "Add": elementwise.from_node,
    "Mul": arith.from_node,
    "GlobalAveragePool": pool2d.from_node,
    "Sigmoid": activation.from_node,
    "LeakyRelu": activation.from_node,
}
_VALUES = typing.get_args(Value)
_BOUNDARIES = ("QuantizeLinear", "DequantizeLinear")


@dataclass(frozen=True, kw_only=True)
class Quantized(GeneratedOp):
    """A float operator (`inner`) between 8-bit tensors: input i read as `reads[i]` dequantizes it (None:
    a float32 input, read as it is), the output written as `writes` quantizes it (and, `dequantizes`,
    dequantizes that 8-bit value again: a float32 output, as a DequantizeLinear after it computes it).
    `fused`: for an int8 QDQ Add, the QLinearAdd ONNX Runtime fuses it into where its build fuses int8
    QDQ groups (`fuses_int8_qdq`), which a build for such a target computes instead (`for_target`)."""

    inner: GeneratedOp
    reads: tuple[QParams | None, ...]
    writes: QParams
    dequantizes: bool = False
    fused: QAdd | None = None

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return self.inner.input_shapes

    @property
    def output_shape(self) -> Shape:
        return self.inner.output_shape

    @property
    def label(self) -> str:
        return f"q{self.inner.label}"

    def reference(self, *xs: np.ndarray) -> np.ndarray:
        floats = (x if q is None else q.dequantize(x) for q, x in zip(self.reads, xs, strict=True))
        q = self.writes.quantize(self.inner.reference(*floats))
        return self.writes.dequantize(q) if self.dequantizes else q

    def in_layout(self, layout: Layout, out_shape: Shape) -> Quantized:
        return replace(self, inner=self.inner.in_layout(layout, out_shape))

    def for_target(self, target: Target) -> GeneratedOp:
        if self.fused is None or not fuses_int8_qdq(target):
            return self
        return replace(self.fused, dequantizes=self.dequantizes).for_target(target)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        kernel = self.inner.kernel_nest(name, lanes)
        inputs = [b.name for b in kernel.params if b.kind is BufferKind.INPUT]
        reads = {b: q for b, q in zip(inputs, self.reads, strict=True) if q is not None}
        out = next(b.name for b in kernel.params if b.kind is BufferKind.OUTPUT)

        def load(value: Load) -> Value:
            if value.buffer == out:
                raise ValueError(f"{self.inner.label}: reads its output back, so it cannot store 8-bit")
            q = reads.get(value.buffer)
            if q is None:
                return value
            if value.count not in (0, value.lanes) and kernel.stack_bytes:
                # A partial vector's lanes past `count` are 0 for a horizontal reduction to add; the
                # dequantized 0 is not 0. The float kernels reduce so only in NCHW (family: NHWC only).
                raise ValueError(f"{self.inner.label}: reduces a partial vector across lanes")
            return dequantized(value, value.lanes, q)

        def stmt(s: Stmt) -> Stmt:
            if isinstance(s, For):
                return replace(s, body=tuple(stmt(t) for t in s.body))
            if isinstance(s, Assign):
                return replace(s, value=_mapped(s.value, load))
            if isinstance(s, Store):
                value = _mapped(s.value, load)
                return replace(s, value=self._stored(value, s.lanes) if s.buffer == out else value)
            return s

        types = {**reads} if self.dequantizes else {**reads, out: self.writes}
        buffers = tuple(
            replace(b, dtype=types[b.name].dtype) if b.name in types else b for b in kernel.buffers
        )
        return replace(kernel, buffers=buffers, body=tuple(stmt(s) for s in kernel.body))

    def _stored(self, value: Value, lanes: int) -> Value:
        q = quantized(value, lanes, self.writes)
        return dequantized(q, lanes, self.writes) if self.dequantizes else q


def _reads_output(kernel: Kernel) -> bool:
    out = next(b.name for b in kernel.params if b.kind is BufferKind.OUTPUT)
    found: list[bool] = []

    def load(value: Load) -> Value:
        found.append(value.buffer == out)
        return value

    for s, _ in walk(kernel.body):
        if isinstance(s, Assign | Store):
            _mapped(s.value, load)
    return any(found)


def fused_boundary(
    graph: Graph, node: Node, mapped: Mapped, layouts: frozenset[Layout], nxt: Node | None
) -> Mapped:
    """`mapped`, the generated operator of `node` (run in `layouts`), with `nxt`, the only reader of its
    output, folded in as its kernel's last step where `nxt` is
    - a per-tensor QuantizeLinear after a float operator: the float32 value quantized in the register it
      is computed in, as the QuantizeLinear would from memory; not for a kernel that reads its own output
      back (Softmax) or runs in some layouts only (the layout pass converts float32 tensors, never 8-bit);
    - a DequantizeLinear of the same scale and zero point after a `Quantized` kernel: its 8-bit result
      dequantized before the store (the rounding to 8 bits happens all the same).
    Never for one of several calls or one already folding a node; `mapped` itself where nothing fuses."""
    kernel, out = mapped.kernel, node.outputs[0] if node.outputs else ""
    if nxt is None or nxt.op not in _BOUNDARIES or nxt.inputs[0] != out or out in graph.outputs:
        return mapped
    params = node_qparams(graph, nxt)
    if kernel is None or params is None or mapped.fused is not None or mapped.more or mapped.output:
        return mapped
    if isinstance(kernel, Quantized | QAdd | QGlobalAveragePool):
        if nxt.op != "DequantizeLinear" or kernel.dequantizes or params != kernel.writes:
            return mapped
        return replace(mapped, kernel=replace(kernel, dequantizes=True), in_place=False, fused=nxt)
    if nxt.op != "QuantizeLinear" or (mapped.layouts or layouts) != frozenset(Layout):
        return mapped
    if _reads_output(kernel.kernel_nest("probe", 4)):
        return mapped
    wrapped = Quantized(inner=kernel, reads=(None,) * len(kernel.input_shapes), writes=params)
    return replace(mapped, kernel=wrapped, in_place=False, fused=nxt)


def _mapped(value: Value, load: typing.Callable[[Load], Value]) -> Value:
    """`value` with every Load in it replaced by load(that Load)."""
    if isinstance(value, Load):
        return load(value)
    changes: dict[str, Value] = {
        f.name: _mapped(v, load)
        for f in dataclasses.fields(value)
        if isinstance(v := getattr(value, f.name), _VALUES)
    }
    return replace(value, **changes) if changes else value  # type: ignore[arg-type]


def _qparams(graph: Graph, node: Node, tensor: str, scale: str, zero: str) -> QParams:
    """The per-tensor quantization of `tensor` from a node's constant scale and zero point (absent: 0 of
    the tensor's type)."""
    s = graph.constant(scale)
    kind = graph.dtype(tensor)
    z = graph.constant(zero) if zero else np.zeros((), np.dtype(kind if kind in RANGES else "uint8"))
    if s is None or z is None or s.size != 1 or z.size != 1:
        raise refuse(graph, node, f"the quantization of '{tensor}' is not one constant scale and zero point")
    if str(z.dtype) not in RANGES or kind != str(z.dtype):
        raise refuse(graph, node, f"'{tensor}' is {kind}; xtune quantizes to int8 and uint8")
    qtype = typing.cast(typing.Literal["int8", "uint8"], str(z.dtype))
    return QParams(scale=float(s.reshape(-1)[0]), zero=int(z.reshape(-1)[0]), qtype=qtype)


def _tflite_mean(graph: Graph, node: Node) -> Mapped:
    """A TFLite model's QLinearGlobalAveragePool (`requant="tflite"`, its MEAN over H and W): not the float
    form but TFLite's integer MEAN over each plane (xtune/ops/qpool.py's ScaledMean), run in the layout
    its 8-bit input is in."""
    shape = graph.shape(node.inputs[0])
    if len(shape) != 4 or node.int_attr("channels_last", 0):
        raise refuse(graph, node, "only the mean of NCHW planes (a 4-D input, channels_last=0) is supported")
    n, c, h, w = shape
    pool = pool2d.GlobalAveragePool(n=n, c=c, h=h, w=w, quantized=scaled_mean(graph, node, h * w))
    return Mapped(kernel=pool, inputs=(node.inputs[0],), follows_input=True)


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    op, count = FLOAT_FORMS[node.op]
    if op == "GlobalAveragePool" and node_arithmetic(node) == "tflite":
        return _tflite_mean(graph, node)
    if op == "GlobalAveragePool" and node.int_attr("channels_last", 0):
        raise refuse(graph, node, "channels_last=1 is not supported (an NCHW tensor is)")
    ins = [(*node.inputs[3 * i : 3 * i + 3], "")[:3] for i in range(count)]
    if any(graph.constant(x) is not None for x, _, _ in ins):
        raise refuse(graph, node, "a constant 8-bit operand is not supported (activations are)")
    reads = tuple(_qparams(graph, node, *t) for t in ins)
    out = node.outputs[0]
    scale, zero = (*node.inputs[3 * count : 3 * count + 2], "")[:2]
    writes = _qparams(graph, node, out, scale, zero)
    attrs = {k: v for k, v in node.attrs.items() if k == "alpha"}
    float_node = Node(name=node.name, op=op, inputs=tuple(x for x, _, _ in ins), outputs=(out,), attrs=attrs)
    inner = _MAPPINGS[op](graph, float_node, consts, None)
    assert inner.kernel is not None and inner.fused is None
    same = all(q.qtype == writes.qtype for q in reads)  # in place: the same bytes per element
    # Pooled in NHWC only: NCHW sums a plane's partial vector across lanes (`Quantized.kernel_nest`).
    layouts = frozenset((Layout.NHWC,)) if op == "GlobalAveragePool" else inner.layouts
    kernel = _onnx_runtime_form(node, inner.kernel, reads, writes) or Quantized(
        inner=inner.kernel, reads=reads, writes=writes
    )
    return Mapped(kernel=kernel, inputs=inner.inputs, in_place=inner.in_place and same, layouts=layouts)


def _onnx_runtime_form(
    node: Node, inner: GeneratedOp, reads: tuple[QParams, ...], writes: QParams
) -> GeneratedOp | None:
    """The kernel with ONNX Runtime's own arithmetic (xtune/ops/qmlas.py) for a node of an ONNX model
    that ONNX Runtime runs with MLAS: a QLinearAdd of two same-shape tensors (Elementwise; a broadcasting
    one is arith's kernel, its float form kept) and a QLinearGlobalAveragePool; None for the others, and
    where the node keeps TFLite's arithmetic (`requant="tflite"`: its ADD the float form, its MEAN
    `_tflite_mean`). An int8 QDQ Add (`requant="float"`, xtune/frontend/quantized.py) is the float form
    where ONNX Runtime's build leaves it unfused, its QLinearAdd where it fuses it (`Quantized.fused`)."""
    arithmetic = node_arithmetic(node)
    if arithmetic == "tflite":
        return None
    if isinstance(inner, elementwise.Elementwise) and len(reads) == 2:
        qadd = QAdd(shape=inner.shape, reads=(reads[0], reads[1]), writes=writes)
        return (
            qadd if arithmetic == "onnx" else Quantized(inner=inner, reads=reads, writes=writes, fused=qadd)
        )
    if isinstance(inner, pool2d.GlobalAveragePool) and arithmetic == "onnx":
        n, c, h, w = inner.n, inner.c, inner.h, inner.w
        return QGlobalAveragePool(n=n, c=c, h=h, w=w, reads=reads[0], writes=writes, layout=inner.layout)
    return None


FAMILY = NodeFamily(
    kind="qelementwise",
    onnx_ops=tuple(FLOAT_FORMS),
    layouts=frozenset(Layout),
    from_node=from_node,
    follows_input=True,
)
