"""One- and few-node networks for the generated operators' tests, written with onnx.helper: a convolution
first (so that in NHWC the operator reads a converted activation, as inside a real network), then the
nodes under test; `check` builds one through the real build path (xtune.firmware.build.build_model), runs
it on a board and compares it with ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xtune.boards.board import get_board
from xtune.firmware.build import build_model
from xtune.firmware.entry import NetArtifact
from xtune.firmware.network_bench import random_input, run_network
from xtune.ops.workload import RTOL, compare_output
from xtune.tuning.peers import ort_network

LAYOUTS = ("nchw", "nhwc")
# Odd shapes first: 1x1 spatial, channels that are no multiple of any target's vector width (4, 8, 16).
SHAPES = ((1, 5, 1, 1), (2, 3, 3, 7), (1, 16, 4, 4))


def net(
    nodes: list[onnx.NodeProto],
    shape: tuple[int, ...],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    conv: bool = True,
) -> onnx.ModelProto:
    """x of `shape` -> a 1x1 Conv keeping the channels ("a", skipped without `conv`: "a" is then x) ->
    `nodes`, the last node's first output the network's output. Seeded weights."""
    rng = np.random.default_rng(7)
    c = shape[1]
    consts = dict(inits or {})
    first: list[onnx.NodeProto] = []
    if conv:
        consts["conv.w"] = (rng.standard_normal((c, c, 1, 1)) * 1.5).astype(np.float32)
        first = [helper.make_node("Conv", ["x", "conv.w"], ["a"], name="conv")]
    else:
        first = [helper.make_node("Identity", ["x"], ["a"], name="in")]
    graph = helper.make_graph(
        [*first, *nodes],
        "ops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(model: onnx.ModelProto, layout: str, board: str = "local") -> NetArtifact:
    """Build `model` for `board`'s target in `layout`, run it there and assert it matches ONNX Runtime."""
    b = get_board(board)
    artifact = build_model(model, b.target, layout=layout)
    x = random_input(artifact.program.input_shape) * np.float32(3)  # both signs, past the knees
    got, _ = run_network(b, artifact, x)
    want, _ = ort_network(model.SerializeToString(), x)
    assert compare_output(got, want, RTOL) == "", (got.reshape(-1)[:8], want.reshape(-1)[:8])
    return artifact


def kinds(artifact: NetArtifact) -> set[str]:
    """The generated kernels' kinds and the tasks' operators that the build made."""
    return {k.what.split(":")[0] for k in artifact.kernels}
