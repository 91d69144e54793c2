"""The commands on a whole ONNX model: `xtune tasks`, `xtune build --model`, `xtune bench --model`."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xtune.cli.common import _emit_json, _warnings_unless_error, one_line
from xtune.errors import InputError

if TYPE_CHECKING:
    from xtune.boards.board import Board
    from xtune.firmware.profile import NetProfile
    from xtune.frontend.tasks import TaskSet
    from xtune.ops.layout import Layout
    from xtune.target import Target
    from xtune.tuning.database import Record


def model_layout(args: argparse.Namespace) -> Layout:
    """--layout (default: xtune/ops/layout.py's), which only a model takes."""
    from xtune.ops.layout import DEFAULT, parse_layout

    if args.layout is not None and getattr(args, "model", None) is None:
        raise InputError("--layout is the layout a whole network (--model) runs in")
    return DEFAULT if args.layout is None else parse_layout(args.layout)


def _bench_model(args: argparse.Namespace) -> int:
    from xtune.boards.board import get_board
    from xtune.firmware.network_bench import bench_model

    if args.workload is not None or args.config is not None:
        raise InputError("--model benches a whole network: --workload and --config are for one kernel")
    board = get_board(args.board, args.boards, target=args.target)
    if args.profile:
        from xtune.firmware.profile import check_board

        check_board(board)  # before building and running anything
    with _warnings_unless_error():
        report = bench_model(
            args.model,
            board,
            args.log or (),
            layout=model_layout(args),
            refuse_nonfinite=args.refuse_nonfinite,
        )
    profile = _profile(args, board) if args.profile and report.correct else None
    if args.json:
        _emit_json({**report.as_dict(), **({"profile": profile.as_dict()} if profile else {})})
        return 0 if report.correct else 1
    model = one_line(report.model)
    print(
        f"{model} on {report.board} ({report.target}, {report.layout}): {report.kernels} kernels "
        f"({report.defaults} at the default config), workspace {report.workspace_bytes} B"
    )
    if not report.correct:
        print(f"  xtune  WRONG against {report.peer}: {report.error}")
        print(f"  check  {report.check}")
        return 1
    print(f"  xtune  matches {report.peer} (max abs error {report.max_abs_error:.3g})")
    print(f"  check  {report.check}")
    if report.seconds is not None:
        print(f"  xtune  {report.seconds * 1e3:9.3f} ms per inference")
    elif report.instructions is not None:
        print(f"  xtune  {report.instructions:.0f} instructions per inference (emulated: no wall time)")
    elif report.cycles is not None:
        print(f"  xtune  {report.cycles:.0f} cycles per inference (emulated estimate: no wall time)")
    if report.ort_seconds is not None:
        peer = f"{report.peer}, 1 thread, same run"
        print(f"  peer   {report.ort_seconds * 1e3:9.3f} ms per inference ({peer})")
    if report.ratio_vs_ort is not None:
        print(f"  ratio  {report.ratio_vs_ort:9.2f}x {report.peer}'s speed")
    if profile is not None:
        _print_profile(profile)
    return 0


def _profile(args: argparse.Namespace, board: Board) -> NetProfile:
    from xtune.firmware.profile import profile_model

    with _warnings_unless_error():
        return profile_model(args.model, board, args.log or (), layout=model_layout(args))


def _print_profile(profile: NetProfile) -> None:
    """The steps in execution order: time in the network, share, and the log's standalone latency."""
    total = sum(s.seconds for s in profile.steps)
    # Each step's median leaves out the runs it was preempted in, the median inference does not: on a
    # busy machine the steps sum to less.
    print(
        f"profile: {len(profile.steps)} steps, median of {profile.runs} runs: {profile.seconds * 1e3:.3f} "
        f"ms per profiled inference, the steps' medians sum to {total * 1e3:.3f} ms "
        f"(counter {profile.ticks_per_second / 1e6:.0f} MHz)"
    )
    print(f"  {'step':>4} {'us':>9} {'share':>6} {'alone us':>9} {'ratio':>6}  kernel")
    for s in profile.steps:
        alone = f"{s.standalone * 1e6:9.1f}" if s.standalone is not None else f"{'-':>9}"
        ratio = f"{s.ratio:6.2f}" if s.ratio is not None else f"{'-':>6}"
        print(
            f"  {s.index:>4} {s.seconds * 1e6:9.1f} {100 * s.seconds / total:5.1f}% {alone} {ratio}  "
            f"{s.label}"
        )
    tuned = [s for s in profile.steps if s.standalone is not None]
    if tuned:
        inside = sum(s.seconds for s in tuned)
        standalone, rest = profile.estimate, total - inside
        print(
            f"  tuned steps: {inside * 1e3:.3f} ms in the network, {standalone * 1e3:.3f} ms alone "
            f"(x{inside / standalone:.2f}); other steps: {rest * 1e3:.3f} ms"
        )


def _build_model(args: argparse.Namespace, target: Target) -> int:
    from xtune.firmware.network_bench import build_model_files

    if args.workload or args.archive:
        raise InputError("--model builds one network object: --workload and --archive are for kernels")
    start = time.perf_counter()
    with _warnings_unless_error():
        artifact = build_model_files(
            args.model,
            target,
            object_path=args.output,
            header_path=args.header,
            reference_path=args.reference,
            logs=args.log or (),
            prefix=args.prefix or "net",
            layout=model_layout(args),
            profile=args.profile,
            refuse_nonfinite=args.refuse_nonfinite,
        )
    seconds = time.perf_counter() - start
    for warning in artifact.warnings:
        print(f"xtune: warning: {one_line(warning)}", file=sys.stderr)
    if args.json:
        _emit_json(
            {
                **artifact.as_dict(),
                "object": args.output,
                "header": args.header,
                "reference": args.reference,
                "seconds": round(seconds, 3),
            }
        )
        return 0
    plan = artifact.program.memory
    print(f"{'kernel':<10} {'source':<9} {'config':>10} {'calls':>5} {'stack':>9}  computes")
    for k in artifact.kernels:
        config = f"{k.config_index:>10}" if k.config_index is not None else f"{'-':>10}"
        print(f"{k.symbol:<10} {k.source:<9} {config} {k.calls:>5} {k.stack_bytes:>7} B  {k.what}")
    print(
        f"{artifact.entry}: {len(artifact.program.calls)} calls in {artifact.program.layout.value}, "
        f"workspace {plan.workspace_bytes} bytes (lower bound {plan.lower_bound}, "
        f"{plan.intermediate_bytes} of intermediates), stack {artifact.stack_bytes} bytes, weights "
        f"{artifact.weights_bytes} bytes"
    )
    wrote = ", ".join(p for p in (args.output, args.header, args.reference) if p)
    print(f"{artifact.target.name}: wrote {one_line(wrote)} in {seconds:.1f} s")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from xtune.boards.cost import gflops
    from xtune.firmware.program import unsupported as unsupported_nodes
    from xtune.frontend.load import load_graph
    from xtune.frontend.refusal import refusal
    from xtune.frontend.tasks import extract_tasks, logged_best
    from xtune.tuning.database import read_logs

    graph = load_graph(args.model)
    # What a whole-network build refuses, the generated operators' attribute checks included: the text
    # form refuses it as `xtune build` does, the JSON lists it.
    unsupported = unsupported_nodes(graph, model_layout(args))
    if unsupported and not args.json:
        raise refusal(graph.name, unsupported)
    taskset = extract_tasks(graph, args.target, model_layout(args), partial=True)
    with _warnings_unless_error():
        records = read_logs(args.log or ())
    bests = logged_best(taskset.tasks, taskset.target, records)
    if args.json:
        _emit_json(
            {**_tasks_json(taskset, bests, args.log or []), "unsupported": [u.as_dict() for u in unsupported]}
        )
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
    print(
        f"{len(taskset.tasks)} tasks for {calls} kernel calls, {taskset.total_flops / 1e9:.3f} GFLOP per "
        f"inference, {tuned} with a best on {taskset.target.name} (the network runs in "
        f"{taskset.layout.value})"
    )
    if taskset.other_nodes:
        shown = one_line(", ".join(f"{o.name} ({o.op})" for o in taskset.other_nodes))
        print(f"{len(taskset.other_nodes)} other nodes (not tuning tasks): {shown}")
    return 0


def _tasks_json(taskset: TaskSet, bests: Sequence[Record | None], logs: Sequence[str]) -> dict[str, object]:
    def best(record: Record | None) -> dict[str, object] | None:
        if record is None:
            return None
        return {
            "config": record.index,
            "cost": record.cost,
            "cost_unit": record.result.cost_unit.value,
            "board": record.board,
        }

    return {
        "model": taskset.model,
        "target": taskset.target.name,
        "layout": taskset.layout.value,
        "total_flops": taskset.total_flops,
        "logs": list(logs),
        "tasks": [
            {
                "workload": t.workload.key,
                "op": t.workload.op,
                "count": t.count,
                "nodes": list(t.nodes),
                "flops": t.flops,
                "share": taskset.share(t),
                "fused": [list(op.fused) for op in t.ops],
                "weights_transposed": list(t.transposed),
                "best": best(r),
            }
            for t, r in zip(taskset.tasks, bests, strict=True)
        ],
        "other_nodes": [{"name": o.name, "op": o.op, "kind": o.kind} for o in taskset.other_nodes],
    }
