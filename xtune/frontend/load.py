"""ONNX import: a model file (or ModelProto) in, a small typed `Graph` (xtune/graph.py) out — nodes with their
op, inputs, outputs and attributes, the constants as numpy arrays, and every tensor's static shape.

The model
is normalized first (xtune/frontend/normalize.py: opsets 7-10 upgraded, constants folded, Identity and
inference Dropout removed, ...), and a quantized model's QDQ patterns become QOperator nodes
(xtune/frontend/quantized.py). Only what xtune cannot represent is refused here, in one line naming every node
concerned: tensors of dynamic shape, activations that are neither float32 nor 8-bit integers (nor
MatMulInteger's int32 sums), subgraphs, opsets outside 7..current. Which ops a network may hold is the
business of the passes that read the graph (`xtune.frontend.tasks`, and the whole-network build that emits
it), not of the import."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from xtune.errors import InputError, UnsupportedNode
from xtune.files import check_input
from xtune.frontend.external import load_external_data
from xtune.frontend.formats import is_tflite_file
from xtune.frontend.normalize import normalize
from xtune.frontend.protos import default_opset, skeleton
from xtune.frontend.qfloat import contrib_shapes
from xtune.frontend.quantized import REQUANT_PROP, Requant, qoperators
from xtune.frontend.refusal import by_op, refusal
from xtune.frontend.validate import check, check_weights, validate
from xtune.graph import AttrValue, Graph, Node

Source = str | os.PathLike[str] | onnx.ModelProto
# Integer activations a quantized model has: 8-bit values, and the int32 sums of MatMulInteger. Which
# operator may read them is the business of the operator families (a float one refuses them).
_QUANTIZED = frozenset((onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT32))
_INTEGER_SUMS = frozenset(("MatMulInteger",))


def load_model(source: Source) -> onnx.ModelProto:
    """The ModelProto of a file (ONNX, its external data read from beside it, or TFLite converted by
    xtune.frontend.tflite), or InputError naming the file."""
    if isinstance(source, onnx.ModelProto):
        return source
    path = check_input(source, "model file")
    if path.stat().st_size == 0:
        raise InputError(f"{source}: the file is empty, not an ONNX or TFLite model")
    if path.suffix.lower() == ".tflite" or is_tflite_file(path):  # by content: "TFL3" at bytes 4..8
        from xtune.frontend.tflite import load_tflite  # its flatbuffer code loads for TFLite files only

        return load_tflite(path)
    try:
        model = onnx.load_model(path, load_external_data=False)
    except Exception as err:  # protobuf's DecodeError and friends: the file is not a model
        raise InputError(f"{source}: not an ONNX model ({type(err).__name__}: {err})") from None
    return load_external_data(model, path)


def load_graph(source: Source, qdq: bool = False) -> Graph:
    """Import `source` (a path or a ModelProto); InputError in one line for anything xtune cannot take.
    `qdq`: a quantized model's QDQ units as the model has them (for the rules about them, such as
    xtune/frontend/qdqunits.py's), not yet rewritten into QOperator nodes."""
    loaded = load_model(source)
    where = str(source) if not isinstance(source, onnx.ModelProto) else (loaded.graph.name or "model")
    model = normalize(validate(loaded, where), where)  # nodes in topological order from here on
    opset = default_opset(model) or 0
    try:
        bare = contrib_shapes(skeleton(model), shape_inference.infer_shapes)
        inferred = shape_inference.infer_shapes(bare, strict_mode=True)
    except Exception as err:  # onnx's InferenceError, ValidationError: a broken or inconsistent model
        first = " ".join(str(err).split())[:300] or type(err).__name__
        raise InputError(f"{where}: shape inference failed: {first}") from None
    check(inferred, where)
    g = inferred.graph
    constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    nodes = []
    for index, proto in enumerate(g.node):
        node = _node(proto, index)
        if node.op == "Constant" and not proto.domain:
            constants[node.outputs[0]] = _constant_value(node, where)
            continue
        nodes.append(node)
    shapes, types = _value_infos(g, constants)
    dtypes = {t: str(onnx.helper.tensor_dtype_to_np_dtype(e)) for t, e in types.items() if e in _QUANTIZED}
    graph = Graph(
        name=where,
        opset=opset,
        nodes=tuple(nodes),
        inputs=tuple(i.name for i in g.input if i.name not in constants),
        outputs=tuple(o.name for o in g.output),
        constants=constants,
        shapes=shapes,
        dtypes=dtypes,
    )
    if qdq:
        return graph
    graph = qoperators(graph, _requant(loaded))  # a quantized model's QDQ patterns as QOperator nodes
    _check_tensors(graph, types, where)
    check_weights(g.node, shapes, where)
    return graph


