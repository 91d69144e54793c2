"""The command line: argv in, library calls and a table or one JSON object out; errors: one line, exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from xtune.errors import XtuneError

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
    from xtune.board import board_names, get_board

    rows = []
    for name in board_names():
        board = get_board(name)
        rows.append({"name": name, "target": board.target.name, "timing": board.wall_time_is_meaningful})
    if args.json:
        _emit_json({"boards": rows})
        return 0
    for row in rows:
        print(f"{row['name']:<16} {row['target']:<14} {'wall time' if row['timing'] else 'correctness only'}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from xtune.bench import bench
    from xtune.board import get_board
    from xtune.workload import parse_workload

    workload = parse_workload(args.workload)
    board = get_board(args.board)
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
        if report.status.value == "ok":
            print(
                f"  xtune  {report.gflops:8.1f} GFLOP/s  ({d['percent_of_peak']}% of nominal peak), correct"
            )
        else:
            print(f"  xtune  {report.status.value}: {report.error}")
        print(f"  numpy  {report.numpy_gflops:8.1f} GFLOP/s  (single thread, same run)")
        print(f"  ratio  {report.ratio:8.2f}x numpy")
    return 0 if report.status.value == "ok" else 1


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="xtune", description="Auto-tune tensor kernels for embedded targets.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("targets", help="list target descriptors")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_targets)

    p = sub.add_parser("boards", help="list boards")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_boards)

    p = sub.add_parser("bench", help="default (or given) config vs numpy, measured in one run")
    p.add_argument("--workload", required=True, help='e.g. "matmul:m=512,n=512,k=512"')
    p.add_argument("--board", default="local")
    p.add_argument("--config", type=int, default=None, help="config index (default: the template's default)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(handler=cmd_bench)
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


if __name__ == "__main__":
    sys.exit(main())
