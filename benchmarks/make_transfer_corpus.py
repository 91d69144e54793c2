"""Measure the transfer-learning corpus on this machine and train the shipped models.

Usage: python benchmarks/make_transfer_corpus.py [--targets x86-avx2,x86-sse42] [--ops matmul,conv2d]
                                              [--only-train]

For every training workload and target, one tuning log in xtune/data/corpus/<target>.jsonl.gz gets some
random configs and then the configs of an xgb tuning run that resumes from them (CORPUS_PLAN): a team's
shared logs are tuning logs (mostly good configs, some exploration), and the random part shows the model
the bad regions too. Shapes already in a log are resumed, not measured again, so the script can be re-run
after an interruption; shapes measured on another machine (another cpu in the records' fingerprints) are
measured again on this one and appended, so the corpus grows with every machine it is run on. The logs are
kept gzipped (15x smaller; xtune reads .gz logs): each is unpacked to a working log beside it, tuned into,
and packed again. Then one model per machine is trained on that machine's records of every target (as
`xtune model train` would) into xtune/data/models/x86-<cpu>.json; `xtune tune --transfer-from builtin` on
an x86 target uses the one of the board's cpu, else another x86 one.

The held-out shapes of benchmarks/transfer_eval.py are deliberately not among TRAIN_SHAPES.
"""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "xtune" / "data" / "corpus"
MODELS = ROOT / "xtune" / "data" / "models"

# Square, tall, wide, deep and shallow products between 64 and 1024: the shapes of dense and attention
# layers of small models, none of them a held-out shape of benchmarks/transfer_eval.py. The first eight were
# picked by hand; the other sixteen were drawn (random.Random(0), each of m, n, k uniform over 64, 96,
# 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024, m*n*k between 2^20 and 2^28, held-out shapes, the
# first eight and repeats skipped) so that the corpus is not shaped by anyone's idea of the held-out set.
TRAIN_SHAPES = (
    (256, 256, 256),
    (512, 512, 512),
    (128, 768, 768),
    (384, 384, 128),
    (64, 512, 256),
    (256, 64, 1024),
    (1024, 128, 64),
    (192, 192, 576),
    (320, 320, 64),
    (192, 512, 384),
    (320, 192, 384),
    (256, 640, 160),
    (512, 128, 192),
    (128, 96, 640),
    (192, 512, 1024),
    (640, 128, 192),
    (96, 1024, 96),
    (768, 256, 384),
    (512, 96, 256),
    (320, 256, 640),
    (768, 160, 512),
    (384, 384, 512),
    (192, 64, 512),
    (64, 96, 1024),
)
# Convolution layers of small image models: 1x1, 3x3 and 5x5, stride 1 and 2, 3 to 128 input
# channels, 7x7 to 64x64 images; none is a held-out layer of benchmarks/transfer_eval.py --op conv2d. Fewer
# configs per layer than matmul (32 random + 96 xgb): conv2d has no analytic estimate to start from, and
# the corpus is meant to show what a few hours of a team's tuning on another board give.
CONV_TRAIN_LAYERS = (
    "c=32,h=28,w=28,k=32,r=3,s=3,stride=1,pad=1",
    "c=64,h=14,w=14,k=64,r=3,s=3,stride=1,pad=1",
    "c=16,h=56,w=56,k=32,r=3,s=3,stride=1,pad=1",
    "c=64,h=28,w=28,k=128,r=1,s=1,stride=1,pad=0",
    "c=32,h=28,w=28,k=64,r=3,s=3,stride=2,pad=1",
    "c=128,h=7,w=7,k=128,r=3,s=3,stride=1,pad=1",
    "c=3,h=64,w=64,k=32,r=5,s=5,stride=2,pad=2",
    "c=96,h=14,w=14,k=48,r=1,s=1,stride=1,pad=0",
)
# op -> (training workloads, random configs, xgb configs) per workload and target
CORPUS_PLAN = {
    "matmul": (tuple("matmul:m={},n={},k={}".format(*s) for s in TRAIN_SHAPES), 48, 144),
    "conv2d": (tuple(f"conv2d:n=1,{layer}" for layer in CONV_TRAIN_LAYERS), 32, 96),
}


