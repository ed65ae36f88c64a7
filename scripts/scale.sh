#!/usr/bin/env bash
# Scale by simulation: the commit protocol with 64, 256 and 1,024 simulated
# processes (threads of one program, each a SimulatedGroup member) saving
# onto the memory backend (committing by rename, and as on an object store),
# and one load merging their 1,024 index files.
# Prints the timings. The goal is under a second per step at the largest
# size; it fails when a step takes longer than that and its cost per
# process also grew more than 4x from the smallest size (a protocol gone
# quadratic; a loaded machine slows every size alike).
#
#   scripts/scale.sh                 # 64, 256, 1024 processes
#   scripts/scale.sh 1024,4096       # other sizes
#
# Builds the C++ tests in build/cpp if needed (as scripts/test.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."

sizes="${1:-64,256,1024}"
cmake -S . -B build/cpp -G Ninja -DSHARDKEEP_BUILD_TESTS=ON > /dev/null
cmake --build build/cpp --target shardkeep_tests > /dev/null
SHARDKEEP_SCALE_PROCESSES="$sizes" SHARDKEEP_SCALE_MAX_S=1 \
  build/cpp/shardkeep_tests --gtest_brief=1 --gtest_filter='Modes/ScaleTest.*'
