"""The command line: argv in, library calls and a table or one JSON object out; errors: one line, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from xtune.errors import InputError, XtuneError
from xtune.files import check_output
from xtune.tuning.tuner import TUNERS

if TYPE_CHECKING:
    from xtune.boards.board import Board
    from xtune.boards.cost import CostUnit
    from xtune.network.scheduler import ModelProgress, ModelTuningResult
    from xtune.network.tasks import Task, TaskSet
    from xtune.transfer.pretrained import TransferSource
    from xtune.tuning.costmodel import CostModel
    from xtune.tuning.database import Record, TuningLog
    from xtune.tuning.run import TuneOptions, TuningReport
    from xtune.tuning.tuner import TuneProgress

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


# Flag ranges: what the agent protocol's u32 fields carry (xtune/agent_src/PROTOCOL.md: repeat <= 1024,
# timeout_ms >= 1) and what numpy and xgboost take as seeds and thread counts. A flag outside its range is
# one usage line and exit 2 here, not a ValueError from deep inside a run.
U32 = 2**32 - 1
MAX_REPEAT = 1024


def _int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an ASCII decimal integer in [low, high]."""

    def parse(text: str) -> int:
        digits = text[1:] if text.startswith("-") else text
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 20:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer in {low}..{high}")
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside {low}..{high}")
        return value

    return parse


def _float_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (no nan, no inf)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g}..{high:g}")
        return value

    return parse


def _emit_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=None, sort_keys=False) + "\n")


def cmd_targets(args: argparse.Namespace) -> int:
    from xtune.target import host_target, load_targets

    try:
        host = host_target().name
    except XtuneError:
        host = ""
    targets = load_targets()
    if args.json:
        _emit_json({"host": host, "targets": [vars(t) for t in targets.values()]})
        return 0
    print(f"{'name':<14} {'triple':<28} {'cpu':<14} {'vec':>4} {'regs':>4} {'L1d':>6} {'L2':>7} {'peak':>7}")
    for t in targets.values():
        mark = "  (host)" if t.name == host else ""
        print(
            f"{t.name:<14} {t.triple:<28} {t.cpu:<14} {t.vector_bits:>4} {t.vector_registers:>4} "
            f"{t.l1d_bytes // 1024:>4}K {t.l2_bytes // 1024:>5}K {t.peak_gflops:>6.1f}G{mark}"
        )
    return 0


def cmd_boards(args: argparse.Namespace) -> int:
    from xtune.boards.board import board_names, get_board
    from xtune.boards.cost import CostUnit
    from xtune.boards.ssh import SshBoard, probe

    rows = []
    for name in board_names(args.boards):
        board = get_board(name, args.boards)
        row: dict[str, object] = {
            "name": name,
            "target": board.target.name,
            "kind": "built-in",
            "timing": board.cost_unit is CostUnit.SECONDS,
            "cost_unit": board.cost_unit.value,
        }
        if isinstance(board, SshBoard):  # a short connect per SSH board: reachable, or why not
            why = probe(board, timeout=args.timeout)
            row.update(kind="ssh", host=board.config.host, reachable=not why, reason=why)
        rows.append(row)
    if args.json:
        _emit_json({"boards": rows})
        return 0
    for row in rows:
        status = ""
        if row["kind"] == "ssh":
            state = "reachable" if row["reachable"] else f"unreachable: {row['reason']}"
            status = f"  ssh {row['host']}: {state}"
        print(f"{row['name']:<16} {row['target']:<14} {CostUnit(row['cost_unit']).describe}{status}")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from xtune.boards.board import get_board
    from xtune.boards.ssh import SshBoard, deploy

    board = get_board(args.board, args.boards)
    if not isinstance(board, SshBoard):
        raise InputError(f"board '{args.board}' is built in and needs no deploy (only SSH boards do)")
    where = f"{args.board} ({board.config.host})"
    print(f"xtune: deploying the {board.target.arch} agent to {where}", file=sys.stderr)
    result = deploy(board, accept_new_host_key=args.accept_new_host_key)
    if args.json:
        _emit_json(result)
        return 0
    fp = result["fingerprint"]
    assert isinstance(fp, dict)
    print(f"{args.board}: agent {result['agent_version']} at {result['agent']}, hello arch={result['arch']} "
          f"exec={result['exec']} ({result['seconds']} s)")  # fmt: skip
    print(f"  {fp['uname']}\n  cpu: {fp['cpu']}, {fp['cores']} cores")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from xtune.bench import bench
    from xtune.boards.board import get_board
    from xtune.workload import parse_workload

    if args.model is not None:
        return _bench_model(args)
    if args.workload is None:
        raise InputError("give --workload (a kernel) or --model (a whole network)")
    if args.log:
        raise InputError("--log is for --model; a kernel's config is --config")
    workload = parse_workload(args.workload)
    board = get_board(args.board, args.boards, target=args.target)
    report = bench(workload, board, args.config)
    if args.json:
        _emit_json(report.as_dict())
    else:
        d = report.as_dict()
        print(
            f"{report.workload} on {report.board} ({report.target}), "
            f"{report.config_source} config {report.config_index}"
        )
        print(f"  knobs: {', '.join(f'{k}={v}' for k, v in report.config)}")
        if not report.correct:
            print(f"  xtune  {report.status.value}: {report.error}")
        elif report.gflops is not None:
            print(
                f"  xtune  {report.gflops:8.1f} GFLOP/s  ({d['percent_of_peak']}% of nominal peak), correct"
            )
        elif d["instructions"] is not None:
            print(
                f"  xtune  {report.cost:.0f} instructions per call (emulated; no wall-time figure), correct"
            )
        else:
            print("  xtune  correct (a correctness-only board: no speed figure)")
        print(f"  numpy  {report.numpy_gflops:8.1f} GFLOP/s  (single thread on this host, same run)")
        if report.ort_gflops is not None:
            print(f"  ORT    {report.ort_gflops:8.1f} GFLOP/s  (ONNX Runtime, single thread, same run)")
        if report.ratio is not None:
            versus_ort = f", {report.ratio_vs_ort:.2f}x ONNX Runtime" if report.ratio_vs_ort else ""
            print(f"  ratio  {report.ratio:8.2f}x numpy{versus_ort}")
    return 0 if report.correct else 1


