"""Graph normalization: an onnx.ModelProto as an exporter wrote it in, the same network out in the forms
the importer reads (opset 11 or newer, constants folded, no Identity or inference Dropout, arithmetic by
constants as Add and Mul, GELU as one node (xtune/frontend/gelu.py), BatchNormalization's trailing
per-channel scale and shift folded into it, a zero Pad before a Conv folded into its pads:
xtune/frontend/padfold.py).

Each pass keeps the network's output: it is compared with ONNX Runtime on the original model pass by pass
(tests/test_normalize.py) and on the model zoo's graphs (tests/test_real_models.py). What the passes do
and which library does each is in docs/networks.md, "Normalization".
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import version_converter
from onnx.reference import ReferenceEvaluator

from xtune.errors import InputError
from xtune.frontend.gelu import declare, fuse_gelu
from xtune.frontend.padfold import fold_pads
from xtune.frontend.protos import (
    DEFAULT_DOMAINS,
    SMALL_CONSTANT,
    EditGraph,
    Shapes,
    default_opset,
    skeleton,
    static_shapes,
)

MIN_OPSET = 11  # the oldest opset the importer reads: Clip's bounds became inputs in opset 11
OLDEST_OPSET = 7  # older models are refused: broadcasting was an attribute before opset 7 (ONNX Changelog)
# Operators whose output is not a function of their inputs: never folded.
_RANDOM = frozenset(
    ["RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"]
)
# A quantized model's QDQ form stays as it is: DequantizeLinear of constant int8 weights is how the model
# says its weights are integers (folded, they would be float32), and onnx's reference evaluator has no
# QuantizeLinear/DequantizeLinear before opset 19 (a TFLite int8 import is opset 17).
_QDQ = frozenset(["QuantizeLinear", "DequantizeLinear"])


def normalize(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """`model` (left unchanged) normalized; InputError in one line naming `where` for an opset xtune
    cannot read or the version converter cannot upgrade."""
    model = upgrade_opset(model, where)
    net, shapes = EditGraph.of(model, MIN_OPSET), static_shapes(model)
    fold_constants(net, shapes)
    canonical_arithmetic(net)
    gelus = fuse_gelu(net, shapes)
    remove_identities(net)
    merge_scale_into_batchnorm(net, shapes)
    fold_pads(net)
    normalized = net.model(model)
    declare(normalized, gelus)
    return normalized


# Opsets 7-10 upgraded by onnx's version converter; newer than the installed onnx, or unused domains, refused
# or dropped.
def upgrade_opset(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """The model at opset 11 or newer (the version converter's lowest target that succeeds), the imports of
    domains no node uses (ai.onnx.ml in a converted scikit-learn pipeline that kept only the network)
    dropped, since the converter refuses domains it has no adapters for."""
    version = default_opset(model)
    current = onnx.defs.onnx_opset_version()
    if version is None:
        raise InputError(f"{where}: the model imports no default-domain opset")
    if version > current:
        raise InputError(
            f"{where}: opset {version} is newer than the installed onnx knows ({current}); "
            "a newer onnx package reads it"
        )
    if version < OLDEST_OPSET:
        raise InputError(
            f"{where}: opset {version} is not supported (xtune reads {OLDEST_OPSET} to {current}; "
            f"re-export with opset {MIN_OPSET} or newer)"
        )
    used = {n.domain for n in model.graph.node} | {f.domain for f in model.functions}
    unused = [o for o in model.opset_import if o.domain not in (*DEFAULT_DOMAINS, *used)]
    if unused:
        trimmed = onnx.ModelProto()
        trimmed.CopyFrom(model)
        del trimmed.opset_import[:]
        trimmed.opset_import.extend(o for o in model.opset_import if o not in unused)
        model = trimmed
    if version >= MIN_OPSET:
        return model
    # The converter copies the model through protobuf twice: it converts the skeleton, the large weights
    # (which no adapter rewrites: adapters change nodes, attributes and small constants) put back after.
    bare, first = skeleton(model), ""
    for target in range(MIN_OPSET, current + 1):  # the lowest target every adapter on the way has
        try:
            converted = version_converter.convert_version(bare, target)
            break
        except Exception as err:  # the converter raises RuntimeError or its own ConvertError
            first = first or (" ".join(str(err).split())[:200] or type(err).__name__)
    else:
        raise InputError(f"{where}: onnx's version converter cannot upgrade opset {version}: {first}")
    _keep_opset10_resize(converted)
    declared = {i.name for i in model.graph.input}
    large = [i for i in model.graph.initializer if int(np.prod(i.dims)) > SMALL_CONSTANT]
    moved = {i.name for i in large} - declared
    inputs = [i for i in converted.graph.input if i.name not in moved]
    del converted.graph.input[:]
    converted.graph.input.extend(inputs)
    converted.graph.initializer.extend(large)
    return converted


# Upsample (opsets 7 and 9) and Resize (opset 10) sample at x_out / scale (ONNX Changelog, Resize-11:
# "coordinate_transformation_mode" added, asymmetric being the old behaviour), nearest rounding down when
# upsampling and up when downsampling (ONNX Runtime's upsample kernel, its "simple" nearest mode). The
# version converter turns them into Resize-11 without that attribute, whose default is half_pixel: a
# different bilinear result. The attributes are set here so the upgraded node means what the old did.
def _keep_opset10_resize(model: onnx.ModelProto) -> None:
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            consts[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t)
    for node in model.graph.node:
        if node.op_type != "Resize" or node.domain not in DEFAULT_DOMAINS:
            continue
        scales = consts.get(node.input[2]) if len(node.input) > 2 else None
        down = scales is not None and bool(np.all(scales <= 1)) and bool(np.any(scales < 1))
        node.attribute.extend(
            [
                onnx.helper.make_attribute("coordinate_transformation_mode", "asymmetric"),
                onnx.helper.make_attribute("nearest_mode", "ceil" if down else "floor"),
            ]
        )


# Constant folding: every node whose inputs are all constants (Shape and Size: whose input's shape is
# static) evaluated once, by onnx's reference evaluator, its outputs made initializers.
def fold_constants(net: EditGraph, shapes: Shapes) -> None:
    """Constant, ConstantOfShape, the Shape/Gather/Unsqueeze/Concat chains of a Reshape or Flatten, Cast,
    arithmetic on constants: any deterministic default-domain node, so that no operator's semantics is
    written here again. A node that writes a graph output stays (the output must be computed)."""
    kept = []
    for node in net.nodes:
        feeds = _foldable(node, net, shapes)
        if feeds is None:
            kept.append(node)
            continue
        try:
            values = _evaluate(node, feeds, net.opset)
        except Exception:  # the evaluator lacks the op at this opset, or refuses its inputs: not folded,
            kept.append(node)  # so the node reaches the families, which run it or name it in the refusal
            continue
        for name, value in zip(node.output, values, strict=False):
            if name:
                net.consts[name] = np.asarray(value)
    net.nodes = kept


def _evaluate(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opset: int) -> list[np.ndarray]:
    """The node's outputs, by onnx's reference evaluator at the model's opset (a one-node model: given a
    bare node, the evaluator takes each operator's newest version)."""
    graph = onnx.helper.make_graph(
        [node],
        "fold",
        [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in feeds],
        [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in node.output if name],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    return list(ReferenceEvaluator(model).run(None, feeds))


def _foldable(node: onnx.NodeProto, net: EditGraph, shapes: Shapes) -> dict[str, np.ndarray] | None:
    """The evaluator's inputs for `node` if it folds, else None."""
    if (
        node.domain not in DEFAULT_DOMAINS
        or node.op_type in _RANDOM
        or node.op_type in _QDQ
        or any(o in net.outputs for o in node.output)
    ):
        return None
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) or a.name.startswith("sparse")
        for a in node.attribute
    ):
        return None
    feeds = {}
    for i, name in enumerate(node.input):
        if not name:
            continue
        if name in net.consts:
            feeds[name] = net.consts[name]
        elif i == 0 and node.op_type in ("Shape", "Size") and name in shapes:
            # Shape reads only the shape: a zero-stride array of it costs no memory.
            feeds[name] = np.lib.stride_tricks.as_strided(
                np.zeros(1, np.float32), shapes[name], (0,) * len(shapes[name])
            )
        else:
            return None
    return feeds