def _requant(model: onnx.ModelProto) -> Requant:
    """Whose integer arithmetic the model's quantized nodes follow (`REQUANT_PROP`; ONNX Runtime's when
    the model does not say)."""
    said = next((p.value for p in model.metadata_props if p.key == REQUANT_PROP), "onnx")
    return "tflite" if said == "tflite" else "onnx"


def _node(proto: onnx.NodeProto, index: int) -> Node:
    name = proto.name or f"{proto.op_type}_{index}"
    attrs: dict[str, AttrValue] = {}
    for a in proto.attribute:
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            raise InputError(f"node '{name}' ({proto.op_type}): subgraphs (control flow) are not supported")
        attrs[a.name] = _attr_value(onnx.helper.get_attribute_value(a))
    op = proto.op_type if proto.domain in ("", "ai.onnx") else f"{proto.domain}.{proto.op_type}"
    return Node(name=name, op=op, inputs=tuple(proto.input), outputs=tuple(proto.output), attrs=attrs)


def _attr_value(value: object) -> AttrValue:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    assert isinstance(value, int | float), value
    return value


def _constant_value(node: Node, where: str) -> np.ndarray:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in node.attrs:
            return np.asarray(node.attrs[key])
    raise InputError(f"{where}: {node.label} holds no value xtune reads (sparse or string constant)")


def _value_infos(
    g: onnx.GraphProto, constants: Mapping[str, np.ndarray]
) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Static shapes (-1 for a dimension that is not a number) and element types of every typed tensor."""
    shapes: dict[str, tuple[int, ...]] = {name: tuple(a.shape) for name, a in constants.items()}
    types: dict[str, int] = {}
    for info in (*g.input, *g.value_info, *g.output):
        if info.name in constants or not info.type.HasField("tensor_type"):
            continue
        tensor = info.type.tensor_type
        types[info.name] = tensor.elem_type
        if tensor.HasField("shape"):
            shapes[info.name] = tuple(
                d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim
            )
    return shapes, types


def _check_tensors(graph: Graph, types: Mapping[str, int], where: str) -> None:
    """Every activation a node reads or writes: float32, of a known static shape; one refusal names every
    node that has another."""
    failures = []
    sums = {t for node in graph.nodes if node.op in _INTEGER_SUMS for t in node.outputs}
    for node in graph.nodes:
        for tensor in (*node.inputs, *node.outputs):
            if problem := _tensor_problem(graph, types, tensor, sums):
                failures.append(UnsupportedNode(where, node.name, node.op, *problem))
                break
    if failures:
        raise refusal(where, by_op(failures))


def _tensor_problem(
    graph: Graph, types: Mapping[str, int], tensor: str, sums: set[str]
) -> tuple[str, str] | None:
    """Why xtune cannot take `tensor`, and what would help; None if it can."""
    if not tensor or tensor in graph.constants:
        return None
    shape = graph.shapes.get(tensor)
    if shape is None or any(d < 0 for d in shape):
        shown = "unknown" if shape is None else "x".join("?" if d < 0 else str(d) for d in shape)
        return (
            f"tensor '{tensor}' has a dynamic shape ({shown})",
            "fix the batch and input size when exporting",
        )
    if 0 in shape:
        return (
            f"tensor '{tensor}' has no elements (shape {shape})",
            "xtune runs tensors of at least one element",
        )
    elem = types.get(tensor, onnx.TensorProto.FLOAT)
    kind = graph.dtypes.get(tensor, "")  # a rewrite's output (quantized.py) has no ONNX type
    if kind in ("int8", "uint8") or (kind == "int32" and tensor in sums):
        return None
    if elem != onnx.TensorProto.FLOAT:
        return (
            f"tensor '{tensor}' is {onnx.helper.tensor_dtype_to_np_dtype(elem)}, xtune runs float32 only",
            "",
        )
    return None