def _bench_model(args: argparse.Namespace) -> int:
    from xtune.boards.board import get_board
    from xtune.netbench import bench_model

    if args.workload is not None or args.config is not None:
        raise InputError("--model benches a whole network: --workload and --config are for one kernel")
    board = get_board(args.board, args.boards, target=args.target)
    with _warnings_unless_error():
        report = bench_model(args.model, board, args.log or ())
    if args.json:
        _emit_json(report.as_dict())
        return 0 if report.correct else 1
    print(f"{report.model} on {report.board} ({report.target}): {report.kernels} kernels "
          f"({report.defaults} at the default config), workspace {report.workspace_bytes} B")  # fmt: skip
    if not report.correct:
        print(f"  xtune  WRONG against ONNX Runtime: {report.error}")
        return 1
    print(f"  xtune  matches ONNX Runtime (max abs error {report.max_abs_error:.3g})")
    if report.seconds is not None:
        print(f"  xtune  {report.seconds * 1e3:9.3f} ms per inference")
    elif report.instructions is not None:
        print(f"  xtune  {report.instructions:.0f} instructions per inference (emulated: no wall time)")
    if report.ort_seconds is not None:
        print(f"  ORT    {report.ort_seconds * 1e3:9.3f} ms per inference (ONNX Runtime, 1 thread, same run)")
    if report.ratio_vs_ort is not None:
        print(f"  ratio  {report.ratio_vs_ort:9.2f}x ONNX Runtime's speed")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from xtune.artifact import build, check_outputs

    if args.model is not None:
        return _build_model(args)
    if not args.workload:
        raise InputError("give --workload (repeat for each kernel) or --model (a whole network)")
    if args.reference is not None:
        raise InputError("--reference is for --model builds")
    check_outputs(args.output, args.header, args.archive)  # before compiling anything
    artifact = build(args.target, args.workload, args.log or (), args.prefix or "xt")
    artifact.write(args.output, args.header, args.archive)
    for warning in artifact.warnings:
        print(f"xtune: warning: {warning}", file=sys.stderr)
    if args.json:
        _emit_json({
            "target": artifact.target.name, "object": args.output, "header": args.header,
            "archive": args.archive, "kernels": [k.as_dict() for k in artifact.kernels],
            "warnings": list(artifact.warnings),
        })  # fmt: skip
        return 0
    width = max(len("symbol"), *(len(k.symbol) for k in artifact.kernels))
    print(f"{'symbol':<{width}}  {'source':<7} {'config':>10} {'code':>8} {'stack':>9} {'GFLOP/s':>8}")
    for k in artifact.kernels:
        gflops = f"{k.gflops:8.1f}" if k.gflops is not None else f"{'-':>8}"
        print(
            f"{k.symbol:<{width}}  {k.source:<7} {k.config_index:>10} {k.code_bytes:>6} B "
            f"{k.stack_bytes:>7} B {gflops}"
        )
    wrote = ", ".join(p for p in (args.output, args.header, args.archive) if p)
    print(f"{len(artifact.kernels)} kernel(s) for {artifact.target.name}: wrote {wrote}")
    return 0


