"""Measurement: candidates (workload, target, config) in, checked and timed `MeasureResult`s out."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from xtune.boards.agent import AgentSession, RunReply, RunRequest, RunStatus
from xtune.boards.board import Board, InsnCountingSession
from xtune.boards.cost import CostUnit
from xtune.codegen.compile import compile_object
from xtune.codegen.link import link_flat
from xtune.codegen.lower import lower
from xtune.errors import BoardError, LinkError, XtuneError
from xtune.target import Target, get_target
from xtune.templates import template_for
from xtune.workload import Workload, parse_workload, random_inputs


class MeasureStatus(Enum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    LINK_ERROR = "link_error"
    RUNTIME_ERROR = "runtime_error"  # the kernel died by a signal
    TIMEOUT = "timeout"
    WRONG_ANSWER = "wrong_answer"
    BOARD_ERROR = "board_error"  # the board or its connection failed; the candidate itself may be fine


@dataclass(frozen=True, kw_only=True)
class MeasureOptions:
    """How a board times a candidate; written into the log with every result."""

    number: int = 1  # calls per repeat (raised by the agent until a repeat lasts min_repeat_ms)
    repeat: int = 3
    min_repeat_ms: float = 10.0
    warmup: int = 1
    timeout_ms: int = 10_000
    flush_cache: bool = False
    rtol: float = 1e-4  # relative to the reference's max magnitude times sqrt(reduction length)


@dataclass(frozen=True)
class MeasureResult:
    status: MeasureStatus
    costs: tuple[float, ...] = ()  # per call in `cost_unit`, one per repeat; none on a correctness-only board
    error: str = ""
    compile_seconds: float = 0.0
    # What the board measures. `Measurer.run` stamps its board's unit on every result, failures included;
    # the default is for results made up in tests of the logic.
    cost_unit: CostUnit = CostUnit.SECONDS
    extra: tuple[tuple[str, float], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.status is MeasureStatus.OK

    @property
    def cost(self) -> float:
        """The figure of merit: median repeat cost; +inf for anything not OK, and for a correctness-only
        board's result (it has no figure: OK says the output was right, nothing more)."""
        if not self.ok or not self.costs or self.cost_unit is CostUnit.NONE:
            return float("inf")
        return statistics.median(self.costs)


ENTRY = "xt_kernel"  # the entry point name of a candidate image


@dataclass(frozen=True)
class BuiltImage:
    """What a compile worker sends back: a flat image, or the status and text of why there is none."""

    status: MeasureStatus
    image: bytes = b""
    entry_offset: int = 0
    compile_seconds: float = 0.0
    error: str = ""


def build_image(workload_key: str, target_name: str, config_index: int) -> BuiltImage:
    """template -> loop nest -> LLVM IR -> object -> flat image; runs in a compile worker process."""
    start = time.perf_counter()
    try:
        target = get_target(target_name)
        template = template_for(parse_workload(workload_key), target)
        kernel = template.kernel(template.space.config(config_index), ENTRY)
        obj = compile_object(lower([kernel]), target, (ENTRY,))
    except XtuneError as err:  # CompileError, or a config/workload the template rejects
        return BuiltImage(MeasureStatus.COMPILE_ERROR, error=str(err))
    try:
        image = link_flat(obj)
    except LinkError as err:
        return BuiltImage(MeasureStatus.LINK_ERROR, error=str(err))
    return BuiltImage(MeasureStatus.OK, image.code, image.entry(ENTRY), time.perf_counter() - start)


BuildJob = Callable[[str, str, int], BuiltImage]


