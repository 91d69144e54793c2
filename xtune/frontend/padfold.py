"""A normalization pass (xtune/frontend/normalize.py): a graph being normalized in, every zero constant Pad
of the spatial axes whose only reader is a Conv (or an AveragePool that counts the padding) folded into
that reader's own pads out.

TensorFlow's "same" padding with a stride above 1 is exported this way: tf2onnx writes an explicit Pad
(often asymmetric: the odd pixel at the bottom and right) before a Conv with pads 0. A convolution's
pads are zeros (ONNX operator spec, Conv), and so are an AveragePool's with count_include_pad=1, which
divides by the whole window padding included; a MaxPool pads with -inf, and an AveragePool that does not
count the padding divides by fewer elements, so neither is the same network: their Pad stays and runs as
the pad family's kernel (xtune/ops/pad.py)."""

from __future__ import annotations

import numpy as np
import onnx

from xtune.frontend.protos import DEFAULT_DOMAINS, EditGraph


def fold_pads(net: EditGraph) -> None:
    """Each Pad that folds is removed and its reader reads the Pad's input with the pads added."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in net.nodes:
        for name in dict.fromkeys(node.input):
            readers.setdefault(name, []).append(node)
    folded = []
    for pad in net.nodes:
        spatial = _spatial_pads(pad, net)
        reader = readers.get(pad.output[0], []) if spatial is not None and pad.output[0] else []
        if spatial is None or pad.output[0] in net.outputs or len(reader) != 1 or not _takes(reader[0]):
            continue
        (conv,) = reader
        if list(conv.input).count(pad.output[0]) != 1 or conv.input[0] != pad.output[0]:
            continue  # the padded tensor is also its weights or bias: not the same network folded
        given = _attr(conv, "pads")
        own = list(onnx.helper.get_attribute_value(given)) if given is not None else [0] * len(spatial)
        pads = [a + b for a, b in zip(own, spatial, strict=True)]
        if len(own) != len(spatial) or not _fits(conv, pads):
            continue
        _set_attr(conv, "pads", pads)
        _set_attr(conv, "auto_pad", None)  # NOTSET or VALID: the explicit pads say it all now
        conv.input[0] = pad.input[0]
        folded.append(id(pad))
    net.nodes = [n for n in net.nodes if id(n) not in folded]


def _spatial_pads(pad: onnx.NodeProto, net: EditGraph) -> list[int] | None:
    """A zero constant Pad's pads of the axes after the first two, in the order of a Conv's `pads`
    (x1_begin, x2_begin, ..., x1_end, x2_end, ...); None where the Pad is anything else."""
    if pad.op_type != "Pad" or pad.domain not in DEFAULT_DOMAINS or len(pad.input) < 2:
        return None
    mode = _attr(pad, "mode")
    if mode is not None and onnx.helper.get_attribute_value(mode) != b"constant":
        return None
    if len(pad.input) > 3 and pad.input[3]:  # opset 18's axes: the Pad runs as it is
        return None
    pads = net.consts.get(pad.input[1])
    value = net.consts.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
    if pads is None or value is None or value.size != 1 or float(value.reshape(-1)[0]) != 0:
        return None
    pads = pads.reshape(-1).astype(np.int64)
    rank = len(pads) // 2
    if rank < 3 or np.any(pads < 0) or np.any(pads[[0, 1, rank, rank + 1]] != 0):
        return None
    return [int(p) for p in (*pads[2:rank], *pads[rank + 2 :])]


def _takes(node: onnx.NodeProto) -> bool:
    """A reader whose own padding is zeros: Conv, or AveragePool counting the padding; auto_pad either
    absent (NOTSET) or VALID (no padding of its own)."""
    if node.domain not in DEFAULT_DOMAINS or node.op_type not in ("Conv", "AveragePool"):
        return False
    auto = _attr(node, "auto_pad")
    if auto is not None and onnx.helper.get_attribute_value(auto) not in (b"NOTSET", b"VALID"):
        return False
    if node.op_type == "AveragePool":
        counts = _attr(node, "count_include_pad")
        return counts is not None and onnx.helper.get_attribute_value(counts) == 1
    return True


def _fits(node: onnx.NodeProto, pads: list[int]) -> bool:
    """Whether a pooling window stays larger than its pads on every side (ONNX Runtime refuses a pad as
    large as the window: such a window could hold padding alone)."""
    if node.op_type != "AveragePool" or (kernel := _attr(node, "kernel_shape")) is None:
        return node.op_type != "AveragePool"
    window = list(onnx.helper.get_attribute_value(kernel))
    return len(window) * 2 == len(pads) and all(p < window[k % len(window)] for k, p in enumerate(pads))


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def _set_attr(node: onnx.NodeProto, name: str, values: list[int] | None) -> None:
    """Attribute `name` set to `values`, or removed for None."""
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    if values is not None:
        node.attribute.append(onnx.helper.make_attribute(name, values))