def _build_model(args: argparse.Namespace) -> int:
    from xtune.artifact import check_outputs
    from xtune.files import write_all_atomic
    from xtune.netbench import reference_file
    from xtune.netbuild import build_model

    if args.workload or args.archive:
        raise InputError("--model builds one network object: --workload and --archive are for kernels")
    check_outputs(args.output, args.header)  # before compiling anything
    if args.reference is not None:
        reference = check_output(args.reference, "reference")
        if reference in (check_output(args.output), check_output(args.header)):
            raise InputError(f"the reference {args.reference} is the object or the header")
    start = time.perf_counter()
    with _warnings_unless_error():
        artifact = build_model(args.model, args.target, args.log or (), args.prefix or "net")
    files: list[tuple[str, bytes | str, str]] = [(args.output, artifact.object, "object"),
                                                  (args.header, artifact.header, "header")]  # fmt: skip
    if args.reference is not None:
        files.append((args.reference, reference_file(artifact, args.model), "reference"))
    write_all_atomic(files)
    seconds = time.perf_counter() - start
    for warning in artifact.warnings:
        print(f"xtune: warning: {warning}", file=sys.stderr)
    if args.json:
        _emit_json({**artifact.as_dict(), "object": args.output, "header": args.header,
                    "reference": args.reference, "seconds": round(seconds, 3)})  # fmt: skip
        return 0
    plan = artifact.program.memory
    print(f"{'kernel':<10} {'source':<9} {'config':>10} {'calls':>5} {'stack':>9}  computes")
    for k in artifact.kernels:
        config = f"{k.config_index:>10}" if k.config_index is not None else f"{'-':>10}"
        print(f"{k.symbol:<10} {k.source:<9} {config} {k.calls:>5} {k.stack_bytes:>7} B  {k.what}")
    print(f"{artifact.entry}: {len(artifact.program.calls)} calls, workspace {plan.workspace_bytes} bytes "
          f"(lower bound {plan.lower_bound}, {plan.intermediate_bytes} of intermediates), stack "
          f"{artifact.stack_bytes} bytes, weights {artifact.weights_bytes} bytes")  # fmt: skip
    wrote = ", ".join(p for p in (args.output, args.header, args.reference) if p)
    print(f"{artifact.target.name}: wrote {wrote} in {seconds:.1f} s")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from xtune.boards.board import get_board
    from xtune.templates import template_for
    from xtune.tuning.database import TuningLog
    from xtune.tuning.features import features_op
    from xtune.tuning.run import local_numpy_gflops, run_tuning
    from xtune.tuning.session import check_boards
    from xtune.tuning.tuner import StopReason
    from xtune.workload import parse_workload

    check_output(args.log, "log", append=True)  # a folder, device, read-only file: before measuring
    workload = parse_workload(args.workload) if args.workload is not None else None
    boards = [get_board(name, args.boards, target=args.target) for name in (args.board or ["local"])]
    log = TuningLog(args.log)
    # run_tuning and the scheduler check both too, but only after training --transfer-from logs
    check_boards(boards)
    log.check_appendable()
    if workload is None:
        return _tune_model(args, boards, log)
    # A pointwise conv2d is tuned as the matmul it lowers to: that operator's model scores its configs.
    op = features_op(template_for(workload, boards[0].target))
    transfer, pretrained = _transfer_source(args, boards[0], op)
    options = _tune_options(args)
    numpy_gflops = local_numpy_gflops(workload, boards)
    bar = _ProgressBar(args.trials, workload.flops(), numpy_gflops, boards[0].cost_unit)
    try:
        report = run_tuning(
            workload,
            boards,
            options,
            log,
            bar.update,
            numpy_gflops,
            pretrained,
            hedge_with_estimate=transfer is not None and not transfer.saw(boards[0].target),
        )
    finally:
        bar.close()
    if args.json:
        used = transfer.as_dict() if transfer else None
        _emit_json({**report.as_dict(), "log": str(args.log), "transfer": used})
    else:
        _print_tuning(report, args.log)
    if report.stop is StopReason.INTERRUPTED:
        print("xtune: interrupted; every finished measurement is in the log", file=sys.stderr)
        return 130
    if report.stop is StopReason.BOARD_FAILED:  # the summary above says what was measured; the log has it all
        print(f"xtune: error: {report.error}", file=sys.stderr)
        return 2
    return 0


def _tune_options(args: argparse.Namespace) -> TuneOptions:
    from xtune.tuning.measure import MeasureOptions
    from xtune.tuning.run import TuneOptions

    return TuneOptions(
        tuner=args.tuner, trials=args.trials, batch_size=args.batch_size,
        early_stopping=args.early_stopping, seed=args.seed,
        measure=MeasureOptions(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                               timeout_ms=args.timeout_ms),
        confirm=args.confirm,
    )  # fmt: skip


