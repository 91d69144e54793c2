"""A quantized network whole: ONNX Runtime's quantize_static (QDQ, per channel, calibration on random inputs)
of a float network, tuned on the local board, built and run against ONNX Runtime's int8 in the same run
(one thread), beside xtune's float32 build of the same network tuned with the same budget; the firmware
sizes (weights bytes, workspace) of both builds. The network is an MLP (--model mlp: --batch, --width,
--layers; --trials over all its tasks) or ResNet-18 / MobileNetV2 at 224x224 (tests/networks.py, random
weights; --trials per task, the issue's "64 trials per task").

Usage: python benchmarks/bench_int8_network.py [--model mlp|resnet18|mobilenet_v2] [--trials 64]
       [--activations s8|u8] [--batch 64] [--width 512] [--layers 3] [--repeat 20] [--target x86-avx512-vnni]
       [--check] [--pre-process]
--pre-process runs ONNX Runtime's quant_pre_process first (BatchNormalization folded into its convolution).
--check builds the int8 network with default configs (no tuning, no timing), runs it once on the local board
and says how many of its outputs differ from ONNX Runtime's and by how many quantization steps, and the
planned workspace (and its lower bound) of the int8 and the float32 builds: deterministic figures.
--activations u8 quantizes activations to uint8 (ONNX Runtime's fastest form on x86: U8S8); s8 is
quantize_static's default. The machine should be otherwise idle: every time is a timing. Needs the `bench`
extra (onnxruntime).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xtune.boards.board import Board, get_board
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import bench_model, network_input, run_network
from xtune.frontend.tasks import extract_tasks
from xtune.frontend.tune import tune_model
from xtune.tuning.options import MeasureOptions, TuneOptions
from xtune.tuning.peers import ort_network

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/networks.py: the networks

from tests.networks import NETWORKS, quantize_qdq

CNNS = ("resnet18", "mobilenet_v2")


def float_mlp(batch: int, width: int, layers: int) -> onnx.ModelProto:
    """`layers` Gemm(transB=1, bias) + Relu of `width` features, then a 10-way Gemm."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers + 1):
        n = 10 if i == layers else width
        inits += [
            numpy_helper.from_array(rng.normal(0, width**-0.5, (n, width)).astype(np.float32), f"w{i}"),
            numpy_helper.from_array(rng.normal(0, 0.1, n).astype(np.float32), f"b{i}"),
        ]
        out = "y" if i == layers else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [out], name=f"fc{i}", transB=1))
        if i < layers:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def quantize(source: Path, out: Path, activations: str, pre_process: bool = False) -> None:
    """`source` by quantize_static (tests/networks.py): QDQ, int8 weights per channel, activations of type
    `activations`, calibrated on four random inputs of its input's shape; `pre_process`: after ONNX
    Runtime's quant_pre_process (shape inference and its graph optimizations, BatchNormalization folded into
    the convolution before it), as ONNX Runtime's quantization guide advises."""
    if pre_process:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        prepared = out.with_suffix(".pre.onnx")
        quant_pre_process(str(source), str(prepared))
        source = prepared
    first = onnx.load(str(source)).graph.input[0]
    shape = [d.dim_value for d in first.type.tensor_type.shape.dim]
    rng = np.random.default_rng(1)
    batches = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(4)]
    quantize_qdq(source, out, batches, uint8=activations == "u8")


