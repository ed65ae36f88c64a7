#!/usr/bin/env bash
# Builds the given targets in build/asan, the one clang tree of the C++
# tests under AddressSanitizer + UndefinedBehaviorSanitizer
# (scripts/sanitize.sh asan) and of the libFuzzer targets
# (scripts/fuzz.sh): both need the core library compiled with the same
# sanitizers, so it is compiled once, with libFuzzer's coverage hooks
# (SHARDKEEP_BUILD_FUZZERS), which a test binary carries unused.
#
#   scripts/build_asan.sh target...
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 target..." >&2; exit 2; }

cmake -S . -B build/asan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Sanitize \
  -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all" \
  -DSHARDKEEP_BUILD_FUZZERS=ON -DSHARDKEEP_BUILD_TESTS=ON > /dev/null
cmake --build build/asan -j "${SANITIZE_JOBS:-$(nproc)}" --target "$@"
