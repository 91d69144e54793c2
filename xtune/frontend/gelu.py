"""GELU as exporters write it, recognized: the graph being normalized (xtune/frontend/normalize.py) in,
each GELU written as arithmetic on one tensor x replaced by one node out.

torch.onnx writes GELU's exact form as x * 0.5 * (1 + Erf(x / sqrt 2)) (or (x * 0.5) * ..., or 0.5 *
(x * ...)), and its tanh approximation as 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) with
Pow or Mul for the cube, in any association order (Hendrycks and Gimpel, "Gaussian Error Linear Units",
arXiv:1606.08415, eq. 1 and the tanh approximation). Rather than list the orders, a candidate is the
smallest closed piece of the graph around one Erf or Tanh node: Mul, Div, Add, Sub and Pow by scalar
constants and by tensors of the piece, reading one outside tensor x, its inner tensors read nowhere
else; it is GELU when it computes GELU, evaluated in float64 on 49 points of [-6, 6] against both
forms. The replacement is ONNX's own Gelu (opset 20, `approximate` none or tanh) in a model of opset
20 or newer, else ONNX Runtime's contrib operators of the same meaning, com.microsoft Gelu and FastGelu
(onnxruntime docs/ContribOperators.md), which onnx's checker takes at any opset and ONNX Runtime runs:
the normalized model stays a model ONNX Runtime can check a pass against."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import onnx

from xtune.frontend.protos import DEFAULT_DOMAINS, EditGraph, Shapes

CONTRIB = "com.microsoft"  # ONNX Runtime's contrib operator domain (Gelu, FastGelu), version 1
_ARITH = frozenset(["Mul", "Div", "Add", "Sub", "Pow"])
_CORE = frozenset(["Erf", "Tanh"])
_MAX_NODES = 12  # the tanh form with its cube as Mul(Mul(x, x), x) has 9
_SAMPLES = np.linspace(-6.0, 6.0, 49)
_TOLERANCE = 1e-5  # relative to 1 + |GELU|: float32 constants agree to 1e-7, the two forms differ by 5e-4


def gelu(x: np.ndarray, tanh: bool) -> np.ndarray:
    """GELU in float64: x * Phi(x), or its tanh approximation."""
    if tanh:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def fuse_gelu(net: EditGraph, shapes: Shapes) -> list[onnx.ValueInfoProto]:
    """Every GELU of `net` as one node; the value infos of their outputs, which onnx's shape inference
    cannot give a contrib operator (`declare` puts them in the model)."""
    declared = []
    maps = _maps(net)
    for core in [n for n in net.nodes if n.op_type in _CORE and n.domain in DEFAULT_DOMAINS]:
        if not any(n is core for n in net.nodes):  # part of a GELU already replaced
            continue
        found = _find(net, core, *maps)
        if found is None or found[1] not in shapes:
            continue
        x, y, piece, tanh = found
        at = max(i for i, n in enumerate(net.nodes) if any(n is p for p in piece))
        net.nodes[at] = _gelu_node(net, x, y, tanh)
        net.nodes = [n for n in net.nodes if not any(n is p for p in piece)]
        declared.append(onnx.helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, list(shapes[y])))
        maps = _maps(net)
    return declared


_Producers = dict[str, onnx.NodeProto]
_Readers = dict[str, list[onnx.NodeProto]]


def _maps(net: EditGraph) -> tuple[_Producers, _Readers]:
    """Each tensor's producer and readers."""
    producers = {t: n for n in net.nodes for t in n.output}
    readers: _Readers = {}
    for n in net.nodes:
        for t in dict.fromkeys(n.input):
            readers.setdefault(t, []).append(n)
    return producers, readers


def _gelu_node(net: EditGraph, x: str, y: str, tanh: bool) -> onnx.NodeProto:
    name = net.fresh(f"{y}.gelu")
    if net.opset >= 20:
        return onnx.helper.make_node("Gelu", [x], [y], name=name, approximate="tanh" if tanh else "none")
    return onnx.helper.make_node("FastGelu" if tanh else "Gelu", [x], [y], name=name, domain=CONTRIB)