def _tune_model(args: argparse.Namespace, boards: list[Board], log: TuningLog) -> int:
    """`xtune tune --model`: every task of the model under one budget (xtune.network.scheduler)."""
    from xtune.network.scheduler import ModelStop, SchedulerOptions, Strategy, tune_tasks
    from xtune.network.tasks import extract_tasks
    from xtune.templates import template_for
    from xtune.tuning.features import features_op

    taskset = extract_tasks(args.model, boards[0].target)
    pretrained: dict[str, tuple[CostModel, bool]] = {}
    used: dict[str, object] = {}
    source: TransferSource | None = None
    ops = {features_op(template_for(t.workload, boards[0].target)) for t in taskset.tasks}  # as the scheduler
    for op in sorted(ops):
        if source is None or source.kind == "builtin":  # the built-in model is chosen per operator
            source, model = _transfer_source(args, boards[0], op)
        else:  # one model file, or logs trained on once, has a booster per operator
            model = source.model.cost_model(op)
        if source is not None and model is not None:
            pretrained[op] = (model, not source.saw(boards[0].target))
            used[op] = source.as_dict()
    bar = _ModelProgressBar(args.trials, taskset.tasks, boards[0].cost_unit)
    try:
        result = tune_tasks(taskset.tasks, boards, _tune_options(args), log, model=taskset.model,
                            scheduler=SchedulerOptions(strategy=Strategy(args.strategy)),
                            pretrained=pretrained, on_progress=bar.update)  # fmt: skip
    finally:
        bar.close()
    if args.json:
        _emit_json({**result.as_dict(), "log": str(args.log), "transfer": used or None})
    else:
        _print_model_tuning(result, args.log)
    if result.stop is ModelStop.INTERRUPTED:
        print("xtune: interrupted; every finished measurement is in the log", file=sys.stderr)
        return 130
    if result.stop is ModelStop.BOARD_FAILED:  # the table above says what was measured; the log has it all
        print(f"xtune: error: {result.error}", file=sys.stderr)
        return 2
    return 0


def _transfer_source(
    args: argparse.Namespace, board: Board, op: str
) -> tuple[TransferSource | None, CostModel | None]:
    """The source of --transfer-from (trained here if logs are given) and its model for `op`, or Nones."""
    if not args.transfer_from:
        return None, None
    from xtune.transfer.pretrained import load_source

    if args.tuner != "xgb":
        raise InputError(f"--transfer-from needs the xgb tuner (--tuner {args.tuner} has no cost model)")
    with _warnings_unless_error():
        source = load_source(args.transfer_from, board.target, op, cpu=board.fingerprint().get("cpu"))
    pretrained = source.model.cost_model(op)
    m = source.model.manifest
    print(f"xtune: transfer from {source.kind} {', '.join(source.paths)} ({m.records_used} records of "
          f"{', '.join(m.targets)}, trained {m.created})", file=sys.stderr)  # fmt: skip
    return source, pretrained