def slug(cpu: str) -> str:
    """ "Intel(R) Xeon(R) Processor" -> "intel-xeon": the model file's name for a machine."""
    words = re.sub(r"\((r|tm)\)|processor|cpu", " ", cpu.lower())
    return re.sub(r"[^a-z0-9]+", "-", words).strip("-") or "unknown"


def train_models(logs: list[Path]) -> None:
    """One model per machine (cpu) in the corpus, trained on all its targets' logs: `--transfer-from
    builtin` picks the one of the board's cpu, else any of the target's."""
    from xtune.transfer.pretrained import train
    from xtune.tuning.database import read_logs
    from xtune.tuning.ranking import cpu_of

    records = read_logs(logs)
    for cpu in sorted({cpu_of(r) or "" for r in records}):
        model = train([r for r in records if (cpu_of(r) or "") == cpu], sources=[str(p) for p in logs])
        path = MODELS / f"x86-{slug(cpu)}.json"
        model.save(path)
        print(
            f"wrote {path.relative_to(ROOT)} from {model.manifest.records_used} records of {cpu!r}",
            file=sys.stderr,
        )


def xtune(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "xtune.cli", *args], check=True, stdout=subprocess.DEVNULL)


def measure(log: Path, target: str, workload: str, n_random: int, n_xgb: int) -> None:
    print(f"{target} {workload}", file=sys.stderr, flush=True)
    # --confirm 0: one timing per config, as many configs as asked (the trees learn from spread, not
    # from a few leaders timed three times).
    common = [
        "tune",
        "--workload",
        workload,
        "--target",
        target,
        "--log",
        str(log),
        "--json",
        "--confirm",
        "0",
    ]
    # --trials counts new measurements; configs already in the log are resumed (and learned from).
    xtune(*common, "--tuner", "random", "--trials", str(n_random), "--seed", "1")
    xtune(*common, "--tuner", "xgb", "--trials", str(n_xgb), "--seed", "1")


def measured_shapes(log: Path, cpu: str) -> set[str]:
    """Workloads the log already holds for this machine's cpu (the corpus keeps several machines')."""
    from xtune.tuning.database import read_logs
    from xtune.tuning.ranking import cpu_of

    return {r.workload for r in read_logs([log]) if cpu_of(r) == cpu} if log.exists() else set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="x86-avx2,x86-sse42")
    parser.add_argument("--ops", default="matmul,conv2d", help="operators to measure (see CORPUS_PLAN)")
    parser.add_argument("--only-train", action="store_true", help="train the model on the logs as they are")
    args = parser.parse_args()
    CORPUS.mkdir(parents=True, exist_ok=True)
    MODELS.mkdir(parents=True, exist_ok=True)
    if not args.only_train:
        from xtune.boards.board import get_board
        from xtune.ops.registry import parse_workload

        for target in args.targets.split(","):
            packed, work = CORPUS / f"{target}.jsonl.gz", CORPUS / f"{target}.jsonl"
            if packed.exists() and not work.exists():  # a working log left by an interrupted run wins
                work.write_bytes(gzip.decompress(packed.read_bytes()))
            cpu = get_board("local", target=target).fingerprint()["cpu"]
            done = measured_shapes(work, cpu)
            for op in args.ops.split(","):
                workloads, n_random, n_xgb = CORPUS_PLAN[op]
                for workload in workloads:
                    if parse_workload(workload).key not in done:
                        measure(work, target, workload, n_random, n_xgb)
            if work.exists():
                packed.write_bytes(gzip.compress(work.read_bytes(), mtime=0))
                work.unlink()
    train_models(sorted(CORPUS.glob("*.jsonl.gz")))


if __name__ == "__main__":
    main()
