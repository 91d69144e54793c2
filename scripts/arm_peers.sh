#!/usr/bin/env bash
# Builds the arm64 Python that xtune/tuning/arm_peers.py runs under qemu-aarch64: Debian 12's python3.11
# for arm64 unpacked (dpkg -x) into .cache/arm64-peers/root, with the aarch64 wheels of ONNX Runtime,
# LiteRT and numpy in root/opt/peers (docs/arm-peers.md says why each step exists).
# Idempotent and quick when done (a stamp records what was installed); downloads only from Debian's
# archive and PyPI, through apt-get and pip; needs neither root nor a change to the host's apt state.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=".cache/arm64-peers"
ROOT="$CACHE/root"
# Debian 12's python3.11 for arm64, whatever the host runs: the wheels below are built for CPython 3.11,
# and this release's glibc (2.36) is new enough for their manylinux tags.
SUITE="bookworm"
# The smallest set the interpreter, numpy, ONNX Runtime and LiteRT load (their NEEDED entries, checked
# with readelf): the interpreter and its standard library, glibc, the C++ runtime, expat and zlib (the
# interpreter links them), libffi (ctypes, which LiteRT imports).
DEBS=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib
      libc6 libgcc-s1 libstdc++6 libexpat1 zlib1g libffi8)
# Pinned so that the peers' figures in docs/benchmarks.md can be reproduced.
WHEELS=(onnxruntime==1.32.0 ai-edge-litert==2.3.0 numpy==2.4.6)
GLIBC_MINOR=36  # bookworm's glibc 2.36: pip takes any manylinux_2_N tag with N up to this
STAMP="$SUITE ${DEBS[*]} ${WHEELS[*]}"

if [ -f "$ROOT/.complete" ] && [ "$(cat "$ROOT/.complete")" = "$STAMP" ]; then
  exit 0
fi
echo "setup: building the arm64 Python with ONNX Runtime and LiteRT in $ROOT (about 200 MB)" >&2

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
if [ ! -f "$KEYRING" ]; then
  echo "arm_peers: $KEYRING is missing: apt-get install debian-archive-keyring" >&2
  exit 2
fi

# A private apt configuration: arm64 only, Debian's archive, its own lists, cache and (empty) package
# status, so the host's architectures and package lists stay as they are (no dpkg --add-architecture).
APT="$(pwd -P)/$CACHE/apt"
mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$APT/sources.list.d" "$APT/debs"
touch "$APT/status"
cat >"$APT/sources.list" <<EOF
deb [arch=arm64 signed-by=$KEYRING] http://deb.debian.org/debian $SUITE main
deb [arch=arm64 signed-by=$KEYRING] http://deb.debian.org/debian-security $SUITE-security main
EOF
APT_OPTS=(
  -o APT::Architecture=arm64 -o APT::Architectures::=arm64
  -o Dir::State::Lists="$APT/lists" -o Dir::State::status="$APT/status"
  -o Dir::Cache="$APT" -o Dir::Cache::archives="$APT/archives"
  -o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts="$APT/sources.list.d"
  -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)"
)
apt-get "${APT_OPTS[@]}" -qq update
rm -f "$APT/debs/"*.deb
(cd "$APT/debs" && apt-get "${APT_OPTS[@]}" -qq download "${DEBS[@]}")

# Unpack into a fresh directory and move it into place last, so an interrupted run leaves no half root.
rm -rf "$ROOT.tmp"
mkdir -p "$ROOT.tmp"
for deb in "$APT/debs/"*.deb; do
  dpkg-deb -x "$deb" "$ROOT.tmp"
done

source scripts/python.sh
# pip matches the platform tag exactly: list every manylinux_2_N the root's glibc satisfies.
platforms=()
for ((n = GLIBC_MINOR; n >= 17; n--)); do platforms+=(--platform "manylinux_2_${n}_aarch64"); done
platforms+=(--platform manylinux2014_aarch64)
"$PYTHON" -m pip install -q --disable-pip-version-check --no-warn-script-location \
  --only-binary=:all: "${platforms[@]}" --implementation cp --python-version 3.11 --abi cp311 \
  --target "$ROOT.tmp/opt/peers" "${WHEELS[@]}" 2>&1 \
  | grep -v -E "^(WARNING: Running pip as|WARNING: Location|.*Consider using a virtual environment)" >&2 || true
test -d "$ROOT.tmp/opt/peers/onnxruntime" && test -d "$ROOT.tmp/opt/peers/ai_edge_litert"
# Debian compiles the standard library at install time (py3compile), which dpkg -x skips: compile it here
# with the host's Python 3.11 (same bytecode), or every emulated start would compile what it imports.
if "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  "$PYTHON" -m compileall -q -j 0 "$ROOT.tmp/usr/lib/python3.11" >/dev/null || true
fi

# The interpreter starts and numpy imports: the runtimes themselves need the emulated CPU's
# /proc/cpuinfo, which xtune/tuning/arm_peers.py provides.
QEMU="$(command -v qemu-aarch64 || true)"
if [ -z "$QEMU" ]; then
  echo "arm_peers: qemu-aarch64 is missing: apt-get install qemu-user" >&2
  exit 2
fi
"$QEMU" -L "$ROOT.tmp" "$ROOT.tmp/usr/bin/python3.11" -I -S -c \
  "import sys; sys.path.insert(0, '$(pwd -P)/$ROOT.tmp/opt/peers'); import numpy"

rm -rf "$ROOT"
echo "$STAMP" >"$ROOT.tmp/.complete"
mv "$ROOT.tmp" "$ROOT"
