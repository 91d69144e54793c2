"""Measurement: candidates (workload, target, config) in, checked and timed `MeasureResult`s out."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from xtune.boards.agent import AgentSession, RunReply, RunRequest, RunStatus
from xtune.boards.board import Board, InsnCountingSession
from xtune.boards.cost import COUNTED_UNITS, CostUnit
from xtune.codegen.compile import compile_object
from xtune.codegen.link import link_flat
from xtune.codegen.lower import lower
from xtune.errors import BoardError, BoardFault, LinkError, XtuneError
from xtune.ops.registry import template_for
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import Workload, compare_output, random_inputs
from xtune.target import Target
from xtune.tuning.options import MeasureOptions


class MeasureStatus(Enum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    LINK_ERROR = "link_error"
    RUNTIME_ERROR = "runtime_error"  # the kernel died by a signal
    TIMEOUT = "timeout"
    WRONG_ANSWER = "wrong_answer"
    BOARD_ERROR = "board_error"  # the board or its connection failed; the candidate itself may be fine


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

# A build (template, lowering, LLVM O3, link) takes 30-150 ms (docs/benchmarks.md), a fresh worker's
# imports a second or two; one that runs this long is stuck, in a template or in LLVM.
BUILD_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One config of one workload's template on one target: what a compile worker builds. It carries the
    objects themselves, so a worker looks nothing up again (a target read from a file has no name to find)."""

    workload: Workload
    target: Target
    index: int  # the config's index in the template's space


@dataclass(frozen=True)
class BuiltImage:
    """What a compile worker sends back: a flat image, or the status and text of why there is none."""

    status: MeasureStatus
    image: bytes = b""
    entry_offset: int = 0
    compile_seconds: float = 0.0
    error: str = ""
    index: int | None = None  # the config it was built from (CompilePool.build_all); None: a hand-made image


def build_image(candidate: Candidate, template: ScheduleTemplate | None = None) -> BuiltImage:
    """template -> loop nest -> LLVM IR -> object -> flat image; runs in a compile worker process.

    `template` is the candidate's registered template unless one is given. xtune's own errors become
    statuses here; any other exception (a bug in a template or in lowering) leaves the worker, and the
    pool makes it the candidate's `compile_error` (CompilePool.build_all)."""
    start = time.perf_counter()
    try:
        template = template or template_for(candidate.workload, candidate.target)
        kernel = template.kernel(template.space.config(candidate.index), ENTRY)
        obj = compile_object(lower([kernel]), candidate.target, (ENTRY,))
    except XtuneError as err:  # CompileError, or a config/workload the template rejects
        return BuiltImage(MeasureStatus.COMPILE_ERROR, error=str(err), index=candidate.index)
    try:
        image = link_flat(obj)
    except LinkError as err:
        return BuiltImage(MeasureStatus.LINK_ERROR, error=str(err), index=candidate.index)
    seconds = time.perf_counter() - start
    return BuiltImage(MeasureStatus.OK, image.code, image.entry(ENTRY), seconds, index=candidate.index)


BuildJob = Callable[[Candidate], BuiltImage]


class _Lost(Enum):
    """Why a build gave no answer at all."""

    DIED = "the compiler process died (LLVM abort)"
    HUNG = "the build did not finish within the {timeout:g} s build timeout; its worker was killed"


