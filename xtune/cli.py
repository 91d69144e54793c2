"""The command line: argv in, library calls and a table or one JSON object out; errors: one line, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from xtune.errors import InputError, XtuneError
from xtune.tuning.tuner import TUNERS

if TYPE_CHECKING:
    from xtune.boards.board import Board
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
    from xtune.boards.ssh import SshBoard, probe

    rows = []
    for name in board_names(args.boards):
        board = get_board(name, args.boards)
        row: dict[str, object] = {
            "name": name,
            "target": board.target.name,
            "kind": "built-in",
            "timing": board.wall_time_is_meaningful,
            "cost_unit": board.cost_unit,
        }
        if isinstance(board, SshBoard):  # a short connect per SSH board: reachable, or why not
            why = probe(board, timeout=args.timeout)
            row.update(kind="ssh", host=board.config.host, reachable=not why, reason=why)
        rows.append(row)
    if args.json:
        _emit_json({"boards": rows})
        return 0
    for row in rows:
        cost = {"s": "wall time", "insn": "instructions (emulated)"}.get(str(row["cost_unit"]), "")
        cost = cost if row["timing"] or row["cost_unit"] == "insn" else "correctness only (emulated)"
        status = ""
        if row["kind"] == "ssh":
            state = "reachable" if row["reachable"] else f"unreachable: {row['reason']}"
            status = f"  ssh {row['host']}: {state}"
        print(f"{row['name']:<16} {row['target']:<14} {cost}{status}")
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
        if report.status.value != "ok":
            print(f"  xtune  {report.status.value}: {report.error}")
        elif not board.wall_time_is_meaningful or report.gflops == 0.0:
            print(f"  xtune  correct on an emulated board; {report.error or 'wall time is not a speed here'}")
        else:
            print(
                f"  xtune  {report.gflops:8.1f} GFLOP/s  ({d['percent_of_peak']}% of nominal peak), correct"
            )
        print(f"  numpy  {report.numpy_gflops:8.1f} GFLOP/s  (single thread on this host, same run)")
        if board.wall_time_is_meaningful and report.gflops:
            print(f"  ratio  {report.ratio:8.2f}x numpy")
    return 0 if report.status.value == "ok" else 1


def cmd_build(args: argparse.Namespace) -> int:
    from xtune.artifact import build

    artifact = build(args.target, args.workload, args.log or (), args.prefix)
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


def cmd_tune(args: argparse.Namespace) -> int:
    from xtune.boards.board import get_board
    from xtune.tuning.database import TuningLog
    from xtune.tuning.run import local_numpy_gflops, run_tuning
    from xtune.workload import parse_workload

    if args.trials < 1:
        raise InputError("--trials must be at least 1")
    if args.confirm < 0:
        raise InputError("--confirm must be 0 or more")
    boards = [get_board(name, args.boards, target=args.target) for name in (args.board or ["local"])]
    log = TuningLog(args.log)
    log.check_appendable()  # run_tuning checks too, but only after training --transfer-from logs
    if args.model:
        return _tune_model(args, boards, log)
    workload = parse_workload(args.workload)
    transfer, pretrained = _transfer_source(args, boards[0], workload.op)
    options = _tune_options(args)
    numpy_gflops = local_numpy_gflops(workload, boards)
    bar = _ProgressBar(args.trials, workload.flops(), numpy_gflops)
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
    if report.stop == "interrupted":
        print("xtune: interrupted; every finished measurement is in the log", file=sys.stderr)
        return 130
    return 0


def _tune_options(args: argparse.Namespace) -> TuneOptions:
    from xtune.tuning.measure import MeasureOptions
    from xtune.tuning.run import TuneOptions

    return TuneOptions(
        args.tuner, args.trials, args.batch_size, args.early_stopping, args.seed,
        MeasureOptions(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, timeout_ms=args.timeout_ms),
        confirm=args.confirm,
    )  # fmt: skip


def _tune_model(args: argparse.Namespace, boards: list[Board], log: TuningLog) -> int:
    """`xtune tune --model`: every task of the model under one budget (xtune.network.scheduler)."""
    from xtune.network.scheduler import SchedulerOptions, Strategy, tune_tasks
    from xtune.network.tasks import extract_tasks

    taskset = extract_tasks(args.model, boards[0].target)
    pretrained: dict[str, tuple[CostModel, bool]] = {}
    used: dict[str, object] = {}
    source: TransferSource | None = None
    for op in sorted({t.workload.op for t in taskset.tasks}):
        if source is None or source.kind == "builtin":  # the built-in model is chosen per operator
            source, model = _transfer_source(args, boards[0], op)
        else:  # one model file, or logs trained on once, has a booster per operator
            model = source.model.cost_model(op)
        if source is not None and model is not None:
            pretrained[op] = (model, not source.saw(boards[0].target))
            used[op] = source.as_dict()
    bar = _ModelProgressBar(args.trials, taskset.tasks)
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
    if result.stop.value == "interrupted":
        print("xtune: interrupted; every finished measurement is in the log", file=sys.stderr)
        return 130
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
    with _plain_warnings():
        source = load_source(args.transfer_from, board.target, op, cpu=board.fingerprint().get("cpu"))
    pretrained = source.model.cost_model(op)
    m = source.model.manifest
    print(f"xtune: transfer from {source.kind} {', '.join(source.paths)} ({m.records_used} records of "
          f"{', '.join(m.targets)}, trained {m.created})", file=sys.stderr)  # fmt: skip
    return source, pretrained


@contextlib.contextmanager
def _plain_warnings() -> Iterator[None]:
    """xtune's own warnings (skipped log lines or records) as one "xtune: warning:" line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        print(f"xtune: warning: {w.message}", file=sys.stderr)


