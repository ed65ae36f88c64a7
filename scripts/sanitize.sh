#!/usr/bin/env bash
# Builds the C++ tests with sanitizers, each kind in its own build folder
# (scripts/build_sanitized.sh), and runs them:
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (build/asan, shared
#         with the fuzzers): every C++ test;
#   tsan  ThreadSanitizer (build/tsan): the tests that run threads against
#         each other (the thread pool, the simulated group, single- and
#         multi-process saves and the order of their syncs, jobs racing on
#         an object store, the save thread, the save queue, the checkpoint
#         pipeline, the S3 client and its multipart uploads).
# Any report fails the run. Usage: scripts/sanitize.sh [asan|tsan|all]
# (default all). Compiler: clang++.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
case "$what" in asan|tsan|all) ;; *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;; esac

TSAN_TESTS="parallel_test;simulated_group_test;multiprocess_save_test;save_thread_test;\
checkpoint_test;shard_writer_test;save_durability_test;reader_cancellation_test;\
object_store_save_test;s3_client_test;multipart_upload_test;s3_storage_test;\
checkpoint_writer_test;verify_test;save_queue_test"
# Sanitizer allocators abort on a request they cannot serve instead of
# throwing std::bad_alloc, so the test of exactly that is left out.
SKIP='-ParallelForTest.HugeAllocationFailsWithResourceExhausted'

# run <dir>: runs the tests of one tree, split into one shard per core
# (gtest's sharding: each process runs every n-th case), each shard one
# process: far faster than one process per case through ctest. Each
# shard's output is printed when it ends.
source scripts/lanes.sh
shard() {  # shard <dir> <shards>, lane $LANE
  GTEST_TOTAL_SHARDS=$2 GTEST_SHARD_INDEX=$LANE \
    "$1/shardkeep_tests" --gtest_brief=1 --gtest_filter="$SKIP"
}
run() {
  local shards=${SANITIZE_JOBS:-$(nproc)}
  echo "== $1/shardkeep_tests in $shards shards"
  run_lanes "$shards" "$1/shard" shard "$1" "$shards" || { echo "FAILED: $1" >&2; exit 1; }
}

if [[ $what == asan || $what == all ]]; then
  scripts/build_sanitized.sh asan shardkeep_tests
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 run build/asan
fi
if [[ $what == tsan || $what == all ]]; then
  scripts/build_sanitized.sh tsan -DSHARDKEEP_TESTS="$TSAN_TESTS" shardkeep_tests
  # ThreadSanitizer cannot start threads in the forked child of a process
  # that has some, which that test does on purpose.
  SKIP="$SKIP:ParallelForTest.WorksInAForkedChild"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run build/tsan
fi
echo "sanitizers: clean"
