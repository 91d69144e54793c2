"""Runs one entry point of a flat image once on a board and returns its buffers: the way tests check
kernels that are not a workload's (network operators, weights sections) against numpy."""

from __future__ import annotations

import numpy as np

from xtune.boards.agent import RunRequest, RunStatus
from xtune.boards.board import get_board
from xtune.codegen.link import FlatImage


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
