"""The model path under hostile input (docs/faults.md, "Models"): each class of malformed or malicious ONNX
model generated with onnx.helper and run through the real command line (a fresh interpreter: exit status 2,
one `xtune: error:` line, no traceback, nothing written); outputs that are inputs; FIFOs; names that try
to inject C into the generated header (compiled with gcc -Wall -Werror) or escape sequences into the
terminal; non-finite weights against ONNX Runtime; Ctrl-C during the imports."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import run_cli
from xtune.errors import InputError
from xtune.ops.workload import compare_output, max_abs_error
from xtune.tuning.peers import ort_network

X_SHAPE = [1, 3, 8, 8]
node = helper.make_node


def weights(shape: tuple[int, ...] = (4, 3, 3, 3), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def make(
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto] | None = None,
    inputs: list[onnx.ValueInfoProto] | None = None,
    outputs: list[onnx.ValueInfoProto] | None = None,
) -> onnx.ModelProto:
    """A model of `nodes`; by default input x (1, 3, 8, 8), output y, and the 3x3 conv weight w."""
    graph = helper.make_graph(
        nodes,
        "g",
        inputs if inputs is not None else [helper.make_tensor_value_info("x", TensorProto.FLOAT, X_SHAPE)],
        outputs if outputs is not None else [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits if inits is not None else [numpy_helper.from_array(weights(), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def conv_relu(**names: str) -> onnx.ModelProto:
    """x -> Conv(w, pad 1) -> Relu -> y, any tensor or node renamed through `names`."""
    n = {"x": "x", "w": "w", "c": "c", "y": "y", "conv": "conv", "relu": "relu", **names}
    return make(
        [
            node("Conv", [n["x"], n["w"]], [n["c"]], name=n["conv"], pads=[1, 1, 1, 1]),
            node("Relu", [n["c"]], [n["y"]], name=n["relu"]),
        ],
        [numpy_helper.from_array(weights(), n["w"])],
        [helper.make_tensor_value_info(n["x"], TensorProto.FLOAT, X_SHAPE)],
        [helper.make_tensor_value_info(n["y"], TensorProto.FLOAT, None)],
    )


def short_raw(shape: tuple[int, ...], kept: int) -> onnx.TensorProto:
    t = numpy_helper.from_array(weights(shape), "w")
    t.raw_data = t.raw_data[: 4 * kept]
    return t


def no_data(dims: list[int]) -> onnx.TensorProto:
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT)
    t.dims.extend(dims)
    return t


def sparse_initializer() -> onnx.ModelProto:
    model = conv_relu()
    values = numpy_helper.from_array(np.ones(2, np.float32), "s")
    indices = numpy_helper.from_array(np.array([0, 5], np.int64), "s_idx")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4, 4]))
    return model


def sparse_constant() -> onnx.ModelProto:
    values = numpy_helper.from_array(np.ones(2, np.float32), "v")
    indices = numpy_helper.from_array(np.array([0, 5], np.int64), "i")
    const = node(
        "Constant", [], ["k"], name="const", sparse_value=helper.make_sparse_tensor(values, indices, [4])
    )
    return make([const, node("Relu", ["x"], ["y"], name="relu")])


def type_proto_attribute() -> onnx.ModelProto:
    relu = node("Relu", ["x"], ["y"], name="relu")
    attr = relu.attribute.add()
    attr.name, attr.type = "kind", onnx.AttributeProto.TYPE_PROTO
    attr.tp.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [1]))
    return make([relu])


def undefined_initializer() -> onnx.ModelProto:
    model = conv_relu()
    model.graph.initializer[0].data_type = TensorProto.UNDEFINED
    return model


def renamed_io(part: str) -> onnx.ModelProto:
    model = make([node("Relu", ["x"], ["y"], name="relu")])
    getattr(model.graph, part)[0].name = ""
    return model


def relu_graph(*relus: tuple[str, str], outputs: tuple[str, ...] = ("y",)) -> onnx.ModelProto:
    nodes = [node("Relu", [a], [b], name=f"relu_{a}_{b}") for a, b in relus]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    return make(nodes, [], outputs=outs)


# name -> (the model, what its one error line must say)
FAULTS: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    "raw data shorter than the shape": (
        lambda: make([node("Conv", ["x", "w"], ["y"], name="conv")], [short_raw((4, 3, 1, 1), 6)]),
        "initializer 'w' of shape (4, 3, 1, 1) holds 24 bytes of data, its shape and type need 48",
    ),
    "initializer without data": (
        lambda: make(
            [node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], [no_data([4, 3, 3, 3])]
        ),
        "initializer 'w' of shape (4, 3, 3, 3) holds 0 values",
    ),
    "empty huge initializer": (
        lambda: make([node("Conv", ["x", "w"], ["y"], name="conv")], [no_data([1 << 20, 3, 1 << 20, 1])]),
        "holds 0 values of data, its shape and type need 3298534883328",
    ),
    "weight channels that do not match": (
        lambda: make(
            [node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
            [numpy_helper.from_array(weights((4, 2, 3, 3)), "w")],
        ),
        "node 'conv' (Conv): the input has 3 channels",
    ),
    "sparse initializer": (sparse_initializer, "sparse initializer"),
    "sparse constant": (
        sparse_constant,
        "node 'const' (Constant): attribute 'sparse_value' is a sparse tensor",
    ),
    "TYPE_PROTO attribute": (type_proto_attribute, "node 'relu' (Relu): attribute 'kind' is a type"),
    "UNDEFINED element type of an initializer": (
        undefined_initializer,
        "initializer 'w' has element type UNDEFINED",
    ),
    "UNDEFINED element type of the input": (
        lambda: make([node("Relu", ["x"], ["y"])], [], [helper.make_tensor_value_info("x", 0, X_SHAPE)]),
        "tensor 'x' has an undefined element type",
    ),
    "empty input name": (lambda: renamed_io("input"), "graph input 0 has an empty name"),
    "empty output name": (lambda: renamed_io("output"), "graph output 0 has an empty name"),
    "no nodes": (
        lambda: make([], [], outputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, None)]),
        "the graph has no nodes",
    ),
    "an output that is an initializer": (
        lambda: make(
            [node("Relu", ["x"], ["r"])],
            outputs=[helper.make_tensor_value_info("w", TensorProto.FLOAT, None)],
        ),
        "graph output 'w' is an initializer",
    ),
    "a dangling output": (
        lambda: relu_graph(("x", "y"), outputs=("y", "z")),
        "graph output 'z' is never produced",
    ),
    "a self-cycle": (lambda: relu_graph(("x", "a"), ("y", "y")), "node 'relu_y_y' (Relu) is in a cycle"),
    "a two-node cycle": (lambda: relu_graph(("b", "a"), ("a", "b"), ("a", "y")), "is in a cycle"),
    "two nodes writing one tensor": (lambda: relu_graph(("x", "y"), ("x", "y")), "both write 'y'"),
    "a node writing the input": (lambda: relu_graph(("x", "y"), ("y", "x")), "writes 'x', a graph input"),
    "an input nothing produces": (
        lambda: relu_graph(("ghost", "y")),
        "node 'relu_ghost_y' (Relu) reads 'ghost', which no node, graph input or initializer provides",
    ),
    "a conv with no output channels": (
        lambda: make(
            [node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
            [numpy_helper.from_array(weights((0, 3, 3, 3)), "w")],
        ),
        "node 'conv' (Conv): tensor 'y' has no elements (shape (1, 0, 8, 8))",
    ),
    "an input of a 3x4096x4096 image": (
        lambda: make(
            [node("Conv", ["x", "w"], ["y"], name="big", pads=[1, 1, 1, 1])],
            inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4096, 4096])],
        ),
        "node 'big' (Conv): its kernel",
    ),
}


def one_error_line(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("xtune: error:"), done.stderr
    assert "Traceback" not in done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_is_one_line_naming_the_file(fault: str, tmp_path: Path) -> None:
    make_model, expected = FAULTS[fault]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(), path)
    one_error_line(run_cli("tasks", str(path)), f"{path}: ", expected)


@pytest.mark.parametrize(
    "fault",
    [
        "raw data shorter than the shape",
        "two nodes writing one tensor",
        "a self-cycle",
        "weight channels that do not match",
        "no nodes",
    ],
)
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_faults_that_built_silently_are_refused_by_build(fault: str, layout: str, tmp_path: Path) -> None:
    make_model, expected = FAULTS[fault]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(), path)
    before = sorted(tmp_path.iterdir())
    outputs = ["-o", str(tmp_path / "n.o"), "--header", str(tmp_path / "n.h")]
    one_error_line(
        run_cli("build", "--target", "x86-avx2", "--model", str(path), "--layout", layout, *outputs), expected
    )
    assert sorted(tmp_path.iterdir()) == before


def test_messages_of_empty_and_unsorted_models(tmp_path: Path) -> None:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    one_error_line(run_cli("tasks", str(empty)), f"{empty}: the file is empty, not an ONNX or TFLite model")
    blank = tmp_path / "blank.onnx"
    blank.write_bytes(onnx.ModelProto().SerializeToString() + b"\x08\x07")  # ir_version 7 and nothing else
    one_error_line(run_cli("tasks", str(blank)), f"{blank}: not an ONNX model (it holds no graph)")
    # Out of order but acyclic: ONNX Runtime runs it, and so does xtune (sorted at load).
    unsorted = tmp_path / "unsorted.onnx"
    model = conv_relu()
    model.graph.node.reverse()
    onnx.save(model, unsorted)
    done = run_cli("tasks", str(unsorted), "--json")
    assert done.returncode == 0, done.stderr
    assert [t["nodes"] for t in json.loads(done.stdout)["tasks"]] == [["conv"]]


# ---- outputs that are inputs; paths that are not regular files ---------------------------------------------


def test_no_output_may_be_an_input(tmp_path: Path) -> None:
    path = tmp_path / "v.onnx"
    onnx.save(conv_relu(), path)
    log = tmp_path / "L.jsonl"
    log.write_text("")
    (tmp_path / "hard.onnx").hardlink_to(path)
    (tmp_path / "soft.h").symlink_to(path)
    model_bytes = path.read_bytes()
    o, h = str(tmp_path / "n.o"), str(tmp_path / "n.h")
    build = ["build", "--target", "x86-avx2", "--model", str(path)]
    cases = [
        ([*build, "-o", str(path), "--header", h], "the object"),
        ([*build, "-o", o, "--header", str(path)], "the header"),
        ([*build, "-o", o, "--header", h, "--reference", str(path)], "the reference"),
        ([*build, "-o", str(tmp_path / "hard.onnx"), "--header", h], "is the model"),
        ([*build, "-o", o, "--header", str(tmp_path / "soft.h")], "is the model"),
        ([*build, "--log", str(log), "-o", str(log), "--header", h], "is the log"),
        ([*build, "-o", o, "--header", o], "is the object"),
        (
            [
                "build",
                "--target",
                "x86-avx2",
                "--workload",
                "matmul:m=8,n=8,k=8",
                "--log",
                str(log),
                "-o",
                o,
                "--header",
                str(log),
            ],
            "is the log",
        ),
        (["report", str(log), "--plot", str(log)], "is the log"),
        (["model", "train", str(log), "-o", str(log)], "is the log"),
        (["tune", "--model", str(path), "--log", str(path), "--trials", "1"], "the log"),
        (
            ["tune", "--model", str(path), "--log", str(tmp_path / "hard.onnx"), "--trials", "1"],
            "is the model",
        ),
    ]
    for args, expected in cases:
        one_error_line(run_cli(*args), expected)
        assert path.read_bytes() == model_bytes and log.read_text() == ""
        assert not (tmp_path / "n.o").exists() and not (tmp_path / "n.h").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="root passes access(2); the mode bits must refuse it anyway")
def test_read_only_outputs_are_refused_for_root(tmp_path: Path) -> None:
    path = tmp_path / "v.onnx"
    onnx.save(conv_relu(), path)
    locked = tmp_path / "locked.o"
    locked.write_bytes(b"keep")
    locked.chmod(0o444)
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    build = ["build", "--target", "x86-avx2", "--model", str(path), "--header", str(tmp_path / "n.h")]
    one_error_line(run_cli(*build, "-o", str(locked)), "the file is not writable")
    one_error_line(run_cli(*build, "-o", str(folder / "n.o")), "is not writable")
    assert locked.read_bytes() == b"keep" and not list(folder.iterdir())
    one_error_line(
        run_cli("tune", "--model", str(path), "--log", str(locked), "--trials", "1"), "not writable"
    )


def test_fifo_logs_and_models_are_refused_before_they_are_opened(tmp_path: Path) -> None:
    path = tmp_path / "v.onnx"
    onnx.save(conv_relu(), path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = ["-o", str(tmp_path / "n.o"), "--header", str(tmp_path / "n.h")]
    for args in (
        ["tasks", str(path), "--log", str(fifo)],
        ["build", "--target", "x86-avx2", "--model", str(path), "--log", str(fifo), *out],
        ["bench", "--model", str(path), "--log", str(fifo)],
        ["best", "--log", str(fifo)],
        ["tasks", str(fifo)],
        ["tune", "--model", str(path), "--log", str(fifo), "--trials", "1"],
    ):
        one_error_line(run_cli(*args), "it is a FIFO, not a regular file")


# ---- names that try to inject code into the header or escapes into the terminal ---------------------------

INJECTED = 'x */ #include <stdio.h>\n__attribute__((constructor)) static void f(void){ puts("INJECTED"); } /*'
HOSTILE = {
    "x": INJECTED,
    "y": "out /* nested \x1b[31m red */ and \\",
    "conv": "conv */ int injected_conv = 1; /*",
    "relu": "relu\nstep\r\x00*/",
    "w": "w*/w",
    "c": "c\u2028é",
}


@pytest.mark.host_runs("x86-avx2")
def test_hostile_names_are_escaped_in_the_header_and_on_the_terminal(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc")
    path = tmp_path / "evil *\x1b[31m name.onnx"
    onnx.save(conv_relu(**HOSTILE), path)
    header = tmp_path / "net.h"
    done = run_cli(
        "build",
        "--target",
        "x86-avx2",
        "--model",
        str(path),
        "-o",
        str(tmp_path / "net.o"),
        "--header",
        str(header),
        "--profile",
    )
    assert done.returncode == 0, done.stderr
    text = header.read_text()
    assert text.isascii() and "\x1b" not in text and "\r" not in text
    subprocess.run([gcc, "-Wall", "-Werror", "-fsyntax-only", "-x", "c", str(header)], check=True)
    subprocess.run([gcc, "-Wall", "-Werror", "-fsyntax-only", "-x", "c++", str(header)], check=True)
    main_c = tmp_path / "main.c"
    main_c.write_text('#include "net.h"\n#include <stdio.h>\nint main(void) { puts("clean"); return 0; }\n')
    program = tmp_path / "main"
    subprocess.run(
        [gcc, "-Wall", "-Werror", "-o", str(program), str(main_c), str(tmp_path / "net.o")], check=True
    )
    ran = subprocess.run([str(program)], capture_output=True, text=True, check=True)
    assert ran.stdout == "clean\n"
    for args in (["tasks", str(path)], ["bench", "--model", str(path)]):
        shown = run_cli(*args)
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout + shown.stderr and "\r" not in shown.stdout + shown.stderr
    refused = run_cli("tasks", str(path), "--target", "x86-avx2", "--log", str(tmp_path / "\x1b[2Jmissing"))
    one_error_line(refused, "\\x1b[2Jmissing")


# ---- non-finite weights against ONNX Runtime --------------------------------------------------------------


def nonfinite_model() -> onnx.ModelProto:
    w = weights()
    w[1, 0, 1, 1], w[2, 1, 0, 0] = np.inf, np.nan
    return make(
        [
            node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            node("Relu", ["c"], ["y"], name="relu"),
        ],
        [numpy_helper.from_array(w, "w")],
    )


def test_non_finite_weights_are_never_called_right(tmp_path: Path) -> None:
    path = tmp_path / "inf.onnx"
    onnx.save(nonfinite_model(), path)
    done = run_cli("bench", "--model", str(path), "--json")
    assert done.returncode in (0, 1), done.stderr
    assert done.stderr.startswith("xtune: warning:") and "'w' (2 values)" in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert math.isfinite(report["max_abs_error"])
    assert report["correct"] == (done.returncode == 0) and (report["correct"] or report["error"])
    refused = run_cli("bench", "--model", str(path), "--refuse-nonfinite")
    one_error_line(refused, "'w' (2 values)", "--refuse-nonfinite")


def test_batchnorm_with_zero_and_nan_variance_matches_onnx_runtime_without_numpy_warnings(
    tmp_path: Path,
) -> None:
    stats = {"g": np.ones(4), "b": np.zeros(4), "m": np.zeros(4), "v": np.array([1, 0, np.nan, -1])}
    inits = [numpy_helper.from_array(weights(), "w")]
    inits += [numpy_helper.from_array(v.astype(np.float32), k) for k, v in stats.items()]
    model = make(
        [
            node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            node("BatchNormalization", ["c", *stats], ["y"], name="bn", epsilon=0.0),
        ],
        inits,
    )
    path = tmp_path / "bn.onnx"
    onnx.save(model, path)
    done = run_cli("bench", "--model", str(path))
    assert "RuntimeWarning" not in done.stderr and "invalid value" not in done.stderr, done.stderr
    assert done.returncode == 0 and "matches ONNX Runtime" in done.stdout, done.stdout + done.stderr


def test_the_output_check_compares_non_finite_values_by_position_and_value() -> None:
    ref = np.array([1.0, np.inf, -np.inf, np.nan, 2.0], np.float32)
    assert compare_output(ref.copy(), ref, 1e-4) == ""
    assert max_abs_error(ref, ref) == 0.0
    for i, value in ((1, -np.inf), (1, np.nan), (2, 5.0), (3, np.inf), (3, 0.0)):
        got = ref.copy()
        got[i] = value
        assert "non-finite output(s) differ" in compare_output(got, ref, 1e-4), (i, value)
    got = ref.copy()
    got[0] = np.nan  # where the reference is finite: a never-written element, as in every kernel check
    assert "not finite (NaN where the reference is finite" in compare_output(got, ref, 1e-4)
    got = ref.copy()
    got[4] = 2.5
    assert "max abs error 0.5" in compare_output(got, ref, 1e-4) and max_abs_error(got, ref) == 0.5


def test_a_model_onnx_runtime_refuses_is_one_line() -> None:
    with pytest.raises(InputError, match=r"^m\.onnx: ONNX Runtime refuses the model \(\w+: .+\)$"):
        ort_network(b"\x08\x07junk", np.zeros((1, 3), np.float32), where="m.onnx")


# ---- Ctrl-C while Python imports -------------------------------------------------------------------------


def _importing_numpy(pid: int) -> bool:
    """Whether the process has loaded numpy's extension: it is inside xtune's own imports."""
    try:
        return "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_ctrl_c_during_the_imports_is_one_line_and_exit_130(tmp_path: Path) -> None:
    path = tmp_path / "v.onnx"
    onnx.save(conv_relu(), path)
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "xtune.cli", "tasks", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 60
        while not _importing_numpy(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if proc.returncode == 0:
            continue  # it had finished already: nothing to interrupt
        assert proc.returncode == 130 and err == "xtune: interrupted\n", (proc.returncode, err)


# ---- fuzz: truncations and byte mutations of a small model, in process -------------------------------------

FUZZ_SEED = 32
FUZZ_TRUNCATIONS = 150
FUZZ_MUTATIONS = 350


def fuzz_cases(seed: int = FUZZ_SEED) -> list[tuple[str, bytes]]:
    """Seeded variants of a small Conv + BatchNormalization + Relu + Reshape + Gemm model (weights of a
    few bytes, so that most mutations hit the structure): truncated at random lengths, and with 1 to 4
    bytes overwritten (with a random byte, 0x00, 0x7f, 0x80 or 0xff: protobuf's varint edges), inserted
    or deleted."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(weights((2, 2, 1, 1)), "w"),
        numpy_helper.from_array(weights((3, 8)), "fc"),
    ]
    inits += [
        numpy_helper.from_array(np.full(2, v, np.float32), k)
        for k, v in (("g", 1), ("b", 0), ("m", 0), ("v", 1))
    ]
    inits.append(numpy_helper.from_array(np.array([1, 8], np.int64), "shape"))
    model = make(
        [
            node("Conv", ["x", "w"], ["c"], name="conv", strides=[2, 2]),
            node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
            node("Relu", ["n"], ["r"], name="relu"),
            node("Reshape", ["r", "shape"], ["f"], name="flat"),
            node("Gemm", ["f", "fc"], ["y"], name="fc", transB=1),
        ],
        inits,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
    )
    data = model.SerializeToString()
    cases = [(f"truncated to {n}", data[:n]) for n in rng.integers(0, len(data), FUZZ_TRUNCATIONS)]
    for i in range(FUZZ_MUTATIONS):
        mutated = bytearray(data)
        for _ in range(int(rng.integers(1, 5))):
            at, value = (
                int(rng.integers(0, len(mutated))),
                int(rng.choice([int(rng.integers(0, 256)), 0, 0x7F, 0x80, 0xFF])),
            )
            if i % 4 < 2:
                mutated[at] = value
            elif i % 4 == 2:
                mutated.insert(at, value)
            else:
                del mutated[at]
        cases.append((f"mutation {i}", bytes(mutated)))
    return [("original", data), *cases]


