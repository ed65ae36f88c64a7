#!/usr/bin/env bash
# Builds targets in a clang tree instrumented with sanitizers, one tree per
# kind, each compiling the core library once for all it holds:
#   asan  build/asan: AddressSanitizer + UndefinedBehaviorSanitizer; the C++
#         tests (scripts/sanitize.sh asan) and the libFuzzer targets
#         (scripts/fuzz.sh), so the core also carries libFuzzer's coverage
#         hooks (SHARDKEEP_BUILD_FUZZERS), which the tests carry unused;
#   tsan  build/tsan: ThreadSanitizer; the tests named by the caller
#         (-DSHARDKEEP_TESTS=...: scripts/sanitize.sh tsan).
#
#   scripts/build_sanitized.sh asan|tsan [-D...]... target...
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: $0 asan|tsan [-D...]... target..." >&2; exit 2; }
[ $# -ge 2 ] || usage
kind=$1; shift
case "$kind" in
  asan) flags=() ;;  # the sanitizer flags come with SHARDKEEP_BUILD_FUZZERS
  tsan) flags=(-fsanitize=thread) ;;
  *) usage ;;
esac
options=()
while [[ $# -gt 0 && $1 == -D* ]]; do options+=("$1"); shift; done
[ $# -gt 0 ] || usage
[[ $kind == asan ]] && options+=(-DSHARDKEEP_BUILD_FUZZERS=ON)

# Line tables are all a sanitizer report's stack needs (file:line), and
# compile faster than full debug information.
cmake -S . -B "build/$kind" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Sanitize \
  -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -gline-tables-only -fno-omit-frame-pointer -fno-sanitize-recover=all ${flags[*]}" \
  -DCMAKE_EXE_LINKER_FLAGS_SANITIZE="${flags[*]}" -DSHARDKEEP_BUILD_TESTS=ON "${options[@]}" > /dev/null
cmake --build "build/$kind" -j "${SANITIZE_JOBS:-$(nproc)}" --target "$@"
