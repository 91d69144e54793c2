"""Benchmark: median round trip of one RUN request through SSH to a long-lived agent on 127.0.0.1.

Starts its own private sshd (the test fixture's PrivateSshd), deploys the agent natively and under
qemu-aarch64 behind SSH, and times check-only RUN requests of an empty kernel (one fork-per-run each,
as every measurement does). The targets: median <= 2 ms native, <= 5 ms under qemu.

    python benchmarks/bench_ssh.py [--requests 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_ssh import PrivateSshd
from xtune.boards.agent import RunRequest
from xtune.boards.board import get_board
from xtune.boards.ssh import SshBoard, deploy, run_command
from xtune.codegen.compile import compile_object
from xtune.codegen.link import link_flat
from xtune.target import get_target

EMPTY = 'define void @xt_kernel(ptr %A) nounwind "no-builtins" {\nentry:\n  ret void\n}\n'
BOARDS = {
    "ssh-native": ("x86-avx2", ""),
    "ssh-qemu-aarch64": ("arm-a72-neon", "qemu-aarch64 -cpu cortex-a72"),
}


def bench_board(board: SshBoard, requests: int) -> dict[str, float]:
    image = link_flat(compile_object(EMPTY, get_target(board.target.name), ("xt_kernel",)))
    run_command(board.client(), "true")  # reconnect after deploy; the first session is slow
    start = time.perf_counter()
    session = board.open()  # new exec channel + agent start, on an already open connection
    spawn_ms = (time.perf_counter() - start) * 1e3
    try:
        session.set_buffer(0, bytes(64))
        session.load_image(image.code)
        req = RunRequest.check(image.entry("xt_kernel"), (0,))
        for _ in range(10):  # warm up: qemu translates the agent's run path once
            session.run(req)
        rtts = []
        for _ in range(requests):
            t0 = time.perf_counter()
            session.run(req)
            rtts.append((time.perf_counter() - t0) * 1e3)
    finally:
        session.close()
    rtts.sort()
    return {
        "median_ms": round(statistics.median(rtts), 3),
        "p90_ms": round(rtts[int(0.9 * (len(rtts) - 1))], 3),
        "spawn_agent_ms": round(spawn_ms, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="xtune-bench-ssh-") as tmp:
        server = PrivateSshd(Path(tmp))
        boards = Path(tmp) / "boards.toml"
        boards.write_text("".join(server.boards_toml(name, t, wrapper=w) for name, (t, w) in BOARDS.items()))
        server.start()
        try:
            for name in BOARDS:
                board = get_board(name, boards)
                assert isinstance(board, SshBoard)
                t0 = time.perf_counter()
                deploy(board)
                connect_deploy_s = time.perf_counter() - t0
                figures[name] = {**bench_board(board, args.requests), "deploy_s": round(connect_deploy_s, 3)}
                board.close()
        finally:
            server.kill_all()
    if args.json:
        print(json.dumps(figures))
        return 0
    print(
        f"one RUN request (check-only, empty kernel, fork per run) over SSH to 127.0.0.1, "
        f"{args.requests} requests"
    )
    for name, f in figures.items():
        print(
            f"  {name:<17} median {f['median_ms']:6.3f} ms  p90 {f['p90_ms']:6.3f} ms  "
            f"(agent start {f['spawn_agent_ms']:.1f} ms; deploy incl. connect {f['deploy_s']:.2f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
