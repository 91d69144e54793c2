"""Networks to tune, built here without a download: the layer structure of torchvision's ResNet-18 and
MobileNetV2 (BatchNormalization included, as an exported training-mode-free model has it before
folding), random weights from a seeded generator, written as ONNX with `onnx.helper`.

Node names follow torchvision's module names ("layer2.0.downsample.0", "features.3.conv.1.0"), so a
task table reads like the PyTorch model. Both accept a width and resolution, so the tests build small
variants of the same structure (MobileNetV2 0.35 at 96x96, a ResNet of one block per stage).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the oldest IR that opset 17 allows: readable by older runtimes too


class _Builder:
    """Nodes and initializers of one graph; every tensor is named after the node that writes it."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def node(self, op: str, name: str, inputs: list[str], **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def conv(self, name: str, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> str:
        """Conv without bias (a BatchNormalization follows), He-initialised so activations stay O(1)."""
        fan_in = cin // groups * k * k
        w = self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / fan_in)
        return self.node(
            "Conv",
            name,
            [x, self.const(f"{name}.weight", w)],
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[k // 2] * 4,
            group=groups,
        )

    def bn(self, name: str, x: str, channels: int) -> str:
        rng = self.rng
        params = [
            self.const(f"{name}.weight", rng.uniform(0.5, 1.0, channels)),
            self.const(f"{name}.bias", rng.uniform(-0.1, 0.1, channels)),
            self.const(f"{name}.running_mean", rng.uniform(-0.1, 0.1, channels)),
            self.const(f"{name}.running_var", rng.uniform(0.5, 1.5, channels)),
        ]
        return self.node("BatchNormalization", name, [x, *params], epsilon=1e-5)

    def relu6(self, name: str, x: str) -> str:
        if not any(i.name == "relu6.min" for i in self.inits):
            self.const("relu6.min", np.array(0.0))
            self.const("relu6.max", np.array(6.0))
        return self.node("Clip", name, [x, "relu6.min", "relu6.max"])

    def head(self, x: str, channels: int, classes: int) -> str:
        """Global average pool, flatten, and the classifier as Gemm with transB=1 (PyTorch's Linear)."""
        pooled = self.node("GlobalAveragePool", "avgpool", [x])
        flat = self.node("Flatten", "flatten", [pooled], axis=1)
        w = self.rng.standard_normal((classes, channels)) / np.sqrt(channels)
        b = self.rng.uniform(-0.1, 0.1, classes)
        return self.node("Gemm", "fc", [flat, self.const("fc.weight", w), self.const("fc.bias", b)], transB=1)

    def model(self, name: str, resolution: int, out: str, classes: int) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, resolution, resolution])],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, classes])],
            self.inits,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="xtune"
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


