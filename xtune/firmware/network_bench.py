"""Whole networks on a board: an ONNX model, a board and tuning logs in; the network object built for the
board's target, run through the agent on a seeded random input, checked against ONNX Runtime's output on
the same input (a quantized network built for an aarch64 target: ONNX Runtime's aarch64 build under
qemu-aarch64, `onnx_peer`), and timed (`bench_model`, `xtune bench --model`): wall time on the local
board, beside ONNX Runtime's on one thread in the same run; the instruction count of one inference on
QEMU boards.

Correctness uses the rule every kernel check uses (xtune.ops.workload.compare_output): max |got - ref| <=
RTOL * max(1, max |ref|), RTOL = 1e-4; a quantized output the one-step rule (`compare_network`). Over a
whole network the error of float32 accumulation in another order grows with depth, but stays far below
that: 2e-7 to 1.2e-6 of the output's largest magnitude on the small and full ResNet-18 and MobileNetV2
(measured on x86-avx512), while a wrong weight, layout or workspace offset gives errors of the output's
own size.
"""

from __future__ import annotations

import os
import statistics
import struct
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from xtune.boards.agent import AgentSession, RunReply, RunRequest, RunStatus
from xtune.boards.board import Board, InsnCountingSession
from xtune.boards.cost import CostUnit
from xtune.codegen.compile import ObjectCode
from xtune.codegen.link import FlatImage, link_flat
from xtune.errors import BoardError, InputError, XtuneWarning
from xtune.files import check_paths, write_all_atomic
from xtune.firmware.build import build_model, nonfinite_notes
from xtune.firmware.entry import NetArtifact
from xtune.frontend.formats import is_tflite_file
from xtune.frontend.load import Source, load_model
from xtune.ops.layout import DEFAULT, Layout, parse_layout
from xtune.ops.workload import RTOL, compare_output, max_abs_error
from xtune.target import Target, host_cpu
from xtune.tuning.arm_peers import emulation_missing, onnx_aarch64
from xtune.tuning.peers import litert_available, litert_network, ort_available, ort_network

PathLike = str | os.PathLike[str]
SEED = 0  # of the random input, so that a run can be repeated
TIMEOUT_MS = 600_000  # one inference under qemu-user can take minutes on a loaded machine


@dataclass(frozen=True, kw_only=True)
class NetBenchReport:
    model: str
    target: str
    board: str
    layout: str  # the layout the network ran in (xtune/ops/layout.py)
    correct: bool
    error: str  # why not correct; "" when it is
    max_abs_error: float  # against ONNX Runtime
    cost_unit: CostUnit
    seconds: float | None  # median per inference on the board (wall-time boards)
    instructions: float | None  # per inference (QEMU boards with the instruction counter)
    cycles: float | None  # estimated per inference (QEMU cycles boards, llvm-mca's model)
    ort_seconds: float | None  # the peer on this host, one thread, same run (wall-time boards only)
    workspace_bytes: int
    kernels: int
    defaults: int  # tasks built from their template's default config
    peer: str = "ONNX Runtime"  # the reference and timing peer (`network_peer`): LiteRT for a TFLite model
    # Which outputs the check compared with (`Peer.reference`) and by what rule (`tolerance`).
    check: str = ""

    @property
    def ratio_vs_ort(self) -> float | None:
        """The peer's time over ours: above 1, xtune is faster."""
        return self.ort_seconds / self.seconds if self.seconds and self.ort_seconds else None

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "target": self.target,
            "board": self.board,
            "layout": self.layout,
            "correct": self.correct,
            "error": self.error,
            "max_abs_error": self.max_abs_error,
            "cost_unit": self.cost_unit.value,
            "seconds": self.seconds,
            "instructions": self.instructions,
            "cycles": self.cycles,
            "ort_seconds": self.ort_seconds,
            "speedup_vs_ort": self.ratio_vs_ort,
            "workspace_bytes": self.workspace_bytes,
            "kernels": self.kernels,
            "default_configs": self.defaults,
            "peer": self.peer,
            "check": self.check,
        }


@dataclass(frozen=True, kw_only=True)
class Peer:
    """What a user would run a model with instead: its output on an input and, with a repeat count, its
    seconds per inference (one thread, on this host); `reference` says which build computed the output."""

    name: str
    run: Callable[[np.ndarray, int], tuple[np.ndarray, list[float]]]
    reference: str


