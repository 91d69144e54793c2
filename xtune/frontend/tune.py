"""A network's tuning: an ONNX model (path or ModelProto), boards and one trial budget in; its tasks
(xtune/frontend/tasks.py) tuned by the task scheduler (xtune/tuning/task_scheduler.py) and the result out,
what `xtune tune --model` and `xtune.tune_model` run."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from xtune.boards.board import Board, get_board
from xtune.errors import InputError
from xtune.frontend.load import Source
from xtune.frontend.tasks import extract_tasks
from xtune.ops.layout import parse_layout
from xtune.tuning.allocation import SchedulerOptions, Strategy, parse_strategy
from xtune.tuning.database import TuningLog
from xtune.tuning.options import TuneOptions
from xtune.tuning.results import ModelProgress, ModelTuningResult
from xtune.tuning.task_scheduler import tune_tasks


def tune_model(
    model: Source,
    *,
    board: str | Board | Sequence[str | Board] = "local",
    boards_file: str | os.PathLike[str] | None = None,
    target: str | None = None,
    trials: int | None = None,
    log: str | os.PathLike[str] | TuningLog | None = None,
    options: TuneOptions | None = None,
    strategy: Strategy | str = Strategy.GRADIENT,
    on_progress: Callable[[ModelProgress], None] | None = None,
    layout: str = "nhwc",
) -> ModelTuningResult:
    """Tune every task of an ONNX model (path or ModelProto) on `board` (a name, a Board, or several of
    one target) under one budget of `trials` (default: options.trials), the network run in `layout`
    (xtune/ops/layout.py), appending to `log` and resuming from it: what `xtune tune --model` does. The
    run is checked once, by the task scheduler (xtune.tuning.session.check_run), before the log is read."""
    where = parse_layout(layout)  # before any board is opened
    chosen = parse_strategy(strategy)
    options = options or TuneOptions()
    options = replace(options, trials=trials) if trials is not None else options
    if options.trials < 1:
        raise InputError("trials must be at least 1")
    items = [board] if isinstance(board, str) or not isinstance(board, Sequence) else list(board)
    path = Path(boards_file) if boards_file is not None else None
    boards = [get_board(b, path, target=target) if isinstance(b, str) else b for b in items]
    if not boards:
        raise InputError("no board to tune on")
    tuning_log = log if isinstance(log, TuningLog) or log is None else TuningLog(log)
    taskset = extract_tasks(model, boards[0].target, where)
    return tune_tasks(
        taskset.tasks,
        boards,
        options,
        tuning_log,
        model=taskset.model,
        scheduler=SchedulerOptions(strategy=chosen),
        on_progress=on_progress,
        reads=[(model if isinstance(model, str | os.PathLike) else None, "model")],
    )