def _find(
    net: EditGraph, core: onnx.NodeProto, producers: _Producers, readers: _Readers
) -> tuple[str, str, list[onnx.NodeProto], bool] | None:
    """(x, y, the piece's nodes, whether it is the tanh form) of the GELU around `core`, or None."""
    for y in reversed(list(_chain(core, readers, net))):
        for x in _sources(core.input[0], producers, net):
            piece = _piece(y, x, producers, net)
            if (
                piece is None
                or not any(n is core for n in piece)
                or sum(n.op_type in _CORE for n in piece) != 1
            ):
                continue
            inner = {t for n in piece for t in n.output} - {y}
            if any(t in net.outputs or any(r not in piece for r in readers.get(t, [])) for t in inner):
                continue
            ordered = [n for n in net.nodes if any(n is p for p in piece)]
            value = _evaluate(ordered, x, net)
            for tanh in (False, True):
                g = gelu(_SAMPLES, tanh)
                if value is not None and np.all(np.abs(value - g) <= _TOLERANCE * (1 + np.abs(g))):
                    return x, y, ordered, tanh
    return None


def _chain(core: onnx.NodeProto, readers: _Readers, net: EditGraph) -> Iterator[str]:
    """The tensors after `core` along its arithmetic, each the only reader's output: where y may be."""
    t = core.output[0]
    for _ in range(4):
        nxt = readers.get(t, [])
        if len(nxt) != 1 or nxt[0].op_type not in _ARITH or t in net.outputs:
            return
        t = nxt[0].output[0]
        yield t


def _sources(t: str, producers: _Producers, net: EditGraph) -> Iterator[str]:
    """The tensors the arithmetic before `t` reads, nearest first: where x may be."""
    seen, frontier = set(), [t]
    for _ in range(5):
        following = []
        for tensor in frontier:
            if tensor in seen or tensor in net.consts:
                continue
            seen.add(tensor)
            yield tensor
            node = producers.get(tensor)
            if node is not None and node.op_type in _ARITH and node.domain in DEFAULT_DOMAINS:
                following.extend(node.input)
        frontier = following


def _piece(y: str, x: str, producers: _Producers, net: EditGraph) -> list[onnx.NodeProto] | None:
    """The nodes computing `y` from `x` and scalar constants alone, or None."""
    piece: list[onnx.NodeProto] = []

    def visit(t: str) -> bool:
        if t == x or (t in net.consts and net.consts[t].size == 1):
            return True
        node = producers.get(t)
        if node is None or node.op_type not in _ARITH | _CORE or node.domain not in DEFAULT_DOMAINS:
            return False
        if any(node is n for n in piece):
            return True
        piece.append(node)
        return len(piece) <= _MAX_NODES and all(visit(i) for i in node.input)

    return piece if visit(y) else None


def _evaluate(nodes: list[onnx.NodeProto], x: str, net: EditGraph) -> np.ndarray | None:
    """The piece's output on `_SAMPLES` as x, in float64 (None if a constant is not a float)."""
    values: dict[str, np.ndarray] = {x: _SAMPLES}
    for node in nodes:
        args = []
        for t in node.input:
            if t in values:
                args.append(values[t])
                continue
            const = net.consts[t]
            if not np.issubdtype(const.dtype, np.floating):
                return None
            args.append(const.reshape(-1)[:1].astype(np.float64))
        with np.errstate(all="ignore"):
            values[node.output[0]] = _apply(node.op_type, args)
    return values[nodes[-1].output[0]]


def _apply(op: str, args: list[np.ndarray]) -> np.ndarray:
    if op == "Erf":
        return np.vectorize(math.erf)(args[0])
    if op == "Tanh":
        return np.tanh(args[0])
    a, b = args
    functions = {"Mul": np.multiply, "Div": np.divide, "Add": np.add, "Sub": np.subtract, "Pow": np.power}
    return np.asarray(functions[op](a, b), np.float64)


def declare(model: onnx.ModelProto, outputs: list[onnx.ValueInfoProto]) -> None:
    """The GELU outputs' shapes (a graph output's own type, else a value info), and the contrib domain
    imported where a node uses it."""
    graph_outputs = {o.name: o for o in model.graph.output}
    for info in outputs:
        if info.name in graph_outputs:
            graph_outputs[info.name].type.CopyFrom(info.type)
        else:
            model.graph.value_info.append(info)
    uses = any(n.domain == CONTRIB for n in model.graph.node)
    if uses and all(o.domain != CONTRIB for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(CONTRIB, 1))
