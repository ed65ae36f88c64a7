#!/usr/bin/env bash
# Sets everything up, then runs every test: the C++ tests (ctest), the
# installed C++ package as a shared library, the commit protocol at
# simulated scale, the C++ tests under sanitizers, the Python tests
# (pytest, on 8 CPU devices), a wheel built and tested as a user installs
# it, 50 crash-torture trials and a short fuzzing run; and mypy on the
# installed package. Prints the wall and CPU time of each stage at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python writes the bytecode of what the tests import once, to be reused by
# every later process; setup.sh installs the packages without it.
unset PYTHONDONTWRITEBYTECODE

# stage <name> <command...>: runs one stage and records its wall time and
# the CPU time of its processes. The table is printed on exit, a failed
# stage marked, so that a slow or broken CI run shows where its time went,
# and which stages keep the cores busy and which wait.
timings=() current="" current_start=0 current_cpu=0 all_start=$SECONDS
stage_shell=$$  # the shell whose children a stage's processes are
children_cpu_ticks() {  # user + system time of that shell's reaped children
  local stat
  read -ra stat < "/proc/$stage_shell/stat"
  echo $((stat[15] + stat[16]))
}
record() {
  local ticks=$(( $(children_cpu_ticks) - current_cpu ))
  timings+=("$(printf '%-22s %5d s %6d s%s' "$current" $((SECONDS - current_start)) \
               $((ticks / $(getconf CLK_TCK))) "$1")")
}
stage() {
  current=$1 current_start=$SECONDS current_cpu=$(children_cpu_ticks)
  shift
  "$@"
  record ""
  current=""
}

# beside <name> <command...>: starts a stage in the background, beside the
# stages that follow, for stages that leave a core idle (waiting on
# servers, subprocesses or one thread). Its output is held in
# build/stages/<name>.log until `joined <name>` waits for it, prints it
# and records its row (marked "beside"); a failure fails the run there.
declare -A beside_pids=()
stage_logs=build/stages
beside() {
  local name=$1
  shift
  mkdir -p "$stage_logs"
  (
    timings=() stage_shell=$BASHPID
    trap '[ -z "$current" ] || record "  FAILED"
          printf "%s\n" "${timings[@]}" > "$stage_logs/$name.row"' EXIT
    stage "$name" "$@"
    timings[-1]+="  beside"
  ) > "$stage_logs/$name.log" 2>&1 &
  beside_pids[$name]=$!
}
joined() {
  local rc=0
  wait "${beside_pids[$1]}" || rc=$?
  unset "beside_pids[$1]"
  echo "== $1 (ran beside the stages before this point)"
  cat "$stage_logs/$1.log"
  timings+=("$(cat "$stage_logs/$1.row")")
  return $rc
}

print_timings() {
  local rc=$?
  [ ${#beside_pids[@]} -eq 0 ] || kill "${beside_pids[@]}" 2>/dev/null || true
  [ -z "$current" ] || record "  FAILED"
  echo "== stage timings (wall, CPU; a stage marked beside ran with others)"
  printf '%s\n' "${timings[@]}"
  printf '%-22s %5d s %6d s\n' total $((SECONDS - all_start)) \
    $(( $(children_cpu_ticks) / $(getconf CLK_TCK) ))
  return $rc
}
trap print_timings EXIT

stage setup scripts/setup.sh
# The trees below share the core's objects with the extension setup built.
source scripts/compile_cache.sh

build_cpp() {
  cmake -S . -B build/cpp -G Ninja -DSHARDKEEP_BUILD_TESTS=ON -DSHARDKEEP_BUILD_EXAMPLES=ON > /dev/null
  cmake --build build/cpp
}
stage "build cpp" build_cpp
stage scale scripts/scale.sh  # the commit protocol with up to 1,024 simulated processes
# The C++ package as a shared library too (ctest checks the static one).
shared_package() {
  cmake -S . -B build/shared -G Ninja -DBUILD_SHARED_LIBS=ON -DSHARDKEEP_BUILD_TESTS=OFF > /dev/null
  cmake --build build/shared
  cpp/package_test/check.sh build/shared
}
stage "shared package" shared_package

# The wheel as users install it (docs/WHEELS.md), for one Python other
# than .venv's: built apart from the developer build (build/wheel-<tag>),
# then installed alone into a fresh environment and checked there.
stage "wheel build" scripts/build_wheels.sh 3.12

# Three stages that each keep about one core busy, run together: ctest
# (its longest test waits on a SeaweedFS server), the wheel's test (pip
# and a server) and mypy.
beside ctest ctest --test-dir build/cpp --output-on-failure -j 2
beside "wheel test" scripts/test_wheels.sh 3.12
# The package type-checks against the extension's stubs: mypy on the
# installed package, from outside the repository so that `shardkeep` is
# the installed one (with _core.pyi); settings in pyproject.toml.
mypy_installed() {
  (repo=$PWD && cd /tmp && "$repo/.venv/bin/python" -m mypy --no-incremental \
     --config-file "$repo/pyproject.toml" -p shardkeep)
}
stage mypy mypy_installed
joined ctest
joined "wheel test"

stage asan scripts/sanitize.sh asan
stage tsan scripts/sanitize.sh tsan

# test_cpp_round_trip.py runs the C++ examples built above. Three workers
# (pytest-xdist) on two cores: the tests wait on their subprocesses and
# servers about a third of the time (measured: 188 s against 213 s with
# two workers and 210 s with four).
stage pytest env XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
  SHARDKEEP_EXAMPLES_DIR="$PWD/build/cpp/examples/cpp" \
  .venv/bin/python -m pytest python/tests -q -n 3

stage torture scripts/torture.sh 50

# Short fuzzing: each libFuzzer target for 20 s, one per core at a time.
# Each starts from its kept corpus (cpp/fuzz/corpus), with more coverage
# at its first input than 45 s from the seeds alone reached, so the 20 s
# go to code no earlier run reached.
stage fuzz scripts/fuzz.sh --seconds 20
