"""`xtune tune`: one workload (--workload) or every task of an ONNX model (--model) under one budget."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from xtune.cli.common import _emit_json, _warnings_unless_error
from xtune.cli.networks import model_layout
from xtune.cli.progress import _ModelProgressBar, _print_model_tuning, _print_tuning, _ProgressBar

if TYPE_CHECKING:
    from xtune.boards.board import Board
    from xtune.ops.layout import Layout
    from xtune.transfer.pretrained import TransferSource
    from xtune.tuning.costmodel import CostModel
    from xtune.tuning.database import TuningLog
    from xtune.tuning.options import TuneOptions


def cmd_tune(args: argparse.Namespace) -> int:
    from xtune.boards.board import get_board
    from xtune.ops.registry import parse_workload, template_for
    from xtune.tuning.database import TuningLog
    from xtune.tuning.features import features_op
    from xtune.tuning.loop import StopReason
    from xtune.tuning.run import local_numpy_gflops, run_tuning

    layout = model_layout(args)
    workload = parse_workload(args.workload) if args.workload is not None else None
    boards = [get_board(name, args.boards, target=args.target) for name in (args.board or ["local"])]
    log = TuningLog(args.log)
    if workload is None:
        return _tune_model(args, boards, log, layout)
    # A pointwise conv2d is tuned as the matmul it lowers to: that operator's model scores its configs.
    op = features_op(template_for(workload, boards[0].target))
    used: dict[str, object] = {}

    def transfer() -> tuple[CostModel | None, bool]:
        """The --transfer-from model, loaded (or trained) once the run is checked."""
        source, model = _transfer_source(args, boards[0], op)
        if source is None:
            return None, False
        used.update(source.as_dict())
        return model, not source.saw(boards[0].target)

    options = _tune_options(args)
    numpy_gflops = local_numpy_gflops(workload, boards)
    bar = _ProgressBar(
        args.trials, workload.flops(), numpy_gflops, options.measure.unit_on(boards[0].cost_unit)
    )
    try:
        report = run_tuning(
            workload,
            boards,
            options,
            log,
            bar.update,
            numpy_gflops,
            reads=_reads(args),
            transfer=transfer if args.transfer_from else None,
        )
    finally:
        bar.close()
    if args.json:
        _emit_json({**report.as_dict(), "log": str(args.log), "transfer": used or None})
    else:
        _print_tuning(report, args.log)
    return _exit_status(
        interrupted=report.stop is StopReason.INTERRUPTED,
        board_failed=report.stop is StopReason.BOARD_FAILED,
        error=report.error,
    )


def _reads(args: argparse.Namespace) -> list[tuple[str | None, str]]:
    """The files the run reads, which the log must not be: the model, the --transfer-from sources."""
    sources = [s for s in args.transfer_from or () if s != "builtin"]
    return [(args.model, "model"), *((s, "--transfer-from source") for s in sources)]


def _tune_options(args: argparse.Namespace) -> TuneOptions:
    from xtune.tuning.options import MeasureOptions, TuneOptions

    return TuneOptions(
        tuner=args.tuner,
        trials=args.trials,
        batch_size=args.batch_size,
        early_stopping=args.early_stopping,
        seed=args.seed,
        measure=MeasureOptions(
            repeat=args.repeat,
            min_repeat_ms=args.min_repeat_ms,
            timeout_ms=args.timeout_ms,
            cold_weights=args.cold_weights,
        ),
        confirm=args.confirm,
    )


def _tune_model(args: argparse.Namespace, boards: list[Board], log: TuningLog, layout: Layout) -> int:
    """`xtune tune --model`: every task of the model under one budget (xtune.tuning.task_scheduler)."""
    from xtune.frontend.tasks import extract_tasks
    from xtune.ops.registry import template_for
    from xtune.tuning.allocation import SchedulerOptions, parse_strategy
    from xtune.tuning.features import features_op
    from xtune.tuning.results import ModelStop
    from xtune.tuning.task_scheduler import tune_tasks

    taskset = extract_tasks(args.model, boards[0].target, layout)
    used: dict[str, object] = {}

    def transfer() -> dict[str, tuple[CostModel, bool]]:
        """Each operator's --transfer-from model (and whether the estimate hedges it), loaded (or trained)
        once the run is checked."""
        pretrained: dict[str, tuple[CostModel, bool]] = {}
        source: TransferSource | None = None
        ops = {features_op(template_for(t.workload, boards[0].target)) for t in taskset.tasks}  # as the run
        for op in sorted(ops):
            if source is None or source.kind == "builtin":  # the built-in model is chosen per operator
                source, model = _transfer_source(args, boards[0], op)
            else:  # one model file, or logs trained on once, has a booster per operator
                model = source.model.cost_model(op)
            if source is not None and model is not None:
                pretrained[op] = (model, not source.saw(boards[0].target))
                used[op] = source.as_dict()
        return pretrained

    options = _tune_options(args)
    bar = _ModelProgressBar(args.trials, taskset.tasks, options.measure.unit_on(boards[0].cost_unit))
    try:
        result = tune_tasks(
            taskset.tasks,
            boards,
            options,
            log,
            model=taskset.model,
            scheduler=SchedulerOptions(strategy=parse_strategy(args.strategy)),
            on_progress=bar.update,
            reads=_reads(args),
            transfer=transfer if args.transfer_from else None,
        )
    finally:
        bar.close()
    if args.json:
        _emit_json({**result.as_dict(), "log": str(args.log), "transfer": used or None})
    else:
        _print_model_tuning(result, args.log)
    return _exit_status(
        interrupted=result.stop is ModelStop.INTERRUPTED,
        board_failed=result.stop is ModelStop.BOARD_FAILED,
        error=result.error,
    )


def _exit_status(*, interrupted: bool, board_failed: bool, error: str) -> int:
    """How a tuning run that ended ends the command: 130 after Ctrl-C, 2 with one error line when a board
    failed for good (the summary printed before says what was measured; the log has it all), else 0."""
    if interrupted:
        print("xtune: interrupted; every finished measurement is in the log", file=sys.stderr)
        return 130
    if board_failed:
        print(f"xtune: error: {error}", file=sys.stderr)
        return 2
    return 0


def _transfer_source(
    args: argparse.Namespace, board: Board, op: str
) -> tuple[TransferSource | None, CostModel | None]:
    """The source of --transfer-from (trained here if logs are given) and its model for `op`, or Nones."""
    if not args.transfer_from:
        return None, None
    from xtune.transfer.pretrained import load_source

    with _warnings_unless_error():
        source = load_source(args.transfer_from, board.target, op, cpu=board.fingerprint().get("cpu"))
    pretrained = source.model.cost_model(op)
    m = source.model.manifest
    print(
        f"xtune: transfer from {source.kind} {', '.join(source.paths)} ({m.records_used} records of "
        f"{', '.join(m.targets)}, trained {m.created})",
        file=sys.stderr,
    )
    return source, pretrained