# Sum of n inputs as a chain of Add; Sub of a constant as Add of its negation; Div by a power of two as
# Mul by its reciprocal; a constant operand of Add and Mul moved second: the forms fusion looks for.
def canonical_arithmetic(net: EditGraph) -> None:
    """Every rewrite is exact in IEEE 754 arithmetic: negation is exact, and x / 2^k and x * 2^-k are the
    same real number rounded once. A Div by any other constant stays a Div: x * fl(1/c) differs from
    x / c in the last bit for some x (tests/test_normalize.py shows one), which ONNX Runtime does not."""
    rewritten = []
    for node in net.nodes:
        rewritten.extend(_canonical(node, net) if node.domain in DEFAULT_DOMAINS else [node])
    net.nodes = rewritten


def _canonical(node: onnx.NodeProto, net: EditGraph) -> list[onnx.NodeProto]:
    op, inputs = node.op_type, list(node.input)
    if op == "Sum" and len(inputs) == 1:
        return [_like(node, "Identity", inputs)]
    if op == "Sum":
        chain, acc = [], inputs[0]
        for i, term in enumerate(inputs[1:], start=1):
            last = i == len(inputs) - 1
            out = node.output[0] if last else net.fresh(f"{node.output[0]}.partial{i}")
            name = node.name if last else net.fresh(f"{node.name}.add{i}")
            chain.append(onnx.helper.make_node("Add", [acc, term], [out], name=name))
            acc = out
        return chain
    if len(inputs) != 2:
        return [node]
    a, c = inputs
    if op in ("Add", "Mul") and a in net.consts and c not in net.consts:
        return [_like(node, op, [c, a])]
    value = net.consts.get(c)
    if a in net.consts or value is None or not np.issubdtype(value.dtype, np.floating):
        return [node]
    if op == "Sub":
        return [_like(node, "Add", [a, net.constant(f"{c}_neg", -value)])]
    if op == "Div" and _power_of_two(value):
        return [_like(node, "Mul", [a, net.constant(f"{c}_reciprocal", (1 / value).astype(value.dtype))])]
    return [node]


