#!/usr/bin/env bash
# The whole test suite: set up (system packages included), then ruff, mypy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/python.sh
"$PYTHON" -m ruff check xtune tests benchmarks
"$PYTHON" -m ruff format --check xtune tests benchmarks
"$PYTHON" -m mypy
exec "$PYTHON" -m pytest -q "$@"
