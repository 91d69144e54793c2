#!/usr/bin/env bash
# Installs everything xtune and its tests need on a Debian/Ubuntu machine, then xtune itself.
# Idempotent and quick when everything is already there (no apt-get update then).
set -euo pipefail
cd "$(dirname "$0")/.."

# qemu-user runs the agent for the emulated boards (7.2 loads TCG plugins; -static cannot).
# scripts/arm_peers.sh checks Debian's arm64 packages with Debian's archive keyring (on Ubuntu too).
# Cross gcc builds the agent for aarch64/riscv64 and links firmware artifacts in the tests;
# their binutils are the linker oracle. openssh-server is the real sshd of the SSH board tests.
# llvm-22 gives llvm-mca-22 and llvm-mc-22, the cycle cost of the emulated "-cycles" boards: the newest
# Debian LLVM apt offers here (bookworm-security); its scheduling models include the SpacemiT X60 (LLVM 20+)
# and years of fixes to the Cortex-A and SiFive ones since the system's llvm-14 (docs/qemu-insn-count.md).
APT_PACKAGES=(
  gcc libc6-dev make cmake
  qemu-user
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils-aarch64-linux-gnu
  gcc-riscv64-linux-gnu libc6-dev-riscv64-cross binutils-riscv64-linux-gnu
  openssh-server openssh-client
  llvm-22
  python3 python3-pip python3-venv
  debian-archive-keyring
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing system packages: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

source scripts/python.sh
if [ "$PYTHON" = "$(pwd -P)/.venv/bin/python" ] && [ ! -x "$PYTHON" ]; then
  echo "setup: python3 is externally managed (PEP 668): making a virtual environment in .venv" >&2
  python3 -m venv .venv
fi
# Install this checkout (editable) unless it is already the installed xtune with its dependencies.
# The check runs from / so that the current directory cannot stand in for the installed package.
here="$(pwd -P)/xtune/__init__.py"
installed="$(cd / && "$PYTHON" -c 'import os, xtune, llvmlite, paramiko, xgboost, elftools, tqdm, pytest, ruff, mypy, onnx, onnxruntime, matplotlib, ai_edge_litert
print(os.path.realpath(xtune.__file__))' 2>/dev/null || true)"
if [ "$installed" != "$here" ]; then
  echo "setup: installing xtune and its Python dependencies" >&2
  "$PYTHON" -m pip install -q --disable-pip-version-check -e ".[dev,plot,bench]" 2>&1 \
    | grep -v -E "^(WARNING: Running pip as|WARNING: Location|.*Consider using a virtual environment)" >&2 || true
  (cd / && "$PYTHON" -c "import xtune, llvmlite, paramiko, xgboost, elftools")
fi

# The ARM peers of the benchmarks and their test: an arm64 Python with ONNX Runtime and LiteRT, run under
# qemu-aarch64 (docs/arm-peers.md). Quick when already built.
bash scripts/arm_peers.sh
