"""The QDQ Convs of a quantized model that ONNX Runtime's x86-64 build runs in float (xtune/frontend/
qdqunits.py), and per Conv how many of its 8-bit outputs two computations put one step off ONNX Runtime's,
each given ONNX Runtime's own 8-bit input to that Conv (so no difference comes from an earlier layer):
the integer QLinearConv xtune's qconv2d computes (the exact int32 sum, requantized by the float32
sx * sw / sy as ONNX Runtime's QLinearConv does) and MLAS's float Conv order (xtune/ops/mlasconv.py,
`float_unit`). Deterministic (no timing); ONNX Runtime on this host, one thread.

Usage: python benchmarks/ort_float_convs.py [--model resnet18|mobilenet_v2] [--activations s8|u8]
       [--pre-process] [--path model.onnx]
The model is bench_int8_network.py's (quantize_static of tests/networks.py's network, random weights and
calibration), or the quantized ONNX file given by --path. Needs the `bench` extra (onnxruntime).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import cast

import numpy as np
import onnx
from onnx import TensorProto, helper

from xtune.frontend.load import load_graph
from xtune.frontend.qdqunits import x86_float_convs
from xtune.graph import Graph, Node
from xtune.ops.mlasconv import float_unit, patches
from xtune.ops.quantize import QParams, QType

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_int8_network: the quantized models

from bench_int8_network import quantize


def integer_conv(graph: Graph, conv: Node, x_q: np.ndarray) -> np.ndarray:
    """ONNX's QLinearConv of the unit of `conv` with ONNX Runtime's requantization: the int32 sum of
    (x - zx) * w plus the int32 bias, times float32(float32(sx * sw[j]) / sy), rounded half to even, plus
    zy, saturated."""
    writers, readers = graph.producers(), graph.consumers()
    dq_x, dq_w, dq_b = (graph.nodes[writers[t]] for t in conv.inputs)
    (q,) = (graph.nodes[i] for i in readers[conv.outputs[0]])
    sx, zx = graph.constants[dq_x.inputs[1]], graph.constants[dq_x.inputs[2]]
    weights, sw = graph.constants[dq_w.inputs[0]], graph.constants[dq_w.inputs[1]]
    sy, zy = graph.constants[q.inputs[1]], graph.constants[q.inputs[2]]
    top, left, bottom, right = conv.ints("pads", (0, 0, 0, 0))
    strides = conv.ints("strides", (1, 1))
    shifted = (x_q[0].astype(np.int64) - int(zx)).astype(np.float32)  # exact: |q - z| < 2^24
    cols = patches(shifted, weights.shape[2:], (strides[0], strides[1]), (top, left, bottom, right))
    m = weights.shape[0]
    acc = weights.reshape(m, -1).astype(np.int64) @ cols.astype(np.int64)
    acc += graph.constants[dq_b.inputs[0]].astype(np.int64).reshape(-1, 1)
    scale = ((np.float32(sx) * sw.astype(np.float32)).astype(np.float32) / np.float32(sy)).astype(np.float32)
    out = QParams(scale=1.0, zero=int(zy), qtype=cast(QType, str(zy.dtype)))  # x / 1: the rounding alone
    values = (acc.astype(np.float32) * scale.reshape(-1, 1)).astype(np.float32)
    return out.quantize(values).reshape(1, m, *graph.shape(conv.outputs[0])[2:])


def onnx_runtime_tensors(path: Path, names: list[str], x: np.ndarray) -> dict[str, np.ndarray]:
    """The named 8-bit tensors of one ONNX Runtime run of `path` on `x` (made graph outputs)."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    kinds = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
    graph = load_graph(path, qdq=True)
    for name in names:
        model.graph.output.append(helper.make_tensor_value_info(name, kinds[graph.dtype(name)], None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, {session.get_inputs()[0].name: x}), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("resnet18", "mobilenet_v2"), default="resnet18")
    parser.add_argument("--activations", choices=("s8", "u8"), default="s8")
    parser.add_argument("--pre-process", action="store_true")
    parser.add_argument("--path", type=Path, default=None, help="a quantized ONNX model instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.path
        if path is None:
            from tests.networks import NETWORKS

            fp32, path = Path(tmp) / "model.onnx", Path(tmp) / "model_int8.onnx"
            onnx.save(NETWORKS[args.model](), fp32)
            quantize(fp32, path, args.activations, args.pre_process)
        graph = load_graph(path, qdq=True)
        names = x86_float_convs(graph)
        convs = [n for n in graph.nodes if n.name in names]
        writers, readers = graph.producers(), graph.consumers()
        inputs = {c.name: graph.nodes[writers[c.inputs[0]]].inputs[0] for c in convs}
        outputs = {c.name: graph.nodes[readers[c.outputs[0]][0]].outputs[0] for c in convs}
        shape = graph.shape(graph.inputs[0])
        x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
        seen = onnx_runtime_tensors(path, sorted({*inputs.values(), *outputs.values()}), x)
        total = sum(n.op == "Conv" for n in graph.nodes)
        print(f"{len(convs)} of {total} Convs run in float by ONNX Runtime x86-64")
        print(f"{'conv':32} {'outputs':>8} {'integer':>8} {'mlas':>5}")
        for conv in convs:
            x_q, want = seen[inputs[conv.name]], seen[outputs[conv.name]]
            integer = np.count_nonzero(integer_conv(graph, conv, x_q) != want)
            mlas = np.count_nonzero(float_unit(graph, conv, x_q) != want)
            print(f"{conv.name:32} {want.size:8d} {integer:8d} {mlas:5d}")


if __name__ == "__main__":
    main()