class CompilePool:
    """Compile workers (spawned, so an LLVM abort() kills a worker, never the tuner).

    One worker by default on a 2-core machine: the other core is the board's while it times."""

    def __init__(self, workers: int | None = None, job: BuildJob = build_image):
        self.workers = workers or max(1, (os.cpu_count() or 2) - 1)
        self.job = job  # a picklable module-level function; tests substitute one that aborts
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(os.getpid(),),
            )
        return self._pool

    def submit(self, workload: Workload, target: Target, index: int) -> Future[BuiltImage]:
        return self._executor().submit(self.job, workload.key, target.name, index)

    def build_all(self, workload: Workload, target: Target, indices: Sequence[int]) -> Iterator[BuiltImage]:
        """Built images in the order of `indices`, compiled ahead while the caller measures."""
        futures = [self.submit(workload, target, i) for i in indices]
        for pos, index in enumerate(indices):
            try:
                yield futures[pos].result()
            except BrokenProcessPool:
                # A worker died (LLVM abort): every pending future failed with it. Retry this
                # candidate alone in a fresh pool; if it kills that one too, it is the culprit.
                self.close()
                retry = self.submit(workload, target, index)
                try:
                    built = retry.result()
                except BrokenProcessPool:
                    self.close()
                    built = BuiltImage(
                        MeasureStatus.COMPILE_ERROR, error="the compiler process died (LLVM abort)"
                    )
                futures[pos + 1 :] = [self.submit(workload, target, i) for i in indices[pos + 1 :]]
                yield built

    def close(self) -> None:
        if self._pool is not None:
            # wait=True: the pending jobs are cancelled, so this waits for at most one compile per worker.
            # With wait=False, CPython 3.11's exit handler could still wake the pool's manager thread while
            # that thread closed its pipe, printing "Exception ignored ... Bad file descriptor" at the end
            # of a run (seen once in 16 `xtune tune` runs; the race of cpython issue gh-83279).
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _init_worker(parent: int) -> None:
    """Ctrl-C is for the tuner, which stops cleanly; workers must not die mid-job printing tracebacks.
    And a worker outlives no tuner: one killed by SIGKILL or SIGTERM cannot close its pool, and its spawned
    workers, blocked on the pool's queue, were seen idling on for over 10 minutes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="exit-with-parent").start()


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:  # re-parented (to init or a subreaper) once the tuner is gone
        time.sleep(0.5)
    os._exit(0)


def check_output(got: np.ndarray, expected: np.ndarray, rtol: float) -> str:
    """'' if `got` matches the reference, else why not (NaN means an element was never written)."""
    if not np.all(np.isfinite(got)):
        bad = int(np.count_nonzero(~np.isfinite(got)))
        return f"{bad} of {got.size} outputs are not finite (never written or overflowed)"
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    err = float(np.max(np.abs(got - expected))) if expected.size else 0.0
    if err > rtol * scale:
        where = np.unravel_index(int(np.argmax(np.abs(got - expected))), expected.shape)
        return f"max abs error {err:.3g} > {rtol * scale:.3g} at {tuple(int(i) for i in where)}"
    return ""


class Measurer:
    """Measures configs of one workload on one board: build (in workers), check against numpy, time."""

    def __init__(
        self, board: Board, workload: Workload, options: MeasureOptions, pool: CompilePool | None = None
    ):
        self.board = board
        self.workload = workload
        self.options = options
        self.pool = pool or CompilePool()
        self._owns_pool = pool is None
        self.inputs = random_inputs(workload)
        self.expected = workload.reference(self.inputs).astype(np.float32)
        self.tensors = workload.tensors()
        self.args = tuple(range(len(self.tensors)))  # buffer slot i is the kernel's i-th parameter
        self.out_slot = next(i for i, t in enumerate(self.tensors) if t.is_output)
        self.out_shape = self.tensors[self.out_slot].shape
        self._poison = np.full(self.out_shape, np.nan, dtype=np.float32).tobytes()
        self._session: AgentSession | None = None

    def session(self) -> AgentSession:
        if self._session is None:
            self._session = self.board.open()
            inputs = iter(self.inputs)
            for slot, tensor in enumerate(self.tensors):
                data = self._poison if tensor.is_output else next(inputs).tobytes()
                self._session.set_buffer(slot, data)
        return self._session

    def measure(self, indices: Sequence[int]) -> list[MeasureResult]:
        return [self.run(built) for built in self.pool.build_all(self.workload, self.board.target, indices)]

    def run(self, built: BuiltImage) -> MeasureResult:
        """The result of one built candidate, stamped with what this board measures (failures too: a
        log reader never guesses a failure's unit, docs/design.md "Measurement")."""
        return replace(self._run(built), cost_unit=self.board.cost_unit)

    def _run(self, built: BuiltImage) -> MeasureResult:
        if built.status is not MeasureStatus.OK:
            return MeasureResult(built.status, error=built.error)
        for attempt in (1, 2):  # a dead agent is restarted once; the candidate is then retried
            try:
                result = self._check_and_time(built)
                return replace(result, compile_seconds=built.compile_seconds)
            except BoardError as err:
                self.close_session()
                if attempt == 2:
                    return MeasureResult(MeasureStatus.BOARD_ERROR, error=str(err))
        raise AssertionError("unreachable")

    def _check_and_time(self, built: BuiltImage) -> MeasureResult:
        session, opts, args = self.session(), self.options, self.args
        session.load_image(built.image)
        session.set_buffer(self.out_slot, self._poison)
        reply = session.run(RunRequest.check(built.entry_offset, args, opts.timeout_ms))
        if reply.status is not RunStatus.OK:
            return _failed(reply)
        got = np.frombuffer(session.read_buffer(self.out_slot), dtype=np.float32).reshape(self.out_shape)
        mismatch = check_output(got, self.expected, opts.rtol)
        if mismatch:
            return MeasureResult(MeasureStatus.WRONG_ANSWER, error=mismatch)
        if self.board.cost_unit is CostUnit.NONE:
            # Correctness only: the output was checked, and emulated wall time would rank nothing
            # (docs/boards.md), so no timed run follows.
            return MeasureResult(MeasureStatus.OK)
        if self.board.cost_unit is CostUnit.INSTRUCTIONS:
            # QEMU boards: the check run was exactly one call and the insncount plugin counted its
            # instructions: a deterministic cost (docs/qemu-insn-count.md), so no timed run follows.
            count = session.last_insn_count if isinstance(session, InsnCountingSession) else None
            if count is None:
                raise BoardError(f"board {self.board.name} reported no instruction count for the run")
            return MeasureResult(MeasureStatus.OK, (float(count),))
        flush = 2 * self.board.target.l2_bytes if opts.flush_cache else 0
        timed = RunRequest(
            built.entry_offset, args, opts.number, opts.repeat, opts.min_repeat_ms, opts.warmup,
            opts.timeout_ms, flush,
        )  # fmt: skip
        reply = session.run(timed)
        if reply.status is not RunStatus.OK:
            return _failed(reply)
        return MeasureResult(MeasureStatus.OK, reply.seconds)

    def close_session(self) -> None:
        if self._session is not None:
            with contextlib.suppress(BoardError):
                self._session.close()
            self._session = None

    def close(self) -> None:
        self.close_session()
        if self._owns_pool:
            self.pool.close()


def _failed(reply: RunReply) -> MeasureResult:
    if reply.status is RunStatus.TIMEOUT:
        return MeasureResult(MeasureStatus.TIMEOUT, error="the kernel exceeded its deadline and was killed")
    try:
        name = signal.Signals(reply.signal).name
    except ValueError:
        name = f"signal {reply.signal}"
    return MeasureResult(
        MeasureStatus.RUNTIME_ERROR, error=f"the kernel was killed by {name} ({reply.signal})"
    )
