"""Write the networks xtune is tried on as ONNX files, built here without a download: ResNet-18 and
MobileNetV2 1.0 at 224x224 (torchvision's layer structure, BatchNormalization included, random
weights from a fixed seed), and the small variants the tests build in memory.

Usage: python3 benchmarks/make_networks.py [OUTDIR] [--only NAME ...]; then e.g.
`xtune tasks OUTDIR/resnet18.onnx`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx

# tests/networks.py builds the test networks; the repository root holds the `tests` package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.networks import NETWORKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "outdir", nargs="?", default="networks", help="directory to write (default: networks)"
    )
    parser.add_argument("--only", action="append", choices=sorted(NETWORKS), help="write only these")
    args = parser.parse_args()
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only or NETWORKS:
        path = out / f"{name}.onnx"
        onnx.save_model(NETWORKS[name](), path)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
