#!/usr/bin/env bash
# The main job: set up, then compile and measure matmul 512^3 on the local board against numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/python.sh
exec "$PYTHON" -m xtune.cli bench --workload "${XTUNE_WORKLOAD:-matmul:m=512,n=512,k=512}" --board local "$@"