@contextlib.contextmanager
def _warnings_unless_error() -> Iterator[None]:
    """Warnings raised in the block are shown (one line each, see `_show_warning`) only if it ends
    well: when it raises, the error line alone says what went wrong (a log whose every line is unreadable
    is one error, not a warning per line and then an error)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)


class _ProgressBar:
    """tqdm on stderr: trials done, best GFLOP/s (or instructions), % of numpy, failures, ETA."""

    def __init__(self, total: int, flops: int, numpy_gflops: float | None, unit: CostUnit):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="trial", file=sys.stderr, dynamic_ncols=True, leave=True)
        self.flops, self.numpy_gflops, self.failed, self.unit = flops, numpy_gflops, 0, unit

    def update(self, progress: TuneProgress) -> None:
        from xtune.boards.cost import gflops

        self.failed += sum(1 for r in progress.results if not r.ok)
        post: dict[str, object] = {"failed": self.failed}
        speed = gflops(self.flops, progress.best_cost, self.unit)  # the boards' unit, never a result's
        if speed is not None:
            post["best"] = f"{speed:.1f} GFLOP/s"
            if self.numpy_gflops:
                post["numpy"] = f"{100 * speed / self.numpy_gflops:.0f}%"
        elif progress.best_cost < float("inf"):
            post["best"] = f"{progress.best_cost:.0f} insn"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(len(progress.batch))

    def close(self) -> None:
        self.bar.close()


def _print_tuning(report: TuningReport, log: str) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in report.counts if v)
    print(f"{report.workload} on {'+'.join(report.boards)} ({report.target}): {report.trials} trials"
          f" ({counts}), {report.resumed} resumed from {log}, stopped: {report.stop.value}")  # fmt: skip
    if report.best_index is None:
        print("  no correct config yet")
        return
    knobs = ", ".join(f"{k}={v}" for k, v in report.best_knobs)
    print(f"  best config #{report.best_index}: {knobs}")
    timed = report.timings_text()
    if report.best_gflops is not None:
        line = f"  best {report.best_gflops:.1f} GFLOP/s ({report.best_cost * 1e3:.3f} ms, {timed})"
        if report.numpy_gflops:
            line += (
                f"; numpy {report.numpy_gflops:.1f} GFLOP/s; {report.best_gflops / report.numpy_gflops:.2f}x"
            )
        print(line)
    else:
        print(
            f"  best {report.best_cost:.0f} instructions per call ({timed}; emulated board: not a wall time)"
        )
    print(f"  {report.seconds:.1f} s wall, of which {report.tuner_seconds:.1f} s in the tuner")


def _cost_text(cost: float, unit: CostUnit) -> str:
    from xtune.boards.cost import CostUnit

    if not math.isfinite(cost):
        return "-"
    if unit is not CostUnit.SECONDS:
        return f"{cost:.0f} {unit.value}"
    return f"{cost * 1e3:.4g} ms" if cost >= 1e-4 else f"{cost * 1e6:.4g} us"


class _ModelProgressBar:
    """tqdm on stderr over the model's budget; a line per batch: the task, its best, the model estimate."""

    def __init__(self, total: int, tasks: Sequence[Task], unit: CostUnit):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="trial", file=sys.stderr, dynamic_ncols=True, leave=True)
        self.tasks, self.unit = tasks, unit

    def update(self, progress: ModelProgress) -> None:
        task, unit = self.tasks[progress.task], self.unit  # the boards' unit, never a result's
        model = _cost_text(progress.estimate, unit)
        self.bar.write(f"[{progress.trials:>5}/{progress.budget}] task {progress.task + 1}/{len(self.tasks)} "
                       f"{task.workload.key} (x{task.count}): best "
                       f"{_cost_text(progress.latencies[progress.task], unit)}; model {model}",
                       file=sys.stderr)  # fmt: skip
        self.bar.set_postfix({"model": model}, refresh=False)
        self.bar.update(len(progress.batch.batch))

    def close(self) -> None:
        self.bar.close()


def _print_model_tuning(result: ModelTuningResult, log: str) -> None:
    unit = result.cost_unit
    print(f"{result.model} on {'+'.join(result.boards)} ({result.target}), {result.strategy.value}: "
          f"{result.trials} of {result.budget} trials, stopped: {result.stop.value}; log {log}")  # fmt: skip
    width = max(len("workload"), *(len(t.workload) for t in result.tasks))
    print(f"{'workload':<{width}} {'nodes':>5} {'trials':>6} {'resumed':>7} {'default':>11} {'best':>11} "
          f"{'speedup':>7}  stop")  # fmt: skip
    for t in result.tasks:
        gain = t.default_cost / t.best_cost if 0 < t.best_cost < float("inf") > t.default_cost else None
        print(f"{t.workload:<{width}} {t.count:>5} {t.trials:>6} {t.resumed:>7} "
              f"{_cost_text(t.default_cost, unit):>11} {_cost_text(t.best_cost, unit):>11} "
              f"{f'{gain:.2f}x' if gain else '-':>7}  {t.stop.value}")  # fmt: skip
    line = f"estimated end-to-end latency: {_cost_text(result.estimate, unit)}"
    if 0 < result.estimate < float("inf") > result.default_estimate:
        line += (f" (default configs: {_cost_text(result.default_estimate, unit)}, "
                 f"{result.default_estimate / result.estimate:.2f}x)")  # fmt: skip
    print(line + " = sum of node count x best latency over the tasks")


def cmd_best(args: argparse.Namespace) -> int:
    from xtune.report import format_table, summarize
    from xtune.tuning.database import read_logs

    rows = summarize(read_logs(args.log), args.workload, args.target)
    if args.json:
        _emit_json({"best": [row.as_dict() for row in rows]})
    elif rows:
        print(format_table(rows))
    else:
        raise InputError("no records match in " + ", ".join(args.log))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from xtune.report import format_table, plot_convergence, summarize
    from xtune.tuning.database import read_logs

    if args.plot:
        check_output(args.plot, "plot")
    records = read_logs(args.log)
    if not records:
        raise InputError("no usable records in " + ", ".join(args.log))
    rows = summarize(records)
    if args.json:
        _emit_json({"workloads": [row.as_dict() for row in rows], "plot": args.plot})
    else:
        print(format_table(rows))
    if args.plot:
        plot_convergence(records, args.plot)
        print(f"xtune: convergence plot written to {args.plot}", file=sys.stderr)
    return 0