def network_peer(model: Source, target: Target | None = None) -> Peer:
    """The peer of `model`, by its format: the TFLite interpreter (LiteRT) for a TFLite file, whose
    kernels define what the model computes; ONNX Runtime for ONNX (`onnx_peer`: for `target`'s
    architecture). A TFLite model whose float kernels read int8 weights is timed on LiteRT but checked
    against ONNX Runtime on its import: LiteRT rounds its activations to int8 on the fly there, which the
    model's weights do not ask for."""
    tflite = not isinstance(model, onnx.ModelProto) and is_tflite_file(model)
    data = b""
    if tflite:
        from xtune.frontend.tflite import dynamic_range  # the flatbuffer code, for TFLite files only

        if not litert_available():
            raise InputError("checking a TFLite network needs LiteRT: pip install 'xtune[bench]'")
        data = Path(model).read_bytes()
        if not dynamic_range(data, str(model)):
            return Peer(
                name="LiteRT",
                run=lambda x, repeat: litert_network(data, x, repeat),
                reference="LiteRT on this host",
            )
    if not ort_available():
        raise InputError("checking a network needs ONNX Runtime: pip install 'xtune[bench]'")
    loaded = load_model(model)
    where = "the model" if isinstance(model, onnx.ModelProto) else str(model)
    if not tflite:
        return onnx_peer(loaded, where, target)
    serialized = loaded.SerializeToString()

    def checked_on_import(x: np.ndarray, repeat: int) -> tuple[np.ndarray, list[float]]:
        return ort_network(serialized, x, where=where)[0], litert_network(data, x, repeat)[1]

    return Peer(
        name="LiteRT (outputs: ONNX Runtime on the import)",
        run=checked_on_import,
        reference="ONNX Runtime on this host, on the import",
    )


def onnx_peer(model: onnx.ModelProto, where: str, target: Target | None) -> Peer:
    """ONNX Runtime on this host, timed there; for a quantized network (`eight_bit`) built for an aarch64
    target on another host, its outputs are those of ONNX Runtime's aarch64 build under qemu-aarch64 on
    the target's core, the reference a user of that board compares with: the two builds round some
    8-bit results differently (MLAS's QLinearAdd, docs/int8.md "Exactness"). Where that build cannot
    run here, the host's with the same one-step rule, and the reference saying so."""
    serialized = model.SerializeToString()
    host = host_cpu()

    def on_host(x: np.ndarray, repeat: int) -> tuple[np.ndarray, list[float]]:
        return ort_network(serialized, x, repeat, where=where)

    here = f"ONNX Runtime on this host ({host.machine})"
    if target is None or target.arch != "aarch64" or host.arch == "aarch64" or not eight_bit(model):
        return Peer(name="ONNX Runtime", run=on_host, reference=here)
    core = target.qemu_cpu
    missing = emulation_missing(core)
    if missing:
        return Peer(name="ONNX Runtime", run=on_host, reference=f"{here}, not its aarch64 build ({missing})")

    def on_aarch64(x: np.ndarray, repeat: int) -> tuple[np.ndarray, list[float]]:
        seconds = on_host(x, repeat)[1]  # first: a model ONNX Runtime refuses is one line, as on x86
        return onnx_aarch64(serialized, x, core), seconds

    reference = f"ONNX Runtime's aarch64 build under qemu-aarch64 -cpu {core}"
    return Peer(name="ONNX Runtime", run=on_aarch64, reference=reference)


_EIGHT_BIT = frozenset((onnx.TensorProto.INT8, onnx.TensorProto.UINT8))


