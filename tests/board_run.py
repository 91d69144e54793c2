"""Runs one entry point of a flat image once on a board and returns its buffers: the way tests check
kernels that are not a workload's (network operators, weights sections) against numpy."""

from __future__ import annotations

import shutil
from collections.abc import Iterable

import numpy as np
import pytest

from xtune.boards.agent import RunRequest, RunStatus
from xtune.boards.board import get_board
from xtune.codegen.compile import compile_object
from xtune.codegen.link import FlatImage, link_flat
from xtune.codegen.lower import lower
from xtune.ops.opkit import GeneratedOp
from xtune.schedule.loopnest import Kernel
from xtune.target import Target


def image(kernel: Kernel, target: Target) -> FlatImage:
    return link_flat(compile_object(lower([kernel]), target, (kernel.name,)))


def run_entry(
    board_name: str,
    image: FlatImage,
    entry: str,
    buffers: list[np.ndarray],
    args: tuple[int, ...] | None = None,
) -> list[np.ndarray]:
    """Calls `entry` once (parameter i gets buffer i, or buffer args[i]) and returns every buffer as it is
    afterwards, same shapes and dtypes. Pass outputs filled with NaN so that unwritten elements show."""
    board = get_board(board_name)
    with board.open() as session:
        session.load_image(image.code)
        for slot, array in enumerate(buffers):
            session.set_buffer(slot, np.ascontiguousarray(array).tobytes())
        slots = tuple(range(len(buffers))) if args is None else args
        reply = session.run(RunRequest.check(image.entry(entry), slots))
        assert reply.status is RunStatus.OK, (board_name, entry, reply)
        return [
            np.frombuffer(session.read_buffer(slot), dtype=array.dtype).reshape(array.shape)
            for slot, array in enumerate(buffers)
        ]


def run_cases(
    board_name: str, entry: str, cases: Iterable[tuple[str, GeneratedOp, np.ndarray, np.ndarray]]
) -> None:
    """Each case (label, operator, its input, its expected output) built for the board with the target's
    lanes and run once on it: the output equal to the expected one. Skipped where the board's emulator
    is not installed."""
    target = get_board(board_name).target
    if target.qemu_binary and shutil.which(target.qemu_binary) is None:
        pytest.skip(f"needs {target.qemu_binary}")
    for label, op, x, want in cases:
        kernel = op.kernel_nest(entry, target.fp32_lanes)
        got = run_entry(board_name, image(kernel, target), entry, [x, np.zeros_like(want)])
        np.testing.assert_array_equal(got[-1], want, err_msg=label)