def cmd_model_train(args: argparse.Namespace) -> int:
    from xtune.transfer.pretrained import TrainOptions, train_from_logs

    check_output(args.output, "model file")  # before training, not after
    start = time.perf_counter()
    options = TrainOptions(objective=args.objective, seed=args.seed, nthread=args.threads)
    with _warnings_unless_error():
        model = train_from_logs(args.log, options)
    model.save(args.output)
    seconds = time.perf_counter() - start
    m = model.manifest
    if args.json:
        _emit_json({"model": args.output, "seconds": round(seconds, 3), "manifest": m.as_dict()})
        return 0
    print(f"wrote {args.output}: {', '.join(m.ops)} booster(s) on {m.records_used} records "
          f"({len(m.groups)} workloads; targets {', '.join(m.targets)}; {m.records_skipped} skipped) "
          f"in {seconds:.1f} s")  # fmt: skip
    return 0


def cmd_model_info(args: argparse.Namespace) -> int:
    from xtune.transfer.modelfile import format_manifest, read_model

    # A model of another features version is shown (that is how one finds out), only tuning refuses it.
    manifest = read_model(args.model, check_features=False).manifest
    if args.json:
        reason = manifest.unusable_reason()
        _emit_json(
            {"model": args.model, "usable": reason is None, "reason": reason, "manifest": manifest.as_dict()}
        )
    else:
        print(format_manifest(manifest, args.model))
    return 0