def check(path: Path, fp32: Path, board: Board) -> str:
    """How the default int8 build's output differs from ONNX Runtime's on the seeded random input: the
    count of differing values, and the largest difference in steps of the smallest one (the logits'
    DequantizeLinear makes every difference a multiple of the output's scale); then the workspace of the
    int8 build and of the float32 one (`fp32`), each with its lower bound."""
    built = build_model(path, board.target)
    workspace = [
        f"{name} workspace {m.workspace_bytes} B (lower bound {m.lower_bound})"
        for name, m in (
            ("int8", built.program.memory),
            ("float32", build_model(fp32, board.target).program.memory),
        )
    ]
    x = network_input(built)
    got, _ = run_network(board, built, x)
    ort = ort_network(path.read_bytes(), x)[0]
    diff = np.abs(got.astype(np.float64) - ort.astype(np.float64)).reshape(-1)
    off = diff[diff > 0]
    steps = f", up to {off.max() / off.min():.0f} steps of {off.min():.4g}" if off.size else ""
    return f"{off.size} of {diff.size} outputs differ from ONNX Runtime's{steps}; " + ", ".join(workspace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", *CNNS), default="mlp")
    parser.add_argument("--activations", choices=("s8", "u8"), default="s8")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--target", default=None, help="the local board's target (default: the host's)")
    parser.add_argument("--check", action="store_true", help="only compare the default int8 build with ORT")
    parser.add_argument(
        "--pre-process", action="store_true", help="quant_pre_process before quantize_static (BN folded)"
    )
    parser.add_argument(
        "--cold-weights",
        action="store_true",
        help="tune with each candidate's weights evicted before each call (xtune tune --cold-weights)",
    )
    args = parser.parse_args()
    board = get_board("local", target=args.target)
    with tempfile.TemporaryDirectory() as tmp:
        fp32, int8 = Path(tmp) / f"{args.model}.onnx", Path(tmp) / f"{args.model}_int8.onnx"
        if args.model == "mlp":
            onnx.save(float_mlp(args.batch, args.width, args.layers), fp32)
            shape = f"MLP {args.batch}x{args.width}, {args.layers}+1 layers, {args.trials} trials"
        else:
            onnx.save(NETWORKS[args.model](), fp32)
            shape = f"{args.model}, {args.trials} trials per task"
        quantize(fp32, int8, args.activations, args.pre_process)
        pre = ", quant_pre_process" if args.pre_process else ""
        pre += ", tuned with cold weights" if args.cold_weights else ""
        if args.check:
            found = check(int8, fp32, board)
            print(f"{shape}, {args.activations} activations{pre}, {board.target.name}: {found}")
            return
        rows = []
        for name, path in (("int8", int8), ("float32", fp32)):
            log = Path(tmp) / f"{name}.jsonl"
            tasks = len(extract_tasks(path, board.target).tasks) if args.model != "mlp" else 1
            options = TuneOptions(measure=MeasureOptions(cold_weights=args.cold_weights))
            tune_model(path, board=board, trials=args.trials * tasks, log=log, options=options)
            report = bench_model(path, board, logs=[log], repeat=args.repeat)
            built = build_model(path, board.target, logs=[log])
            memory = built.program.memory
            rows.append((name, report, built.weights_bytes, memory.workspace_bytes, memory.lower_bound))
        print(f"{shape}, {args.activations} activations{pre}, {board.target.name}")
        heads = (
            "build",
            "correct",
            "xtune ms",
            "ORT ms",
            "vs ORT",
            "weights B",
            "workspace B",
            "lower bound",
        )
        print("{:8} {:7} {:>9} {:>8} {:>7} {:>10} {:>11} {:>11}".format(*heads))
        for name, r, weights, workspace, bound in rows:
            ms = r.seconds * 1e3 if r.seconds else float("nan")
            ort = r.ort_seconds * 1e3 if r.ort_seconds else float("nan")
            ratio = ort / ms
            print(
                f"{name:8} {r.correct!s:7} {ms:9.4f} {ort:8.4f} {ratio:6.2f}x {weights:10d} {workspace:11d} "
                f"{bound:11d}"
            )
        (_, q, qw, _, _), (_, f, fw, _, _) = rows
        if q.seconds and f.seconds:
            print(f"int8 vs xtune float32: {f.seconds / q.seconds:.2f}x speed, {qw / fw:.2f}x weights")


if __name__ == "__main__":
    main()
