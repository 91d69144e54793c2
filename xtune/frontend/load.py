"""ONNX import: a model file (or ModelProto) in, a small typed `Graph` (xtune/graph.py) out — nodes with
their op, inputs, outputs and attributes, the constants as numpy arrays, and every tensor's static shape.

Only what xtune cannot represent is refused here, in one line naming the node and its op: tensors of
dynamic shape, activations that are not float32, subgraphs, opsets outside 11..current. Which ops a
network may hold is the business of the passes that read the graph (`xtune.frontend.tasks`, and the
whole-network build that emits it), not of the import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from xtune.errors import InputError
from xtune.graph import AttrValue, Graph, Node

SMALL_CONSTANT = 64  # elements: initializers up to this size stay data during shape inference
MIN_OPSET = 11  # Clip's bounds became inputs in opset 11; older models are not worth a second path
Source = str | os.PathLike[str] | onnx.ModelProto


def load_model(source: Source) -> onnx.ModelProto:
    """The ModelProto of a file, or InputError naming the file."""
    if isinstance(source, onnx.ModelProto):
        return source
    path = Path(source)
    if not path.is_file():
        raise InputError(f"{path}: no such ONNX file")
    try:
        return onnx.load_model(path)
    except Exception as err:  # protobuf's DecodeError and friends: the file is not a model
        raise InputError(f"{path}: not an ONNX model ({type(err).__name__}: {err})") from None


def load_graph(source: Source) -> Graph:
    """Import `source` (a path or a ModelProto); InputError in one line for anything xtune cannot take."""
    model = load_model(source)
    where = str(source) if not isinstance(source, onnx.ModelProto) else (model.graph.name or "model")
    opset = _opset(model, where)
    try:
        inferred = shape_inference.infer_shapes(_skeleton(model), strict_mode=True)
    except Exception as err:  # onnx's InferenceError, ValidationError: a broken or inconsistent model
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{where}: shape inference failed: {first}") from None
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
    graph = Graph(
        name=where, opset=opset, nodes=tuple(nodes),
        inputs=tuple(i.name for i in g.input if i.name not in constants),
        outputs=tuple(o.name for o in g.output), constants=constants, shapes=shapes,
    )  # fmt: skip
    _check_tensors(graph, types, where)
    return graph


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its large initializers declared as typed inputs instead: shape inference copies
    the whole model through protobuf twice, which was half the time of `xtune tasks` on ResNet-18's
    47 MB. Small ones stay data, since inference reads shape tensors (Reshape's shape, Clip's bounds)."""
    skeleton = onnx.ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    src, g = model.graph, skeleton.graph
    g.name = src.name
    for part in ("node", "input", "output", "value_info"):
        getattr(g, part).extend(getattr(src, part))
    declared = {i.name for i in src.input}
    for init in src.initializer:
        if int(np.prod(init.dims)) <= SMALL_CONSTANT:
            g.initializer.append(init)
        elif init.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return skeleton


def _opset(model: onnx.ModelProto, where: str) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise InputError(f"{where}: the model imports no default-domain opset")
    current = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= versions[0] <= current:
        raise InputError(
            f"{where}: opset {versions[0]} is not supported (xtune reads {MIN_OPSET} to {current})"
        )
    return versions[0]


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
    """Every activation a node reads or writes: float32, of a known static shape."""
    for node in graph.nodes:
        for tensor in (*node.inputs, *node.outputs):
            if not tensor or tensor in graph.constants:
                continue
            shape = graph.shapes.get(tensor)
            if shape is None or any(d < 0 for d in shape):
                shown = "unknown" if shape is None else "x".join("?" if d < 0 else str(d) for d in shape)
                raise InputError(
                    f"{where}: {node.label}: tensor '{tensor}' has a dynamic shape ({shown}); "
                    "xtune needs static shapes (fix the batch size and input size when exporting)"
                )
            elem = types.get(tensor, onnx.TensorProto.FLOAT)
            if elem != onnx.TensorProto.FLOAT:
                kind = onnx.helper.tensor_dtype_to_np_dtype(elem)
                raise InputError(
                    f"{where}: {node.label}: tensor '{tensor}' is {kind}, xtune runs float32 only"
                )
