#!/usr/bin/env bash
# Installs the C++ package from BUILD_DIR into a temporary prefix, builds
# cpp/package_test against it with find_package(shardkeep), and reads a
# value of a compatibility checkpoint with it.
#   cpp/package_test/check.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > /dev/null
cmake -S "$here" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" > /dev/null
cmake --build "$work/build" > /dev/null
size=$("$work/build/read_value" "$here/../testdata/compat/v1/zstd" blob)
[[ $size == 265 ]] || { echo "read_value printed '$size', expected 265" >&2; exit 1; }
if "$work/build/read_value" "$here/../testdata/compat/v1/missing" blob 2> "$work/err"; then
  echo "read_value succeeded on a missing checkpoint" >&2; exit 1
fi
grep -q NotFound "$work/err" || { cat "$work/err" >&2; exit 1; }
echo "installed package: find_package(shardkeep) builds and runs"
