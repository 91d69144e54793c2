"""The ONNX protos the normalization passes read and rewrite: a ModelProto in; its default opset, the
skeleton shape inference reads, its static shapes, and an editable graph (`EditGraph`: node copies, the
constants converted to numpy when first read) that becomes a ModelProto again out."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

DEFAULT_DOMAINS = ("", "ai.onnx")
SMALL_CONSTANT = 64  # elements: initializers up to this size stay data during shape inference
Shapes = Mapping[str, tuple[int, ...]]
_Proto = onnx.ModelProto | onnx.GraphProto


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain opset, None when it imports none."""
    return next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its large initializers declared as typed inputs instead: shape inference copies
    the whole model through protobuf twice, which was half the time of `xtune tasks` on ResNet-18's
    47 MB. Small ones stay data, since inference reads shape tensors (Reshape's shape, Clip's bounds)."""
    bare = onnx.ModelProto(ir_version=model.ir_version)
    bare.opset_import.extend(model.opset_import)
    bare.functions.extend(model.functions)
    src, g = model.graph, bare.graph
    g.name = src.name
    for part in ("node", "input", "output", "value_info"):
        getattr(g, part).extend(getattr(src, part))
    declared = {i.name for i in src.input}
    for init in src.initializer:
        if int(np.prod(init.dims)) <= SMALL_CONSTANT:
            g.initializer.append(init)
        elif init.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return bare


def static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Every tensor whose shape onnx's shape inference (with data propagation, which follows the
    Shape/Gather/Concat chains exporters write) knows completely; empty if inference fails (the import
    reports that, with the node, after normalization)."""
    try:
        inferred = shape_inference.infer_shapes(skeleton(model), data_prop=True)
    except Exception:  # onnx's InferenceError and friends: reported by the importer's strict inference
        return {}
    shapes = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor = info.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        if info.type.HasField("tensor_type") and tensor.HasField("shape") and all(d >= 0 for d in dims):
            shapes[info.name] = dims
    return shapes


class Constants(MutableMapping[str, np.ndarray]):
    """The model's initializers as numpy arrays, each converted when first read (most never are: a
    network's weights pass through normalization untouched), and the constants the passes add."""

    def __init__(self, initializers: Iterable[onnx.TensorProto]) -> None:
        self.protos = {init.name: init for init in initializers}
        self.arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            self.arrays[name] = numpy_helper.to_array(self.protos[name])
        return self.arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.protos.pop(name, None)
        self.arrays[name] = value

    def __delitem__(self, name: str) -> None:
        self.protos.pop(name, None)
        self.arrays.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self.protos or name in self.arrays

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.protos), **dict.fromkeys(self.arrays)})

    def __len__(self) -> int:
        return len(set(self.protos) | set(self.arrays))

    def proto(self, name: str) -> onnx.TensorProto:
        """The initializer of `name`: the original where the passes left it unchanged."""
        original = self.protos.get(name)
        return original if original is not None else numpy_helper.from_array(self.arrays[name], name)


@dataclass
class EditGraph:
    """The graph while the passes rewrite it: nodes (copies) in order, the constants."""

    nodes: list[onnx.NodeProto]
    consts: Constants
    outputs: tuple[str, ...]
    opset: int
    names: set[str] = field(default_factory=set)  # every node and tensor name: new ones must differ

    @classmethod
    def of(cls, model: onnx.ModelProto, opset: int) -> EditGraph:
        """`model`'s graph to rewrite; `opset` is the default domain's where the model imports none."""
        nodes = []
        for proto in model.graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(proto)
            nodes.append(copy)
        consts = Constants(model.graph.initializer)
        net = cls(
            nodes=nodes,
            consts=consts,
            outputs=tuple(o.name for o in model.graph.output),
            opset=default_opset(model) or opset,
        )
        net.names = {n.name for n in nodes} | {t for n in nodes for t in (*n.input, *n.output)} | set(consts)
        return net

    def fresh(self, base: str) -> str:
        """A tensor or node name no other has, starting with `base`."""
        name, i = base, 0
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def constant(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.consts[name] = value
        return name

    def model(self, original: onnx.ModelProto) -> onnx.ModelProto:
        """The rewritten graph as a model: the original's metadata, inputs (less those now constants),
        outputs, and the constants still read as initializers. Nothing of the original's graph is copied
        but what is kept: a copy of the whole model would copy every weight twice."""
        out = onnx.ModelProto()
        g = out.graph
        copy_fields(original, out, skip=("graph",))
        copy_fields(original.graph, g, skip=("node", "initializer", "input", "value_info"))
        read = {t for n in self.nodes for t in n.input} | set(self.outputs)
        g.node.extend(self.nodes)
        g.initializer.extend(self.consts.proto(name) for name in self.consts if name in read)
        g.input.extend(i for i in original.graph.input if i.name not in self.consts)
        g.value_info.extend(v for v in original.graph.value_info if v.name not in self.consts)
        # Initializers need not be graph inputs from IR version 4 on (ONNX IR spec, "Graphs").
        default = [o for o in out.opset_import if o.domain in DEFAULT_DOMAINS]
        out.ir_version = max(out.ir_version, onnx.helper.find_min_ir_version_for(default))
        return out


def copy_fields(src: _Proto, dst: _Proto, skip: tuple[str, ...]) -> None:
    """Every field set in protobuf message `src` but those named in `skip`, copied into `dst`."""
    for desc, value in src.ListFields():
        if desc.name in skip:
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(dst, desc.name).extend(value)
        elif hasattr(value, "CopyFrom"):  # a message
            getattr(dst, desc.name).CopyFrom(value)
        else:
            setattr(dst, desc.name, value)