class CompilePool:
    """Compile workers (spawned, so an LLVM abort() kills a worker, never the tuner).

    One worker by default on a 2-core machine: the other core is the board's while it times. No
    candidate ends the run: an exception in its build, a worker it kills or a build that outlasts
    `build_timeout_s` become its `compile_error` (docs/design.md, Compilation)."""

    def __init__(
        self,
        workers: int | None = None,
        job: BuildJob = build_image,
        build_timeout_s: float = BUILD_TIMEOUT_S,
    ):
        self.workers = workers or max(1, (os.cpu_count() or 2) - 1)
        self.job = job  # a picklable module-level function; tests substitute ones that fail
        self.build_timeout_s = build_timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # one pool per board thread of a run (_BoardsMeasurer) at a time
        self._running: set[Future[BuiltImage]] = set()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker,
                    initargs=(os.getpid(),),
                )
            return self._pool

    def submit(self, candidate: Candidate) -> Future[BuiltImage]:
        future = self._executor().submit(self.job, candidate)
        self._running.add(future)
        future.add_done_callback(self._running.discard)
        return future

    def build_all(self, workload: Workload, target: Target, indices: Sequence[int]) -> Iterator[BuiltImage]:
        """Built images in the order of `indices`, compiled ahead while the caller measures."""
        candidates = [Candidate(workload=workload, target=target, index=i) for i in indices]
        futures = [self.submit(c) for c in candidates]
        for pos, candidate in enumerate(candidates):
            built = self._outcome(futures[pos])
            if isinstance(built, _Lost):
                # A worker died (LLVM abort) or a build hung, which may be another's, queued ahead of
                # this one: the pool is restarted (every pending future fails with it) and this
                # candidate built alone in the fresh one. If it is lost there too, it is the culprit.
                self._stop(kill=built is _Lost.HUNG)
                built = self._outcome(self.submit(candidate))
                if isinstance(built, _Lost):
                    self._stop(kill=built is _Lost.HUNG)
                    text = built.value.format(timeout=self.build_timeout_s)
                    built = BuiltImage(MeasureStatus.COMPILE_ERROR, error=text)
                futures[pos + 1 :] = [self.submit(c) for c in candidates[pos + 1 :]]
            yield replace(built, index=candidate.index)

    def _outcome(self, future: Future[BuiltImage]) -> BuiltImage | _Lost:
        """The build's image or status, or why there is none. The deadline runs from now: every earlier
        candidate of the caller is done, so this one has been running since at most now, unless another
        caller's (another board's) builds are queued ahead of it, which the lone retry sorts out."""
        done, _ = wait([future], timeout=self.build_timeout_s)
        if not done:
            return _Lost.HUNG
        err = future.exception()
        if isinstance(err, BrokenProcessPool):
            return _Lost.DIED
        if err is not None:  # a bug in a template or in lowering: the candidate's, not the run's
            return BuiltImage(MeasureStatus.COMPILE_ERROR, error=_one_line(err))
        return future.result()

    def _stop(self, kill: bool) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:  # a hung worker never takes the shutdown sentinel; the pool fails its pending jobs
            for process in list((pool._processes or {}).values()):
                process.kill()
        # wait=True: the pending jobs are cancelled, so this waits for at most one compile per worker.
        # With wait=False, CPython 3.11's exit handler could still wake the pool's manager thread while
        # that thread closed its pipe, printing "Exception ignored ... Bad file descriptor" at the end
        # of a run (seen once in 16 `xtune tune` runs; the race of cpython issue gh-83279).
        # Ctrl-C inside `submit`, after the executor made its manager thread and before it started it:
        # shutdown's join raises "cannot join thread before it is started". Nothing runs then; a worker
        # already spawned exits with this process (_init_worker).
        with contextlib.suppress(RuntimeError):
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Stop the workers; one still building (the caller was interrupted, or left early) is killed, so
        that a hung build cannot hold up the end of a run."""
        self._stop(kill=bool(self._running))


def _one_line(err: BaseException) -> str:
    """`Type: message` on one line, for the log."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


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


# Candidates in a row that end in board_error (each after one retry with a fresh session) before the
# board counts as failed for good: transient faults that keep coming are not transient.
MAX_BOARD_ERRORS_IN_A_ROW = 3


