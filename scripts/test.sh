#!/usr/bin/env bash
# The whole test suite: set up (system packages included), then ruff, mypy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/python.sh
"$PYTHON" -m ruff check xtune tests benchmarks
"$PYTHON" -m ruff format --check xtune tests benchmarks
"$PYTHON" -m mypy
# Two workers, a test file each at a time (--dist loadfile keeps a file's module fixtures in one
# process): about half the wall time on two cores. `-n 0` in "$@" runs it in one process.
exec "$PYTHON" -m pytest -q -n 2 --dist loadfile "$@"
