"""`xtune bench`, `xtune build`, `xtune best`, `xtune report`, `xtune model train|info`: kernels, logs and
cost models."""

from __future__ import annotations

import argparse
import sys
import time

from xtune.cli.common import _emit_json, _warnings_unless_error
from xtune.cli.networks import _bench_model, _build_model, model_layout
from xtune.errors import InputError
from xtune.files import check_paths


def cmd_bench(args: argparse.Namespace) -> int:
    from xtune.boards.board import get_board
    from xtune.ops.registry import parse_workload
    from xtune.tuning.kernel_bench import bench

    if args.model is not None:
        return _bench_model(args)
    model_layout(args)  # refuses --layout without a model
    if args.workload is None:
        raise InputError("give --workload (a kernel) or --model (a whole network)")
    if args.log:
        raise InputError("--log is for --model; a kernel's config is --config")
    if args.profile:
        raise InputError("--profile times the steps of a whole network (--model)")
    if args.refuse_nonfinite:
        raise InputError("--refuse-nonfinite is for a whole network (--model)")
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
        elif d["instructions"] is not None or d["cycles"] is not None:
            noun = report.cost_unit.noun
            print(f"  xtune  {report.cost:.0f} {noun} per call (emulated; no wall-time figure), correct")
        else:
            print("  xtune  correct (a correctness-only board: no speed figure)")
        print(f"  numpy  {report.numpy_gflops:8.1f} GFLOP/s  (single thread on this host, same run)")
        if report.ort_gflops is not None:
            print(f"  ORT    {report.ort_gflops:8.1f} GFLOP/s  (ONNX Runtime, single thread, same run)")
        if report.ratio is not None:
            versus_ort = f", {report.ratio_vs_ort:.2f}x ONNX Runtime" if report.ratio_vs_ort else ""
            print(f"  ratio  {report.ratio:8.2f}x numpy{versus_ort}")
    return 0 if report.correct else 1


def cmd_build(args: argparse.Namespace) -> int:
    from xtune.firmware.kernels import build, check_outputs
    from xtune.target import get_target, host_target

    target = get_target(args.target) if args.target is not None else host_target()  # as tune and bench
    if args.model is not None:
        return _build_model(args, target)
    model_layout(args)  # refuses --layout without a model
    if not args.workload:
        raise InputError("give --workload (repeat for each kernel) or --model (a whole network)")
    if args.reference is not None or args.profile or args.refuse_nonfinite:
        option = (
            "--reference"
            if args.reference is not None
            else "--profile"
            if args.profile
            else "--refuse-nonfinite"
        )
        raise InputError(f"{option} is for --model builds")
    logs = [(log, "log") for log in args.log or ()]
    check_outputs(args.output, args.header, args.archive, logs)  # before compiling anything
    artifact = build(target, args.workload, args.log or (), args.prefix or "xt")
    artifact.write(args.output, args.header, args.archive)
    for warning in artifact.warnings:
        print(f"xtune: warning: {warning}", file=sys.stderr)
    if args.json:
        _emit_json(
            {
                "target": artifact.target.name,
                "object": args.output,
                "header": args.header,
                "archive": args.archive,
                "kernels": [k.as_dict() for k in artifact.kernels],
                "warnings": list(artifact.warnings),
            }
        )
        return 0
    width = max(len("symbol"), *(len(s) for k in artifact.kernels for s in k.symbols))
    print(f"{'symbol':<{width}}  {'source':<7} {'config':>10} {'code':>8} {'stack':>9} {'GFLOP/s':>8}")
    for k in artifact.kernels:
        gflops = f"{k.gflops:8.1f}" if k.gflops is not None else f"{'-':>8}"
        print(
            f"{k.symbol:<{width}}  {k.source:<7} {k.config_index:>10} {k.code_bytes:>6} B "
            f"{k.stack_bytes:>7} B {gflops}"
        )
        if k.pack:  # its pack function, built from the same config
            size = f"{k.pack.code_bytes:>6} B {k.pack.stack_bytes:>7} B {'-':>8}"
            print(f"{k.pack.symbol:<{width}}  {'pack':<7} {k.config_index:>10} {size}")
    wrote = ", ".join(p for p in (args.output, args.header, args.archive) if p)
    print(f"{len(artifact.kernels)} kernel(s) for {artifact.target.name}: wrote {wrote}")
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    from xtune.tuning.database import read_logs
    from xtune.tuning.report import format_table, summarize

    rows = summarize(read_logs(args.log), args.workload, args.target)
    if args.json:
        _emit_json({"best": [row.as_dict() for row in rows]})
    elif rows:
        print(format_table(rows))
    else:
        raise InputError("no records match in " + ", ".join(args.log))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from xtune.tuning.database import read_logs
    from xtune.tuning.report import format_table, plot_convergence, summarize

    check_paths([(args.plot, "plot")], [(log, "log") for log in args.log])  # before reading, not after
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
    from xtune.transfer.options import TrainOptions
    from xtune.transfer.pretrained import train_from_logs

    check_paths([(args.output, "model file")], [(log, "log") for log in args.log])  # before training
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
    print(
        f"wrote {args.output}: {', '.join(m.ops)} booster(s) on {m.records_used} records "
        f"({len(m.groups)} workloads; targets {', '.join(m.targets)}; {m.records_skipped} skipped) "
        f"in {seconds:.1f} s"
    )
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
