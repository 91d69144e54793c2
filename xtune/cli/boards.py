"""`xtune targets`, `xtune boards`, `xtune deploy`: the targets and the boards to run on."""

from __future__ import annotations

import argparse
import sys

from xtune.cli.common import _emit_json
from xtune.errors import InputError, XtuneError


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
    from xtune.boards.board import QemuBoard, board_names, get_board
    from xtune.boards.cost import CostUnit
    from xtune.boards.ssh import SshBoard, probe

    rows = []
    for name in board_names(args.boards):
        board = get_board(name, args.boards, check=False)  # one that cannot measure is listed, with why
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
        elif isinstance(board, QemuBoard) and (problem := board.problem()) is not None:
            row.update(unavailable=problem)
        rows.append(row)
    if args.json:
        _emit_json({"boards": rows})
        return 0
    for row in rows:
        status = ""
        if row["kind"] == "ssh":
            state = "reachable" if row["reachable"] else f"unreachable: {row['reason']}"
            status = f"  ssh {row['host']}: {state}"
        elif "unavailable" in row:
            status = f"  unavailable: {row['unavailable']}"
        print(f"{row['name']:<22} {row['target']:<14} {CostUnit(row['cost_unit']).describe}{status}")
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
    print(
        f"{args.board}: agent {result['agent_version']} at {result['agent']}, hello arch={result['arch']} "
        f"exec={result['exec']} ({result['seconds']} s)"
    )
    print(f"  {fp['uname']}\n  cpu: {fp['cpu']}, {fp['cores']} cores")
    return 0
