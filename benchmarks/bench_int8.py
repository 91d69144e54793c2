"""int8 matmul (qmatmul) and int8 convolution (qconv2d, qdepthwise) at network-like shapes against ONNX
Runtime's int8 and xtune's own float32.

For each shape: xtune's int8 kernel with its default config and tuned (--trials xgb trials, on the local
board with the VNNI target), ONNX Runtime's one-node QLinearMatMul on the same data (one intra-op thread,
checked equal to the kernel's reference first), and xtune's float32 matmul of the same shape (weights
prepacked, as a network runs it) default and tuned with the same trials; the tuned configs re-timed in
--rounds interleaved rounds. Then the default int8 kernel's qemu-aarch64 instructions per multiply-add on
the A72 (no dot product: the mla route) and the A76 (sdot) targets, and, with --insn-trials N, the best
count of N trials tuned by instruction count.

The convolution layers (--layers) are MLPerf Tiny's: ResNet-8 on 32x32 CIFAR-10 (r8c1 the stem, r8s1 a
stack-1 3x3, r8s2 and r8s3 the stride-2 3x3s opening stacks 2 and 3 with TensorFlow's SAME padding
(the odd pixel at the bottom and right), r8l3 a stack-3 3x3) and the DS-CNN keyword spotter on 49x10
MFCCs (kws1 its 10x4 stride-2 stem, kwsdw a 3x3 depthwise, kwspw a 1x1 pointwise), per-channel scales
as their int8 TFLite files have; ONNX Runtime runs each as a one-node QLinearConv (NCHW) and the float32
peer is xtune's conv2d or depthwise with layout=nhwc. `--layers depthwise` runs the int8 depthwise layers
alone: kwsdw and MobileNetV2's (`MOBILENET_DW`, which the default list leaves out).

Usage: python benchmarks/bench_int8.py [--shapes fc,pw,mid] [--layers r8c1,...|none] [--trials 64]
       [--rounds 3] [--insn-trials 0] [--a u8|s8] [--target x86-avx512-vnni] [--float-target x86-avx512]
       [--no-float] [--no-qemu] [--qemu-only]
--qemu-only prints only the qemu-aarch64 instruction counts (deterministic: no timing, any machine).
--a is the activation type, u8 by default: ONNX Runtime 1.32's QLinearMatMul runs uint8 activations
through MLAS's packed u8s8 kernels, int8 ones about 12x slower here (12.6 against 159 GOP/s at 784x512x128,
measured while writing this script), so u8 compares with ONNX Runtime at its best.
ORT needs the `bench` extra; the machine should be otherwise idle: every GOP/s is a timing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from xtune.boards.board import Board, get_board
from xtune.ops.qconv import qconv_shape
from xtune.ops.qmatmul import reference as ref
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import Workload, random_inputs
from xtune.tuning.database import TuningLog
from xtune.tuning.kernel_bench import retime_gflops
from xtune.tuning.measure import CompilePool, Measurer
from xtune.tuning.options import MeasureOptions
from xtune.tuning.peers import _seconds_per_call, ort_available, ort_session
from xtune.tuning.run import TuneOptions, run_tuning

# m x n x k: ResNet-18's classifier (one image), a ResNet-50 bottleneck's 1x1 expand at 56x56, a 1x1 at 28x28.
SHAPES = {"fc": (1, 1000, 512), "pw": (3136, 256, 64), "mid": (784, 512, 128)}
# MLPerf Tiny's int8 convolution layers (module docstring): the workload keys after "qconv2d:"/"qdepthwise:".
LAYERS = {
    "r8c1": "qconv2d:n=1,c=3,h=32,w=32,k=16,r=3,s=3,pad=1",
    "r8s1": "qconv2d:n=1,c=16,h=32,w=32,k=16,r=3,s=3,pad=1",
    "r8s2": "qconv2d:n=1,c=16,h=32,w=32,k=32,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1",
    "r8s3": "qconv2d:n=1,c=32,h=16,w=16,k=64,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1",
    "r8l3": "qconv2d:n=1,c=64,h=8,w=8,k=64,r=3,s=3,pad=1",
    "kws1": "qconv2d:n=1,c=1,h=49,w=10,k=64,r=10,s=4,stride=2,pad=4,pad_left=1,pad_bottom=5,pad_right=1",
    "kwsdw": "qdepthwise:n=1,c=64,h=25,w=5,r=3,s=3,pad=1",
    "kwspw": "qconv2d:n=1,c=64,h=25,w=5,k=64,r=1,s=1",
}
# MobileNetV2's 3x3 depthwise layers (224x224 input), not run unless named: --layers depthwise runs these
# and DS-CNN's kwsdw, every int8 depthwise layer the goals depend on.
MOBILENET_DW = {
    "mbdw32": "qdepthwise:n=1,c=32,h=112,w=112,r=3,s=3,pad=1",
    "mbdw96": "qdepthwise:n=1,c=96,h=112,w=112,r=3,s=3,stride=2,pad=1",
    "mbdw144": "qdepthwise:n=1,c=144,h=56,w=56,r=3,s=3,pad=1",
    "mbdw384": "qdepthwise:n=1,c=384,h=14,w=14,r=3,s=3,pad=1",
    "mbdw960": "qdepthwise:n=1,c=960,h=7,w=7,r=3,s=3,pad=1",
}
DEPTHWISE_LAYERS = ("kwsdw", *MOBILENET_DW)


def qmodel(wl: Workload, inputs: list[np.ndarray]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """A one-node QLinearMatMul of the workload's data (per-tensor, requant=onnx): the model, its input A,
    and the reference output with the scale ONNX Runtime derives (a_scale * b_scale / y_scale)."""
    from onnx import TensorProto, helper, numpy_helper

    a, b, bias, scale, qparams = inputs
    za, zy = int(qparams[0]), int(qparams[1])
    a_scale, y_scale = np.float32(0.02), np.float32(0.02 / float(scale[0]) * 0.01)
    b_scale = np.float32(0.01)
    ort_scale = np.array([a_scale * b_scale / y_scale], np.float32)
    act = ref.NUMPY_TYPES[str(wl.value("a"))]
    consts: dict[str, np.ndarray] = {
        "a_scale": np.array(a_scale),
        "a_zp": np.array(za, act),
        "B": b,
        "b_scale": np.array(b_scale),
        "b_zp": np.array(0, np.int8),
        "y_scale": np.array(y_scale),
        "y_zp": np.array(zy, act),
    }
    elem = TensorProto.UINT8 if act is np.uint8 else TensorProto.INT8
    node = helper.make_node("QLinearMatMul", ["A", *list(consts)[:2], "B", *list(consts)[3:]], ["Y"])
    m, n, k = wl["m"], wl["n"], wl["k"]
    graph = helper.make_graph(
        [node],
        "qmatmul",
        [helper.make_tensor_value_info("A", elem, [m, k])],
        [helper.make_tensor_value_info("Y", elem, [m, n])],
        [numpy_helper.from_array(v, name) for name, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    expected = wl.reference([a, b, np.zeros_like(bias), ort_scale, qparams])
    return model.SerializeToString(), a, expected


def qconv_model(wl: Workload, inputs: list[np.ndarray]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """A one-node QLinearConv (NCHW, as ONNX's) of a qconv2d or qdepthwise workload's data, requant=onnx
    (per-channel w_scale where the workload is per channel): the model, its NCHW input and the NCHW
    reference output with the scales ONNX Runtime derives (x_scale * w_scale / y_scale in float32)."""
    from onnx import TensorProto, helper, numpy_helper

    x, w, bias, scale, qparams = inputs
    sh = qconv_shape(wl)
    x_scale, y_scale = np.float32(0.02), np.float32(0.5)
    w_scale = (scale * y_scale / x_scale).astype(np.float32)
    ort_scale = (x_scale * w_scale / y_scale).astype(np.float32)
    act = ref.NUMPY_TYPES[str(wl.value("a"))]
    depthwise = wl.op == "qdepthwise"
    oihw = w.transpose(2, 0, 1)[:, None] if depthwise else w.transpose(3, 2, 0, 1)
    per_tensor = w_scale.size == 1
    consts: dict[str, np.ndarray] = {
        "x_scale": np.array(x_scale),
        "x_zp": np.array(qparams[0], act),
        "W": np.ascontiguousarray(oihw),
        "w_scale": w_scale.reshape(()) if per_tensor else w_scale,
        "w_zp": np.zeros(() if per_tensor else w_scale.size, np.int8),
        "y_scale": np.array(y_scale),
        "y_zp": np.array(qparams[1], act),
        "bias": bias,
    }
    elem = TensorProto.UINT8 if act is np.uint8 else TensorProto.INT8
    node = helper.make_node(
        "QLinearConv",
        ["X", *consts],
        ["Y"],
        kernel_shape=[sh.r, sh.s],
        strides=[sh.stride] * 2,
        pads=[sh.top, sh.left, sh.bottom, sh.right],
        dilations=[sh.dilation] * 2,
        group=sh.c if depthwise else 1,
    )
    graph = helper.make_graph(
        [node],
        wl.op,
        [helper.make_tensor_value_info("X", elem, [sh.n, sh.c, sh.h, sh.w])],
        [helper.make_tensor_value_info("Y", elem, [sh.n, sh.k, sh.oh, sh.ow])],
        [numpy_helper.from_array(v, name) for name, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    expected = wl.reference([x, w, bias, ort_scale, qparams]).transpose(0, 3, 1, 2)
    return model.SerializeToString(), np.ascontiguousarray(x.transpose(0, 3, 1, 2)), expected


def ort_gops(wl: Workload) -> float | None:
    if not ort_available():
        return None
    build = qmodel if wl.op == "qmatmul" else qconv_model
    model, a, expected = build(wl, random_inputs(wl))
    session = ort_session(model)
    name = session.get_inputs()[0].name
    got = session.run(None, {name: a})[0]
    if not np.array_equal(got, expected):
        raise SystemExit(
            f"ONNX Runtime's {wl.op} node differs from the reference on {int((got != expected).sum())} "
            "outputs"
        )
    seconds = _seconds_per_call(lambda: session.run(None, {name: a}), 5, 0.05)
    return wl.flops() / statistics.median(seconds) / 1e9


def tuned(wl: Workload, board: Board, trials: int, rounds: int) -> tuple[float, float]:
    """GOP/s of the default config and of the best of `trials` xgb trials, re-timed together."""
    default = template_for(wl, board.target).default_config().index
    with tempfile.TemporaryDirectory() as tmp:
        log = TuningLog(Path(tmp) / "log.jsonl")
        report = run_tuning(wl, [board], TuneOptions(trials=trials), log)
    best = report.best_index if report.best_index is not None else default
    rows = retime_gflops(wl, board, [default, best], rounds)
    return statistics.median(rows[0]), statistics.median(rows[1])


def insn_per_mac(wl: Workload, board_name: str, trials: int) -> float:
    """Instructions per multiply-add of the default config (or the best of `trials` by instruction count)."""
    board = get_board(board_name)
    if trials:
        with tempfile.TemporaryDirectory() as tmp:
            report = run_tuning(
                wl, [board], TuneOptions(trials=trials, confirm=0), TuningLog(Path(tmp) / "l.jsonl")
            )
        return report.best_cost / (wl.flops() // 2)
    pool = CompilePool()
    measurer = Measurer(board, wl, MeasureOptions(), pool)
    try:
        (result,) = measurer.measure([measurer.template.default_config().index])
    finally:
        measurer.close()
        pool.close()
    return result.cost / (wl.flops() // 2)  # flops count each multiply-add as two


def float_key(wl: Workload) -> str:
    """The float32 workload of the same shape: a prepacked matmul, or conv2d/depthwise in NHWC."""
    if wl.op == "qmatmul":
        return f"matmul:m={wl['m']},n={wl['n']},k={wl['k']},prepacked=1"
    sizes = ",".join(f"{k}={v}" for k, v in wl.params if k not in ("a", "requant", "perchannel"))
    return f"{wl.op[1:]}:{sizes},layout=nhwc"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="fc,pw,mid", help="qmatmul shapes, or none")
    parser.add_argument("--layers", default=",".join(LAYERS), help="int8 convolution layers, or none")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--insn-trials", type=int, default=0)
    parser.add_argument("--a", choices=("u8", "s8"), default="u8")
    parser.add_argument("--target", default="x86-avx512-vnni")
    parser.add_argument("--float-target", default="x86-avx512")
    parser.add_argument("--no-float", action="store_true")
    parser.add_argument("--no-qemu", action="store_true")
    parser.add_argument("--qemu-only", action="store_true")
    args = parser.parse_args()
    board = get_board("local", target=args.target)
    print(
        f"{'shape':<16} {'int8 def':>9} {'int8 tuned':>10} {'ORT int8':>9} {'f32 def':>8} {'f32 tuned':>9} "
        f"{'vs ORT':>7} {'vs f32':>7} {'A72 i/MAC':>9} {'A76 i/MAC':>9}   (GOP/s, one thread)"
    )
    rows = [
        (name, f"qmatmul:m={m},n={n},k={k},a={args.a}", f"{m}x{n}x{k}")
        for name, (m, n, k) in SHAPES.items()
        if name in args.shapes.split(",")
    ] + [
        (name, f"{key},a={args.a},perchannel=1", "")
        for name, key in (LAYERS | MOBILENET_DW).items()
        if name in args.layers.replace("depthwise", ",".join(DEPTHWISE_LAYERS)).split(",")
    ]
    for name, key, size in rows:
        wl = parse_workload(key)
        if args.qemu_only:
            counts = [insn_per_mac(wl, b, args.insn_trials) for b in ("qemu-aarch64", "qemu-aarch64-dotprod")]
            print(f"{name} {size}".ljust(16) + " " * 66 + "".join(f" {c:9.3f}" for c in counts))
            continue
        q_default, q_best = tuned(wl, board, args.trials, args.rounds)
        ort = ort_gops(wl)
        f_default = f_best = float("nan")
        if not args.no_float:
            fwl = parse_workload(float_key(wl))
            f_default, f_best = tuned(
                fwl, get_board("local", target=args.float_target), args.trials, args.rounds
            )
        a72 = a76 = float("nan")
        if not args.no_qemu:
            a72 = insn_per_mac(wl, "qemu-aarch64", args.insn_trials)
            a76 = insn_per_mac(wl, "qemu-aarch64-dotprod", args.insn_trials)
        vs_ort = f"{q_best / ort:.2f}x" if ort else "-"
        print(
            f"{name} {size}".ljust(16) + f" {q_default:9.1f} {q_best:10.1f} {ort or float('nan'):9.1f} "
            f"{f_default:8.1f} {f_best:9.1f} {vs_ort:>7} {q_best / f_best:6.2f}x {a72:9.3f} {a76:9.3f}"
        )


if __name__ == "__main__":
    main()
