"""Exactness check: a directory of integer-input .tflite files (MLPerf Tiny's int8 reference models:
docs/benchmarks.md says how to get them) in; per model, how many of xtune's outputs differ from LiteRT's
(and by how many quantization steps at most), against its reference kernels (BUILTIN_REF), its optimized
builtin kernels and its default (XNNPACK), over seeded random inputs, on one board.

Usage: python benchmarks/tflite_exact.py DIR [--board local] [--target x86-avx512-vnni] [--seeds 10]
(--target: the code the local board runs, e.g. the VNNI target whose int8 kernels differ from x86-avx512's.)

Deterministic (no timing): the figures docs/int8.md's TFLite table quotes come from here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from xtune.boards.board import Board, get_board
from xtune.errors import XtuneError
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import random_input, run_network
from xtune.frontend.tflite_file import read_tflite

RESOLVERS = ("BUILTIN_REF", "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "AUTO")
LABELS = ("reference", "optimized", "default")


def litert(data: bytes, x: np.ndarray, resolver: str) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(
        model_content=data, num_threads=1, experimental_op_resolver_type=getattr(OpResolverType, resolver)
    )
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return np.array(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))


def compare(path: Path, board: Board, seeds: int) -> str:
    """ "d of n (max s)" against each resolver: outputs that differ, of all, and the largest difference."""
    data = path.read_bytes()
    model = read_tflite(data, str(path))
    source = model.tensors[model.inputs[0]]
    artifact = build_model(path, board.target)
    off, worst, total = [0] * len(RESOLVERS), [0] * len(RESOLVERS), 0
    for seed in range(seeds):
        x = random_input(source.shape, seed, str(source.dtype))
        got, _ = run_network(board, artifact, x)
        total += got.size
        for i, resolver in enumerate(RESOLVERS):
            diff = np.abs(got.astype(np.int64) - litert(data, x, resolver).astype(np.int64))
            off[i] += int(np.count_nonzero(diff))
            worst[i] = max(worst[i], int(diff.max()))
    return "  ".join(f"{o:>5} of {total:<6} (max {w})" for o, w in zip(off, worst, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where the .tflite files are (searched recursively)")
    parser.add_argument("--board", default="local")
    parser.add_argument("--target", default=None, help="the local board's target")
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    paths = []
    for p in sorted(args.directory.rglob("*.tflite")):
        model = read_tflite(p.read_bytes(), str(p))
        if model.tensors[model.inputs[0]].dtype != np.float32:
            paths.append(p)
    if not paths:
        print(f"{args.directory}: no integer-input .tflite files", file=sys.stderr)
        return 2
    try:
        board = get_board(args.board, target=args.target)
    except XtuneError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"{'model':32} " + "  ".join(f"{'vs ' + label:24}" for label in LABELS))
    for path in paths:
        try:
            print(f"{path.name:32} {compare(path, board, args.seeds)}", flush=True)
        except XtuneError as err:
            print(f"{path.name:32} {err}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
