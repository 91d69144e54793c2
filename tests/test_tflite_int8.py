"""Quantized TFLite models (tests/tflite_nets.py, calibrated on LiteRT's ranges) imported as ONNX QDQ:
weights int8 with DequantizeLinear per output channel, int32 biases at input times weight scale, every
activation through QuantizeLinear/DequantizeLinear; ONNX Runtime on the QDQ model within one quantization
step of LiteRT's own kernels, each operator alone and small networks, int8 and uint8."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

import xtune
from tests.test_tflite import NETS, buildable, int8_model
from tests.tflite_nets import SAME, Net
from tests.tflite_run import quantized, within_one_step
from xtune.errors import InputError
from xtune.frontend.tflite import tflite_to_onnx
from xtune.frontend.tflite_file import read_tflite
from xtune.tuning.peers import litert_network

pytest.importorskip("onnxruntime")
pytest.importorskip("ai_edge_litert")


@pytest.mark.parametrize("name", NETS)
def test_int8_models_import_as_qdq(name: str) -> None:
    """Constant weights as int8 and DequantizeLinear per output channel, biases int32 in the scale of
    input times weights, every activation through QuantizeLinear/DequantizeLinear."""
    data = int8_model(name)
    model = tflite_to_onnx(data)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    writer = {n.output[0]: n for n in model.graph.node}
    tflite = read_tflite(data, "model.tflite")
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == sum(op.op in ("CONV_2D", "DEPTHWISE_CONV_2D") for op in tflite.ops)
    for conv in convs:
        weights, bias, x = writer[conv.input[1]], writer[conv.input[2]], writer[conv.input[0]]
        assert weights.op_type == bias.op_type == x.op_type == "DequantizeLinear"
        w, scale = inits[weights.input[0]], inits[weights.input[1]]
        assert w.dtype == np.int8 and scale.shape == (w.shape[0],)
        assert [a.i for a in weights.attribute if a.name == "axis"] == [0]
        assert inits[bias.input[0]].dtype == np.int32
        np.testing.assert_allclose(inits[bias.input[1]], inits[x.input[1]] * scale, rtol=1e-6)
        assert writer[x.input[0]].op_type == "QuantizeLinear"
    quantized_outputs = sum(tflite.tensors[op.outputs[0]].quant is not None for op in tflite.ops)
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) == quantized_outputs


def test_int8_network_within_one_step_of_litert() -> None:
    """The MobileNet-like int8 net: ONNX Runtime on the QDQ model against LiteRT's kernels."""
    data = int8_model("buildable")
    within_one_step(data, tflite_to_onnx(data), seeds=32)


def test_uint8_network_imports_and_stays_within_one_step_of_litert() -> None:
    """TFLite's older scheme: uint8 activations, uint8 asymmetric weights per tensor."""
    data = quantized(buildable, unsigned=True)
    model = tflite_to_onnx(data)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    writer = {n.output[0]: n for n in model.graph.node}
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    weights = writer[conv.input[1]]
    assert inits[weights.input[0]].dtype == np.uint8 and inits[weights.input[2]].shape == ()
    assert inits[weights.input[2]] != 0  # asymmetric
    assert inits[writer[writer[conv.input[0]].input[0]].input[2]].dtype == np.uint8  # activations
    within_one_step(data, model, seeds=16)


def _single(op: str) -> Callable[[Net], list[int]]:
    """A net of one int8 operator between QUANTIZE and DEQUANTIZE, on (1, 8, 8, 6) inputs."""

    def build(net: Net) -> list[int]:
        a = net.quantize(net.input((1, 8, 8, 6)))

        def b() -> int:
            return net.quantize(net.input((1, 8, 8, 6)))

        y = {
            "CONV_2D": lambda: net.conv(a, 8, 3, 3, stride=2, padding=SAME, act="RELU"),
            "DEPTHWISE_CONV_2D": lambda: net.depthwise(a, 3, 3, multiplier=2, padding=SAME, act="RELU6"),
            "FULLY_CONNECTED": lambda: net.fc(a, 16, act="RELU"),
            "AVERAGE_POOL_2D": lambda: net.pool("AVERAGE_POOL_2D", a, 3, 2, padding=SAME),
            "MAX_POOL_2D": lambda: net.pool("MAX_POOL_2D", a, 3, 2, padding=SAME),
            "ADD": lambda: net.binary("ADD", a, b(), act="RELU"),
            "SUB": lambda: net.binary("SUB", a, b()),
            "MUL": lambda: net.binary("MUL", a, b()),
            "CONCATENATION": lambda: net.concat([a, b()], axis=3),
            "MEAN": lambda: net.mean(a, (1, 2), keep_dims=True),
            "PAD": lambda: net.pad(a, ((0, 0), (1, 1), (0, 2), (0, 0))),
            "RESHAPE": lambda: net.reshape(a, (1, 384)),
            "SOFTMAX": lambda: net.softmax(a),
            "MAXIMUM": lambda: net.binary("MAXIMUM", a, b()),
            "MINIMUM": lambda: net.binary("MINIMUM", a, b()),
            "TRANSPOSE": lambda: net.transpose(a, (0, 2, 1, 3)),
        }.get(op, lambda: net.unary(op, a))()
        return [net.dequantize(y)]

    return build


INT8_OPS = (
    "CONV_2D",
    "DEPTHWISE_CONV_2D",
    "FULLY_CONNECTED",
    "AVERAGE_POOL_2D",
    "MAX_POOL_2D",
    "ADD",
    "SUB",
    "MUL",
    "CONCATENATION",
    "MEAN",
    "PAD",
    "RESHAPE",
    "SOFTMAX",
    "LOGISTIC",
    "TANH",
    "HARD_SWISH",
    "RELU",
    "RELU6",
    "MAXIMUM",
    "MINIMUM",
    "TRANSPOSE",
)


@pytest.mark.parametrize("op", INT8_OPS)
def test_each_int8_operator_within_one_step_of_litert(op: str) -> None:
    """Each operator alone, so that a rounding difference is its own and not one inherited and grown
    through the layers after it."""
    data = quantized(_single(op))
    within_one_step(data, tflite_to_onnx(data), seeds=8)


def test_the_litert_peer_takes_the_models_own_input_type() -> None:
    data = int8_model("buildable")  # QUANTIZE inside: the model's input is float32
    with pytest.raises(InputError, match="input is float32, not int8"):
        litert_network(data, np.zeros((1, 15, 15, 3), np.int8))
    out, seconds = litert_network(data, np.zeros((1, 15, 15, 3), np.float32), repeat=2, min_repeat_s=0.001)
    assert out.shape == (1, 10) and out.dtype == np.float32 and len(seconds) == 2 and min(seconds) > 0


def test_an_int8_model_imports_as_qlinearconv_refused_in_one_line_until_an_int8_conv_family_maps_it(
    tmp_path: Path,
) -> None:
    """The QDQ form reaches the importer intact (not folded), which makes QLinearConv nodes of it
    (xtune/frontend/quantized.py). FLIPS when the int8 conv families land: then it makes their tasks."""
    path = tmp_path / "int8.tflite"
    path.write_bytes(int8_model("buildable"))
    try:
        tasks = xtune.tasks(path, "x86-avx2")
    except InputError as err:
        assert "\n" not in str(err) and "(1 op type): QLinearConv" in str(err)
        return
    assert tasks.tasks