def fuzz(tmp: Path) -> dict[str, int]:
    """Every case through the model path up to the kernels (import, validation, fusion, layout, memory
    plan: xtune.firmware.program, both layouts): how many were accepted, refused (XtuneError) or raised
    anything else (a traceback for the user), by exception type."""
    from xtune.errors import XtuneError
    from xtune.firmware.program import program

    outcome: dict[str, int] = {}
    path = tmp / "fuzz.onnx"
    for i, (_, data) in enumerate(fuzz_cases()):
        path.write_bytes(data)
        try:
            program(path, "nhwc" if i % 2 else "nchw")
            key = "accepted"
        except XtuneError:
            key = "refused"
        except Exception as err:  # what the test counts: anything but a refusal
            key = type(err).__name__
        outcome[key] = outcome.get(key, 0) + 1
    return outcome


def test_fuzzed_models_are_accepted_or_refused_never_a_traceback(tmp_path: Path) -> None:
    outcome = fuzz(tmp_path)
    assert set(outcome) <= {"accepted", "refused"}, outcome
    assert outcome["accepted"] >= 1 and outcome["refused"] >= FUZZ_TRUNCATIONS // 2, outcome


if __name__ == "__main__":  # the figures of docs/faults.md, "Models"
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        print(fuzz(Path(folder)))


def test_sigterm_stops_tuning_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM mid-run: exit 130 with the interrupted line, every record complete, and no warning from
    multiprocessing's resource tracker (the compile pool was shut down, its semaphores released)."""
    path, log = tmp_path / "v.onnx", tmp_path / "log.jsonl"
    onnx.save(conv_relu(), path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "xtune.cli",
            "tune",
            "--model",
            str(path),
            "--trials",
            "500",
            "--log",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not log.exists() or log.read_text().count("\n") < 4):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "xtune: interrupted; every finished measurement is in the log" in err
    assert "resource_tracker" not in err and "leaked" not in err and "Traceback" not in err, err
    assert all(json.loads(line) for line in log.read_text().splitlines())