def eight_bit(model: onnx.ModelProto) -> bool:
    """Whether a model computes on 8-bit tensors (QDQ, QOperator or integer nodes): 8-bit constants, input,
    output or inferred tensors, or a node that quantizes."""
    g = model.graph
    typed = (*g.input, *g.output, *g.value_info)
    return (
        any(t.data_type in _EIGHT_BIT for t in g.initializer)
        or any(v.type.tensor_type.elem_type in _EIGHT_BIT for v in typed)
        or any(n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") for n in g.node)
    )


REFERENCE_MAGIC = b"XTNETREF"


def reference_file(artifact: NetArtifact, model: Source) -> bytes:
    """What `xtune build --model --reference` writes for a firmware's self-test (examples/network): the
    seeded random input and the peer's output for it (`network_peer`). Little-endian: 8 bytes "XTNETREF",
    u32 version 1, u32 the build id (the header's), u64 input floats, u64 output floats, then both arrays
    as float32."""
    prog = artifact.program
    if prog.input_type != "float32" or prog.output_type != "float32":
        raise InputError(
            f"{prog.model}: a reference file holds float32 arrays; this network's input is "
            f"{prog.input_type} and its output {prog.output_type}"
        )
    x = network_input(artifact)
    ref, _ = network_peer(model, artifact.target).run(x, 0)
    head = REFERENCE_MAGIC + struct.pack("<IIQQ", 1, artifact.build_id, x.size, ref.size)
    return head + x.astype("<f4").tobytes() + ref.astype("<f4").tobytes()


def build_model_files(
    model: Source,
    target: str | Target,
    *,
    object_path: PathLike,
    header_path: PathLike,
    reference_path: PathLike | None = None,
    logs: Sequence[PathLike] = (),
    prefix: str = "net",
    layout: str | Layout = DEFAULT,
    profile: bool = False,
    refuse_nonfinite: bool = False,
) -> NetArtifact:
    """What `xtune build --model` does: every path checked before anything is built (each output
    writable, none another output or a file the build reads: the model, a log), the network built
    (`build_model`), and the object, the header and the reference file (`reference_file`,
    with `reference_path`) written atomically, all or none."""
    inputs = [
        (None if isinstance(model, onnx.ModelProto) else model, "model"),
        *((log, "log") for log in logs),
    ]
    outputs = [(object_path, "object"), (header_path, "header"), (reference_path, "reference")]
    check_paths(outputs, inputs)
    artifact = build_model(model, target, logs, prefix, layout, profile, refuse_nonfinite)
    files: list[tuple[PathLike, bytes | str, str]] = [
        (object_path, artifact.object, "object"),
        (header_path, artifact.header, "header"),
    ]
    if reference_path is not None:
        files.append((reference_path, reference_file(artifact, model), "reference"))
    write_all_atomic(files)
    return artifact


def random_input(shape: tuple[int, ...], seed: int = SEED, dtype: str = "float32") -> np.ndarray:
    """The input every network check feeds: uniform in [-1, 1), float32; an 8-bit input uniform over its
    type's values."""
    rng = np.random.default_rng(seed)
    if dtype != "float32":
        info = np.iinfo(np.dtype(dtype))
        return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(np.float32)


def network_input(artifact: NetArtifact) -> np.ndarray:
    """The seeded random input of the artifact's network, in its entry's input type."""
    return random_input(artifact.program.input_shape, dtype=artifact.program.input_type)


# A quantized network's output may differ from ONNX Runtime's by one quantization step on this share of
# its values at most (docs/int8.md, "Exactness"); every other value must be equal.
ONE_STEP_SHARE = 0.001


def output_step(artifact: NetArtifact) -> float | None:
    """The quantization step of the network's output: 1 for an 8-bit output, the scale of the dequantized
    8-bit tensor a float output is, None for any other output."""
    prog = artifact.program
    if prog.output_type in ("int8", "uint8"):
        return 1.0
    return prog.output_quant[0] if prog.output_quant is not None and prog.output_type == "float32" else None


def tolerance(artifact: NetArtifact) -> str:
    """The rule `compare_network` checks the network's output by, in words."""
    if output_step(artifact) is None:
        return f"max |error| <= {RTOL:g} x max(1, max |reference|)"
    return f"quantized: equal, or one step off on at most {ONE_STEP_SHARE:.1%} of the outputs"


def compare_network(artifact: NetArtifact, got: np.ndarray, ref: np.ndarray) -> str:
    """Why `got` is not the network's output `ref` ("" when it is): a quantized output (8-bit, or the
    dequantization of an 8-bit tensor) by the rule of ONE_STEP_SHARE, any other by compare_output's."""
    step = output_step(artifact)
    if step is None or got.shape != ref.shape:
        return compare_output(got, ref, RTOL)
    steps = np.abs(got.astype(np.float64) - ref.astype(np.float64)) / step
    off = int(np.count_nonzero(got != ref))
    allowed = int(ONE_STEP_SHARE * got.size)
    if off == 0 or (float(steps.max()) <= 1 + 1e-6 and off <= allowed):
        return ""
    return (
        f"{off} of {got.size} quantized outputs differ (at most {allowed} may, by one step), "
        f"the largest by {float(steps.max()):.3g} steps of {step!r}"
    )


def load_network(session: AgentSession, artifact: NetArtifact, x: np.ndarray) -> FlatImage:
    """Link the network's object, load it into `session` and set its entries' buffers: 0 the input `x`,
    1 the output (NaN: an element never written shows), 2 the workspace. Returns the image (its entries)."""
    image = link_flat(
        ObjectCode(artifact.target.name, artifact.target.arch, artifact.object, artifact.entry_points)
    )
    session.load_image(image.code)
    prog = artifact.program
    session.set_buffer(0, np.ascontiguousarray(x, dtype=prog.input_type).tobytes())
    # NaN (a float output) or a byte pattern (an integer one): an element never written shows.
    unwritten = np.nan if prog.output_type == "float32" else 0x5A
    session.set_buffer(1, np.full(prog.output_shape, unwritten, prog.output_type).tobytes())
    session.set_buffer(2, bytes(max(64, artifact.workspace_bytes)))
    return image


def run_network(
    board: Board, artifact: NetArtifact, x: np.ndarray, repeat: int = 0
) -> tuple[np.ndarray, float]:
    """The network's output on `board` for input `x` (one checked call), and with `repeat` its cost per
    inference in the board's unit (median seconds, or the instruction or cycle count of one call; nan for
    none)."""
    with board.open() as session:
        entry = load_network(session, artifact, x).entry(artifact.entry)
        reply = session.run(RunRequest.check(entry, (0, 1, 2), timeout_ms=TIMEOUT_MS))
        check_finished(reply, board)
        out = np.frombuffer(session.read_buffer(1), artifact.program.output_type)
        got = out.reshape(artifact.program.output_shape).copy()
        cost = float("nan")
        if isinstance(session, InsnCountingSession) and session.last_cost is not None:
            cost = session.last_cost  # the check-only call is one inference (deterministic)
        if repeat and board.cost_unit is CostUnit.SECONDS:
            timed = session.run(
                RunRequest(entry, (0, 1, 2), number=1, repeat=repeat, warmup=1, timeout_ms=TIMEOUT_MS)
            )
            check_finished(timed, board)
            cost = statistics.median(timed.seconds)
    return got, cost


def check_finished(reply: RunReply, board: Board, what: str = "the network") -> None:
    """BoardError (not transient: the same call would fail again) unless the network's call returned."""
    if reply.status is not RunStatus.OK:
        why = f"signal {reply.signal}" if reply.status is RunStatus.SIGNAL else reply.status.value
        raise BoardError(f"{board.name}: {what} did not finish ({why})", transient=False)


def bench_model(
    model: Source,
    board: Board,
    logs: Sequence[PathLike] = (),
    repeat: int = 5,
    layout: str | Layout = DEFAULT,
    refuse_nonfinite: bool = False,
) -> NetBenchReport:
    """Build `model` for the board's target in `layout`, run it on `board`, check it against its peer
    (ONNX Runtime, or LiteRT for a TFLite model; non-finite outputs by position and value:
    xtune.ops.workload.compare_output), time both. A constant holding NaN or infinity is a warning, or with
    `refuse_nonfinite` an InputError."""
    where = parse_layout(layout)
    peer = network_peer(model, board.target)
    artifact = build_model(model, board.target, logs, layout=where, refuse_nonfinite=refuse_nonfinite)
    for note in nonfinite_notes(artifact.program, refuse_nonfinite):
        warnings.warn(note, XtuneWarning, stacklevel=2)
    x = network_input(artifact)
    wall = board.cost_unit is CostUnit.SECONDS
    # First: a model its peer refuses is refused before the board runs it.
    ref, ort_times = peer.run(x, repeat if wall else 0)
    got, cost = run_network(board, artifact, x, repeat)
    mismatch = compare_network(artifact, got, ref)
    error = max_abs_error(
        got.astype(np.float64), ref.astype(np.float64)
    )  # over the finite positions: the others matched, or mismatch says
    return NetBenchReport(
        model=artifact.model,
        target=board.target.name,
        board=board.name,
        layout=where.value,
        correct=not mismatch,
        error=mismatch,
        max_abs_error=error,
        cost_unit=board.cost_unit,
        seconds=cost if wall and not mismatch else None,
        instructions=cost if board.cost_unit is CostUnit.INSTRUCTIONS and not mismatch else None,
        cycles=cost if board.cost_unit is CostUnit.CYCLES and not mismatch else None,
        ort_seconds=statistics.median(ort_times) if ort_times else None,
        workspace_bytes=artifact.workspace_bytes,
        kernels=len(artifact.kernels),
        defaults=sum(k.source == "default" for k in artifact.kernels),
        peer=peer.name,
        check=f"against {peer.reference}; {tolerance(artifact)}",
    )