def _defaults(options: type) -> dict[str, Any]:
    """The field defaults of an options dataclass (TuneOptions, MeasureOptions, TrainOptions): the one home
    of every default the CLI offers, so a flag left out means what the library means."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def cmd_tasks(args: argparse.Namespace) -> int:
    from xtune.boards.cost import gflops
    from xtune.network.tasks import extract_tasks, logged_best
    from xtune.tuning.database import read_logs

    taskset = extract_tasks(args.model, args.target)
    with _warnings_unless_error():
        records = read_logs(args.log or ())
    bests = logged_best(taskset.tasks, taskset.target, records)
    if args.json:
        _emit_json(_tasks_json(taskset, bests, args.log or []))
        return 0
    width = max(len("workload"), *(len(t.workload.key) for t in taskset.tasks)) if taskset.tasks else 8
    print(f"{'workload':<{width}} {'nodes':>5} {'flops':>6} {'MFLOP':>9}  best in log")
    for task, record in zip(taskset.tasks, bests, strict=True):
        if record is None:
            logged = "-"
        elif (speed := gflops(task.flops, record.cost, record.result.cost_unit)) is not None:
            logged = f"{speed:.1f} GFLOP/s (config {record.index})"
        else:
            logged = f"{record.cost:.0f} {record.result.cost_unit.value} (config {record.index})"
        share = 100 * taskset.share(task)
        print(
            f"{task.workload.key:<{width}} {task.count:>5} {share:>5.1f}% {task.flops / 1e6:>9.1f}  {logged}"
        )
    calls = sum(t.count for t in taskset.tasks)
    tuned = sum(r is not None for r in bests)
    print(f"{len(taskset.tasks)} tasks for {calls} kernel calls, {taskset.total_flops / 1e9:.3f} GFLOP per "
          f"inference, {tuned} with a best on {taskset.target.name}")  # fmt: skip
    if taskset.other_nodes:
        shown = ", ".join(f"{o.name} ({o.op})" for o in taskset.other_nodes)
        print(f"{len(taskset.other_nodes)} other nodes (not tuning tasks): {shown}")
    return 0


def _tasks_json(taskset: TaskSet, bests: Sequence[Record | None], logs: Sequence[str]) -> dict[str, object]:
    def best(record: Record | None) -> dict[str, object] | None:
        if record is None:
            return None
        return {"config": record.index, "cost": record.cost, "cost_unit": record.result.cost_unit.value,
                "board": record.board}  # fmt: skip

    return {
        "model": taskset.model, "target": taskset.target.name, "total_flops": taskset.total_flops,
        "logs": list(logs),
        "tasks": [
            {"workload": t.workload.key, "op": t.workload.op, "count": t.count, "nodes": list(t.nodes),
             "flops": t.flops, "share": taskset.share(t), "fused": [list(op.fused) for op in t.ops],
             "weights_transposed": list(t.transposed), "best": best(r)}
            for t, r in zip(taskset.tasks, bests, strict=True)
        ],
        "other_nodes": [{"name": o.name, "op": o.op, "kind": o.kind} for o in taskset.other_nodes],
    }  # fmt: skip


def _add_model_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    from xtune.transfer.pretrained import TrainOptions

    train = _defaults(TrainOptions)
    p = sub.add_parser("model", help="pretrained cost models for transfer learning (train, info)")
    model_sub = p.add_subparsers(dest="model_command", required=True, parser_class=_Parser)
    t = model_sub.add_parser("train", help="train a cost model on tuning logs of any workloads and targets")
    t.add_argument("log", nargs="+", help="tuning log(s), JSON lines")
    t.add_argument("-o", "--output", required=True, help="model file to write (JSON), e.g. model.json")
    t.add_argument(
        "--objective",
        choices=("reg", "rank"),
        default=train["objective"],
        help="reg: squared error on normalized throughput; rank: pairwise ranking (default %(default)s)",
    )
    t.add_argument("--seed", type=_int_in(0, 2**31 - 1), default=train["seed"])
    t.add_argument(
        "--threads",
        type=_int_in(0, 1024),
        default=train["nthread"],
        metavar="N",
        help="xgboost threads (default %(default)s; 0 = every core, best on an otherwise idle machine)",
    )
    t.add_argument("--json", action="store_true", help="one JSON object on stdout")
    t.set_defaults(handler=cmd_model_train)
    i = model_sub.add_parser("info", help="print a model file's manifest")
    i.add_argument("model")
    i.add_argument("--json", action="store_true", help="one JSON object on stdout")
    i.set_defaults(handler=cmd_model_info)


def build_parser() -> argparse.ArgumentParser:
    from xtune.network.scheduler import SchedulerOptions, Strategy
    from xtune.tuning.measure import MeasureOptions
    from xtune.tuning.run import TuneOptions
    from xtune.tuning.session import CONFIRM_TIMINGS

    tune, measure, scheduler = _defaults(TuneOptions), _defaults(MeasureOptions), _defaults(SchedulerOptions)
    parser = _Parser(prog="xtune", description="Auto-tune tensor kernels for embedded targets.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("targets", help="list target descriptors")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_targets)

    p = sub.add_parser("boards", help="list boards (SSH ones with their reachability)")
    p.add_argument("--boards", type=Path, default=None, help="boards.toml (default: ./boards.toml, "
                   "then ~/.config/xtune/boards.toml)")  # fmt: skip
    p.add_argument(
        "--timeout", type=_float_in(0.001, 3600), default=3.0, help="seconds per SSH reachability check"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_boards)

    p = sub.add_parser("deploy", help="build and upload the agent to an SSH board, record its fingerprint")
    p.add_argument("--board", required=True)
    p.add_argument("--boards", type=Path, default=None, help="boards.toml (default: ./boards.toml, "
                   "then ~/.config/xtune/boards.toml)")  # fmt: skip
    p.add_argument("--accept-new-host-key", action="store_true",
                   help="trust the host key offered if known_hosts has none, and record it")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(handler=cmd_deploy)

    p = sub.add_parser("tune", help="tune a workload, or every task of an ONNX model under one budget, on a "
                       "board; every measurement goes to the log")  # fmt: skip
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--workload")
    what.add_argument("--model", metavar="MODEL.onnx", help="tune every task of the model (see `xtune "
                      "tasks`) under the one budget of --trials, with a task scheduler")  # fmt: skip
    p.add_argument("--strategy", choices=[s.value for s in Strategy], default=scheduler["strategy"].value,
                   help="--model: which task gets the next batch: the largest expected gain of the model's "
                   "latency (gradient), or each in turn (default %(default)s)")  # fmt: skip
    p.add_argument("--board", action="append", help="board name; repeat for parallel boards of one target")
    p.add_argument(
        "--boards", type=Path, metavar="FILE", help="boards.toml (default: ./boards.toml, ~/.config/xtune/)"
    )
    p.add_argument("--target", default=None, help="code to tune on the local board (default: the host's "
                   "target), e.g. x86-sse42 on an AVX2 host")  # fmt: skip
    p.add_argument("--trials", type=_int_in(1, 10**9), default=tune["trials"], metavar="N",
                   help="new trials to measure in this run (default %(default)s): configs already in the "
                   "log for this workload, target and cpu are resumed, not measured again, and do not "
                   "count")  # fmt: skip
    p.add_argument("--tuner", choices=TUNERS, default=tune["tuner"])
    p.add_argument("--log", default="xtune-log.jsonl", help="tuning log (JSON lines), appended and resumed")
    p.add_argument(
        "--early-stopping",
        type=_int_in(1, 10**9),
        default=tune["early_stopping"],
        metavar="N",
        help="stop after N trials without gain (with --model: each task)",
    )
    p.add_argument("--seed", type=_int_in(0, U32), default=tune["seed"])
    p.add_argument("--batch-size", type=_int_in(1, 4096), default=tune["batch_size"])
    p.add_argument("--repeat", type=_int_in(1, MAX_REPEAT), default=measure["repeat"],
                   help="timed repeats per candidate")  # fmt: skip
    p.add_argument("--min-repeat-ms", type=_float_in(0, U32 / 1000), default=measure["min_repeat_ms"])
    p.add_argument("--timeout-ms", type=_int_in(1, U32), default=measure["timeout_ms"],
                   help="deadline per kernel call/repeat")  # fmt: skip
    p.add_argument("--confirm", type=_int_in(0, 1024), default=tune["confirm"], metavar="K",
                   help=f"at the end, time the K fastest configs again until each has {CONFIRM_TIMINGS} "
                   "timings; the best is the lowest median, not the luckiest single timing "
                   "(default %(default)s; 0 = off)")  # fmt: skip
    p.add_argument(
        "--transfer-from",
        action="extend",
        nargs="+",
        metavar="SOURCE",
        help="pretrained cost model: a model file, tuning log(s) to train on, or 'builtin'",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(handler=cmd_tune)

    p = sub.add_parser("best", help="the best correct config per workload and target in tuning logs")
    p.add_argument("--log", required=True, action="append")
    p.add_argument("--workload")
    p.add_argument("--target")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_best)

    p = sub.add_parser("report", help="summary table of a tuning log, and a convergence plot")
    p.add_argument("log", nargs="+")
    p.add_argument("--plot", metavar="PNG", help="write the convergence plot (needs xtune[plot])")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser("bench", help="default (or given) config vs numpy and ONNX Runtime, in one run; "
                       "or a whole network (--model) against ONNX Runtime")  # fmt: skip
    p.add_argument("--workload", default=None, help='e.g. "matmul:m=512,n=512,k=512"')
    p.add_argument("--model", default=None, help="ONNX model: build, run and check the whole network")
    p.add_argument("--log", action="append", help="with --model: tuning log(s) to take the best configs from")
    p.add_argument("--board", default="local")
    p.add_argument("--boards", type=Path, metavar="FILE", help="boards.toml for SSH boards")
    p.add_argument("--config", type=_int_in(0, 2**63 - 1), default=None,
                   help="config index (default: the template's default)")  # fmt: skip
    p.add_argument("--target", default=None, help="code to run on the local board (default: the host's "
                   "target), e.g. x86-sse42 on an AVX2 host")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(handler=cmd_bench)

    p = sub.add_parser("build", help="one object + C header of the best (or default) kernels for firmware")
    p.add_argument("--target", required=True, help="target name, see `xtune targets`")
    p.add_argument("--workload", action="append", help="repeat for each kernel")
    p.add_argument("--model", default=None, help="ONNX model: one object running the whole network")
    p.add_argument("--log", action="append", help="tuning log(s) to take the best configs from")
    p.add_argument("-o", "--output", required=True, help="relocatable object to write, e.g. kernels.o")
    p.add_argument("--header", required=True, help="C header to write, e.g. kernels.h")
    p.add_argument("--archive", default=None, help="also write a static library, e.g. libkernels.a")
    p.add_argument("--prefix", default=None, help="entry point prefix (default: xt; net with --model)")
    p.add_argument("--reference", default=None, help="with --model: also write a reference file (a random "
                   "input and ONNX Runtime's output) for a firmware's self-test")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(handler=cmd_build)

    p = sub.add_parser("tasks", help="the unique tuning tasks of an ONNX model (fused epilogues included)")
    p.add_argument("model", help="ONNX model file, e.g. resnet18.onnx")
    p.add_argument("--target", default=None, help="target name (default: the host's target)")
    p.add_argument("--log", action="append", help="tuning log(s): show which tasks already have a best")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(handler=cmd_tasks)

    _add_model_parser(sub)
    return parser


def _show_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    """Every warning as one line (Python's default format adds the source line that raised it)."""
    text = " ".join(str(message).split())
    print(f"xtune: warning: {text}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    with warnings.catch_warnings():  # restored on return: main() may run in a caller's process
        warnings.simplefilter("default")  # each warning once per run (and a fresh registry per call)
        warnings.showwarning = _show_warning
        return _run(handler, args)


def _run(handler: Handler, args: argparse.Namespace) -> int:
    try:
        return handler(args)
    except XtuneError as err:
        print(f"xtune: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except MemoryError:
        print("xtune: error: out of memory (a workload's tensors are bounded, see README.md; "
              "their sum may still exceed this machine's)", file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        print("xtune: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`xtune report log | head`): not an error of ours. Point stdout at
        # /dev/null so that the interpreter's final flush does not raise again (Python docs, "SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