class Measurer:
    """Measures configs of one workload on one board: build (in workers), check against numpy, time.

    Each candidate runs on the inputs as its kernel reads them (the template's `kernel_inputs`: a
    prepacked workload's weights in the packed layout of that config), and its output is checked against
    the reference of the plain inputs, so a wrong packing is a wrong_answer. Inputs are packed and
    uploaded only when the session does not hold them (configs that share a packed layout share it).

    A BoardError that is not transient (docs/boards.md, "Faults") ends measuring: `measure` records
    it in `failure`, returns board_error for the candidates it did not finish, and measures no more."""

    def __init__(
        self,
        board: Board,
        workload: Workload,
        options: MeasureOptions,
        pool: CompilePool | None = None,
        template: ScheduleTemplate | None = None,
    ):
        """`template`: the one whose configs are measured (their inputs its `kernel_inputs`); by default
        the workload's registered template (a benchmark may give another form of the workload)."""
        self.board = board
        self.workload = workload
        self.options = options
        self.cost_unit = options.unit_on(board.cost_unit)  # what every result is stamped with
        self.pool = pool or CompilePool()
        self._owns_pool = pool is None
        self.template = template or template_for(workload, board.target)
        self.inputs = random_inputs(workload)
        self.tensors = workload.tensors()
        self.args = tuple(range(len(self.tensors)))  # buffer slot i is the kernel's i-th parameter
        # The slots a cold-weights timing evicts before each call: the workload's constants.
        self._evict = frozenset(i for i, t in enumerate(self.tensors) if t.constant and options.cold_weights)
        self.out_slot = next(i for i, t in enumerate(self.tensors) if t.is_output)
        self.out_shape = self.tensors[self.out_slot].shape
        self.out_dtype = np.dtype(self.tensors[self.out_slot].dtype)
        self.expected = workload.reference(self.inputs).astype(self.out_dtype)
        self._poison = _poison(self.expected).tobytes()
        self._session: AgentSession | None = None
        self._input_slots = [slot for slot, t in enumerate(self.tensors) if not t.is_output]
        self._held: dict[int, Hashable] = {}  # input slot -> which bytes the session holds (`_upload`)
        self._held_layout: Hashable = _NOTHING  # the layout key of the whole input set the session holds
        self.failure: BoardError | None = None  # why this board cannot measure any more
        self._errors_in_a_row = 0

    def session(self) -> AgentSession:
        if self._session is None:
            self._session = self.board.open()
            self._held, self._held_layout = {}, _NOTHING
            self._session.set_buffer(self.out_slot, self._poison)
        return self._session

    def kernel_inputs(self, index: int | None) -> list[np.ndarray]:
        """The inputs config `index`'s kernel reads (the plain ones for a hand-made image)."""
        if index is None:
            return list(self.inputs)
        return self.template.kernel_inputs(self.template.space.config(index), self.inputs)

    def _upload(self, session: AgentSession, index: int | None) -> None:
        """Each input slot holds what config `index`'s kernel reads; bytes the session already holds are
        neither packed nor sent again (a prepacked workload's weights are megabytes, and an SSH board is
        slow to send them). Which bytes a config reads is its `_layout_key`: no hash of the bytes."""
        key = _layout_key(self.template, index)
        if self._held_layout == key:
            return
        for slot, plain, array in zip(self._input_slots, self.inputs, self.kernel_inputs(index), strict=True):
            held = ("plain",) if array is plain else ("packed", key)
            if self._held.get(slot) != held:
                session.set_buffer(slot, np.ascontiguousarray(array, self.tensors[slot].dtype).tobytes())
                self._held[slot] = held
        self._held_layout = key

    def measure(self, indices: Sequence[int]) -> list[MeasureResult]:
        results: list[MeasureResult] = []
        if self.failure is None:
            builds = self.pool.build_all(self.workload, self.board.target, indices)
            try:
                for built in builds:
                    results.append(self.run(built))
            except BoardError as err:
                self.failure = err  # `builds` is dropped: compiles nobody will run are not waited for
        not_measured = MeasureResult(MeasureStatus.BOARD_ERROR, error=f"not measured: {self.failure}")
        return results + [not_measured] * (len(indices) - len(results))

    def run(self, built: BuiltImage) -> MeasureResult:
        """The result of one built candidate, stamped with what this board measures (failures too: a
        log reader never guesses a failure's unit, docs/design.md "Measurement"). A transient board fault
        is retried once with a fresh session and then recorded as board_error; raises the BoardError
        (naming the board) when the board failed for good."""
        return replace(self._run(built), cost_unit=self.cost_unit)

    def _run(self, built: BuiltImage) -> MeasureResult:
        if built.status is not MeasureStatus.OK:
            return MeasureResult(built.status, error=built.error)
        for attempt in (1, 2):
            try:
                result = self._check_and_time(built)
                self._errors_in_a_row = 0
                return replace(result, compile_seconds=built.compile_seconds)
            except BoardError as err:
                self.close_session()
                failed = self._on_board(err)
                if not failed.transient:
                    raise failed from None
                if attempt == 2:
                    self._errors_in_a_row += 1
                    if self._errors_in_a_row >= MAX_BOARD_ERRORS_IN_A_ROW:
                        raise failed.gave_up(f" ({self._errors_in_a_row} candidates in a row)") from None
                    return MeasureResult(MeasureStatus.BOARD_ERROR, error=str(failed))
        raise AssertionError("unreachable")

    def _on_board(self, err: BoardError) -> BoardError:
        """`err`, its message starting with the board's name (the one line a stopped run prints)."""
        prefix = f"board {self.board.name}"
        if str(err).startswith(prefix):
            return err
        return BoardError(f"{prefix}: {err}", err.kind, err.transient)

    def _check_and_time(self, built: BuiltImage) -> MeasureResult:
        session, opts, args = self.session(), self.options, self.args
        self._upload(session, built.index)
        session.load_image(built.image)
        session.set_buffer(self.out_slot, self._poison)
        reply = session.run(RunRequest.check(built.entry_offset, args, opts.timeout_ms))
        if reply.status is not RunStatus.OK:
            return _failed(reply)
        got = np.frombuffer(session.read_buffer(self.out_slot), dtype=self.out_dtype).reshape(self.out_shape)
        exact = self.tensors[self.out_slot].exact
        mismatch = compare_output(got, self.expected, 0.0 if exact else opts.rtol)
        if mismatch:
            return MeasureResult(MeasureStatus.WRONG_ANSWER, error=mismatch)
        if self.board.cost_unit is CostUnit.NONE:
            # Correctness only: the output was checked, and emulated wall time would rank nothing
            # (docs/boards.md), so no timed run follows.
            return MeasureResult(MeasureStatus.OK)
        if self.board.cost_unit in COUNTED_UNITS:
            # QEMU boards: the check run was exactly one call and the insncount plugin counted it (its
            # instructions, or its blocks for the cycle estimate): a deterministic cost
            # (docs/emulated-costs.md), so no timed run follows.
            cost = session.last_cost if isinstance(session, InsnCountingSession) else None
            if cost is None:
                raise BoardError(
                    f"board {self.board.name} reported no {self.board.cost_unit.value} count for the run",
                    BoardFault.AGENT,
                )
            return MeasureResult(MeasureStatus.OK, (cost,))
        reply = session.run(self._timed_request(built.entry_offset))
        if reply.status is not RunStatus.OK:
            return _failed(reply)
        return MeasureResult(MeasureStatus.OK, reply.seconds)

    def _timed_request(self, entry_offset: int) -> RunRequest:
        """The timed run `options` ask for; with cold weights, one call per repeat, the constants evicted."""
        opts, cold = self.options, self.options.cold_weights
        return RunRequest(
            entry_offset,
            self.args,
            number=1 if cold else opts.number,
            repeat=opts.repeat,
            min_repeat_ms=0.0 if cold else opts.min_repeat_ms,
            warmup=opts.warmup,
            timeout_ms=opts.timeout_ms,
            flush_cache_bytes=2 * self.board.target.l2_bytes if opts.flush_cache else 0,
            evict=self._evict,
        )

    def close_session(self) -> None:
        if self._session is not None:
            with contextlib.suppress(BoardError):
                self._session.close()
            self._session = None

    def close(self) -> None:
        self.close_session()
        if self._owns_pool:
            self.pool.close()


def _poison(expected: np.ndarray) -> np.ndarray:
    """What the output buffer holds before a check run, so that an element the kernel never writes fails
    the check: NaN for floats; for integer outputs, which have no NaN, the reference's complement (every
    element differs from what it should become)."""
    if expected.dtype.kind == "f":
        return np.full(expected.shape, np.nan, expected.dtype)
    return np.invert(expected)


_NOTHING = object()  # `Measurer._held_layout` of a fresh session: equal to no layout key, None included


def _layout_key(template: ScheduleTemplate, index: int | None) -> Hashable:
    """Which bytes config `index`'s kernel reads (None: the plain inputs, a hand-made image's): the
    template's `packed_layout` (configs with equal keys read equal bytes)."""
    return None if index is None else template.packed_layout(template.space.config(index))


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