class _ProgressBar:
    """tqdm on stderr: trials done, best GFLOP/s, % of numpy, failures, ETA."""

    def __init__(self, total: int, flops: int, numpy_gflops: float | None):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="trial", file=sys.stderr, dynamic_ncols=True, leave=True)
        self.flops, self.numpy_gflops, self.failed = flops, numpy_gflops, 0

    def update(self, progress: TuneProgress) -> None:
        self.failed += sum(1 for r in progress.results if not r.ok)
        post: dict[str, object] = {"failed": self.failed}
        if progress.best_cost < float("inf") and progress.results[0].cost_unit == "s":
            gflops = self.flops / progress.best_cost / 1e9
            post["best"] = f"{gflops:.1f} GFLOP/s"
            if self.numpy_gflops:
                post["numpy"] = f"{100 * gflops / self.numpy_gflops:.0f}%"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(len(progress.batch))

    def close(self) -> None:
        self.bar.close()


def _print_tuning(report: TuningReport, log: str) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in report.counts if v)
    print(f"{report.workload} on {'+'.join(report.boards)} ({report.target}): {report.trials} trials"
          f" ({counts}), {report.resumed} resumed from {log}, stopped: {report.stop}")  # fmt: skip
    if report.best_index is None:
        print("  no correct config yet")
        return
    knobs = ", ".join(f"{k}={v}" for k, v in report.best_knobs)
    print(f"  best config #{report.best_index}: {knobs}")
    timed = f"median of {report.best_timings} timings" if report.best_timings > 1 else "timed once"
    if report.best_gflops is not None:
        line = f"  best {report.best_gflops:.1f} GFLOP/s ({report.best_cost * 1e3:.3f} ms, {timed})"
        if report.numpy_gflops:
            line += (
                f"; numpy {report.numpy_gflops:.1f} GFLOP/s; {report.best_gflops / report.numpy_gflops:.2f}x"
            )
        print(line)
    else:
        print(f"  best {report.best_cost:.0f} instructions per call (emulated board: not a wall-time figure)")
    print(f"  {report.seconds:.1f} s wall, of which {report.tuner_seconds:.1f} s in the tuner")


def _cost_text(cost: float, unit: str) -> str:
    if cost == float("inf"):
        return "-"
    if unit != "s":
        return f"{cost:.0f} {unit}"
    return f"{cost * 1e3:.4g} ms" if cost >= 1e-4 else f"{cost * 1e6:.4g} us"


class _ModelProgressBar:
    """tqdm on stderr over the model's budget; a line per batch: the task, its best, the model estimate."""

    def __init__(self, total: int, tasks: Sequence[Task]):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="trial", file=sys.stderr, dynamic_ncols=True, leave=True)
        self.tasks = tasks

    def update(self, progress: ModelProgress) -> None:
        task, unit = self.tasks[progress.task], progress.batch.results[0].cost_unit
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

    records = read_logs(args.log)
    rows = summarize(records)
    if args.json:
        _emit_json({"workloads": [row.as_dict() for row in rows], "plot": args.plot})
    else:
        print(format_table(rows))
    if args.plot:
        plot_convergence(records, args.plot)
        print(f"convergence plot written to {args.plot}", file=sys.stderr)
    return 0


def cmd_model_train(args: argparse.Namespace) -> int:
    from xtune.transfer.pretrained import TrainOptions, train_from_logs

    if args.threads < 0:
        raise InputError("--threads must be 0 (every core) or more")
    if not Path(args.output).resolve().parent.is_dir():  # before training, not after
        raise InputError(f"cannot write the model file {args.output}: no directory "
                         f"{Path(args.output).resolve().parent}")  # fmt: skip
    start = time.perf_counter()
    with _plain_warnings():
        options = TrainOptions(objective=args.objective, seed=args.seed, nthread=args.threads)
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


