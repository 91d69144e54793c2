"""Measure the transfer-learning corpus on this machine and train the shipped model (issue 7).

Usage: python scripts/make_transfer_corpus.py [--random 48] [--xgb 144] [--targets x86-avx2,x86-sse42]
                                              [--only-train]

For every training shape and target, one tuning log in xtune/data/corpus/<target>.jsonl gets `--random`
random configs and then `--xgb` configs of an xgb tuning run that resumes from them: a team's shared logs
are tuning logs (mostly good configs, some exploration), and the random part shows the model the bad
regions too. Shapes already in a log are resumed, not measured again, so the script can be re-run after
an interruption. Then `xtune model train` on all corpus logs writes xtune/data/models/matmul-x86.json,
which `xtune tune --transfer-from builtin` uses on x86 targets.

The held-out shapes of scripts/transfer_eval.py are deliberately not among TRAIN_SHAPES.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "xtune" / "data" / "corpus"
MODEL = ROOT / "xtune" / "data" / "models" / "matmul-x86.json"

# Square, tall, wide, deep and shallow products between 64 and 1024: the shapes of dense and attention
# layers of small models, none of them a held-out shape of scripts/transfer_eval.py.
TRAIN_SHAPES = (
    (256, 256, 256), (512, 512, 512), (128, 768, 768), (384, 384, 128), (64, 512, 256),
    (256, 64, 1024), (1024, 128, 64), (192, 192, 576),
)


def xtune(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "xtune.cli", *args], check=True, stdout=subprocess.DEVNULL)


def measure(target: str, shape: tuple[int, int, int], n_random: int, n_xgb: int) -> None:
    m, n, k = shape
    workload = f"matmul:m={m},n={n},k={k}"
    log = CORPUS / f"{target}.jsonl"
    print(f"{target} {workload}", file=sys.stderr, flush=True)
    common = ["tune", "--workload", workload, "--target", target, "--log", str(log), "--json"]
    # --trials counts new measurements; configs already in the log are resumed (and learned from).
    xtune(*common, "--tuner", "random", "--trials", str(n_random), "--seed", "1")
    xtune(*common, "--tuner", "xgb", "--trials", str(n_xgb), "--seed", "1")


def measured_shapes(log: Path) -> set[str]:
    from xtune.database import read_logs

    return {r.workload for r in read_logs([log])} if log.exists() else set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=48)
    parser.add_argument("--xgb", type=int, default=144)
    parser.add_argument("--targets", default="x86-avx2,x86-sse42")
    parser.add_argument("--only-train", action="store_true", help="train the model on the logs as they are")
    args = parser.parse_args()
    CORPUS.mkdir(parents=True, exist_ok=True)
    MODEL.parent.mkdir(parents=True, exist_ok=True)
    if not args.only_train:
        from xtune.workload import parse_workload

        for target in args.targets.split(","):
            done = measured_shapes(CORPUS / f"{target}.jsonl")
            for shape in TRAIN_SHAPES:
                key = parse_workload("matmul:m={},n={},k={}".format(*shape)).key
                if key not in done:
                    measure(target, shape, args.random, args.xgb)
    logs = sorted(str(p) for p in CORPUS.glob("*.jsonl"))
    xtune("model", "train", *logs, "-o", str(MODEL))
    print(f"wrote {MODEL.relative_to(ROOT)} from {len(logs)} logs", file=sys.stderr)


if __name__ == "__main__":
    main()
