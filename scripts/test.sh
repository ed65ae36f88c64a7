#!/usr/bin/env bash
# Sets everything up, then runs every test: the C++ tests (ctest), the
# installed C++ package as a shared library, the commit protocol at
# simulated scale, the C++ tests under sanitizers, the Python tests
# (pytest, on 8 CPU devices), a wheel built and tested as a user installs
# it, 50 crash-torture trials and a short fuzzing run; and mypy on the
# installed package. Prints the wall time of each stage at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

# stage <name> <command...>: runs one stage and records its wall time and
# the CPU time of its processes. The table is printed on exit, a failed
# stage marked, so that a slow or broken CI run shows where its time went,
# and which stages keep the cores busy and which wait.
timings=() current="" current_start=0 current_cpu=0 all_start=$SECONDS
children_cpu_ticks() {  # user + system time of this shell's reaped children
  local stat
  read -ra stat < /proc/$$/stat
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
print_timings() {
  local rc=$?
  [ -z "$current" ] || record "  FAILED"
  echo "== stage timings (wall, CPU)"
  printf '%s\n' "${timings[@]}"
  printf '%-22s %5d s %6d s\n' total $((SECONDS - all_start)) \
    $(( $(children_cpu_ticks) / $(getconf CLK_TCK) ))
  return $rc
}
trap print_timings EXIT

stage setup scripts/setup.sh
# The trees below share the core's objects with the extension setup built.
source scripts/compile_cache.sh

# The package type-checks against the extension's stubs: mypy on the
# installed package, from outside the repository so that `shardkeep` is
# the installed one (with _core.pyi); settings in pyproject.toml.
mypy_installed() {
  (repo=$PWD && cd /tmp && "$repo/.venv/bin/python" -m mypy --no-incremental \
     --config-file "$repo/pyproject.toml" -p shardkeep)
}
stage mypy mypy_installed

build_cpp() {
  cmake -S . -B build/cpp -G Ninja -DSHARDKEEP_BUILD_TESTS=ON -DSHARDKEEP_BUILD_EXAMPLES=ON > /dev/null
  cmake --build build/cpp
}
stage "build cpp" build_cpp
stage ctest ctest --test-dir build/cpp --output-on-failure -j 2
# The C++ package as a shared library too (ctest checked the static one).
shared_package() {
  cmake -S . -B build/shared -G Ninja -DBUILD_SHARED_LIBS=ON -DSHARDKEEP_BUILD_TESTS=OFF > /dev/null
  cmake --build build/shared
  cpp/package_test/check.sh build/shared
}
stage "shared package" shared_package
stage scale scripts/scale.sh  # the commit protocol with up to 1,024 simulated processes
stage asan scripts/sanitize.sh asan
stage tsan scripts/sanitize.sh tsan

# test_cpp_round_trip.py runs the C++ examples built above. Two workers
# (pytest-xdist): the tests wait on their subprocesses and servers about as
# much as they compute, so on two cores this halves the stage.
stage pytest env XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
  SHARDKEEP_EXAMPLES_DIR="$PWD/build/cpp/examples/cpp" \
  .venv/bin/python -m pytest python/tests -q -n 2

# The wheel as users install it (docs/WHEELS.md), for one Python other
# than .venv's: built apart from the developer build (build/wheel), then
# installed alone into a fresh environment and checked there.
stage "wheel build" scripts/build_wheels.sh 3.12
stage "wheel test" scripts/test_wheels.sh 3.12

stage torture scripts/torture.sh 50

# Short fuzzing: each libFuzzer target for 45 s, one per core at a time.
stage fuzz scripts/fuzz.sh --seconds 45
