"""Networks as exporters write them, for the importer's and the operators' tests: the model zoo's graphs
the onnx package ships (`light_models`, `randomized`), and small networks written with onnx.helper for
the patterns those do not cover — a DS-CNN keyword spotter (TensorFlow's asymmetric "same" padding, a
10x4 kernel), a squeeze-and-excite block (HardSwish, HardSigmoid, a [n,c,1,1] x [n,c,h,w] Mul), a
ReduceMean head (opset 13's axes attribute, opset 18's axes input), and a net of every quirk the
normalization pass removes (`quirks`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_models() -> dict[str, Path]:
    """The light copies of the ONNX Model Zoo graphs inside the onnx package, by name ("resnet50"): the
    zoo's graphs (opset 9, as exported) with every weight a ConstantOfShape of 0.02 instead of data."""
    return {
        p.stem.removeprefix("light_").removeprefix("bvlc_"): p for p in sorted(LIGHT.glob("light_*.onnx"))
    }


def randomized(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """`model` with each ConstantOfShape whose shape is a constant replaced by a seeded random initializer
    of that shape: with every weight 0.02, a wrong channel order or a dropped term goes unseen. Tensors of
    rank 2 and more are He-scaled weights (normal, std sqrt(2 / fan-in)); vectors are in [0.5, 1.5], so
    that a BatchNormalization's variance stays positive and its scale of order one."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shapes = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    kept = []
    for node in out.graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in shapes:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        if len(shape) >= 2:
            value = rng.standard_normal(shape, np.float32)
            value *= np.float32(np.sqrt(2 / max(1, int(np.prod(shape[1:])))))
        else:
            value = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        # Written in place, as numpy_helper.from_array writes it: VGG's 550 MB are copied once, not thrice.
        tensor = out.graph.initializer.add()
        tensor.name, tensor.data_type, tensor.raw_data = node.output[0], TensorProto.FLOAT, value.tobytes()
        tensor.dims.extend(shape)
        # IR version 3 (the zoo's) declares every initializer as a graph input too (ONNX IR spec).
        out.graph.input.append(helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, shape))
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


def _model(
    nodes: list[onnx.NodeProto], x: list[int], inits: dict[str, np.ndarray], opset: int, name: str
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


class _Weights:
    """Seeded weights by name, He-scaled; a BatchNormalization's four vectors."""

    def __init__(self, seed: int) -> None:
        self.rng, self.inits = np.random.default_rng(seed), dict[str, np.ndarray]()

    def conv(self, name: str, k: int, c: int, r: int, s: int) -> str:
        std = np.sqrt(2 / (c * r * s))
        self.inits[name] = (self.rng.standard_normal((k, c, r, s)) * std).astype(np.float32)
        return name

    def vector(self, name: str, n: int, lo: float = -0.5, hi: float = 0.5) -> str:
        self.inits[name] = self.rng.uniform(lo, hi, n).astype(np.float32)
        return name

    def pointwise(self, name: str, x: str, out: str, k: int, c: int) -> onnx.NodeProto:
        """A 1x1 Conv with bias, c channels in and k out."""
        inputs = [x, self.conv(f"{name}.w", k, c, 1, 1), self.vector(f"{name}.b", k)]
        return helper.make_node("Conv", inputs, [out], name=name)

    def bn(self, name: str, n: int) -> list[str]:
        return [
            self.vector(f"{name}.g", n, 0.5, 1.5),
            self.vector(f"{name}.b", n),
            self.vector(f"{name}.m", n),
            self.vector(f"{name}.v", n, 0.5, 1.5),
        ]


def ds_cnn(channels: int = 64, blocks: int = 4, seed: int = 0) -> onnx.ModelProto:
    """The DS-CNN keyword spotter (Zhang et al., "Hello Edge", 2017) as tf2onnx writes it: a 49x10 MFCC
    input, a 10x4 stride-2 first conv with TensorFlow's "same" padding as explicit asymmetric pads (4 on
    top, 5 below, 1 left and right: ceil(49/2) = 25 rows need 9 padded rows), BatchNormalization and
    Relu; `blocks` depthwise-separable blocks; average pooling, Flatten, the 12-class Gemm, Softmax."""
    w = _Weights(seed)
    node = helper.make_node
    nodes = [
        node(
            "Conv",
            ["x", w.conv("conv1.w", channels, 1, 10, 4)],
            ["c0"],
            name="conv1",
            kernel_shape=[10, 4],
            strides=[2, 2],
            pads=[4, 1, 5, 1],
        ),
        node("BatchNormalization", ["c0", *w.bn("bn1", channels)], ["b0"], name="bn1"),
        node("Relu", ["b0"], ["a0"], name="relu1"),
    ]
    for i in range(blocks):
        prev, dw, pw = f"a{2 * i}", f"dw{i}", f"pw{i}"
        nodes += [
            node(
                "Conv",
                [prev, w.conv(f"{dw}.w", channels, 1, 3, 3)],
                [f"{dw}.c"],
                name=dw,
                group=channels,
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
            ),
            node(
                "BatchNormalization", [f"{dw}.c", *w.bn(f"{dw}.bn", channels)], [f"{dw}.b"], name=f"{dw}.bn"
            ),
            node("Relu", [f"{dw}.b"], [f"a{2 * i + 1}"], name=f"{dw}.relu"),
            node(
                "Conv", [f"a{2 * i + 1}", w.conv(f"{pw}.w", channels, channels, 1, 1)], [f"{pw}.c"], name=pw
            ),
            node(
                "BatchNormalization", [f"{pw}.c", *w.bn(f"{pw}.bn", channels)], [f"{pw}.b"], name=f"{pw}.bn"
            ),
            node("Relu", [f"{pw}.b"], [f"a{2 * i + 2}"], name=f"{pw}.relu"),
        ]
    w.inits["fc.w"] = (w.rng.standard_normal((12, channels)) * np.sqrt(1 / channels)).astype(np.float32)
    nodes += [
        node("AveragePool", [f"a{2 * blocks}"], ["pool"], name="pool", kernel_shape=[25, 5]),
        node("Flatten", ["pool"], ["flat"], name="flatten"),
        node("Gemm", ["flat", "fc.w", w.vector("fc.b", 12)], ["logits"], name="fc", transB=1),
        node("Softmax", ["logits"], ["y"], name="softmax"),
    ]
    return _model(nodes, [1, 1, 49, 10], w.inits, 13, "ds_cnn")


def se_block(channels: int = 32, reduced: int = 8, size: int = 14, seed: int = 0) -> onnx.ModelProto:
    """A MobileNetV3 block end (Howard et al., "Searching for MobileNetV3", 2019): a 1x1 conv with
    HardSwish, squeeze-and-excite (global pooling, 1x1 conv, Relu, 1x1 conv, HardSigmoid, then a Mul of
    the [n,c,1,1] gate by the [n,c,h,w] activation), and a 1x1 projection."""
    w = _Weights(seed)
    node = helper.make_node
    nodes = [
        w.pointwise("expand", "x", "e", channels, 16),
        node("HardSwish", ["e"], ["h"], name="hswish"),
        node("GlobalAveragePool", ["h"], ["s"], name="squeeze"),
        w.pointwise("fc1", "s", "f1", reduced, channels),
        node("Relu", ["f1"], ["r"], name="fc1.relu"),
        w.pointwise("fc2", "r", "f2", channels, reduced),
        node("HardSigmoid", ["f2"], ["gate"], name="gate", alpha=1 / 6, beta=0.5),
        node("Mul", ["h", "gate"], ["excited"], name="excite"),
        node("Conv", ["excited", w.conv("project.w", 16, channels, 1, 1)], ["y"], name="project"),
    ]
    return _model(nodes, [1, 16, size, size], w.inits, 14, "se_block")


def reduce_mean_head(opset: int = 18, channels: int = 32, seed: int = 0) -> onnx.ModelProto:
    """An EfficientNet-style head: conv, Relu, global pooling written as ReduceMean over the spatial axes
    (keepdims=0: the exporters' form; the axes an input from opset 18, an attribute before), a Gemm."""
    w = _Weights(seed)
    node = helper.make_node
    if opset >= 18:
        w.inits["axes"] = np.array([2, 3], np.int64)
        mean = node("ReduceMean", ["a", "axes"], ["m"], name="mean", keepdims=0)
    else:
        mean = node("ReduceMean", ["a"], ["m"], name="mean", axes=[2, 3], keepdims=0)
    w.inits["fc.w"] = (w.rng.standard_normal((channels, 10)) * np.sqrt(1 / channels)).astype(np.float32)
    nodes = [
        node("Conv", ["x", w.conv("conv.w", channels, 8, 3, 3)], ["c"], name="conv", pads=[1, 1, 1, 1]),
        node("Relu", ["c"], ["a"], name="relu"),
        mean,
        node("Gemm", ["m", "fc.w", w.vector("fc.b", 10)], ["y"], name="fc"),
    ]
    return _model(nodes, [1, 8, 7, 7], w.inits, opset, "reduce_mean_head")


def quirks(seed: int = 0) -> onnx.ModelProto:
    """Every pattern normalization removes, at opset 9 as old exporters wrote it, in a network xtune
    builds once normalized: a bias from ConstantOfShape, a BatchNormalization followed by Unsqueeze-d
    per-channel Mul and Add (Caffe's Scale); a Sub of a Cast constant, a Div by 3 and a Div by a
    Constant 0.25 after a conv; Identity; Sum of three; Dropout with its mask output; Flatten written as
    Shape/Gather/Unsqueeze/Concat/Reshape; a classifier's Gemm and Softmax."""
    w = _Weights(seed)
    node = helper.make_node
    w.inits["bias.shape"] = np.array([8], np.int64)
    w.inits["half"] = np.full((8, 1, 1), 0.5, np.float64)
    w.inits["three"] = np.array(3.0, np.float32)
    w.inits["zero"] = np.array(0, np.int64)
    w.inits["minus_one"] = np.array([-1], np.int64)
    w.inits["fc.w"] = (w.rng.standard_normal((10, 8 * 6 * 6)) * 0.05).astype(np.float32)
    fill = helper.make_tensor("fill", TensorProto.FLOAT, [1], [0.1])
    quarter = helper.make_tensor("q", TensorProto.FLOAT, [], [0.25])
    nodes = [
        node("ConstantOfShape", ["bias.shape"], ["bias"], name="bias", value=fill),
        node("Conv", ["x", w.conv("w", 8, 3, 3, 3), "bias"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c", *w.bn("bn", 8)], ["b"], name="bn"),
        node("Unsqueeze", [w.vector("scale", 8, 0.5, 1.5)], ["scale3"], name="scale.unsqueeze", axes=[1, 2]),
        node("Mul", ["b", "scale3"], ["bs"], name="scale"),
        node("Unsqueeze", [w.vector("shift", 8)], ["shift3"], name="shift.unsqueeze", axes=[1, 2]),
        node("Add", ["bs", "shift3"], ["bss"], name="shift"),
        node("Relu", ["bss"], ["r"], name="relu"),
        node("Conv", ["r", w.conv("w2", 8, 8, 3, 3)], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        node("Cast", ["half"], ["half32"], name="cast", to=TensorProto.FLOAT),
        node("Sub", ["c2", "half32"], ["centered"], name="sub"),
        node("Div", ["centered", "three"], ["third"], name="div3"),
        node("Constant", [], ["quarter"], name="quarter", value=quarter),
        node("Div", ["third", "quarter"], ["t"], name="div4"),
        node("Identity", ["r"], ["same"], name="identity"),
        node("Sum", ["r", "t", "same"], ["sum"], name="sum"),
        node("MaxPool", ["sum"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        node("Dropout", ["p"], ["d", "mask"], name="dropout", ratio=0.5),
        node("Shape", ["d"], ["shape"], name="shape"),
        node("Gather", ["shape", "zero"], ["batch"], name="gather", axis=0),
        node("Unsqueeze", ["batch"], ["batch1"], name="batch.unsqueeze", axes=[0]),
        node("Concat", ["batch1", "minus_one"], ["flat.shape"], name="flat.concat", axis=0),
        node("Reshape", ["d", "flat.shape"], ["flat"], name="flatten"),
        node("Gemm", ["flat", "fc.w", w.vector("fc.b", 10)], ["logits"], name="fc", transB=1),
        node("Softmax", ["logits"], ["y"], name="softmax"),
    ]
    return _model(nodes, [1, 3, 12, 12], w.inits, 9, "quirks")