def cmd_tasks(args: argparse.Namespace) -> int:
    from xtune.network.tasks import extract_tasks, logged_best
    from xtune.tuning.database import read_logs

    taskset = extract_tasks(args.model, args.target)
    with _plain_warnings():
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
        elif record.result.cost_unit == "s":
            logged = f"{task.flops / record.cost / 1e9:.1f} GFLOP/s (config {record.index})"
        else:
            logged = f"{record.cost:.0f} {record.result.cost_unit} (config {record.index})"
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
        return {"config": record.index, "cost": record.cost, "cost_unit": record.result.cost_unit,
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
    p = sub.add_parser("model", help="pretrained cost models for transfer learning (train, info)")
    model_sub = p.add_subparsers(dest="model_command", required=True, parser_class=_Parser)
    t = model_sub.add_parser("train", help="train a cost model on tuning logs of any workloads and targets")
    t.add_argument("log", nargs="+", help="tuning log(s), JSON lines")
    t.add_argument("-o", "--output", required=True, help="model file to write (JSON), e.g. model.json")
    t.add_argument(
        "--objective",
        choices=("reg", "rank"),
        default="reg",
        help="reg: squared error on normalized throughput (default); rank: pairwise ranking",
    )
    t.add_argument("--seed", type=int, default=0)
    t.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="xgboost threads (default 1; 0 = every core, best on an otherwise idle machine)",
    )
    t.add_argument("--json", action="store_true", help="one JSON object on stdout")
    t.set_defaults(handler=cmd_model_train)
    i = model_sub.add_parser("info", help="print a model file's manifest")
    i.add_argument("model")
    i.add_argument("--json", action="store_true", help="one JSON object on stdout")
    i.set_defaults(handler=cmd_model_info)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="xtune", description="Auto-tune tensor kernels for embedded targets.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("targets", help="list target descriptors")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_targets)

    p = sub.add_parser("boards", help="list boards (SSH ones with their reachability)")
    p.add_argument("--boards", type=Path, default=None, help="boards.toml (default: ./boards.toml, "
                   "then ~/.config/xtune/boards.toml)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per SSH reachability check")
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
    p.add_argument("--strategy", choices=("gradient", "round-robin"), default="gradient",
                   help="--model: which task gets the next batch: the largest expected gain of the model's "
                   "latency (default), or each in turn")  # fmt: skip
    p.add_argument("--board", action="append", help="board name; repeat for parallel boards of one target")
    p.add_argument("--boards", metavar="FILE", help="boards.toml (default: ./boards.toml, ~/.config/xtune/)")
    p.add_argument("--target", default=None, help="code to tune on the local board (default: the host's "
                   "target), e.g. x86-sse42 on an AVX2 host")  # fmt: skip
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--tuner", choices=TUNERS, default="xgb")
    p.add_argument("--log", default="xtune-log.jsonl", help="tuning log (JSON lines), appended and resumed")
    p.add_argument(
        "--early-stopping",
        type=int,
        default=None,
        metavar="N",
        help="stop after N trials without gain (with --model: each task)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3, help="timed repeats per candidate")
    p.add_argument("--min-repeat-ms", type=float, default=10.0)
    p.add_argument("--timeout-ms", type=int, default=10_000, help="deadline per kernel call/repeat")
    p.add_argument("--confirm", type=int, default=3, metavar="K",
                   help="at the end, time the K fastest configs again until each has 3 timings; the best is "
                   "the lowest median, not the luckiest single timing (default 3; 0 = off)")  # fmt: skip
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

    p = sub.add_parser("bench", help="default (or given) config vs numpy, measured in one run")
    p.add_argument("--workload", required=True, help='e.g. "matmul:m=512,n=512,k=512"')
    p.add_argument("--board", default="local")
    p.add_argument("--boards", metavar="FILE", help="boards.toml for SSH boards")
    p.add_argument("--config", type=int, default=None, help="config index (default: the template's default)")
    p.add_argument("--target", default=None, help="code to run on the local board (default: the host's "
                   "target), e.g. x86-sse42 on an AVX2 host")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(handler=cmd_bench)

    p = sub.add_parser("build", help="one object + C header of the best (or default) kernels for firmware")
    p.add_argument("--target", required=True, help="target name, see `xtune targets`")
    p.add_argument("--workload", action="append", required=True, help="repeat for each kernel")
    p.add_argument("--log", action="append", help="tuning log(s) to take the best configs from")
    p.add_argument("-o", "--output", required=True, help="relocatable object to write, e.g. kernels.o")
    p.add_argument("--header", required=True, help="C header to write, e.g. kernels.h")
    p.add_argument("--archive", default=None, help="also write a static library, e.g. libkernels.a")
    p.add_argument("--prefix", default="xt", help="entry point prefix (default: xt)")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except XtuneError as err:
        print(f"xtune: error: {err}", file=sys.stderr)
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