def resnet(
    blocks: tuple[int, ...] = (2, 2, 2, 2),
    width: int = 64,
    resolution: int = 224,
    classes: int = 1000,
    seed: int = 0,
) -> onnx.ModelProto:
    """torchvision's ResNet with BasicBlocks: (2, 2, 2, 2) and width 64 is ResNet-18."""
    b = _Builder(seed)
    x = b.node("Relu", "relu", [b.bn("bn1", b.conv("conv1", "input", 3, width, 7, 2), width)])
    x = b.node("MaxPool", "maxpool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, count in enumerate(blocks):
        cout = width << stage
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            p = f"layer{stage + 1}.{i}"
            y = b.node(
                "Relu", f"{p}.relu1", [b.bn(f"{p}.bn1", b.conv(f"{p}.conv1", x, cin, cout, 3, stride), cout)]
            )
            y = b.bn(f"{p}.bn2", b.conv(f"{p}.conv2", y, cout, cout, 3), cout)
            identity = x
            if stride != 1 or cin != cout:
                down = b.conv(f"{p}.downsample.0", x, cin, cout, 1, stride)
                identity = b.bn(f"{p}.downsample.1", down, cout)
            x = b.node("Relu", f"{p}.relu2", [b.node("Add", f"{p}.add", [y, identity])])
            cin = cout
    return b.model("resnet", resolution, b.head(x, cin, classes), classes)


def resnet18(resolution: int = 224, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    return resnet((2, 2, 2, 2), 64, resolution, classes, seed)


def make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's `_make_divisible`: the nearest multiple of 8, never more than 10% below v."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


# (expansion t, output channels c, repeats n, first stride s) of MobileNetV2 (Sandler et al., 2018, Table 2)
INVERTED_RESIDUALS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def mobilenet_v2(
    width: float = 1.0, resolution: int = 224, classes: int = 1000, seed: int = 0
) -> onnx.ModelProto:
    """torchvision's MobileNetV2: ReLU6 as Clip(0, 6), depthwise 3x3 convs, linear bottlenecks with
    the residual Add where the stride is 1 and the channels match."""
    b = _Builder(seed)
    cin = make_divisible(32 * width)
    last = make_divisible(1280 * max(1.0, width))
    x = b.relu6("features.0.2", b.bn("features.0.1", b.conv("features.0.0", "input", 3, cin, 3, 2), cin))
    index = 1
    for t, c, n, s in INVERTED_RESIDUALS:
        cout = make_divisible(c * width)
        for i in range(n):
            stride = s if i == 0 else 1
            p, hidden, y, layer = f"features.{index}.conv", round(cin * t), x, 0
            if t != 1:
                y = b.relu6(f"{p}.0.2", b.bn(f"{p}.0.1", b.conv(f"{p}.0.0", y, cin, hidden, 1), hidden))
                layer = 1
            dw = b.conv(f"{p}.{layer}.0", y, hidden, hidden, 3, stride, groups=hidden)
            y = b.relu6(f"{p}.{layer}.2", b.bn(f"{p}.{layer}.1", dw, hidden))
            y = b.bn(f"{p}.{layer + 2}", b.conv(f"{p}.{layer + 1}", y, hidden, cout, 1), cout)
            x = b.node("Add", f"features.{index}.add", [x, y]) if stride == 1 and cin == cout else y
            cin, index = cout, index + 1
    x = b.relu6(
        f"features.{index}.2",
        b.bn(f"features.{index}.1", b.conv(f"features.{index}.0", x, cin, last, 1), last),
    )
    return b.model("mobilenet_v2", resolution, b.head(x, last, classes), classes)


def resnet_small(seed: int = 0) -> onnx.ModelProto:
    """ResNet-18's structure at a test's size: one block per stage, width 16, 64x64, 10 classes."""
    return resnet((1, 1, 1, 1), 16, 64, 10, seed)


def mobilenet_v2_small(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 0.35 at 96x96, 10 classes: every block kind of the full network, a test's size."""
    return mobilenet_v2(0.35, 96, 10, seed)


# The networks `benchmarks/make_networks.py` writes, by file stem.
NETWORKS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet18": resnet18,
    "mobilenet_v2": mobilenet_v2,
    "resnet_small": resnet_small,
    "mobilenet_v2_small": mobilenet_v2_small,
}


def quantize_qdq(
    source: Path,
    out: Path,
    batches: list[np.ndarray],
    op_types: list[str] | None = None,
    uint8: bool = False,
) -> Path:
    """`source` (a model of one input) quantized by ONNX Runtime's `quantize_static` into `out`: QDQ, int8
    activations (`uint8`: uint8 ones), int8 weights per channel, calibrated on `batches` of its input; only
    `op_types` if given."""
    import logging

    from onnxruntime import quantization as ort_quant

    name = onnx.load(source).graph.input[0].name

    class Calibration(ort_quant.CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{name: batch} for batch in batches])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's advice to pre-process the model
    ort_quant.quantize_static(
        str(source),
        str(out),
        Calibration(),
        quant_format=ort_quant.QuantFormat.QDQ,
        per_channel=True,
        activation_type=ort_quant.QuantType.QUInt8 if uint8 else ort_quant.QuantType.QInt8,
        weight_type=ort_quant.QuantType.QInt8,
        op_types_to_quantize=op_types,
    )
    return out