def _like(node: onnx.NodeProto, op: str, inputs: list[str]) -> onnx.NodeProto:
    return onnx.helper.make_node(op, inputs, list(node.output), name=node.name)


def _power_of_two(value: np.ndarray) -> bool:
    """Every element ±2^k with a reciprocal that is a normal number of its type."""
    mantissa, _ = np.frexp(value)
    reciprocal = 1 / value.astype(np.float64)
    info = np.finfo(value.dtype)
    return bool(
        np.all(np.abs(mantissa) == 0.5)
        and np.all(np.abs(reciprocal) >= info.tiny)
        and np.all(np.abs(reciprocal) <= info.max)
    )


# Identity, and inference Dropout whose mask nobody reads, removed: readers take the input instead.
def remove_identities(net: EditGraph) -> None:
    """A graph output written by one of them is then written by its input's producer; where the input is
    a graph input or a constant, the node stays (something must write the output)."""
    reads = _readers(net.nodes)
    written = {t for n in net.nodes for t in n.output}
    replaced: dict[str, str] = {}  # tensor -> the tensor that stands for it from now on

    def current(name: str) -> str:
        while name in replaced:
            name = replaced[name]
        return name

    kept = []
    for node in net.nodes:
        if not _is_identity(node, net, reads):
            kept.append(node)
            continue
        src, out = current(node.input[0]), node.output[0]
        if out not in net.outputs:
            replaced[out] = src
        elif src in written and src not in net.outputs:
            replaced[src] = out  # src's producer writes the graph output itself
        else:
            kept.append(node)
    for node in kept:
        for part in (node.input, node.output):
            for i, name in enumerate(part):
                part[i] = current(name)
    net.nodes = kept


def _readers(nodes: list[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    reads: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in dict.fromkeys(node.input):
            reads.setdefault(name, []).append(node)
    return reads


def _is_identity(node: onnx.NodeProto, net: EditGraph, reads: Mapping[str, list[onnx.NodeProto]]) -> bool:
    if node.domain not in DEFAULT_DOMAINS or not node.input or not node.input[0]:
        return False
    if node.op_type == "Identity":
        return True
    if node.op_type != "Dropout":
        return False
    # ONNX Dropout: identity unless training_mode (opset 12 on, input 2) is true; its mask is read nowhere.
    mode = node.input[2] if len(node.input) > 2 else ""
    training = bool(np.any(net.consts[mode])) if mode in net.consts else bool(mode)
    mask = node.output[1] if len(node.output) > 1 else ""
    return not training and (not mask or (mask not in net.outputs and mask not in reads))


# BatchNormalization followed by a Mul and an Add of per-channel constants (Caffe's Scale layer, as in
# Inception v2 and DenseNet-121) is one BatchNormalization with the scale and shift folded into its own.
def merge_scale_into_batchnorm(net: EditGraph, shapes: Shapes) -> None:
    """BN(x) = (x - mean) / sqrt(var + eps) * scale + bias (ONNX operator spec); times v it is BN with
    scale * v and bias * v, plus d it is BN with bias + d. Computed in float64, stored in the BN's type."""
    reads, merged = _readers(net.nodes), set()
    for bn in net.nodes:
        params = [net.consts.get(t) for t in bn.input[1:5]]
        rank = len(shapes.get(bn.input[0], ()))
        if bn.op_type != "BatchNormalization" or bn.domain not in DEFAULT_DOMAINS or len(bn.input) != 5:
            continue
        if any(p is None for p in params) or rank < 2 or any(bn.output[1:]):
            continue
        scale, bias = (np.asarray(p, np.float64) for p in params[:2])
        channels, changed = scale.size, False
        while (
            bn.output[0] not in net.outputs
            and len(readers := reads.get(bn.output[0], [])) == 1
            and readers[0].op_type in ("Mul", "Add")
            and list(readers[0].input[:1]) == [bn.output[0]]
        ):
            nxt = readers[0]
            v = _channel_vector(net.consts.get(nxt.input[1]), rank, channels)
            if v is None:
                break
            scale, bias = (scale * v, bias * v) if nxt.op_type == "Mul" else (scale, bias + v)
            merged.add(id(nxt))
            bn.output[0] = nxt.output[0]  # BN's output was read by nxt alone: BN now writes nxt's
            changed = True
        if changed:
            dtype = params[0].dtype  # type: ignore[union-attr]
            bn.input[1] = net.constant(f"{bn.input[1]}_scaled", scale.astype(dtype))
            bn.input[2] = net.constant(f"{bn.input[2]}_shifted", bias.astype(dtype))
    net.nodes = [n for n in net.nodes if id(n) not in merged]


def _channel_vector(value: np.ndarray | None, rank: int, channels: int) -> np.ndarray | None:
    """A float constant that broadcasts along axis 1 of a rank-`rank` tensor only, as (channels,) float64."""
    if value is None or not np.issubdtype(value.dtype, np.floating) or value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,))
